"""Early exit, executed: stop a decoding step at the first block whose lens read is confident.

At each new token (after the prefill, which runs every block for every prompt position), the stream
after block l (stream layer l, from ``min_layer`` on) is read through a lens: the logit lens
(the model's own final norm and head on the intermediate state; nostalgebraist 2020, Geva et al.
2022 §5.2 for the exit rule) or the tuned lens (Belrose et al. 2023: an affine translator first).
When the top-1 probability reaches ``threshold``, that read's distribution emits the token and the
blocks above are skipped.

Skipped layers still owe keys and values to later tokens. We follow CALM's *state propagation*
(Schuster et al. 2022, §5; google/flaxformer ``calm_t5``, ``only_propagate_state``): the exit
layer's hidden state is copied upward as the input of every skipped block, and each skipped block
runs only what writes its cache (input norm, K and V projections, rotary embedding), then returns
its input unchanged. Every layer's cache therefore has the same length after each step. Which
families can do that, and how, the family adapter knows (:attr:`Borders.fills_cache_only`,
:mod:`vocablens.models.blocks.cache_fill`); for the others the skipped block runs whole and its
output is discarded: the same keys and values, no saving.

Cheaper exit test (``test="candidates"``): the lens is first read on the rows of the previous
token's top-k candidates only (``Unembedding.logits(h, rows=...)``, 2·k·d FLOPs instead of 2·V·d).
Since softmax over a subset R bounds the full probability from above (p_full(v) <= p_R(v)), a
subset maximum below the threshold rejects the exit exactly for every token in R; a pass is
confirmed by one full read. The rule then differs from the full test only when the confident token
lies outside R (that exit is missed and happens later).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from vocablens.errors import BadInput
from vocablens.models.blocks.cache_fill import fill_kv_only  # the family adapter writes a skipped block's K/V
from vocablens.ops.rows import row_top1_prob
from vocablens.models.files.spec import DEFAULT_MODEL


def load_tuned_lens(borders, model_spec: str = DEFAULT_MODEL, path=None):
    """The tuned lens for ``borders`` (the shipped one for ``model_spec`` unless ``path``).

    The only place :mod:`vocablens.generate` imports the tuned lens.
    """
    try:
        from vocablens.lens import load_for_model
    except ImportError:  # vocablens.lens does not export the loader (yet)
        from vocablens.lens.tuned import load_for_model
    return load_for_model(borders, model_spec, path)


def check_exit_options(lens: str, threshold: float, test: str) -> None:
    """The early-exit options known before a model is read (:class:`ExitRule`'s fields): ``lens`` logit
    or tuned, ``threshold`` a number in (0, 1], ``test`` full or candidates. ``vocablens generate`` checks
    its --early-exit, --threshold and --exit-test with it before the load.

    Raises:
        BadInput: naming the bad field (`` `lens` ``, `` `threshold` ``, `` `test` ``).
    """
    if lens not in ("logit", "tuned"):
        raise BadInput(f"`lens` must be 'logit' or 'tuned'; got {lens!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < float(threshold) <= 1:
        raise BadInput(f"`threshold` must be in (0, 1]; got {threshold}")
    if test not in ("full", "candidates"):
        raise BadInput(f"`test` must be 'full' or 'candidates'; got {test!r}")


@dataclass(frozen=True)
class ExitRule:
    """When to leave a decoding step early.

    Attributes:
        lens: ``logit`` or ``tuned``.
        threshold: exit when the lens top-1 probability is >= this, in (0, 1].
        min_layer: first stream layer checked (1..L; layer l is the output of block l).
        test: ``full`` (the lens over all V rows at each checked layer) or ``candidates`` (first the
            rows of the previous token's top ``candidates`` ids; see the module doc).
        candidates: k for ``test="candidates"``.
        tuned: the :class:`~vocablens.lens.tuned.TunedLens` for ``lens="tuned"``.
    """

    lens: str = "logit"
    threshold: float = 0.9
    min_layer: int = 1
    test: str = "full"
    candidates: int = 32
    tuned: Any = field(default=None, repr=False, compare=False)

    def validate(self, n_layers: int) -> None:
        """Raise :class:`BadInput` naming the bad field."""
        check_exit_options(self.lens, self.threshold, self.test)
        if isinstance(self.min_layer, bool) or not isinstance(self.min_layer, int) \
                or not 1 <= self.min_layer <= n_layers:
            raise BadInput(f"`min_layer` must be an int in 1..{n_layers}; got {self.min_layer}")
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 1:
            raise BadInput(f"`candidates` must be an int >= 1; got {self.candidates}")
        if self.lens == "tuned" and self.tuned is None:
            raise BadInput("lens='tuned' needs a tuned lens (see load_tuned_lens)")


@dataclass
class StepRecord:
    """What one decoding step did: exit layer (L = ran every block), lens reads, cache fills."""

    exit_layer: int
    full_reads: int = 0
    row_reads: int = 0
    kv_fills: int = 0


class ExitController:
    """Wraps each block's ``forward`` (restored on exit of :meth:`installed`) so that one decoder
    call runs blocks until the lens is confident, then only fills the skipped blocks' caches.

    Args:
        borders: the model's borders; rule: a validated :class:`ExitRule`; mask: bool [V] of rows
            that may be emitted (the real vocabulary).
    """

    def __init__(self, borders, rule: ExitRule, mask: torch.Tensor | None = None) -> None:
        rule.validate(borders.n_layers)
        self.borders, self.rule, self.U = borders, rule, borders.unembedding
        self.L = borders.n_layers
        self.mask = mask
        self.kv_only = borders.fills_cache_only
        self.on = False
        self.candidates: torch.Tensor | None = None  # ids for the candidates test
        self.record: StepRecord | None = None
        self.logits: torch.Tensor | None = None
        self._tuple_out = False

    # ------------------------------------------------------------------ the lens
    def _normed(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        if self.rule.lens == "tuned":
            h = self.rule.tuned.translate(layer, h)
        return self.U.normed(h)

    def _masked(self, z: torch.Tensor) -> torch.Tensor:
        return z if self.mask is None else z.masked_fill(~self.mask.to(z.device), float("-inf"))

    @staticmethod
    def _top1_prob(z: torch.Tensor) -> float:
        return float(row_top1_prob(z).max())

    def check(self, layer: int, h: torch.Tensor) -> bool:
        """Read stream layer ``layer`` (h [B, d], last position) and decide whether to exit here."""
        rec, rule = self.record, self.rule
        x = self._normed(layer, h)
        if rule.test == "candidates" and self.candidates is not None:
            rec.row_reads += 1
            if self._top1_prob(self.U.logits(x, rows=self.candidates)) < rule.threshold:
                return False
        rec.full_reads += 1
        z = self._masked(self.U.logits(x))
        if self._top1_prob(z) >= rule.threshold:
            self.logits = z
            return True
        return False

    # ------------------------------------------------------------------ one step
    def begin(self) -> None:
        """Arm the controller for the next decoder call (one new token)."""
        self.on, self.logits = True, None
        self.record = StepRecord(exit_layer=self.L)
        self._exit_state: torch.Tensor | None = None

    def end(self, candidates: torch.Tensor | None) -> StepRecord:
        """Disarm; ``candidates`` [k] are the ids the next step's candidates test reads."""
        self.on = False
        self.candidates = candidates
        return self.record

    def _wrap(self, i: int, orig):
        layer = i + 1

        def forward(hidden_states, *args, **kwargs):
            if not self.on:
                return orig(hidden_states, *args, **kwargs)
            if self._exit_state is not None:  # a skipped block: propagate the state, fill the cache
                self.record.kv_fills += 1
                if not (self.kv_only and fill_kv_only(self.borders.blocks[i], hidden_states, kwargs)):
                    orig(hidden_states, *args, **kwargs)  # unknown attention: run it, drop the output
                return (hidden_states,) if self._tuple_out else hidden_states
            out = orig(hidden_states, *args, **kwargs)
            self._tuple_out = isinstance(out, tuple)
            h = out[0] if self._tuple_out else out
            if self.rule.min_layer <= layer < self.L and self.check(layer, h[:, -1]):
                self.record.exit_layer = layer
                self._exit_state = h
            return out

        return forward

    @contextlib.contextmanager
    def installed(self):
        """Install the wrapped forwards on every block for the duration of the block; on exit (also
        through an exception) each block gets back exactly the forward it had
        (:class:`~vocablens.models.hooks.ModelPatch`: an accelerate hook or a user's forward survives)."""
        from vocablens.models.hooks import ModelPatch

        try:
            with ModelPatch() as patch:
                for i, blk in enumerate(self.borders.blocks):
                    patch.forward(blk, lambda orig, i=i: self._wrap(i, orig))
                yield self
        finally:
            self.on = False


__all__ = ["ExitController", "ExitRule", "StepRecord", "check_exit_options", "load_tuned_lens"]
