"""What built one prediction: per-block updates, FFN sub-updates and direct logit attribution.

Geva et al. 2022 §2: each block adds an attention update and an FFN update to the stream; the FFN
update is a sum of sub-updates ``a_i · v_i`` (activation times value vector). For one position: per
block, the change in log-probability of the final top-1 and of a chosen token under the logit lens
after the attention and after the FFN; the FFN sub-updates with the largest direct effect, with the
tokens each promotes; and direct logit attribution (DLA) per head and per FFN to the logit difference
between a target and a contrast token.

**The approximation.** The final norm is linearized at its actual input ``x_L``: every part u of the
stream is read as ``U P (s ⊙ (u - c·mean(u)))`` with s = gain / sigma(x_L), the scale the model
actually applied (c = 1 for LayerNorm-style centering). Because sigma is the one of the whole stream,
the parts sum *exactly* (up to float error) to the model's pre-softcap logits; what is approximate is
reading each part alone at that shared scale (removing a part would change sigma). Post-norms of
gemma2/gemma3/olmo2 blocks are linearized the same way at their actual inputs. A final-logit softcap
is not linear: attributions sum to the logit *before* the softcap.

Logits come from :class:`~vocablens.models.unembed.Unembedding` (``borders.unembedding``) and
log-probabilities from :func:`vocablens.ops.token_logprobs` (chunked over V, float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput, UnsupportedArchitecture
from vocablens.models import Borders
from vocablens.models.blocks import block_views, capture_updates, linearize_norm
from vocablens.ops import token_logprobs
from vocablens.vocab_space.readout import CHUNK_BYTES, check_k, check_token
from vocablens.units import plural

APPROXIMATION = (
    "direct logit attribution reads every part of the residual stream through the final norm linearized "
    "at the actual stream (its scale 1/sigma(x_L) held fixed); the parts sum exactly to the model's "
    "pre-softcap logits, but each part alone is read at the scale of the whole"
)


@dataclass(frozen=True)
class SubUpdate:
    """One FFN sub-update ``a_i · v_i`` (Geva et al. 2022 §2).

    Attributes:
        block, neuron: where it is (block 0..L-1, row of its FFN's down projection).
        activation: a_i, the neuron's activation at the position.
        dla: its direct effect on the logit difference target - contrast (logits).
        dla_target: its direct effect on the target's logit.
        top_ids: [k] tokens the sub-update promotes most (its direct effect on all logits).
    """

    block: int
    neuron: int
    activation: float
    dla: float
    dla_target: float
    top_ids: list[int]


@dataclass(frozen=True)
class BlockExplanation:
    """One block's updates at the explained position, in vocabulary space.

    Attributes:
        block: block index 0..L-1 (it reads stream layer ``block`` and writes layer ``block + 1``).
        attn_dlogprob_top1, mlp_dlogprob_top1: change in the logit-lens log-probability (nats) of the
            final top-1 when the attention update, then the FFN update, are added.
        attn_dlogprob_token, mlp_dlogprob_token: the same for the user's token (None without one).
        attn_dla, mlp_dla: direct effect of each update on the logit difference target - contrast.
        head_dla: [H] float32 on the model's device, per-head share of ``attn_dla``; ``attn_bias_dla``
            is the rest (the output projection's bias and a post-norm's bias), so
            ``head_dla.sum() + attn_bias_dla == attn_dla``.
        mlp_bias_dla: the down projection's (and post-norm's) bias part of ``mlp_dla``.
        attn_top_ids, mlp_top_ids: [k] tokens each update promotes most.
        sub_updates: the FFN sub-updates with the largest |dla|, largest first.
        sub_update_error: max |Σ_i a_i v_i + b_out - FFN output| (a check, ~0).
    """

    block: int
    attn_dlogprob_top1: float
    mlp_dlogprob_top1: float
    attn_dlogprob_token: float | None
    mlp_dlogprob_token: float | None
    attn_dla: float
    mlp_dla: float
    head_dla: torch.Tensor
    attn_bias_dla: float
    mlp_bias_dla: float
    attn_top_ids: list[int]
    mlp_top_ids: list[int]
    sub_updates: list[SubUpdate]
    sub_update_error: float


@dataclass(frozen=True)
class Explanation:
    """What built the prediction at one position (see :func:`explain`).

    Attributes:
        input_ids: [T] int64 prompt; position: the explained position.
        top1: the model's top-1 token there; token: the user's token or None.
        target, contrast: DLA explains ``logit[target] - logit[contrast]`` (target = token or top-1;
            contrast = top-1 when the target is not the top-1, else the runner-up).
        top1_logprob, token_logprob: final log-probabilities (nats).
        embed_dla: direct effect of the embedding (stream layer 0) on the logit difference.
        const_dla: the final norm's bias and the head's bias (same for every prompt).
        blocks: one :class:`BlockExplanation` per block.
        logit_diff_model: the model's pre-softcap ``logit[target] - logit[contrast]``.
        logit_diff_sum: ``embed_dla + Σ (attn_dla + mlp_dla) + const_dla``; equals the model's up to
            float error (see :data:`APPROXIMATION`).
        logit_target_model, logit_target_sum: the same for the target's logit alone.
        resid_error: max |x_0 + Σ updates - x_L| (a check that the updates are the whole stream).
        final_sigma: the final norm's actual RMS/std at the position (the scale held fixed).
        softcap: the final-logit softcap, if any (attributions are before it).
        approximation: the approximation, in words.
    """

    input_ids: torch.Tensor
    position: int
    top1: int
    token: int | None
    target: int
    contrast: int
    top1_logprob: float
    token_logprob: float | None
    embed_dla: float
    const_dla: float
    blocks: list[BlockExplanation]
    logit_diff_model: float
    logit_diff_sum: float
    logit_target_model: float
    logit_target_sum: float
    resid_error: float
    final_sigma: float
    softcap: float | None
    approximation: str = APPROXIMATION


def _host(t: torch.Tensor) -> torch.Tensor:
    """float32 on the host: explain's per-position arithmetic (one position, [2, d] readouts, [L, d]
    updates) runs there; the products with weight matrices run on the model's device first."""
    return t.detach().float().cpu()  # cpu: small per-position results, by design


