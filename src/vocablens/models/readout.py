"""The readout found from the model itself, and checked against the model's own logits.

What a causal LM computes between its last block's output ``h_L`` [B, T, d_model] and its logits
[B, T, V] (a final norm, a projection, a scale before the head, the head, a logit multiplier, a soft
cap) differs by family, and the attribute names of the first lookup (:meth:`Borders.from_model`)
cannot know every family. :func:`find_readout` runs the model once on a few tokens with hooks that
record, in call order, every module outside the blocks and the LM head, then follows the values:

0. the list of blocks the stream flows through: of the lists of repeated blocks found by structure
   (:func:`vocablens.models.find.block_lists`), the one whose every block ran, in order, and whose
   last block ran last before the head (a vision tower does not run on text; a composite model's text
   model does), replacing the first choice when the probe shows another;
1. the chain of modules whose input is exactly the last block's output, then exactly the previous
   module's output, up to the LM head's input (a module that returns its input unchanged, dropout at
   eval, is skipped): that chain is the final norm (and ``project_out``: a linear map d_model ->
   d_emb), whatever the attributes are called;
2. a head input that is the chain's output times one constant (a scale applied as a tensor
   operation, MiniCPM3's ``hidden / logits_scaling``) is folded into the logit scale (exact when the
   head has no bias; with a bias it is refused);
3. the logit scale the config names (:meth:`Borders.from_model`) is tried first; when the model's
   logits are a constant multiple of that readout instead, the multiple is the logit multiplier
   (Cohere's ``logit_scale``, Granite's 1/``logits_scaling``, Falcon-H1's ``lm_head_multiplier``,
   HyperCLOVA X's ``logits_scaling``, which multiplies).

Then the check (every whole load): vocablens's readout of ``h_L`` through
:class:`~vocablens.models.unembed.Unembedding` against the model's own logits, as probabilities;
beyond :data:`TOLERANCE` the load fails with :class:`~vocablens.errors.UnsupportedArchitecture`
naming the mismatch and what it looks like. Nothing is printed from an unchecked readout of a whole
load. Loads without the blocks read a check stored by an earlier whole load
(:mod:`vocablens.models.files.readout_store`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from vocablens.errors import NonFiniteActivations, UnsupportedArchitecture

#: max |Δp| allowed between vocablens's readout and the model's own probabilities, by the head's dtype
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
#: tokens in the probe forward
PROBE_TOKENS = 4


@dataclass(frozen=True)
class ReadoutCheck:
    """One comparison of vocablens's readout with the model's own logits.

    Attributes:
        max_dp: max |Δp| over the probe's positions and the vocabulary (probabilities, unitless).
        tolerance: the bound it was held to (:data:`TOLERANCE` of ``dtype``).
        dtype: the head's dtype (``float32``).
        tokens: positions compared.
        final_norm: the final norm's module path in the model (``model.norm``), or None.
        project_out: ``project_out``'s module path, or None.
        logit_scale: the logit multiplier applied (1.0 for most families).
        softcap: the final-logit soft cap, or None.
        family: ``config.model_type``.
    """

    max_dp: float
    tolerance: float
    dtype: str
    tokens: int
    final_norm: str | None
    project_out: str | None
    logit_scale: float
    softcap: float | None
    family: str = ""

    def line(self) -> str:
        """``checked: max |Δp| = 3.0e-08 over 4 tokens (float32, tolerance 1e-04)``."""
        return (f"checked: max |Δp| = {self.max_dp:.1e} over {self.tokens} tokens against the model's own "
                f"logits ({self.dtype}, tolerance {self.tolerance:.0e})")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def tolerance(dtype: torch.dtype) -> float:
    """The max |Δp| allowed for a head in ``dtype`` (float32: 1e-4; bf16: 2e-2; fp16: 5e-3)."""
    return TOLERANCE.get(dtype, 2e-2)


def probe_ids(borders, n: int = PROBE_TOKENS) -> torch.Tensor:
    """[1, n] int64 token ids spread over the real vocabulary (deterministic, no tokenizer needed)."""
    V = max(2, int(borders.real_vocab_size))
    return (torch.arange(1, n + 1, dtype=torch.int64) * (V // (n + 1))).clamp(0, V - 1)[None]


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    out = getattr(x, "last_hidden_state", None)
    return out if isinstance(out, torch.Tensor) else None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` holds the values of ``b`` (or of its last positions: a head reading only the
    last ``logits_to_keep`` positions)."""
    if a is None or b is None or a.shape[-1] != b.shape[-1] or a.dim() != b.dim():
        return False
    if a.shape != b.shape:
        if a.dim() < 2 or a.shape[:-2] != b.shape[:-2] or a.shape[-2] > b.shape[-2]:
            return False
        b = b[..., b.shape[-2] - a.shape[-2]:, :]
    return a.dtype == b.dtype and torch.equal(a, b)


