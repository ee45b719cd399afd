"""What each topic of :class:`vocablens.Model` needs from the model it is mixed into: one
:class:`typing.Protocol` per topic, declared here once and used as the ``self`` annotation of that
topic's methods, so a reader sees what a topic depends on (and a type checker checks it).

Every topic reads the loaded model (:class:`NeedsLoaded`: the fields of
:class:`~vocablens.models.LoadedModel`, the spec, and ``_result``, how a result is handed back); most
add a few methods of the loaded model (text -> ids) or of another topic (a lens's translator, a
corpus as token rows). ``Model`` satisfies all of them; nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:
    import torch

    from vocablens.handle.results import Result


class NeedsLoaded(Protocol):
    """The loaded model: ``model`` (the causal LM), ``tokenizer``, ``borders`` (the embedding, the blocks,
    the final norm and the head), ``provenance``, ``spec``; ``_result`` wraps an analysis's result with
    what it needs to show itself. The report reads only these (its sections call the other workflows)."""

    model: Any
    tokenizer: Any
    borders: Any
    provenance: Any
    spec: str | None

    def _result(self, cls: type[Result], value: Any, **options: Any) -> Any: ...


class NeedsMatrices(NeedsLoaded, Protocol):
    """Geometry and under-trained tokens read the two matrices and the tokenizer only."""


class NeedsTokens(NeedsLoaded, Protocol):
    """Tokens and positions: text -> ids (:meth:`~vocablens.models.LoadedModel.encode`, ``prompt_ids``)."""

    def encode(self, text: str, *, chat: bool = False, prefix: str = "",
               special_text: str = "parse") -> torch.Tensor: ...

    def prompt_ids(self, ids: Any, batch: bool = False, what: str = "ids") -> list[torch.Tensor]: ...

    def _ids(self, x: Any, chat: bool = False, prefix: str = "", what: str = "text") -> torch.Tensor: ...


class NeedsText(NeedsTokens, Protocol):
    """A workflow that takes prompts and tokens: :class:`NeedsTokens` and one token's id (``token_id``)."""

    def token_id(self, token: str | int, what: str = "token") -> int: ...

    def tokens(self, ids: Any) -> list[str]: ...


class NeedsScoring(NeedsText, Protocol):
    """Scoring and generating: the bytes of tokens (bits per byte) and the ids generation stops at."""

    def n_bytes(self, ids: Any) -> int: ...

    def stop_ids(self) -> list[int]: ...


class NeedsLensLoading(NeedsLoaded, Protocol):
    """The translators of lens kinds: those held, and a lens's quality measured on first use."""

    translators: dict

    @property
    def tuned_lens(self) -> Any: ...

    def translator(self, kind: str, path: Any = None) -> Any: ...

    def _translator(self, kind: str, path: Any = None) -> Any: ...

    def load_jacobian_lens(self, path: Any = None) -> Any: ...

    def ensure_lens_quality(self, lens: Any, kind: str) -> None: ...


class NeedsLensReading(NeedsText, Protocol):
    """Reading the stream through lenses: the translators, and a prompt's images and their labels."""

    def translator(self, kind: str, path: Any = None) -> Any: ...

    def with_images(self, text: str, images: Any) -> tuple[torch.Tensor, Any]: ...

    def position_labels(self, ids: Any) -> tuple[str | None, ...] | None: ...

    def _lens_prompts(self, texts: Any, chat: bool, prefix: str) -> tuple[list[torch.Tensor], list[str], bool]: ...


class NeedsCorpus(NeedsLoaded, Protocol):
    """A workflow that reads a corpus as token rows (:mod:`vocablens.handle.corpus`)."""

    def corpus_rows(self, corpus: str, split: str, seq_len: int, max_tokens: int | None = None,
                    val_fraction: float = 0.1, split_seed: int = 0, shuffle_seed: int | None = None,
                    docs: Any = None, shrink: bool = False) -> tuple[torch.Tensor, dict]: ...

    def eval_rows(self, corpus: str, split: str, seq_len: int, max_tokens: int, val_fraction: float = 0.1,
                  split_seed: int = 0, docs: Any = None) -> tuple[torch.Tensor, dict]: ...

    def first_rows(self, corpus: str, seq_len: int, max_tokens: int) -> torch.Tensor: ...