def _through_post(post, raw: torch.Tensor, r2: torch.Tensor):
    """Readout rows r2 [2, d] pulled back through a block's post-transform (post-norm linearized at its
    actual input ``raw`` [d], then the residual multiplier): ``(rows [2, d], constant [2], the
    linearization or None)``, so that ``r2 · post(u) == rows · u + constant``."""
    r = r2 * post.scale
    if post.norm is None:
        return r, torch.zeros(2), None  # cpu: host arithmetic (_host)
    lin = linearize_norm(post.norm, raw)
    return lin.pull_back(r), r @ lin.bias, lin


def _prompt_position(input_ids: torch.Tensor, position: int) -> tuple[torch.Tensor, int]:
    """The prompt as [T] and the explained position in 0..T-1. Raises BadInput: a batch, an empty
    prompt, a position outside it."""
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise BadInput(f"explain reads one prompt; got a batch of {input_ids.shape[0]}")
        input_ids = input_ids[0]
    T = int(input_ids.numel())
    if T == 0:
        raise BadInput("empty prompt: give some text")
    if not -T <= int(position) < T:
        raise BadInput(f"position {position} is outside the prompt's {plural(T, 'token')}")
    return input_ids, int(position) % T


def _additive_views(borders: Borders) -> list:
    """The block views, each checked to be input + attention update + MLP update.
    Raises UnsupportedArchitecture otherwise (post-LN blocks)."""
    views = block_views(borders)
    for v in views:
        if not v.additive:
            raise UnsupportedArchitecture(borders.family, {"block": type(v.block).__name__},
                                          f"cannot split block {v.index} into updates: {v.not_additive_reason}")
    return views


