"""Whatever vocablens installs on a model (forwards, hooks) comes off by putting back exactly what
was there: an accelerate hook and a user's own forward survive ``generate --early-exit``, steering,
the residual-stream capture and the streaming load, also when an exception interrupts them.

Oracle: a snapshot of every module's instance ``forward`` (the object itself) and hook dicts taken
before, compared by identity after.
"""

from __future__ import annotations

import pytest
import torch

import tiny_models as tm
from vocablens.generate import ExitRule, generate
from vocablens.generate.early_exit import ExitController
from vocablens.models import Borders

_NONE = object()
PROMPT = torch.tensor([5, 17, 3, 88, 41, 9, 60])


def snapshot(model: torch.nn.Module) -> list:
    """Per module: its instance forward (or a marker) and the entries of its hook dicts."""
    out = []
    for name, m in model.named_modules():
        out.append((name, m.__dict__.get("forward", _NONE), list(m._forward_hooks.items()),
                    list(m._forward_pre_hooks.items()), dict(m._forward_hooks_with_kwargs),
                    dict(m._forward_pre_hooks_with_kwargs), set(m._forward_hooks_always_called),
                    getattr(m, "_hf_hook", _NONE), getattr(m, "_old_forward", _NONE)))
    return out


def same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[0] != y[0] or x[1] is not y[1] or x[7] is not y[7] or x[8] is not y[8]:
            return False
        if [(k, v) for k, v in x[2]] != [(k, v) for k, v in y[2]] or x[3] != y[3] or x[4:7] != y[4:7]:
            return False
    return True


@pytest.fixture
def model_borders():
    torch.manual_seed(0)
    model = tm.make_tiny("llama")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(30.0)  # confident lens reads: exits happen
    return model, Borders.from_model(model)


RULE = ExitRule(lens="logit", threshold=0.5, min_layer=1)


class Counting:
    """An accelerate ModelHook that counts the forwards it wraps."""

    def __init__(self):
        from accelerate.hooks import ModelHook

        class _H(ModelHook):
            calls = 0

            def pre_forward(self, module, *args, **kwargs):
                type(self).calls += 1
                return args, kwargs

        self.hook = _H()


def test_accelerate_hook_survives_early_exit(model_borders):
    from accelerate.hooks import add_hook_to_module

    model, borders = model_borders
    c = Counting()
    blk = borders.blocks[0]
    add_hook_to_module(blk, c.hook)
    before = snapshot(model)
    fwd = blk.__dict__["forward"]
    res = generate(borders, PROMPT, max_new_tokens=6, early_exit=RULE)
    assert any(s.exit_layer < borders.n_layers for s in res.steps)  # the wrapped forwards did run
    assert blk.__dict__["forward"] is fwd and same(snapshot(model), before)
    n = type(c.hook).calls
    with torch.no_grad():
        model(input_ids=PROMPT[None])
    assert type(c.hook).calls == n + 1  # still hooked (was: lost after one early-exit run)


def test_user_forward_survives_early_exit(model_borders):
    model, borders = model_borders
    blk = borders.blocks[1]
    calls = []
    orig = blk.forward

    def mine(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    blk.forward = mine
    before = snapshot(model)
    generate(borders, PROMPT, max_new_tokens=4, early_exit=RULE)
    assert blk.__dict__["forward"] is mine and same(snapshot(model), before)
    n = len(calls)
    with torch.no_grad():
        model(input_ids=PROMPT[None])
    assert len(calls) == n + 1


def test_plain_blocks_get_their_class_forward_back(model_borders):
    model, borders = model_borders
    before = snapshot(model)
    generate(borders, PROMPT, max_new_tokens=4, early_exit=RULE)
    assert all("forward" not in b.__dict__ for b in borders.blocks) and same(snapshot(model), before)


def test_exception_mid_generation_leaves_the_model_as_before(model_borders, monkeypatch):
    from accelerate.hooks import add_hook_to_module

    model, borders = model_borders
    add_hook_to_module(borders.blocks[0], Counting().hook)
    blk = borders.blocks[1]
    orig = blk.forward
    blk.forward = lambda *a, **k: orig(*a, **k)
    before = snapshot(model)
    real_check, n = ExitController.check, []

    def failing(self, layer, h):
        n.append(layer)
        if len(n) == 3:
            raise RuntimeError("interrupted in the middle")
        return real_check(self, layer, h)

    monkeypatch.setattr(ExitController, "check", failing)
    with pytest.raises(RuntimeError, match="interrupted"):
        generate(borders, PROMPT, max_new_tokens=8, early_exit=RULE)
    assert len(n) == 3
    assert same(snapshot(model), before)


def test_capture_and_steering_restore_after_an_exception(model_borders):
    from vocablens.models.blocks import block_views, capture_updates
    from vocablens.vocab_space.steer import SteerVector, Steering

    model, borders = model_borders
    before = snapshot(model)
    with pytest.raises(RuntimeError):
        with borders.capture():
            raise RuntimeError("x")
    with pytest.raises(RuntimeError):
        with capture_updates(block_views(borders), (1, 7)):
            raise RuntimeError("x")
    st = Steering(borders, [SteerVector("promote", 0, 3, 1.0, 4.0)])
    with pytest.raises(RuntimeError):
        with st:
            assert not same(snapshot(model), before)  # the hook is on while steering
            raise RuntimeError("x")
    assert same(snapshot(model), before)
    W = borders.blocks[0].mlp.down_proj.weight.detach().clone()
    with pytest.raises(RuntimeError):
        with st.folded():
            assert not torch.equal(borders.blocks[0].mlp.down_proj.weight, W)
            raise RuntimeError("x")
    assert torch.equal(borders.blocks[0].mlp.down_proj.weight, W)


def test_model_patch_undoes_a_failed_install():
    from vocablens.models.hooks import ModelPatch

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    mine = a.forward
    a.forward = mine
    snap = (snapshot(a), snapshot(b))

    def make(orig, count=[0]):
        count[0] += 1
        if count[0] == 2:
            raise ValueError("second install fails")
        return lambda x: orig(x) * 2

    with pytest.raises(ValueError):
        with ModelPatch() as p:
            p.post_hook(a, lambda m, i, o: o)
            p.forward(a, make)
            p.forward(b, make)
    assert same(snapshot(a), snap[0]) and same(snapshot(b), snap[1]) and a.__dict__["forward"] is mine