class NeedsLensFitting(NeedsCorpus, Protocol):
    """Fitting a lens: the corpus's rows, the translators held, the quality measured after the fit."""

    translators: dict

    def quality_after_fit(self, lens: Any, kind: str, corpus: str, val_fraction: float, tokens: int,
                          docs: Any = None) -> None: ...

    def _initial_lens(self, rows: torch.Tensor, init: str, init_tokens: int, resume: bool,
                      status: Any) -> tuple[Any, dict]: ...


class NeedsLensScoring(NeedsCorpus, Protocol):
    """Scoring lenses on a corpus: its rows and the translators."""

    translators: dict

    def translator(self, kind: str, path: Any = None) -> Any: ...

    def _held_label(self, held: Any) -> str: ...


class NeedsLensQuality(NeedsCorpus, Protocol):
    """A lens's quality measured on held-out rows of a corpus."""

    def measure_lens_quality(self, lens: Any, kind: str, corpus: str | None = None, val_fraction: float = 0.1,
                             tokens: int = 2048, seq_len: int = 256, docs: Any = None,
                             cache: bool = False) -> dict: ...


class NeedsDecomposition(NeedsTokens, Protocol):
    """A stream vector decomposed: the prompt's ids and the Jacobian lens."""

    def translator(self, kind: str, path: Any = None) -> Any: ...


class NeedsTrajectories(NeedsText, Protocol):
    """Trajectories and settling: positions, the forward pass, lenses, images and a corpus's first rows."""

    def position(self, text: Any, position: int) -> int: ...

    def forward(self, ids: Any, inputs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def translator(self, kind: str, path: Any = None) -> Any: ...

    def _lens_for_call(self, kind: str, lens_dir: Any = None) -> Any: ...

    def image_prompt(self, text: str, images: Any) -> tuple[torch.Tensor, dict]: ...

    def position_labels(self, ids: Any) -> tuple[str | None, ...] | None: ...

    def first_rows(self, corpus: str, seq_len: int, max_tokens: int) -> torch.Tensor: ...


class NeedsVocabSpace(NeedsText, Protocol):
    """Parameters in vocabulary space: prompts, tokens, probe texts read in part, a word's first token."""

    def encode_raw(self, text: str, max_tokens: int | None = None) -> torch.Tensor: ...

    def _first_token(self, text: str | int, what: str = "token") -> tuple[int, str | None]: ...


class NeedsArgmax(NeedsLoaded, Protocol):
    """Argmax and the bottleneck: the reserved tokens and corpus documents packed into rows."""

    def reserved_tokens(self) -> torch.Tensor: ...

    def pack(self, docs: Any, seq_len: int, max_tokens: int | None = None, shrink: bool = False) -> torch.Tensor: ...


class NeedsSurgery(NeedsLoaded, Protocol):
    """Surgery: a new model of the same class made from edited weights, and what it saves beside them."""

    surgery: Any
    _save_with: tuple

    def _derived(self, model: Any, tokenizer: Any, surgery: Any, probe_texts: Sequence[str],
                 extra_json: dict) -> Any: ...


class NeedsPacking(Protocol):
    """Corpora as token rows: documents packed into rows (:meth:`~vocablens.models.LoadedModel.pack`)."""

    def pack(self, docs: Any, seq_len: int, max_tokens: int | None = None, shrink: bool = False) -> torch.Tensor: ...

    def corpus_rows(self, corpus: str, split: str, seq_len: int, max_tokens: int | None = None,
                    val_fraction: float = 0.1, split_seed: int = 0, shuffle_seed: int | None = None,
                    docs: Any = None, shrink: bool = False) -> tuple[torch.Tensor, dict]: ...


class NeedsImages(NeedsLoaded, Protocol):
    """Images with a prompt: the loaded model (its vision tower, config, tokenizer and provenance read
    the processor and the pixels) and the processor once read."""

    processor: Any

    def image_prompt(self, text: str, images: Any) -> tuple[torch.Tensor, dict]: ...


__all__ = ["NeedsArgmax", "NeedsCorpus", "NeedsDecomposition", "NeedsImages", "NeedsLensFitting", "NeedsLensLoading",
           "NeedsLensQuality", "NeedsLensReading", "NeedsLensScoring", "NeedsLoaded", "NeedsMatrices", "NeedsPacking",
           "NeedsScoring", "NeedsSurgery", "NeedsText", "NeedsTokens", "NeedsTrajectories", "NeedsVocabSpace"]
