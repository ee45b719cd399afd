"""One attention head's OV and QK circuits read token to token (Dar et al. 2022 §2.2; Elhage et al. 2021).

OV: ``E W_V W_O Rᵀ`` — a source token attended to, and the tokens the head's output then promotes (R
the readout, :mod:`.readout`). QK: ``E W_Q W_Kᵀ Eᵀ / sqrt(d_head)`` — a query token and the key
tokens it attends to. E is the input embedding; the grouped-query head a query head reads is mapped
with ``kv_head(h)``. Both [V, V] matrices have rank <= d_head and are streamed, never built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.models.blocks import block_view
from vocablens.vocab_space.readout import check_block, check_k, rows_per_chunk, stream_rows


@dataclass(frozen=True)
class HeadCircuit:
    """One attention head's OV or QK circuit read token to token.

    Attributes:
        block, head: the block and the query head read; ``kv_head`` the key/value head it shares (GQA).
        circuit: ``ov`` (source token attended to -> token the head's output promotes; scores are logits
            per unit attention) or ``qk`` (query token -> key token; scores are attention logits
            before softmax, divided by sqrt(d_head)).
        src_ids, tgt_ids, scores: [k] the top pairs over all source x target tokens.
        self_top1_fraction: fraction of source tokens whose top target is the token itself (a copying
            head for OV, a same-token-attending head for QK).
        n_sources: source tokens scanned.
        apply_norm_gain: final norm gain applied (OV only).
    """

    block: int
    head: int
    kv_head: int
    circuit: str
    src_ids: torch.Tensor
    tgt_ids: torch.Tensor
    scores: torch.Tensor
    self_top1_fraction: float
    n_sources: int
    apply_norm_gain: bool


def _rows_times(borders: Borders, V: int, kind: str, M: torch.Tensor, apply_norm_gain: bool) -> torch.Tensor:
    """``rows[:V] @ M`` [V, m] for the input embedding (``kind='key'``) or the readout (``'value'``),
    one block of rows at a time."""
    return torch.cat([R @ M for _, _, R in stream_rows(borders, V, kind, apply_norm_gain)])


def head_circuit(borders: Borders, block: int, head: int, circuit: str = "ov", k: int = 20,
                 apply_norm_gain: bool = True, max_sources: int | None = None, chunk_rows: int | None = None
                 ) -> HeadCircuit:
    """Top token pairs of one head's OV circuit ``E W_V W_O (g ⊙ U)ᵀ`` or QK circuit ``E W_Q W_Kᵀ Eᵀ``.

    Dar et al. 2022 §2.2 (attention parameters in embedding space); Elhage et al. 2021 ("A Mathematical
    Framework for Transformer Circuits", the OV and QK circuits). E is the input embedding
    (:meth:`Embedding.rows <vocablens.models.embed.Embedding.rows>`: input scale, input norm,
    ``project_in``; no positions, no norm before the attention), so the circuits ignore positions,
    rotary embeddings, q/k norms and biases. The [V, V] matrix is never built: it has rank <= d_head,
    so sources are streamed in chunks of ``[c, d_head] @ [d_head, V]``; cost 2·n_sources·V·d_head FLOPs.

    Args:
        block: block 0..L-1.
        head: query head 0..H-1.
        circuit: ``ov`` or ``qk``.
        k: pairs kept.
        max_sources: scan only the first n source token ids (default: the whole real vocabulary).

    Raises:
        BadInput: block/head out of range, bad circuit, k or max_sources.
        UnsupportedArchitecture: no attention of the expected shape.
    """
    if circuit not in ("ov", "qk"):
        raise BadInput(f"circuit must be 'ov' or 'qk'; got {circuit!r}")
    check_block(borders, block)
    v = block_view(borders, int(block))
    if not 0 <= int(head) < v.n_heads:
        raise BadInput(f"head {head} is out of range: block {block} has heads 0..{v.n_heads - 1}")
    real = borders.real_vocab_size
    n_src = real if max_sources is None else int(max_sources)
    if not 1 <= n_src <= real:
        raise BadInput(f"max_sources must be between 1 and {real}; got {max_sources}")
    check_k(k, n_src * real)
    dev = borders.input_embedding.device
    with torch.no_grad():
        # the [V, d] embedding and readout are streamed by blocks of rows; only [n, d_head] and
        # [d_head, V] products are kept
        if circuit == "ov":
            Wv, Wo = (w.detach().float() for w in v.W_OV(int(head)))
            A = _rows_times(borders, n_src, "key", Wv.to(dev), True)  # [n, dh]: E W_V
            Wo = Wo.to(borders.read_device)
            B = torch.cat([(Wo @ R.t()).to(dev) for _, _, R in stream_rows(borders, real, "value", apply_norm_gain)],
                          1)  # [dh, V]: what each head dim promotes
        else:
            Wq, Wk = (w.detach().float().to(dev) for w in v.W_QK(int(head)))
            A = _rows_times(borders, n_src, "key", Wq, True) / math.sqrt(v.d_head)
            B = _rows_times(borders, real, "key", Wk, True).t().contiguous()  # [dh, V]
    step = rows_per_chunk(real, chunk_rows)
    dev = A.device
    best_s = torch.empty(0, device=dev)
    best_i = torch.empty(0, dtype=torch.long, device=dev)
    self_top = torch.zeros((), dtype=torch.long, device=dev)  # summed on the device, read once
    with torch.no_grad():
        for i in range(0, n_src, step):
            S = A[i:i + step] @ B  # [c, V]
            rows = torch.arange(i, i + S.shape[0], device=dev)
            self_top += (S.argmax(dim=1) == rows).sum()
            kk = min(k, S.numel())
            t = torch.topk(S.flatten(), kk)
            flat = (t.indices // S.shape[1] + i) * real + t.indices % S.shape[1]
            s = torch.cat([best_s, t.values])
            f = torch.cat([best_i, flat])
            t2 = torch.topk(s, min(k, len(s)))
            best_s, best_i = t2.values, f[t2.indices]
    return HeadCircuit(block=int(block), head=int(head), kv_head=v.kv_head(int(head)), circuit=circuit,
                       src_ids=best_i // real, tgt_ids=best_i % real, scores=best_s,
                       self_top1_fraction=int(self_top) / n_src, n_sources=n_src,
                       apply_norm_gain=bool(apply_norm_gain and circuit == "ov"))