def _stream_and_updates(borders: Borders, views: list, input_ids: torch.Tensor, p: int):
    """The residual stream at position ``p`` and each block's two updates there, float32 on the host:
    ``(resid [L+1, 1, T, d] as the model computed it, captures, x [L+1, d], attn_u [L, d],
    mlp_u [L, d], resid_error)``, where resid_error = max |x_0 + Σ updates - x_L|.
    Raises UnsupportedArchitecture when a block's output is not its input plus its two updates."""
    T = int(input_ids.numel())
    with capture_updates(views, (1, T), positions=torch.tensor([p], device=borders.device)) as caps:
        resid, _ = borders.residual_stream(input_ids[None])
    x = _host(resid[:, 0, p])  # [L+1, d]
    attn_u = torch.stack([_host(c.attn[0, 0]) for c in caps])  # [L, d]
    mlp_u = torch.stack([_host(c.mlp[0, 0]) for c in caps])
    recon = x[0] + (attn_u + mlp_u).sum(0)
    resid_error = float((recon - x[-1]).abs().max())
    step_err = (x[:-1] + attn_u + mlp_u - x[1:]).abs().max()
    if float(step_err) > 1e-3 * max(float(x.abs().max()), 1.0):
        raise UnsupportedArchitecture(borders.family, {"block": type(views[0].block).__name__},
                                      f"block outputs are not input + attention + MLP updates "
                                      f"(off by {float(step_err):.3g})")
    return resid, caps, x, attn_u, mlp_u, resid_error


def _lens_logprobs(U, resid: torch.Tensor, x: torch.Tensor, attn_u: torch.Tensor, real: int,
                   token_id: int | None):
    """Lens log-probabilities (nats) at x_l, x_l + attn_l, x_{l+1} (row 2L is x_L: the model's own
    output), through the unembedding and the chunked ops (never a full [N, V] log-softmax).

    Returns ``(hidden [2L+1, d] normed on the model's device, top2, lp_top1 [2L+1], lp_tok [2L+1] or
    None)``: the final top-1 and runner-up among the real tokens, and the log-probabilities of the
    top-1 and of ``token_id``."""
    L = attn_u.shape[0]
    states = torch.empty(2 * L + 1, x.shape[1])  # cpu: built from host rows, then moved
    states[0::2] = x
    states[1::2] = x[:-1] + attn_u
    hidden = U.normed(states.to(resid.device, resid.dtype))
    pad = U.vocab_size - real  # top-k over padding rows too, keeping the first real ones
    tl = token_logprobs(hidden, U.weight, top_k=min(U.vocab_size, 2 + pad), chunk_bytes=CHUNK_BYTES,
                        **U.head_kwargs())
    top2 = [int(i) for i in tl.topk_ids[2 * L].tolist() if i < real][:2]
    follow = [top2[0]] + ([int(token_id)] if token_id is not None else [])
    lp = _host(U.logits(hidden, rows=follow) - tl.lse[:, None])  # [2L+1, 1 or 2]
    return hidden, top2, lp[:, 0], (lp[:, 1] if token_id is not None else None)


