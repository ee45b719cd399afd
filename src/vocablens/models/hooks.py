"""What vocablens installs on a model, and how it is taken off: the one mechanism.

Every hook or forward vocablens puts on a module goes through a :class:`ModelPatch`: a context
manager that records what it changes and, on exit (also when an exception interrupts the block, or
the installation itself), puts back exactly what was there, in reverse order:

- a replaced ``forward``: the instance attribute that was there (the same object: an accelerate
  ``add_hook_to_module`` forward, a user's own function) or, when there was none, no instance
  attribute (the class's ``forward`` shows again);
- a forward (pre-)hook: removed by its handle, so the module's ``_forward_hooks`` /
  ``_forward_pre_hooks`` dicts hold the same entries as before, in the same order.

    with ModelPatch() as patch:
        patch.forward(block, lambda orig: wrapped(orig))
        patch.pre_hook(block, fn, with_kwargs=True)
        model(...)
    # block.forward, block._forward_hooks, block._forward_pre_hooks: as before
"""

from __future__ import annotations

from typing import Callable

from torch import nn

_MISSING = object()


class ModelPatch:
    """Forwards and hooks installed on modules, undone in reverse order by :meth:`close`.

    Use as a context manager (``with ModelPatch() as p: ...``) or keep it and call :meth:`close`
    (the streaming load keeps its block hooks for the model's lifetime).
    """

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> "ModelPatch":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def forward(self, module: nn.Module, make: Callable[[Callable], Callable]) -> None:
        """Set ``module.forward = make(current forward)``; undone by putting back what was there."""
        old = module.__dict__.get("forward", _MISSING)
        new = make(module.forward)

        def undo(module=module, old=old):
            if old is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = old

        self._undo.append(undo)
        module.forward = new

    def pre_hook(self, module: nn.Module, fn: Callable, **kwargs) -> None:
        """``module.register_forward_pre_hook(fn, **kwargs)``, removed on :meth:`close`."""
        self._undo.append(module.register_forward_pre_hook(fn, **kwargs).remove)

    def post_hook(self, module: nn.Module, fn: Callable, **kwargs) -> None:
        """``module.register_forward_hook(fn, **kwargs)``, removed on :meth:`close`."""
        self._undo.append(module.register_forward_hook(fn, **kwargs).remove)

    def close(self) -> None:
        """Undo everything installed, last first (idempotent)."""
        while self._undo:
            self._undo.pop()()


__all__ = ["ModelPatch"]
