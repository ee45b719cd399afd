"""The server's state: the loaded model behind one lock, the per-prompt cache, the background argmax scan.

Requests are serialized around the model (one ``threading.Lock``): the ASGI server runs the sync
endpoints in a thread pool, and a torch model is not safe to run from several threads at once (its
hooks capture into shared dicts). Each prompt's forward pass is cached (``PromptCache``), so clicks
on the cells of a prompt already read do no forward pass; the counter ``forward_passes`` proves it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from vocablens.serve import adapters
from vocablens.models.files.spec import DEFAULT_MODEL


@dataclass
class PromptEntry:
    """One prompt's cached work: ids [1, T], its forward pass ``stream`` = (resid [L+1, 1, T, d], the
    model's logits [1, T, V] float32; filled on first need), and the JSON answers already computed,
    keyed by endpoint and arguments. The forward is keyed by the prompt alone: readout parameters
    (the lens's k and kind, a trajectory's position and token) all read the same ``stream``."""

    ids: torch.Tensor
    stream: tuple[torch.Tensor, torch.Tensor] | None = None
    answers: dict[tuple, dict] = field(default_factory=dict)
    inputs: dict | None = None  # the images' tensors of the forward (``serve --image``), else None

    @property
    def nbytes(self) -> int:
        return 0 if self.stream is None else sum(t.numel() * t.element_size() for t in self.stream)


class PromptCache:
    """Least-recently-used cache of :class:`PromptEntry`, keyed by ``(prompt, chat)``: at most ``size``
    prompts and ``max_bytes`` of cached forward passes (the newest prompt is always kept)."""

    def __init__(self, size: int = 16, max_bytes: int = 512 * 2 ** 20) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._d: OrderedDict[tuple[str, bool], PromptEntry] = OrderedDict()

    def get(self, key: tuple[str, bool], make: Callable[[], torch.Tensor]) -> PromptEntry:
        if key in self._d:
            self._d.move_to_end(key)
            return self._d[key]
        entry = PromptEntry(ids=make())
        self._d[key] = entry
        self.trim()
        return entry

    def trim(self) -> None:
        """Drop the least recently used prompts beyond ``size`` or ``max_bytes``."""
        while len(self._d) > 1 and (len(self._d) > self.size or
                                    sum(e.nbytes for e in self._d.values()) > self.max_bytes):
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


class _Cancelled(Exception):
    """Raised from the scan's progress callback when the server stops."""


