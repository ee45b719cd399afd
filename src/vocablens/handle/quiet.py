"""Loading without transformers' progress bars and info logging, for the duration of one load."""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager

#: loggers of packages transformers imports with every model when they are installed (a quantizer's
#: package: torchao), whose import-time WARNING lines (kernels built for another torch, a pytree
#: deprecation) say nothing about the model being loaded
IMPORT_NOISE = ("torchao", "torch.utils._pytree")


@contextmanager
def quiet_loading():
    """Silence transformers' (and huggingface_hub's) progress bars and logging below errors inside the
    block, and the import-time warnings of the packages transformers imports with a model
    (:data:`IMPORT_NOISE`: torchao's kernels built for another torch), then put back exactly what was
    set before (the process is left as it was found).

    Bars are what print an ``IProgress not found`` warning in a notebook without ipywidgets; tqdm
    reads ``TQDM_DISABLE`` when a bar is made, so it is set only inside the block too; the warning
    ``tqdm.auto`` gives when it is first imported without ipywidgets is ignored inside the block only
    (``warnings.catch_warnings`` puts the filters back).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        with _settings_put_back():
            yield


@contextmanager
def _settings_put_back():
    restore = []
    try:
        from transformers.utils import logging as hf_logging

        bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()

        def put_back_hf():
            hf_logging.set_verbosity(level)
            if bars:
                hf_logging.enable_progress_bar()

        restore.append(put_back_hf)
    except Exception:  # pragma: no cover  (transformers missing: the load itself says so)
        pass
    try:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        hub_off = are_progress_bars_disabled()
        disable_progress_bars()
        restore.append(lambda: None if hub_off else enable_progress_bars())
    except Exception:  # pragma: no cover
        pass
    for name in IMPORT_NOISE:
        logger = logging.getLogger(name)
        restore.append(lambda logger=logger, level=logger.level: logger.setLevel(level))
        logger.setLevel(logging.ERROR)
    old_tqdm = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    restore.append(lambda: os.environ.pop("TQDM_DISABLE", None) if old_tqdm is None
                   else os.environ.__setitem__("TQDM_DISABLE", old_tqdm))
    try:
        yield
    finally:
        for undo in reversed(restore):
            undo()


__all__ = ["IMPORT_NOISE", "quiet_loading"]
