"""A tuned lens trained (``lens train``, :meth:`vocablens.Model.train_lens`): its JSON, the line the command
prints and a row per optimizer step, registered as :data:`RENDERER`."""

from __future__ import annotations

from vocablens.render.renderer import Renderer


def train_summary_to_dict(res, out_dir, steps: int, wall_s: float, world_size: int, data: dict) -> dict:
    """The dict ``lens train --json`` prints: the output folder, steps asked and resumed from, tokens
    seen, wall seconds and tokens/s, the last step's loss (nats summed over layers) and per-layer
    losses (None before any step), the world size and the data record. ``res`` is a
    :class:`vocablens.lens.train.TrainResult`."""
    last = res.history[-1] if res.history else None
    return {"out": str(out_dir) if out_dir is not None else None, "steps": steps, "resumed_from": res.resumed_from,
            "tokens": res.tokens, "seconds": round(wall_s, 2),
            "tokens_per_s": res.tokens / wall_s if wall_s > 0 else None,
            "final_loss": last.loss if last is not None else None,
            "final_layer_loss": last.layer_loss if last is not None else None,
            "world_size": world_size, "data": data}


# ---------- the renderers of a lens_train result (vocablens.handle.results.LensTraining)
def _json_of(r) -> dict:
    o = r.options
    return train_summary_to_dict(r.value, o["out"], o["steps"], o["seconds"], o["world_size"], o["data"])


def _print_of(r, out) -> None:
    d = _json_of(r)
    where = f"saved the tuned lens to {d['out']}" if d["out"] is not None else "trained a tuned lens"
    tps = f"{d['tokens_per_s']:.1f}" if d["tokens_per_s"] is not None else "?"
    loss = f"{d['final_loss']:.4f}" if d["final_loss"] is not None else "?"
    out.print(f"{where} ({d['tokens']} tokens in {r.options['seconds']:.0f} s, {tps} tokens/s; "
              f"final loss {loss} nats summed over layers)")


def _rows_of(r) -> list[dict]:
    """A row per optimizer step run: its loss (nats summed over layers), per-layer losses, tokens seen,
    tokens/s, learning rate and gradient norm (before clipping)."""
    return [{"step": h.step, "loss": h.loss, "layer_loss": list(h.layer_loss), "tokens": h.tokens,
             "tokens_per_s": h.tokens_per_s, "lr": h.lr, "grad_norm": h.grad_norm} for h in r.value.history]


#: how a ``lens_train`` result shows itself
RENDERER = Renderer("lens_train", _json_of, _print_of, None, _rows_of)


__all__ = ["RENDERER", "train_summary_to_dict"]
