"""Lenses over the residual stream.

* :mod:`~vocablens.lens.logit` — the logit lens (and any translator, e.g. a tuned lens) over layers 0..L.
* :mod:`~vocablens.lens.kinds` — the `kind` that names what a lens computed.
* :mod:`~vocablens.lens.tuned` — the tuned lens, its files, and :func:`~vocablens.lens.tuned.find_lens`.
* :mod:`~vocablens.lens.train` — training a tuned lens (checkpoints, exact resume, data-parallel).
* :mod:`~vocablens.lens.regression` — the least-squares start of ``--init regression``.
* :mod:`~vocablens.lens.evaluate` — logit lens vs tuned lens per layer on held-out text.
* :mod:`~vocablens.lens.trajectory` — chosen tokens through the lens layer by layer (the explorer).
* :mod:`~vocablens.lens.anomaly` — odd inputs from their lens trajectories.
"""

from vocablens.lens.logit import (
    LensLayer, LensResult, Translator, layer_logprobs, lens_pair, logit_lens,
)
from vocablens.lens.trajectory import layer_readout

__all__ = ["LensLayer", "LensResult", "Translator", "layer_logprobs", "layer_readout", "lens_pair", "logit_lens"]
