"""Which :class:`~vocablens.Model` workflows run on a model loaded tensor-parallel, and the one guard
that refuses the others.

``vocablens.load(spec, tp=True)`` under torchrun splits every block and the head over the ranks
(:mod:`vocablens.models.tensor_parallel`). Only the workflows in :data:`TENSOR_PARALLEL` read the
split head vocab-parallel (the CLI's ``--tp`` commands: lens, lens eval, score, generate, with the
lens kinds the CLI reads); every other public workflow would read DTensor weights as whole matrices or
run replicated on every rank. :func:`guard_tensor_parallel` wraps each public method of the workflow
classes once: on a tensor-parallel model an unsupported one raises
:class:`~vocablens.errors.TensorParallelUnsupported` (one line, CLI exit 2) before it runs. A call made
from inside a supported workflow (its own helpers) is not checked again.
"""

from __future__ import annotations

import contextvars
import functools
import inspect

from vocablens.errors import TensorParallelUnsupported
from vocablens.models.tensor_parallel import is_tensor_parallel

#: methods of ``vocablens.Model`` that run on a tensor-parallel load (the workflows every rank runs
#: with the head read vocab-parallel, and the helpers that read no weights)
TENSOR_PARALLEL = frozenset({
    "lens", "score", "generate", "eval_lens",  # the workflows (``vocablens lens/lens eval/score/generate --tp``)
    "load_lens", "tuned_lens", "translator", "add_lens", "stop_ids", "token_id", "of",
})

_inside = contextvars.ContextVar("vocablens_tp_workflow", default=False)


def tp_refusal(model, name: str) -> str | None:
    """Why ``model``'s method ``name`` cannot run, in one line, or None: it runs (``model`` is not
    tensor-parallel, or :data:`TENSOR_PARALLEL` holds it; ``lens`` reads every kind, as ``vocablens
    lens --tp``: a tuned or Jacobian lens maps the whole stream, then reads through the split head)."""
    borders = getattr(model, "borders", None)
    if borders is None or not is_tensor_parallel(borders):
        return None
    if name not in TENSOR_PARALLEL:
        return (f"Model.{name} does not run on a model loaded tensor-parallel (tp=True): it reads the whole "
                "matrices or runs through the model in one process; tensor-parallel workflows: lens, score, "
                "generate, eval_lens (load the model without tp=True for the others)")
    return None


def _guarded(name: str, fn):
    """``fn`` refusing to run, as :func:`tp_refusal` says, when called from outside a workflow."""

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        if _inside.get():
            return fn(self, *args, **kwargs)
        why = tp_refusal(self, name)
        if why:
            raise TensorParallelUnsupported(why)
        token = _inside.set(True)
        try:
            return fn(self, *args, **kwargs)
        finally:
            _inside.reset(token)

    return method


def guard_tensor_parallel(cls, base):
    """Every public method ``cls`` gets from its workflow classes (all but those of ``base`` and its
    bases: the loaded model's own text-to-ids helpers, which read no weights) checked by
    :func:`tp_refusal` on entry; the supported ones wrapped too, so what they call inside runs
    unchecked (a workflow's own helpers are not checked again). Returns ``cls``."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        owner = next(c for c in cls.__mro__ if name in c.__dict__)
        fn = owner.__dict__[name]
        if issubclass(base, owner) or not inspect.isfunction(fn):
            continue
        setattr(cls, name, _guarded(name, fn))
    return cls


__all__ = ["TENSOR_PARALLEL", "guard_tensor_parallel", "tp_refusal"]
