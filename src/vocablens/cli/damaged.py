"""Damaged weights, refused once for every command: the check :func:`~vocablens.cli.common.load_model`
makes right after loading."""

from __future__ import annotations


def refuse_nonfinite(lm) -> None:
    """Refuse a model whose loaded weights hold NaN or inf, right after loading, for every command:
    a PCA, a norm, a forward pass or a sampling step would otherwise fail deep inside (a LinAlgError
    traceback in the report's PCA) or print NaN.

    Raises:
        NonFiniteWeights: one line naming the tensor, how many values and the vocabulary rows.
    """
    import torch

    from vocablens.errors import NonFiniteWeights

    b = lm.borders
    bad = b.nonfinite()  # one chunked pass over the weights in memory, remembered on the borders
    if bad:
        b.check_finite(torch.arange(b.vocab_size))  # every row counts here: names the tensor and rows
        raise NonFiniteWeights(f"the weights hold NaN or inf ({', '.join(sorted(bad))}); the checkpoint is "
                               "damaged: download or convert it again")
    # blocks that --max-memory streams are on meta here: read each of their tensors once, one at a time
    for streamer in getattr(lm.model, "vocablens_streamers", None) or []:
        from safetensors import safe_open

        for name, (key, f) in streamer.keys.items():
            with safe_open(str(f), framework="pt") as fh:
                x = fh.get_tensor(key)
            if x.is_floating_point() and not all(bool(torch.isfinite(c.sum())) or bool(c.isfinite().all())
                                                 for c in x.reshape(-1).split(2**22)):
                n = int((~torch.isfinite(x)).sum())
                raise NonFiniteWeights(f"the weights hold NaN or inf: {key} has {n} non-finite values; the "
                                       "checkpoint is damaged: download or convert it again")
