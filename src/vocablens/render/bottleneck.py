"""The softmax bottleneck (``vocablens bottleneck``, :meth:`vocablens.Model.bottleneck`): its JSON, table,
spectra figure, report section and rows, registered as :data:`RENDERER` (Yang et al. 2018)."""

from __future__ import annotations

import inspect
import math

from rich.table import Table

from vocablens.argmax.bottleneck import Bottleneck, softmax_bottleneck
from vocablens.render.html import Section, figure_html, table_html
from vocablens.render.renderer import Renderer, model_of


def _f(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


#: the top-k counts softmax_bottleneck reports by default: always keys of the shares, null past a spectrum
_TOP_K = tuple(inspect.signature(softmax_bottleneck).parameters["top_k"].default)


def _share_keys(b: Bottleneck) -> list[int]:
    return sorted(set(_TOP_K) | set(b.share_W) | set(b.share_A))


def bottleneck_to_dict(b: Bottleneck) -> dict:
    """Plain data for ``vocablens bottleneck --json``; ``share_W`` and ``share_logprobs`` (variance
    share of the top-k singular directions, keyed by k) have the same keys whatever V, d and N (the
    default top-k counts), null where k exceeds that spectrum's length."""
    return {
        "V": b.V, "d": b.d, "rank_W": b.rank_W, "tol_W": b.tol_W, "stable_rank_W": b.stable_rank_W,
        "entropy_rank_W": b.entropy_rank_W, "n_contexts": b.n_contexts, "rank_logprobs": b.rank_A,
        "tol_logprobs": _f(b.tol_A), "rank_bound": b.bound_A, "softcap": b.softcap,
        # one key set for both whatever N: a top-k past the spectrum's length is null
        "share_W": {str(k): b.share_W.get(k) for k in _share_keys(b)},
        "share_logprobs": {str(k): b.share_A.get(k) for k in _share_keys(b)},
        "sigma_W": b.sigma_W.tolist(), "sigma_logprobs": b.sigma_A.tolist(),
    }


def bottleneck_figure(b: Bottleneck):
    """Plotly figure: both singular spectra, normalised by their largest value, log scale."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, s, tol in (("W_U", b.sigma_W, b.tol_W), ("log-probabilities", b.sigma_A, b.tol_A)):
        if len(s) == 0 or float(s[0]) <= 0:
            continue
        y = (s / s[0]).clamp_min(1e-18).tolist()
        fig.add_trace(go.Scatter(x=list(range(1, len(y) + 1)), y=y, mode="lines", name=name))
    fig.add_vline(x=b.d, line_dash="dot", annotation_text=f"d = {b.d}")
    fig.update_layout(title="Singular spectra (sigma / sigma_max)", xaxis_title="index",
                      yaxis_title="sigma / sigma_max", yaxis_type="log", template="plotly_white")
    return fig


def bottleneck_tables(b: Bottleneck) -> list[Table]:
    """Rich table of the bottleneck figures."""
    t = Table(title=f"softmax bottleneck: W_U [{b.V} x {b.d}]", title_justify="left")
    t.add_column("quantity")
    t.add_column("W_U", justify="right")
    t.add_column(f"log-probs over {b.n_contexts} contexts", justify="right")
    t.add_row("numerical rank", str(b.rank_W), f"{b.rank_A} (bound {b.bound_A})" if b.rank_A >= 0 else "-")
    t.add_row("largest singular value", f"{float(b.sigma_W[0]):.4g}",
              f"{float(b.sigma_A[0]):.4g}" if len(b.sigma_A) else "-")
    t.add_row("stable rank", f"{b.stable_rank_W:.2f}", "")
    t.add_row("entropy effective rank", f"{b.entropy_rank_W:.1f}", "")
    for k in sorted(set(b.share_W) | set(b.share_A)):
        t.add_row(f"variance share, top {k}", f"{b.share_W.get(k, float('nan')):.3f}",
                  f"{b.share_A.get(k, float('nan')):.3f}" if k in b.share_A else "-")
    return [t]


def bottleneck_section(b: Bottleneck) -> Section:
    """Report section: ranks, variance shares and the two spectra."""
    rows = [["numerical rank", b.rank_W, f"{b.rank_A} (bound {b.bound_A})"],
            ["stable rank", f"{b.stable_rank_W:.2f}", ""],
            ["entropy effective rank", f"{b.entropy_rank_W:.1f}", ""]]
    rows += [[f"variance share, top {k}", f"{b.share_W.get(k, float('nan')):.3f}",
              f"{b.share_A[k]:.3f}" if k in b.share_A else ""] for k in sorted(b.share_W)]
    html = (f"<p>The logit matrix over any N contexts has rank at most d (Yang et al. 2018); here "
            f"N = {b.n_contexts} real contexts, d = {b.d}.</p>"
            + table_html(["quantity", "W_U", "log-probabilities"], rows)
            + figure_html(bottleneck_figure(b), "bottleneck-spectra"))
    return Section(id="bottleneck", title="Softmax bottleneck", html=html)


# ---------- the renderers of a bottleneck result (vocablens.handle.results.Bottleneck)
def _json_of(r) -> dict:
    return {**bottleneck_to_dict(r.value), "corpus": r.options.get("corpus"), **model_of(r)}


def _print_of(r, out) -> None:
    for t in bottleneck_tables(r.value):
        out.print(t)


def _figure_of(r):
    """The singular spectra ``bottleneck --plot`` writes."""
    return bottleneck_figure(r.value)


def _rows_of(r) -> list[dict]:
    """A row per singular value (index 1..): of W_U (``sigma_W``) and of the log-probabilities over the
    contexts (``sigma_logprobs``; None past that spectrum's length)."""
    w, a = r.value.sigma_W.tolist(), r.value.sigma_A.tolist()
    return [{"index": i + 1, "sigma_W": w[i] if i < len(w) else None, "sigma_logprobs": a[i] if i < len(a) else None}
            for i in range(max(len(w), len(a)))]


#: how a ``bottleneck`` result shows itself
RENDERER = Renderer("bottleneck", _json_of, _print_of, _figure_of, _rows_of)


__all__ = ["RENDERER", "bottleneck_figure", "bottleneck_section", "bottleneck_tables", "bottleneck_to_dict"]
