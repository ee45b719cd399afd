"""``--max-memory`` (the streaming load) gives the normal load's dtypes and results, and refuses a
checkpoint whose index names a missing shard before anything loads.

Oracle: :func:`vocablens.models.load` (transformers' ``from_pretrained``) of the same directory.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_dirs import run_cli, save_tiny, tiny_tokenizer

BF, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def _mixed(k: str) -> torch.dtype:
    return BF if "embed" in k else F32 if "norm" in k else F16


#: name -> (dtype of each checkpoint tensor, config "dtype" or None to drop it)
VARIANTS = {
    "bf16": (lambda k: BF, "bfloat16"),
    "fp16": (lambda k: F16, "float16"),
    "f64": (lambda k: F64, "float64"),
    "mixed": (_mixed, None),           # no dtype in the config: transformers takes the first float tensor's
    "mixed_cfg_f32": (_mixed, "float32"),
}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tok):
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("stream_dtypes")
    out = {}
    for name, (dt, cfg_dtype) in VARIANTS.items():
        d = save_tiny(root / name, tok, family="llama")
        sd = load_file(d / "model.safetensors")
        save_file({k: v.to(dt(k)) for k, v in sd.items()}, str(d / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((d / "config.json").read_text())
        cfg.pop("torch_dtype", None)
        cfg.pop("dtype", None)
        if cfg_dtype:
            cfg["dtype"] = cfg_dtype
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = d
    return out


def _dtypes(lm) -> tuple:
    b = lm.borders
    return b.W_E.dtype, b.unembedding.weight.dtype, b.final_norm.weight.dtype


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_streaming_matches_the_normal_load(dirs, variant):
    from vocablens.models import load
    from vocablens.models.files.streaming import load_streaming

    d = str(dirs[variant])
    ref = load(d)
    ref_dtypes = {p.dtype for p in ref.model.parameters()}
    assert len(ref_dtypes) == 1  # transformers casts a mixed checkpoint to one dtype
    st = load_streaming(d, max_memory=1)  # every block streams
    assert len(st.model.vocablens_streamers) == st.borders.n_layers
    assert _dtypes(st) == _dtypes(ref)
    ids = torch.tensor([[0, 9, 33, 120, 7, 250]])
    r_resid, r_logits = ref.borders.residual_stream(ids)
    s_resid, s_logits = st.borders.residual_stream(ids)
    assert s_resid.dtype == r_resid.dtype
    assert torch.equal(s_resid, r_resid)
    assert torch.equal(s_logits, r_logits)
    # the lens path (final norm + head) at every layer, as the lens reads it
    assert torch.equal(st.borders.unembedding(s_resid[:, 0]), ref.borders.unembedding(r_resid[:, 0]))


def test_streaming_mixed_checkpoint_scores_like_the_normal_load(dirs, capsys):
    d = dirs["mixed"]
    code, want, err = run_cli(capsys, "score", "a mixed checkpoint", "-m", d, "--json")
    assert code == 0, err
    code, got, err = run_cli(capsys, "score", "a mixed checkpoint", "-m", d, "--json", "--max-memory", "1kB")
    assert code == 0, err  # was: RuntimeError: expected m1 and m2 to have the same dtype
    assert json.loads(got) == json.loads(want)  # the streamed load reads the check the whole load stored


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, tok):
    from transformers import AutoModelForCausalLM

    src = save_tiny(tmp_path_factory.mktemp("full") / "m", tok, family="llama")
    d = tmp_path_factory.mktemp("sharded") / "m"
    m = AutoModelForCausalLM.from_pretrained(str(src))
    m.save_pretrained(d, max_shard_size="60KB")
    tok.save_pretrained(d)
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) >= 3
    gone = next(s for s in shards if any(".layers.1." in k for k, v in index.items() if v == s))
    (d / gone).unlink()
    return d, gone


def test_missing_shard_refused_before_loading_api(sharded, monkeypatch):
    import vocablens.models.files.partial as lazy
    from vocablens.errors import CorruptModelFile, VocabLensError
    from vocablens.models.files.streaming import load_streaming

    d, gone = sharded

    def no_load(*a, **k):
        raise AssertionError("loaded before checking the shards")

    monkeypatch.setattr(lazy, "materialize_parts", no_load)
    with pytest.raises(CorruptModelFile) as e:
        load_streaming(str(d), max_memory=1)
    assert isinstance(e.value, VocabLensError) and e.value.exit_code == 2
    assert gone in str(e.value) and "\n" not in str(e.value)


def test_missing_shard_refused_by_the_cli(sharded, capsys):
    d, gone = sharded
    code, out, err = run_cli(capsys, "score", "hello there", "-m", d, "--max-memory", "1kB")
    assert code == 2
    assert out == ""
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("loading")]
    assert len(lines) == 1 and gone in lines[0] and "Traceback" not in err, err