def _block_attribution(i: int, v, c, r2: torch.Tensor, n_sub: int, lp_top1: torch.Tensor,
                       lp_tok: torch.Tensor | None):
    """Block ``i``'s direct logit attribution to (target, contrast) through readout rows r2 [2, d].

    Returns ``(fields, attn_dla [2], mlp_dla [2], sub_vec)``: the :class:`BlockExplanation` fields
    except the top tokens (``sub_updates`` as dicts without theirs), the attention's and the MLP's
    whole effects on the two logits, and the listed sub-updates' vectors [n_sub, d] after the block's
    post-transform (None when ``n_sub`` is 0)."""
    # attention: heads, bias, post-transform
    ra, a_const, _ = _through_post(v.attn_post, c.attn_raw[0, 0], r2)
    z = c.z[0, 0].float().view(v.n_heads, v.d_head)
    WO = v.W_O.detach().float()  # [H, dh, d]
    head_out = _host(torch.einsum("hk,hkd->hd", z, WO.to(z.device)))  # [H, d]
    head_dla = head_out @ ra.t()  # [H, 2]
    bO = v.b_O
    a_bias = (ra @ _host(bO) if bO is not None else torch.zeros(2)) + a_const  # cpu: host
    attn_dla = head_dla.sum(0) + a_bias
    # MLP: sub-updates, bias, post-transform
    rm, m_const, m_lin = _through_post(v.mlp_post, c.mlp_raw[0, 0], r2)
    act_d = c.act[0, 0].float()  # [d_ff]
    act = _host(act_d)
    Wout = v.W_out.detach().float().to(act_d.device)  # [d_ff, d], where it lives
    sub = act[:, None] * _host(Wout @ rm.t().to(act_d.device))  # [d_ff, 2]
    bout = v.b_out
    m_bias = (rm @ _host(bout) if bout is not None else torch.zeros(2)) + m_const  # cpu: host
    mlp_dla = sub.sum(0) + m_bias
    raw = act_d @ Wout + (bout.detach().float().to(act_d.device) if bout is not None else 0.0)
    sub_err = float((raw - c.mlp_raw[0, 0].float()).abs().max())
    diff = sub[:, 0] - sub[:, 1]
    subs: list[dict] = []
    sub_vec = None
    if n_sub:
        idx = torch.topk(diff.abs(), min(n_sub, len(diff))).indices
        contrib = act[idx, None] * _host(Wout[idx.to(Wout.device)])  # [n, d] raw sub-updates
        if m_lin is not None:
            contrib = m_lin.linear(contrib)
        sub_vec = contrib * v.mlp_post.scale
        subs = [dict(block=i, neuron=int(j), activation=float(act[j]), dla=float(diff[j]),
                     dla_target=float(sub[j, 0])) for j in idx.tolist()]
    fields = dict(
        block=i,
        attn_dlogprob_top1=float(lp_top1[2 * i + 1] - lp_top1[2 * i]),
        mlp_dlogprob_top1=float(lp_top1[2 * i + 2] - lp_top1[2 * i + 1]),
        attn_dlogprob_token=None if lp_tok is None else float(lp_tok[2 * i + 1] - lp_tok[2 * i]),
        mlp_dlogprob_token=None if lp_tok is None else float(lp_tok[2 * i + 2] - lp_tok[2 * i + 1]),
        attn_dla=float(attn_dla[0] - attn_dla[1]), mlp_dla=float(mlp_dla[0] - mlp_dla[1]),
        head_dla=(head_dla[:, 0] - head_dla[:, 1]).to(z.device),  # a result tensor: on the model's device
        attn_bias_dla=float(a_bias[0] - a_bias[1]), mlp_bias_dla=float(m_bias[0] - m_bias[1]),
        sub_updates=subs, sub_update_error=sub_err,
    )
    return fields, attn_dla, mlp_dla, sub_vec


def _with_top_tokens(pending: list[dict], tops: list[list[int]]) -> list[BlockExplanation]:
    """Each block's fields completed with its top tokens: ``tops`` lists the attention updates' (one
    per block), then the MLP updates', then every listed sub-update's in block order."""
    n = len(pending)
    at = 2 * n
    blocks: list[BlockExplanation] = []
    for i, kw in enumerate(pending):  # each result built once, whole (none mutated afterwards)
        made = []
        for sd in kw.pop("sub_updates"):
            made.append(SubUpdate(top_ids=tops[at], **sd))
            at += 1
        blocks.append(BlockExplanation(**kw, attn_top_ids=tops[i], mlp_top_ids=tops[n + i], sub_updates=made))
    return blocks


