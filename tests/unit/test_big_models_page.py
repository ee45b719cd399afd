"""docs/guide/big-models.md (issue 49 E): its memory table is what ``docs/big_models.py`` computes with
vocablens's own anatomy, so the page's figures cannot drift from the code.

Oracles independent of the script: the parameter counts of the published checkpoints (the
safetensors index's ``total_size`` of Meta-Llama-3-70B, 141,107,412,992 bytes of bf16, and of
Meta-Llama-3-8B, 16,060,522,496 bytes, halved), the catalogue's stored configs counted by
``anatomy_of``, and the arithmetic a placement must obey (N ranks hold at least the whole model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("big_models", ROOT / "docs" / "big_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_page_holds_the_scripts_table(script):
    page = (ROOT / "docs" / "guide" / "big-models.md").read_text(encoding="utf-8")
    assert script.page_block(page) == script.table(), "run: python docs/big_models.py --write"
    assert "guide/big-models.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_the_counts_are_the_published_checkpoints(script):
    import vocablens

    for name, total_size, alias in (("Llama-3-70B", 141_107_412_992, "llama-3-70b"),
                                    ("Llama-3-8B", 16_060_522_496, "llama-3-8b")):
        f = script.figures(name)
        assert f["params"] == total_size // 2 == vocablens.anatomy_of(alias).params_total
        assert f["bytes_bf16"] == total_size and f["bytes_fp8"] * 2 == f["bytes_bf16"] == f["bytes_int4"] * 4
        d, L, ff, H, kv, V = script.LLAMA3[name]
        assert f["matrix"] == V * d * 2
        assert f["block"] == 2 * (2 * d * d + 2 * d * (d // H) * kv + 3 * d * ff + 2 * d)  # q, o, k, v, MLP, 2 norms
        for n in (2, 4, 8):
            assert n * f[f"tp_{n}"] >= f["bytes_bf16"]  # ranks hold the whole model between them
            assert n * f[f"devmap_{n}"] >= f["bytes_bf16"] - 2 * f["matrix"]  # an even share, plus a border
        assert f["stream_min"] == 2 * f["matrix"] + f["block"] + 2 * d
        assert f["logits_4096"] == 4096 * V * 4
