"""Tensor parallel from Python: every ``vocablens.Model`` workflow that does not run split refuses a
model loaded tensor-parallel in one line (:mod:`vocablens.handle.tp_guard`), before it runs.

The model here is a tiny llama whose LM head weight is a real DTensor on a one-process gloo mesh,
which is how :func:`vocablens.models.tensor_parallel.is_tensor_parallel` tells a ``tp=True`` load."""

import inspect

import pytest
import torch
import torch.distributed as dist

from vocablens.errors import TensorParallelUnsupported, VocabLensError
from vocablens.handle import Model
from vocablens.handle.tp_guard import TENSOR_PARALLEL, tp_refusal
from vocablens.models.files.loaded_model import LoadedModel
from vocablens.models.tensor_parallel import is_tensor_parallel


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(a tiny model as loaded, the same model with its head a DTensor: tensor parallel)."""
    from tiny_dirs import save_tiny, tiny_tokenizer
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate

    from vocablens.models.files.loader import load

    d = save_tiny(tmp_path_factory.mktemp("tp_guard") / "m", tiny_tokenizer())
    plain, tp = Model.of(load(str(d))), Model.of(load(str(d)))
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        head = tp.borders.lm_head
        head.weight = torch.nn.Parameter(DTensor.from_local(head.weight.detach(), mesh, [Replicate()]),
                                         requires_grad=False)
        yield plain, tp
    finally:
        if ours:
            dist.destroy_process_group()


def _workflows() -> list[str]:
    """Public methods of Model outside the loaded model's own text-to-ids helpers."""
    return [n for n in dir(Model) if not n.startswith("_") and not hasattr(LoadedModel, n)
            and inspect.isfunction(inspect.getattr_static(Model, n))]


def test_the_guard_decides_by_the_head(models):
    plain, tp = models
    assert not is_tensor_parallel(plain.borders) and is_tensor_parallel(tp.borders)
    names = _workflows()
    assert {"explain", "argmax", "neighbors", "project", "trajectory", "settle", "steer", "expand", "trim",
            "fit_jacobian_lens", "backward_lens", "compare_lenses", "report", "undertrained",
            "undertrained_within", "anatomy", "decompose"} <= set(names)
    for name in names:
        assert tp_refusal(plain, name) is None, name
        why = tp_refusal(tp, name)
        assert (why is None) == (name in TENSOR_PARALLEL), (name, why)
        if why:
            assert "\n" not in why and f"Model.{name} " in why and "tp=True" in why


@pytest.mark.parametrize("call", [
    lambda m: m.explain("a b c"), lambda m: m.argmax(), lambda m: m.neighbors(" a"),
    lambda m: m.undertrained_within(5.0), lambda m: m.anatomy(), lambda m: m.trim(10),
    lambda m: m.trajectory("a b c", " a"), lambda m: m.compare_lenses(),
])
def test_unsupported_calls_refuse_before_running(models, call, monkeypatch):
    _, tp = models
    from vocablens.geometry import embedding
    from vocablens.lens import logit

    ran = []
    monkeypatch.setattr(embedding, "nearest_neighbors", lambda *a, **k: ran.append(1))
    monkeypatch.setattr(logit, "lens_batches", lambda *a, **k: ran.append(1))
    with pytest.raises(TensorParallelUnsupported) as e:
        call(tp)
    assert isinstance(e.value, VocabLensError) and e.value.exit_code == 2
    assert "\n" not in str(e.value) and "tensor-parallel" in str(e.value) and ran == []


def test_the_same_calls_run_on_a_plain_model(models):
    plain, tp = models
    assert plain.neighbors(" a", k=2).to_json()
    assert tp.encode("a b").tolist() == plain.encode("a b").tolist()  # the text-to-ids helpers are not guarded
    assert inspect.signature(Model.explain).parameters.keys() >= {"text", "position", "target"}
