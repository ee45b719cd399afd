"""Exception types of vocablens (layer 0: knows nothing else).

Every error a user can cause is a :class:`VocabLensError` whose message is one actionable line.
The CLI prints that line on stderr and exits with code 2, without a traceback.
"""

from __future__ import annotations


class VocabLensError(Exception):
    """Base class: a problem the user can fix; ``str(err)`` is one line saying how."""

    exit_code = 2


class ModelNotFound(VocabLensError):
    """The model spec names nothing that can be loaded here (no directory, file, cache entry)."""


class CorruptModelFile(VocabLensError):
    """A model or checkpoint file exists but cannot be read (truncated, wrong format)."""


class UnsupportedArchitecture(VocabLensError):
    """The model family has no recognisable embedding / blocks / final norm / LM head."""

    def __init__(self, family: str, found: dict[str, str] | list[str] | str, why: str = "") -> None:
        self.family = family
        self.found = found
        if isinstance(found, dict):
            found_s = ", ".join(f"{k}={v}" for k, v in found.items())
        elif isinstance(found, (list, tuple)):
            found_s = ", ".join(map(str, found))
        else:
            found_s = str(found)
        msg = f"unsupported architecture {family!r}"
        if why:
            msg += f": {why}"
        msg += f" (modules found: {found_s})"
        super().__init__(msg)


class BadInput(VocabLensError):
    """An argument is out of range or malformed (empty prompt, bad -k, bad layer, bad shape)."""


class PromptTooLong(BadInput):
    """The prompt has more tokens than the model's context window."""


class TokenNotInVocabulary(BadInput):
    """A token string is not in the vocabulary (or maps to several tokens where one is required)."""


class ShapeMismatch(BadInput):
    """Tensors whose shapes or dtypes do not fit together; the message names the shapes."""


class NonFiniteWeights(CorruptModelFile):
    """The weights hold NaN or inf where a result would depend on them; the message names the tensor."""


class NonFiniteActivations(VocabLensError):
    """A forward pass on finite weights produced inf or NaN (a float16 residual stream past 65,504);
    the message names the first layer that holds them. No figure is computed from them."""


class CheckpointMismatch(VocabLensError):
    """A saved lens or edited model belongs to another model than the one it is applied to."""


class OutputExists(VocabLensError):
    """The output path exists and --force was not given; nothing was written."""


class UnsupportedTokenizer(VocabLensError):
    """A tokenizer whose vocabulary vocablens cannot rewrite consistently (e.g. not a fast BPE tokenizer)."""


class TrainingDiverged(VocabLensError):
    """Training produced a non-finite loss or gradient; the message names the layer."""


class WriteFailed(VocabLensError):
    """The destination cannot be written (read-only, disk full, a missing directory); nothing changed."""


class UnsupportedQuantization(VocabLensError):
    """A quantized checkpoint that transformers cannot load on this machine (its quantizer's package,
    kernels or device are missing: bitsandbytes without CUDA ...), or a quantized weight that cannot be
    read as numbers, or an edit that would write into quantized weights."""


class TensorParallelUnsupported(VocabLensError):
    """A workflow called on a model loaded tensor-parallel (``vocablens.load(spec, tp=True)``) that does
    not run split over the ranks (it would read DTensor weights as whole ones, or run replicated)."""


class VocabLensNote(UserWarning):
    """Not an error: something the user should know about their input (the CLI prints it on stderr
    as one ``note:`` line; Python shows it as a warning)."""
