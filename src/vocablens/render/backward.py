"""Rendering of the backward lens (:mod:`vocablens.lens.backward`): its ``--json`` dict and a rich table."""

from __future__ import annotations

from rich.table import Table

from vocablens.lens.backward import BackwardLens
from vocablens.models.tokens import token_str


def backward_json(res: BackwardLens, tokenizer, provenance=None) -> dict:
    """``{"kind": "backward", "tokens", "position", "target", "target_id", "loss", "layers": [{"layer",
    "grad_norm", "target_score", "top_tokens", "top_ids", "top_scores"}], "model"}``: one entry per
    stream layer 0..L; the loss in nats, scores are ``W_U · (-∂loss/∂h_l)`` (logit units per unit step)."""
    d = {"kind": "backward", "tokens": [token_str(tokenizer, i) for i in res.input_ids.tolist()],
         "position": res.position, "target": token_str(tokenizer, res.target), "target_id": res.target,
         "loss": res.loss,
         "layers": [{"layer": ly, "grad_norm": float(res.grad_norm[ly]), "target_score": float(res.target_score[ly]),
                     "top_tokens": [token_str(tokenizer, i) for i in res.top_ids[ly].tolist()],
                     "top_ids": res.top_ids[ly].tolist(),
                     "top_scores": [round(float(x), 6) for x in res.top_scores[ly]]}
                    for ly in range(res.grads.shape[0])]}
    if provenance is not None:
        d["model"] = provenance.to_dict()
    return d


def backward_table(res: BackwardLens, tokenizer) -> Table:
    """One row per stream layer: |g|, the target's score and the top tokens of ``W_U (-g)``."""
    t = Table(title=f"backward lens: -log p({token_str(tokenizer, res.target)!r}) = {res.loss:.3f} nats "
                    f"at position {res.position}", title_justify="left")
    t.add_column("layer", justify="right")
    t.add_column("|∂loss/∂h|", justify="right")
    t.add_column("target score", justify="right")
    t.add_column("tokens a descent step promotes")
    for ly in range(res.grads.shape[0]):
        toks = ", ".join(f"{token_str(tokenizer, i)!r}" for i in res.top_ids[ly].tolist())
        t.add_row(str(ly), f"{float(res.grad_norm[ly]):.3g}", f"{float(res.target_score[ly]):.3g}", toks)
    return t


def print_backward(res: BackwardLens, tokenizer, out, provenance=None) -> None:
    """Print :func:`backward_table` (and the model's provenance) to a rich console."""
    if provenance is not None:
        out.print(f"model: {provenance.describe()}", style="dim", soft_wrap=True)
    out.print(backward_table(res, tokenizer))


__all__ = ["backward_json", "backward_table", "print_backward"]