def explain(borders: Borders, input_ids: torch.Tensor, position: int = -1, token_id: int | None = None,
            k: int = 5, n_sub: int = 5) -> Explanation:
    """Per-block attention and FFN updates, FFN sub-updates and per-head direct logit attribution.

    Geva et al. 2022 §2 (updates and sub-updates in vocabulary space); direct logit attribution as in
    Elhage et al. 2021 §"direct path", with the final norm linearized at the actual scale (see the module
    docstring and :data:`APPROXIMATION`).

    Args:
        borders: the model's borders.
        input_ids: [T] or [1, T] int64.
        position: the position explained (negative counts from the end).
        token_id: a token to follow (log-probability changes, and the DLA target); None = top-1 only.
        k: tokens listed per update and sub-update.
        n_sub: sub-updates listed per block.

    Returns:
        :class:`Explanation`. Memory: one position's activations per block ([d_ff] floats).

    Raises:
        BadInput: empty prompt, bad position, token id or k.
        UnsupportedArchitecture: a block without a dense MLP, or whose output is not its input plus
            its two updates (post-LN blocks).
    """
    input_ids, p = _prompt_position(input_ids, position)
    real = borders.real_vocab_size
    check_k(k, real)
    if n_sub < 0:
        raise BadInput(f"the number of sub-updates must be >= 0; got {n_sub}")
    if token_id is not None:
        token_id = check_token(borders, token_id)
    views = _additive_views(borders)
    L = borders.n_layers
    U = borders.unembedding
    with torch.no_grad():
        # the per-position arithmetic is float32 on the host (_host); products with weight
        # matrices ([V, d], [d_ff, d], [H, dh, d]) run on the model's device and only their results move
        resid, caps, x, attn_u, mlp_u, resid_error = _stream_and_updates(borders, views, input_ids, p)
        dev = resid.device
        hidden, top2, lp_top1, lp_tok = _lens_logprobs(U, resid, x, attn_u, real, token_id)
        top1 = top2[0]
        target = int(token_id) if token_id is not None else top1
        contrast = top1 if target != top1 else top2[1]

        # Final norm linearized at x_L; readout rows (logit scale folded in, no gain) for target and contrast.
        fl = linearize_norm(borders.final_norm, x[L])
        Uh2 = _host(U.readout_rows([target, contrast], False, scaled=True))  # [2, d]
        r2 = fl.pull_back(Uh2)  # [2, d]
        const = _host(U.constant([target, contrast], fl.bias))  # the norm's bias, project_out's and the head's
        # before the final-logit softcap
        logit_t, logit_c = U.logits(hidden[2 * L:], rows=[target, contrast], capped=False)[0].tolist()

        embed = r2 @ x[0]
        total = embed.clone() + const
        pending: list[dict] = []  # each block's fields; its top tokens come from one matmul after the loop
        sub_vecs: list[torch.Tensor] = []
        for i, (v, c) in enumerate(zip(views, caps)):
            fields, attn_dla, mlp_dla, sub_vec = _block_attribution(i, v, c, r2, n_sub, lp_top1, lp_tok)
            if sub_vec is not None:
                sub_vecs.append(sub_vec)
            total = total + attn_dla + mlp_dla
            pending.append(fields)
        # the tokens every update and listed sub-update promotes most (direct effect through the final
        # norm linearized at x_L: readout rows r with fl.pull_back(r)·u == r·fl.linear(u)), scored by
        # the streamed readout in one matmul, never a [V, d] matrix
        u = torch.cat([attn_u, mlp_u, *sub_vecs])
        s = U.scores(fl.linear(u.float()).to(dev), False, scaled=True, rows=slice(0, real))
        blocks = _with_top_tokens(pending, torch.topk(s, k, dim=-1).indices.tolist())
    sigma = float(fl.sigma.flatten()[0])
    return Explanation(
        input_ids=input_ids.detach().cpu(), position=p, top1=top1,  # cpu: result
        token=None if token_id is None else int(token_id), target=target, contrast=contrast,
        top1_logprob=float(lp_top1[2 * L]),
        token_logprob=None if lp_tok is None else float(lp_tok[2 * L]),
        embed_dla=float(embed[0] - embed[1]), const_dla=float(const[0] - const[1]), blocks=blocks,
        logit_diff_model=logit_t - logit_c, logit_diff_sum=float(total[0] - total[1]),
        logit_target_model=logit_t, logit_target_sum=float(total[0]), resid_error=resid_error,
        final_sigma=sigma, softcap=borders.softcap,
    )