def _probe(borders, ids: torch.Tensor):
    """One forward with hooks: ``(blocks, events, last, head_in, head_out, logits)``. ``blocks`` is the
    list of blocks the stream flows through (:func:`_stream_blocks`); events are ``(module, input,
    output)`` of every module outside the lists of blocks and the head, in call order, after its last
    block ran and before the head."""
    from vocablens.models.find import block_lists, config_value
    from vocablens.models.hooks import ModelPatch

    model = borders.model
    lists = [m for _, m in block_lists(model, config_value(borders.config, "num_hidden_layers", default=None))]
    if not any(m is borders.blocks for m in lists):
        lists.insert(0, borders.blocks)
    skip = {id(m) for ml in lists for m in ml.modules()} | {id(m) for m in borders.lm_head.modules()}
    skip |= {id(model), id(borders.embedding)}
    events: list[tuple[int, nn.Module, torch.Tensor | None, torch.Tensor | None]] = []
    runs: list[list[tuple[int, int, torch.Tensor | None]]] = [[] for _ in lists]  # (seq, entry, output)
    seen: dict[str, object] = {}
    seq = iter(range(1 << 62))

    def rec(mod, args, kwargs, output):
        x = args[0] if args else next(iter(kwargs.values()), None)
        events.append((next(seq), mod, _first_tensor(x), _first_tensor(output)))

    def block_hook(li, j):
        return lambda _m, _a, output: runs[li].append((next(seq), j, _first_tensor(output)))

    def head_pre(_m, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        seen.setdefault("head_seq", next(seq))
        seen.setdefault("head_in", _first_tensor(x))

    def head_post(_m, _a, output):
        seen.setdefault("head_out", _first_tensor(output))

    with ModelPatch() as patch, torch.no_grad():
        for m in model.modules():
            if id(m) not in skip and not isinstance(m, (nn.ModuleList, nn.ModuleDict)):
                patch.post_hook(m, rec, with_kwargs=True)
        for li, ml in enumerate(lists):
            for j, blk in enumerate(ml):
                patch.post_hook(blk, block_hook(li, j))
        patch.pre_hook(borders.lm_head, head_pre, with_kwargs=True)
        patch.post_hook(borders.lm_head, head_post)
        out = model(input_ids=ids.to(borders.device), use_cache=False)
    logits = _first_tensor(getattr(out, "logits", out))
    head_seq = seen.get("head_seq", 1 << 62)
    li, last_seq, last = _stream_blocks(lists, runs, head_seq)
    events = [(m, i, o) for s, m, i, o in events if last_seq < s < head_seq]
    return (lists[li] if li is not None else borders.blocks), events, last, seen.get("head_in"), \
        seen.get("head_out"), logits


def _stream_blocks(lists: list, runs: list, head_seq: int) -> tuple[int | None, int, torch.Tensor | None]:
    """``(index, seq, output)``: of the lists whose every block ran, in order, before the head (a
    vision tower does not run on text), the one whose last block ran last before the head: the
    stream flows from it to the head. ``(None, -1, None)`` when none did."""
    best: tuple[int | None, int, torch.Tensor | None] = (None, -1, None)
    for li, ml in enumerate(lists):
        calls = [(s, j, o) for s, j, o in runs[li] if s < head_seq]
        firsts = {}
        for s, j, _o in calls:
            firsts.setdefault(j, s)
        if len(firsts) != len(ml) or [firsts[j] for j in range(len(ml))] != sorted(firsts.values()):
            continue
        s, _j, o = max((c for c in calls if c[1] == len(ml) - 1), key=lambda c: c[0])
        if s > best[1]:
            best = (li, s, o)
    return best


def _is_projection(m: nn.Module) -> bool:
    w = getattr(m, "weight", None)
    return isinstance(m, nn.Linear) or (isinstance(w, torch.Tensor) and w.dim() == 2)


def _max_dp(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().reshape(-1, a.shape[-1]), b.float().reshape(-1, b.shape[-1])
    return float((torch.softmax(a, -1) - torch.softmax(b, -1)).abs().max())


def _looks_like(mine: torch.Tensor, theirs: torch.Tensor) -> str:
    """What a mismatch looks like: a constant logit ratio, or something else."""
    m, t = mine.float().flatten(), theirs.float().flatten()
    keep = m.abs() > 1e-3 * m.abs().max().clamp_min(1e-30)
    if keep.sum() >= 2:
        r = t[keep] / m[keep]
        if float((r - r.median()).abs().max()) <= 1e-3 * float(r.median().abs().clamp_min(1e-12)):
            return (f"the model's logits are {float(r.median()):.6g} x vocablens's: a logit multiplier the "
                    "config sets")
    return "a norm or map before the head that vocablens does not apply"


def find_readout(borders) -> tuple[object, ReadoutCheck]:
    """Find the readout of a whole model by structure and check it (module docstring).

    Args:
        borders: a :class:`~vocablens.models.Borders` of a fully loaded model (its blocks in memory).

    Returns:
        ``(borders, check)``: the borders with the blocks, final norm, ``project_out`` and logit scale found
        (the same object when the first lookup was right) and the :class:`ReadoutCheck`.

    Raises:
        UnsupportedArchitecture: the readout of the last block's output differs from the model's
            own logits beyond :func:`tolerance` (one line: the size, and what it looks like), or the
            head's input cannot be traced from the last block's output.
        NonFiniteActivations: the probe forward itself holds inf or NaN (a float16 stream that
            overflows), so nothing can be compared.
    """
    from vocablens.models.find import named_children

    model = borders.model
    family, found = borders.family, named_children(model)
    ids = probe_ids(borders)
    blocks, events, last, head_in, head_out, logits = _probe(borders, ids)
    if last is None or head_in is None or logits is None:
        raise UnsupportedArchitecture(family, found, "a probe forward of text ran no list of blocks in full, "
                                      "in order, before the LM head")
    if tuple(last.shape[:-1]) != tuple(ids.shape):
        raise UnsupportedArchitecture(family, found, f"the last block's output is {tuple(last.shape)} for "
                                      f"{tuple(ids.shape)} tokens, not one residual stream [B, T, d] (several "
                                      "streams, as hyper-connections keep): the lens cannot read it as one")
    if not all(bool(torch.isfinite(t).all()) for t in (last, head_in, logits)):
        raise NonFiniteActivations(f"the probe forward of {ids.shape[-1]} tokens overflowed "
                                   f"{str(borders._head_tensors()[0].dtype).replace('torch.', '')}: the readout cannot be checked")
    chain, x = [], last  # the modules run on the last block's output, in order, up to the head
    for mod, inp, outp in events:
        if inp is not None and outp is not None and _same(inp, x) and not _same(outp, inp):
            chain.append(mod)
            x = outp
    pre = _scale_before_head(borders, x, head_in)
    names = {id(m): n for n, m in model.named_modules()}
    final_norm, project_out = _norm_and_projection(borders, chain, names)
    cand = borders.replace(final_norm=final_norm, project_out=project_out, blocks=blocks,
                           logit_scale=float(borders.logit_scale) * pre)
    head_dtype = str(borders._head_tensors()[0].dtype).replace("torch.", "")
    tol = tolerance(borders._head_tensors()[0].dtype)
    cand, mine, dp = _with_scale_read_off(cand, last.detach(), logits, head_out, tol)
    if not dp <= tol:  # NaN too
        raise UnsupportedArchitecture(
            family, found, f"vocablens's readout of the last block's output differs from the model's own logits: "
            f"max |Δp| = {dp:.2e} over {ids.shape[-1]} tokens (tolerance {tol:.0e} for "
            f"{head_dtype}); it looks like {_looks_like(mine, logits)}")
    check = ReadoutCheck(max_dp=dp, tolerance=tol, dtype=head_dtype,
                         tokens=int(ids.shape[-1]),
                         final_norm=names.get(id(final_norm)) if final_norm is not None else None,
                         project_out=names.get(id(project_out)) if project_out is not None else None,
                         logit_scale=float(cand.logit_scale), softcap=cand.softcap, family=family)
    same = (cand.final_norm is borders.final_norm and cand.project_out is borders.project_out
            and cand.logit_scale == borders.logit_scale and cand.blocks is borders.blocks)
    return (borders if same else cand), check


def _scale_before_head(borders, x: torch.Tensor, head_in: torch.Tensor) -> float:
    """1.0 when the head's input ``head_in`` is ``x`` (the chain's output), else the constant the
    model multiplies ``x`` by before its head (no bias only).

    Raises:
        UnsupportedArchitecture: the head's input is neither ``x`` nor a multiple of it.
    """
    from vocablens.models.find import named_children

    if _same(head_in, x):
        return 1.0
    xs = x[..., x.shape[-2] - head_in.shape[-2]:, :] if x.shape != head_in.shape and x.dim() >= 2 else x
    ratio = _looks_like(xs, head_in) if xs.shape == head_in.shape else ""
    if "x vocablens" in ratio and borders._head_tensors()[1] is None:
        keep = xs.float().abs() > 1e-6
        return float((head_in.float()[keep] / xs.float()[keep]).median())
    raise UnsupportedArchitecture(borders.family, named_children(borders.model), "the LM head's input is not the "
                                  "output of modules run on the last block's output: a norm or map before the head "
                                  "that vocablens does not apply")


def _norm_and_projection(borders, chain: list, names: dict) -> tuple:
    """``(final_norm, project_out)`` of the modules ``chain`` run between the last block and the head:
    the norms (several: one ``nn.Sequential``) and at most one projection, last.

    Raises:
        UnsupportedArchitecture: more than one projection, or one that is not last.
    """
    from vocablens.models.find import named_children

    projs = [m for m in chain if _is_projection(m)]
    norms = [m for m in chain if not _is_projection(m)]
    if len(projs) > 1 or (projs and chain[-1] is not projs[0]):
        raise UnsupportedArchitecture(borders.family, named_children(borders.model), "more than one map before the "
                                      f"LM head ({', '.join(names.get(id(m), '?') for m in chain)})")
    final_norm = norms[0] if len(norms) == 1 else (nn.Sequential(*norms) if norms else None)
    return final_norm, (projs[0] if projs else None)


def _with_scale_read_off(cand, h_L: torch.Tensor, logits: torch.Tensor, head_out, tol: float):
    """``(borders, their logits of h_L, max |Δp| against logits)``: ``cand``, or ``cand`` with the
    logit scale read off the model when its logits are a constant multiple of the head's output
    ``head_out`` and that scale brings ``cand`` within ``tol`` and closer to the model's logits (also
    when the probabilities agree already: a tiny or untrained model's near-uniform distributions
    hide a logit multiplier from |Δp|, never from the logits themselves)."""
    with torch.no_grad():
        mine = cand.unembedding(h_L)
        dp = _max_dp(mine, logits)
        if (dp > tol or _rel_diff(mine, logits) > 1e-3) and head_out is not None and cand.softcap is None:
            z = head_out.float()
            lg = logits.float()[..., -z.shape[-2]:, :] if z.dim() >= 2 else logits.float()
            s = float((lg * z).sum() / (z * z).sum().clamp_min(1e-30))
            alt = cand.replace(logit_scale=s)
            mine_alt = alt.unembedding(h_L)
            dp_alt = _max_dp(mine_alt, logits)
            if dp_alt <= tol and s > 0 and _rel_diff(mine_alt, logits) < _rel_diff(mine, logits):
                return alt, mine_alt, dp_alt
    return cand, mine, dp


def _rel_diff(mine: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |mine - theirs| / max |theirs| over the positions both hold (logits)."""
    t = theirs.float()
    m = mine.float()[..., -t.shape[-2]:, :] if t.dim() >= 2 and mine.shape != t.shape else mine.float()
    return float((m - t).abs().max() / t.abs().max().clamp_min(1e-30)) if m.shape == t.shape else float("inf")


__all__ = ["PROBE_TOKENS", "TOLERANCE", "ReadoutCheck", "find_readout", "probe_ids", "tolerance"]
