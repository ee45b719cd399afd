"""A Jacobian lens fitted (``lens fit-jacobian``, :meth:`vocablens.Model.fit_jacobian_lens`): its JSON and
the line the command prints, registered as :data:`RENDERER`."""

from __future__ import annotations

from vocablens.render.renderer import Renderer


def fit_summary_to_dict(lens, out, seconds: float, stored_dtype: str, provenance=None) -> dict:
    """The dict ``lens fit-jacobian --json`` prints: ``{"out" (null when not saved), "n_prompts",
    "tokens", "layers", "seconds" (wall, to a tenth of a second), "stored_dtype",
    "model"}``."""
    d = {"out": None if out is None else str(out), "n_prompts": lens.settings["n_prompts"],
         "tokens": lens.settings["tokens"], "layers": lens.layers, "seconds": round(seconds, 1),
         "stored_dtype": stored_dtype}
    if provenance is not None:
        d["model"] = provenance.to_dict()
    return d


def print_fit_summary(lens, out, seconds: float, console) -> None:
    """One line: where the Jacobian lens was saved, its prompts, tokens, layers and wall seconds."""
    what = f"saved the Jacobian lens to {out}" if out is not None else "fitted a Jacobian lens"
    console.print(f"{what} ({lens.settings['n_prompts']} prompts, {lens.settings['tokens']} tokens, "
                  f"{len(lens.layers)} layers, {seconds:.0f} s)")


# ---------- the renderers of a jacobian_fit result (vocablens.handle.results.JacobianFit)
def _json_of(r) -> dict:
    o = r.options
    return fit_summary_to_dict(r.value, o.get("out"), o["seconds"], o["stored_dtype"], r.provenance)


def _print_of(r, out) -> None:
    print_fit_summary(r.value, r.options.get("out"), r.options["seconds"], out)


#: how a ``jacobian_fit`` result shows itself
RENDERER = Renderer("jacobian_fit", _json_of, _print_of)


__all__ = ["RENDERER", "fit_summary_to_dict", "print_fit_summary"]
