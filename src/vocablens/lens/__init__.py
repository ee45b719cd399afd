"""Lenses over the residual stream: the logit lens here, the tuned lens in :mod:`vocablens.lens.tuned`."""

from vocablens.lens.logit import LensLayer, LensResult, Translator, layer_logprobs, lens_to_dict, logit_lens

__all__ = ["LensLayer", "LensResult", "Translator", "layer_logprobs", "lens_to_dict", "logit_lens"]
