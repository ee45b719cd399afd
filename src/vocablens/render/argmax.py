"""Argmax geometry (``argmax``, :meth:`vocablens.Model.argmax`): its JSON, tables, report section and rows,
registered as :data:`RENDERER` (the softmax bottleneck: :mod:`vocablens.render.bottleneck`)."""

from __future__ import annotations

import math

from rich.table import Table

from vocablens.argmax.result import STAGES, VERDICTS
from vocablens.argmax.model import ModelArgmax
from vocablens.models.tokens import token_str, quoted
from vocablens.render.html import Section, esc, table_html
from vocablens.render.renderer import Renderer, model_of
from vocablens.render.tokens import shown as _shown
from vocablens.units import noun, plural


def shown(token: str | None) -> str:
    """A token of the tables, quoted with whitespace visible; empty without a tokenizer."""
    return "" if token is None else _shown(token)

_LIST_MAX = 200


def _f(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _yes_no(v) -> str:
    return {True: "yes", False: "no"}.get(v, "undecided")


def _reserved(ma: ModelArgmax) -> list[int]:
    return [] if ma.reserved is None else [int(t) for t in ma.reserved.tolist()]


def reserved_group(ma: ModelArgmax, item=None) -> dict:
    """The reserved / unused special tokens as their own group: how many, their id range, verdicts
    among them, and (with ``item``, a token -> dict function) the flagged ones."""
    ids = _reserved(ma)
    res = ma.result
    counts = {k: 0 for k in VERDICTS}
    for t in ids:
        counts[VERDICTS[int(res.verdict[t])]] += 1
    g = {"count": len(ids), "first_id": min(ids, default=None), "last_id": max(ids, default=None),
         "counts": counts}
    if item is not None:
        for v in ("unargmaxable", "undecided"):
            g[v] = [item(t) for t in ids if VERDICTS[int(res.verdict[t])] == v]
    return g


def duplicate_groups(ma: ModelArgmax) -> list[dict]:
    """Exact-duplicate groups: ``[{"group", "ids", "can_tie"}]`` sorted by first id (``can_tie``
    None when the group's question was left open, e.g. by the time budget)."""
    res = ma.result
    out: dict[int, list[int]] = {}
    for t in (res.group >= 0).nonzero().flatten().tolist():
        out.setdefault(int(res.group[t]), []).append(t)
    return [{"group": g, "ids": sorted(ids), "can_tie": res.group_can_tie.get(g)}
            for g, ids in sorted(out.items(), key=lambda kv: min(kv[1]))]


def argmax_to_dict(ma: ModelArgmax, tokenizer=None, per_token: bool = True) -> dict:
    """Plain data for ``--json``: counts, stages, flagged tokens (decoded), per-token verdicts; the same
    keys whatever the model and options (``budget_s``, ``reserved``, ``norm`` null when not asked or none)."""
    res = ma.result
    dec = (lambda t: token_str(tokenizer, t)) if tokenizer is not None else (lambda t: None)
    reserved = set(_reserved(ma))

    def item(t):
        t = int(t)
        d = {"id": t, "token": dec(t), "verdict": VERDICTS[int(res.verdict[t])],
             "stage": STAGES[int(res.stage[t])] if int(res.stage[t]) >= 0 else None}
        if t in res.combos:
            ids, w = res.combos[t]
            order = w.argsort(descending=True)[:8]
            d["residual"] = _f(res.residual[t])
            d["support"] = int(len(ids))
            d["top_weights"] = [{"id": int(ids[k]), "token": dec(int(ids[k])), "weight": float(w[k])}
                                for k in order.tolist()]
            if t in res.combo_mean:
                # plus this weight on the mean of every other distinct row in play
                d["mean_of_other_rows_weight"] = float(res.combo_mean[t])
        if not math.isnan(float(res.margin[t])):
            d["margin"] = _f(res.margin[t])
        if t in res.reasons:
            d["reason"] = res.reasons[t]
        return d

    out = {
        "vocab_size": ma.vocab_size,
        "bias": ma.bias_mode,
        "counts": res.counts(),
        "padding_rows": ma.padding_rows,
        "untrained_rows": ma.untrained_rows,
        "unique_rows": res.n_unique,
        "rank": res.rank,
        "tolerance": res.tol,
        "interrupted": res.interrupted,
        "timings_s": {k: round(v, 4) for k, v in res.timings.items()},
        "settled": dict(res.settled),
        "verified_f64": res.verified_f64,
        "unargmaxable": [item(t) for t in res.ids("unargmaxable").tolist() if t not in reserved],
        "undecided": [item(t) for t in res.ids("undecided").tolist() if t not in reserved],
        "duplicates": [dict(g, tokens=[dec(t) for t in g["ids"]]) for g in duplicate_groups(ma)],
        "norm": None,
        "norm_note": ma.norm_note,
    }
    # always present (one schema): null / [] without a --budget, null without reserved tokens
    out["budget_s"] = res.budget_s
    out["cut_short"] = list(res.cut_short) if res.budget_s is not None else []
    out["reserved"] = reserved_group(ma, item) if reserved else None
    if ma.reach is not None:
        r = ma.reach
        out["norm"] = {
            "kind": r.model.kind, "radius": r.model.radius,
            "tokens": [{"id": int(t), "token": dec(int(t)),
                        "argmaxable": {1: True, 0: False}.get(int(r.argmaxable[q])),
                        "p_lower": float(r.p_lower[q]), "p_upper": float(r.p_upper[q]),
                        "margin_lower": _f(r.margin_lower[q]), "margin_upper": _f(r.margin_upper[q])}
                       for q, t in enumerate(r.tokens.tolist())],
        }
    if per_token:
        m = res.margin
        out["per_token"] = {
            "verdict_names": list(VERDICTS),
            "verdict": res.verdict.tolist(),
            "margin": [None if math.isnan(x) or math.isinf(x) else round(x, 6) for x in m.tolist()],
        }
    return out


def argmax_tables(ma: ModelArgmax, tokenizer=None) -> list[Table]:
    """Rich tables: counts, stages, flagged tokens, duplicate groups, norm reachability."""
    res = ma.result
    dec = (lambda t: quoted(token_str(tokenizer, t))) if tokenizer is not None else str
    c = res.counts()
    t1 = Table(title=f"argmax geometry of W_U [{ma.vocab_size} x {res.whiten.shape[0]}], bias {ma.bias_mode}",
               title_justify="left")
    t1.add_column("verdict")
    t1.add_column("tokens", justify="right")
    for k in VERDICTS:
        t1.add_row(k, str(c[k]))
    t2 = Table(title=f"stages ({res.n_unique} distinct rows, rank {res.rank}; "
               f"{res.verified_f64} certificates re-checked in float64)", title_justify="left")
    t2.add_column("stage")
    t2.add_column("seconds", justify="right")
    t2.add_column("settled", justify="right")
    for s in STAGES:
        t2.add_row(s, f"{res.timings.get(s, 0.0):.2f}", str(res.settled.get(s, 0)))
    t2.add_row("total", f"{res.timings.get('total', 0.0):.2f}", "")
    tables = [t1, t2]
    flagged = res.ids("unargmaxable").tolist() + res.ids("undecided").tolist()
    if flagged:
        t3 = Table(title="not argmaxable / undecided", title_justify="left")
        for col in ("id", "token", "verdict", "residual / reason", "heaviest rows of the combination"):
            t3.add_column(col)
        for t in flagged[:_LIST_MAX]:
            v = VERDICTS[int(res.verdict[t])]
            if t in res.combos:
                ids, w = res.combos[t]
                o = w.argsort(descending=True)[:3].tolist()
                heavy = ", ".join(f"{dec(int(ids[k]))} {float(w[k]):.2f}" for k in o)
                info = f"{float(res.residual[t]):.2e}"
            else:
                heavy, info = "", res.reasons.get(t, "")
            t3.add_row(str(t), dec(t), v, info, heavy)
        tables.append(t3)
    groups = duplicate_groups(ma)
    if groups:
        t4 = Table(title="exact duplicate rows (never a strict argmax)", title_justify="left")
        t4.add_column("ids")
        t4.add_column("tokens")
        t4.add_column("can tie for first", justify="right")
        for g in groups[:_LIST_MAX]:
            t4.add_row(", ".join(map(str, g["ids"])), ", ".join(dec(t) for t in g["ids"]),
                       _yes_no(g["can_tie"]))
        tables.append(t4)
    if ma.reach is not None:
        r = ma.reach
        t5 = Table(title=f"under the final norm ({ma.norm_note})", title_justify="left")
        for col in ("id", "token", "argmaxable", "max prob >=", "max prob <=", "margin in"):
            t5.add_column(col)
        for q, t in enumerate(r.tokens.tolist()):
            a = {1: "yes", 0: "no"}.get(int(r.argmaxable[q]), "undecided")
            t5.add_row(str(t), dec(t), a, f"{float(r.p_lower[q]):.4f}", f"{float(r.p_upper[q]):.4f}",
                       f"[{float(r.margin_lower[q]):.3g}, {float(r.margin_upper[q]):.3g}]")
        tables.append(t5)
    return tables


def argmax_section(ma: ModelArgmax, tokenizer=None) -> Section:
    """Report section: counts per verdict, stage timings, flagged and duplicate tokens."""
    d = argmax_to_dict(ma, tokenizer, per_token=False)
    parts = [f"<p>Tokens that can never be the top prediction (Demeter et al. 2020; Grivas et al. 2022), "
             f"decided exactly with a certificate each; bias {esc(d['bias'])}, "
             f"{d['unique_rows']} distinct rows of rank {d['rank']}.</p>",
             table_html(["verdict", "tokens"], [[k, v] for k, v in d["counts"].items()]),
             table_html(["stage", "seconds", "settled"],
                        [[s, f"{d['timings_s'].get(s, 0):.2f}", d["settled"].get(s, 0)] for s in STAGES])]
    if d.get("cut_short"):
        parts.insert(1, f"<p class='note'>Cut short: the time budget of {d['budget_s']:g} s ran out in "
                        f"{esc(', '.join(d['cut_short']))}; {plural(d['counts']['undecided'], 'token')} {noun(d['counts']['undecided'], 'is')} undecided "
                        "(never guessed). Run <code>vocablens argmax</code> for the exact answer.</p>")
    if d.get("reserved"):
        g = d["reserved"]
        parts.append(f"<h3>Reserved / unused special tokens</h3><p>{plural(g['count'], 'token')} (ids {g['first_id']}"
                     f"..{g['last_id']}), reported apart: "
                     + ", ".join(f"{k} {v}" for k, v in g["counts"].items() if v) + ".</p>")
    if d["unargmaxable"]:
        parts.append("<h3>Not argmaxable</h3>" + table_html(
            ["id", "token", "residual", "support"],
            [[x["id"], shown(x["token"]), f"{x.get('residual', 0):.2e}", x.get("support", "")] for x in d["unargmaxable"][:_LIST_MAX]]))
    if d["duplicates"]:
        parts.append("<h3>Exact duplicates</h3>" + table_html(
            ["ids", "tokens", "can tie for first"],
            [[", ".join(map(str, g["ids"])), " ".join(shown(t) for t in g["tokens"]), _yes_no(g["can_tie"])]
             for g in d["duplicates"][:_LIST_MAX]]))
    if d["norm"]:
        parts.append(f"<h3>Under the final norm</h3><p>Probed as {esc(d['norm_note'])}.</p>" + table_html(
            ["id", "token", "argmaxable", "max prob >=", "max prob <="],
            [[x["id"], shown(x["token"]), {True: "yes", False: "no"}.get(x["argmaxable"], "undecided"),
              f"{x['p_lower']:.4f}", f"{x['p_upper']:.4f}"] for x in d["norm"]["tokens"]]))
    return Section(id="argmax", title="Argmax geometry", html="\n".join(parts))


# ---------- the renderers of an argmax result (vocablens.handle.results.Argmax)
def _json_of(r) -> dict:
    return {**argmax_to_dict(r.value, r.tokenizer), **model_of(r)}


def _print_of(r, out) -> None:
    for t in argmax_tables(r.value, r.tokenizer):
        out.print(t)


def _rows_of(r) -> list[dict]:
    """A row per vocabulary row: its verdict, the stage that decided it and its margin."""
    res = r.value.result
    return [{"id": t, "token": token_str(r.tokenizer, t), "verdict": VERDICTS[v],
             "stage": STAGES[s] if s >= 0 else None, "margin": m}
            for t, (v, s, m) in enumerate(zip(res.verdict.tolist(), res.stage.tolist(), res.margin.tolist()))]


#: how an ``argmax`` result shows itself
RENDERER = Renderer("argmax", _json_of, _print_of, None, _rows_of)
