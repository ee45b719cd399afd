"""The backward lens: the gradient of a target's loss at every layer, read in vocabulary space.

Katz et al. (2024, "Backward Lens: Projecting Language Model Gradients into the Vocabulary Space",
EMNLP, §3): a gradient of the loss with respect to a hidden state (the vector-Jacobian product that
back-propagation carries, from which every weight gradient of that layer is formed) lives in the
residual stream's space, so it can be read through the LM head like a forward state. Here, for the
loss ``-log p(target | prompt)`` at one position (nats, the model's own output: final norm, head,
softcap), the gradient ``g_l = ∂loss/∂h_l`` [d] is taken at that position of every stream layer
0..L in one backward pass, and the *descent* direction ``-g_l`` is projected through the head's
weight: ``scores_l = W_U (-g_l)`` [V] (a direction, so no final norm, bias or softcap: those act on
states). The top tokens of ``scores_l`` are those a gradient step on the stream at layer l would make
more likely, to first order, as the readout sees them; ``|g_l|`` says how much that layer's stream
matters for the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vocablens.errors import BadInput
from vocablens.models import Borders
from vocablens.ops import row_logprobs_at, row_logsumexp


@dataclass(frozen=True)
class BackwardLens:
    """The backward lens of one target at one position.

    Attributes:
        kind: ``backward``.
        input_ids: [T] int64, the prompt.
        position: the position whose next-token loss is differentiated (0..T-1).
        target: the target token id.
        loss: ``-log p(target)`` at ``position``, nats.
        grads: [L+1, d] float32, ``∂loss/∂h_l`` at ``position`` for stream layers 0..L.
        grad_norm: [L+1] float32, ``|g_l|``.
        top_ids: [L+1, k] int64, the tokens of the largest ``W_U (-g_l)`` (real vocabulary only).
        top_scores: [L+1, k] float32, those scores.
        target_score: [L+1] float32, the target's own score ``W_U[target] · (-g_l)``.
    """

    kind: str
    input_ids: torch.Tensor
    position: int
    target: int
    loss: float
    grads: torch.Tensor
    grad_norm: torch.Tensor
    top_ids: torch.Tensor
    top_scores: torch.Tensor
    target_score: torch.Tensor


def layer_gradients(borders: Borders, input_ids: torch.Tensor, target: int, position: int = -1
                    ) -> tuple[torch.Tensor, float]:
    """``∂(-log p(target))/∂h_l`` at ``position`` for every stream layer: ([L+1, d] in the model's
    dtype, the loss in nats). One forward (the graph rooted at layer 0) and one backward pass.

    Raises:
        BadInput: empty prompt, a position outside the prompt, a target outside the vocabulary.
    """
    from vocablens.lens.stream_graph import frozen, stream_graph

    ids = torch.as_tensor(input_ids).flatten()
    T = int(ids.numel())
    if T == 0:
        raise BadInput("empty prompt: give some text")
    if not -T <= int(position) < T:
        raise BadInput(f"position {position} is outside the prompt's {T} tokens")
    if not 0 <= int(target) < borders.real_vocab_size:
        raise BadInput(f"target token id {target} is outside the vocabulary 0..{borders.real_vocab_size - 1}")
    pos = int(position) % T
    L = borders.n_layers
    with frozen(borders.model):
        store = stream_graph(borders, ids[None], 0, range(L + 1))
        with torch.enable_grad():
            logits = store["logits"][0, pos]  # [V], the model's own output; float32 at least (float64 stays)
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            # the target's log-prob through ops (float32 at least; differentiable: one [1, V] row)
            lse = row_logsumexp(logits[None], dtype=logits.dtype)
            loss = -row_logprobs_at(logits[None], torch.tensor([[int(target)]], device=logits.device), lse)[0, 0]
            grads = torch.autograd.grad(loss, [store[ly] for ly in range(L + 1)])
    return torch.stack([g[0, pos] for g in grads]).detach(), float(loss.detach())


def backward_lens(borders: Borders, input_ids: torch.Tensor, target: int, position: int = -1,
                  k: int = 5) -> BackwardLens:
    """The backward lens (Katz et al. 2024) of ``target`` at ``position`` of one prompt.

    Args:
        borders: the model (its parameters' ``requires_grad`` flags are left as found).
        input_ids: [T] or [1, T] int64.
        target: the token id whose loss is differentiated.
        position: the position predicting it (default the last; negative from the end).
        k: top tokens per layer.

    Returns:
        :class:`BackwardLens` over stream layers 0..L (scores over the real vocabulary, float32).

    Raises:
        BadInput: as :func:`layer_gradients`; k outside 1..V.
    """
    from vocablens.lens.logit import check_top_k

    real = borders.real_vocab_size
    check_top_k(k, real)
    ids = torch.as_tensor(input_ids).flatten()
    grads, loss = layer_gradients(borders, ids, target, position)
    W = borders.unembedding.weight[:real].detach().float()  # [V', d_emb]
    descent = -grads.float()
    if borders.project_out is not None:  # the head reads d_emb: carry the direction through project_out's linear map
        descent = descent @ borders.project_out.weight.detach().float().T
    scores = descent.to(W.device) @ W.T  # [L+1, V'], one GEMM (L+1 rows)
    top = scores.topk(k, dim=-1)
    T = int(ids.numel())
    # cpu: the finished result, once: a few [L+1, k] / [L+1, d] rows the renderers read on the host
    host = {"grads": grads.float(), "grad_norm": grads.float().norm(dim=-1), "top_ids": top.indices,
            "top_scores": top.values, "target_score": scores[:, int(target)]}
    host = {name: t.cpu() for name, t in host.items()}  # cpu: the result, once (see above)
    return BackwardLens(kind="backward", input_ids=ids.detach().cpu(),  # cpu: result label (the prompt ids)
                        position=int(position) % T, target=int(target), loss=loss, **host)


__all__ = ["BackwardLens", "backward_lens", "layer_gradients"]