class ArgmaxJob:
    """The whole-vocabulary argmax scan, run once in a background thread after start-up; :meth:`cancel`
    stops it at its next progress report (the interpreter must not exit while torch runs in a thread:
    that aborts the process). ``report(stage, done, total)``: also told each progress report (the
    CLI shows them on stderr); ``on_end(message)``: told once, when the scan ends, how it ended."""

    def __init__(self, lm, report=None, on_end=None) -> None:
        self._stop = threading.Event()
        self.lm = lm
        self.report, self.on_end = report, on_end
        self.ma = None
        self.full: dict | None = None
        self.error: str | None = None
        self.progress: dict[str, Any] = {}
        self.seconds: float | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vocablens-argmax", daemon=True)
            self._thread.start()

    def _cb(self, stage: str, done: int, total: int) -> None:
        if self._stop.is_set():
            raise _Cancelled()
        self.progress = {"stage": stage, "done": int(done), "total": int(total)}
        if self.report is not None:
            self.report(stage, done, total)

    def cancel(self, timeout: float = 60.0) -> None:
        """Ask the scan to stop and wait (at most ``timeout`` s) until its thread has ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            # reads W_U (and b_U, the final norm) only: no forward pass, so no model lock
            ma = adapters.argmax_scan(self.lm, progress=self._cb)
            self.full = adapters.argmax_full_json(self.lm, ma)
            self.ma = ma
        except _Cancelled:
            self.error = "the argmax scan was stopped"
        except Exception as exc:  # reported by /api/argmax, the server keeps serving
            self.error = f"the argmax scan failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        self.seconds = time.perf_counter() - t0
        if self.on_end is not None:
            self.on_end(self.error or self.summary())

    def summary(self) -> str:
        """One line on a finished scan: its counts and time (``/api/health`` has the same figures)."""
        c = self.ma.result.counts() if self.ma is not None else {}
        shown = ", ".join(f"{v:,} {k}" for k, v in c.items() if v)
        return f"argmax scan done in {self.seconds:.1f} s: {shown or 'no tokens'}"

    @property
    def done(self) -> bool:
        return self.ma is not None

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done


#: a library argument -> the ``vocablens serve`` option that gives it
SERVED_OPTIONS = {"`path`": "--lens", "`images`": "--image", "`dtype`": "--dtype"}


def served_words(message: str) -> str:
    """A library message in the server's words: the lens folder the library calls `` `path` `` is the
    server's ``--lens``, its `` `images` `` the ``--image`` files (the CLI does the same for its commands,
    :func:`vocablens.cli.common.in_cli_words`)."""
    for name, option in SERVED_OPTIONS.items():
        message = message.replace(name, option)
    return message


class ServerState:
    """The loaded model, its tuned lens (or why there is none), the lock, the caches and counters.

    Args:
        lm: a :class:`~vocablens.models.LoadedModel`.
        model_spec: the ``--model`` it was loaded from (names the shipped tuned lens).
        lens_path: ``--lens``: a folder (or published file) holding a tuned lens, a Jacobian lens or both;
            each kind it holds is read from it, the others are the ones shipped for the model, if any.
            "": the shipped ones.

    Raises:
        BadInput: ``lens_path`` holds no lens (:func:`adapters.lenses_at`). CheckpointMismatch,
            CorruptModelFile: a lens it holds is of another model, or unreadable.
        max_tokens: longest prompt accepted, in tokens (the lens reads every position: cost ~ T).
        argmax: start the background argmax scan (``start()``).
        undertrained: an earlier verification (an ``UndertrainedResult`` or the dict of ``vocablens
            undertrained --json``) whose figures the token panel shows; the indicators are computed
            on the first request either way (:meth:`undertrained_index`).
        argmax_report, argmax_end: the background scan's ``report`` and ``on_end`` (:class:`ArgmaxJob`).
        images: images (paths or PIL images) read with every prompt by a vision-language model's
            processor (``serve --image``); None: text prompts.
    """

    def __init__(self, lm, model_spec: str = DEFAULT_MODEL, lens_path: str = "", max_tokens: int = 128,
                 argmax: bool = True, undertrained=None, argmax_report=None, argmax_end=None,
                 images: list | None = None) -> None:
        from vocablens.errors import VocabLensError

        from vocablens.handle import Model

        lm = Model.of(lm, spec=model_spec)  # the handle: encoding and the workflows the endpoints call
        self.lm = lm
        self.model_spec = model_spec
        self.lens_path = lens_path
        self.max_tokens = max_tokens
        self.images = list(images) if images else None
        if self.images:
            lm.image_prompt("x", self.images)  # no vision tower, an image the processor refuses: one line now
        self.lock = threading.Lock()
        self.prompts = PromptCache()
        self.forward_passes = 0
        lm.borders.model.register_forward_pre_hook(self._count)
        held = adapters.lenses_at(lm, lens_path) if lens_path else {}  # --lens: every kind it holds
        self.tuned, self.tuned_note = self._first_load(adapters.load_tuned, held.get("tuned"))
        self.jacobian_note = self._first_load(adapters.load_jacobian, held.get("jacobian"))[1]
        self.argmax = ArgmaxJob(lm, report=argmax_report, on_end=argmax_end)
        self.want_argmax = argmax
        self.undertrained_verified = adapters.undertrained_verified(undertrained, lm.borders.vocab_size)
        self._undertrained = None

    def _first_load(self, load, path):
        """``(lens, "loaded")`` read from ``path`` (a lens ``--lens`` holds: its errors stop the server),
        else from the lens shipped for the model: ``(None, why not)`` when that fails."""
        from vocablens.errors import VocabLensError

        if path is not None:
            return load(self.lm, str(path)), "loaded"
        try:
            return load(self.lm, ""), "loaded"
        except VocabLensError as exc:
            return None, served_words(str(exc))

    def _count(self, *_):
        self.forward_passes += 1

    def start(self) -> None:
        """Start the background work (the argmax scan)."""
        if self.want_argmax:
            self.argmax.start()

    def entry(self, prompt: str, chat: bool) -> PromptEntry:
        """The prompt's cache entry (encodes it on first use; with :attr:`images`, through the model's
        processor). Call with ``self.lock`` held.

        Raises:
            BadInput: ``chat`` with images (the processor reads the prompt as it is).
        """
        if not self.images:
            return self.prompts.get((prompt, chat), lambda: adapters.encode(self.lm, prompt, chat, self.max_tokens))
        from vocablens.errors import BadInput

        if chat:
            raise BadInput("this server reads each prompt with its image as written: turn the chat template off")
        made: dict = {}

        def make():
            ids, made["inputs"] = adapters.encode_with_images(self.lm, prompt, self.images, self.max_tokens)
            return ids

        e = self.prompts.get((prompt, chat), make)
        if "inputs" in made:
            e.inputs = made["inputs"]
        return e

    def no_images(self, what: str) -> None:
        """Refuse ``what`` (an endpoint that reads a prompt without its pixels) on a server with images.

        Raises:
            BadInput: the server reads its prompts with images.
        """
        from vocablens.errors import BadInput

        if self.images:
            raise BadInput(f"{what} does not read images yet; the lens and trajectories do")

    def forward(self, e: PromptEntry) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt's forward pass (resid [L+1, 1, T, d], logits [1, T, V]), run once. Call with
        ``self.lock`` held."""
        if e.stream is None:
            e.stream = adapters.forward(self.lm, e.ids, e.inputs)
            self.prompts.trim()
        return e.stream

    def undertrained_index(self):
        """Tokenizer classes and indicators (:func:`adapters.undertrained_index`), computed on first
        need. Call with ``self.lock`` held (the tokenizer is shared with the model's requests)."""
        if self._undertrained is None:
            self._undertrained = adapters.undertrained_index(self.lm)
        return self._undertrained

    def need_jacobian(self):
        """The Jacobian lens (read at start from ``--lens`` when it holds one, else the one shipped for the
        model, read on first use), or :class:`BadInput` saying why there is none."""
        from vocablens.errors import BadInput, VocabLensError

        lens = self.lm.translators.get("jacobian")  # the model's lens is the one its lens reads go through
        if lens is None:
            try:
                lens = adapters.load_jacobian(self.lm, "")
            except VocabLensError as exc:
                raise BadInput(f"no Jacobian lens: {served_words(str(exc))}") from None
        return lens

    def need_tuned(self):
        """The tuned lens, or :class:`BadInput` saying why there is none."""
        from vocablens.errors import BadInput

        if self.tuned is None:
            raise BadInput(f"no tuned lens: {self.tuned_note}")
        return self.tuned
