"""The memory figures of docs/guide/big-models.md, computed by vocablens's own anatomy (never guessed).

``python docs/big_models.py`` prints the table; ``python docs/big_models.py --write`` puts it into the
page between its ``<!-- figures -->`` markers. ``tests/unit/test_big_models_page.py`` checks that the
page holds exactly what this script prints, so the figures cannot drift from the code.

The models are Llama-3 configs built from their published numbers (70B: hidden 8,192, 80 layers,
intermediate 28,672, 64 heads, 8 key/value heads, vocabulary 128,256, untied head; 8B: 4,096, 32,
14,336, 32, 8, 128,256, untied) on the meta device (shapes only, no weights). Every count comes from
:func:`vocablens.accounting.anatomy.anatomy` and :func:`~vocablens.accounting.anatomy.count_parameters`;
a placement's figure is those counts added up the way the placement holds them. Weights only: no KV
cache, no activations, no quantization scales.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "guide" / "big-models.md"
START, END = "<!-- figures: python docs/big_models.py --write -->", "<!-- /figures -->"
#: name -> (hidden, layers, intermediate, heads, kv heads, vocabulary), untied head
LLAMA3 = {"Llama-3-70B": (8192, 80, 28672, 64, 8, 128256), "Llama-3-8B": (4096, 32, 14336, 32, 8, 128256)}
#: bytes per parameter of the weights' dtype in the placements below (bf16)
BF16 = 2


def meta_llama(name: str):
    """The meta-device model of ``LLAMA3[name]`` (no storage)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    d, L, ff, H, kv, V = LLAMA3[name]
    cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=ff, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=kv, tie_word_embeddings=False,
                      max_position_embeddings=8192, rope_theta=500000.0)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def figures(name: str) -> dict[str, int]:
    """Parameter counts and bytes of model ``name`` as each placement holds it (bytes, bf16 weights).

    Keys: ``params``, ``bytes_bf16`` / ``bytes_fp8`` / ``bytes_int4`` (the whole model), ``block``
    (one block), ``matrix`` (the embedding, the same size as the head), ``devmap_N`` (the busiest of N
    GPUs under ``--device-map``: an even share of the blocks plus a border matrix), ``tp_N`` (one of N
    ranks under ``--tp``: 1/N of every block's projections and of the head; norms and the embedding
    whole, as transformers' plan for Llama shards them), ``stream_min`` (``--max-memory``'s least:
    the borders and the one block being read), ``logits_4096`` (one float32 [4096, V] logits tensor).
    """
    from vocablens.accounting.anatomy import anatomy, count_parameters, logits_memory
    from vocablens.models import Borders

    model = meta_llama(name)
    b = Borders.from_model(model)
    a = anatomy(b, name=name, context=4096, source="config")
    block = count_parameters(b.blocks[0])
    norm = count_parameters(b.final_norm)
    plan = [re.compile(p.replace(".", r"\.").replace("*", r"\d+") + r"\.") for p in model.config.base_model_tp_plan]
    sharded = sum(p.numel() for n, p in model.model.named_parameters() if any(r.match(n) for r in plan))
    out = {"params": a.params_total, "bytes_bf16": a.model_bytes["bf16"], "bytes_fp8": a.model_bytes["fp8"],
           "bytes_int4": a.model_bytes["int4"], "block": block * BF16, "matrix": a.matrix_bytes["bf16"],
           "stream_min": (a.params_embedding + a.params_unembedding + norm + block) * BF16,
           "logits_4096": logits_memory(a.vocab_size, 1, 4096, "float32").bytes_all_positions}
    for n in (2, 4, 8):
        out[f"devmap_{n}"] = (math.ceil(b.n_layers / n) * block + a.params_unembedding + norm) * BF16
        out[f"tp_{n}"] = ((sharded + a.params_unembedding) // n + a.params_total - sharded - a.params_unembedding) * BF16
    return out


def gib(n: int) -> str:
    """Bytes as GiB, one decimal."""
    return f"{n / 2**30:,.1f} GiB"


def table() -> str:
    """The page's table (markdown), one column per model."""
    f = {name: figures(name) for name in LLAMA3}
    rows = [
        ("parameters (anatomy, shared storage once)", lambda x: f"{x['params']:,}"),
        ("whole model, bf16 (`--device cuda`: one GPU holds this)", lambda x: gib(x["bytes_bf16"])),
        ("whole model, fp8 (quantized checkpoint)", lambda x: gib(x["bytes_fp8"])),
        ("whole model, int4 (quantized checkpoint, scales not counted)", lambda x: gib(x["bytes_int4"])),
        ("one block, bf16", lambda x: gib(x["block"])),
        ("embedding or head [V, d], bf16", lambda x: gib(x["matrix"])),
        *[(f"`--device-map` over {n} GPUs: the busiest GPU", lambda x, n=n: gib(x[f"devmap_{n}"])) for n in (2, 4, 8)],
        *[(f"`--tp` over {n} ranks: each rank", lambda x, n=n: gib(x[f"tp_{n}"])) for n in (2, 4, 8)],
        ("`--max-memory` at its least: borders + one streamed block", lambda x: gib(x["stream_min"])),
        ("one float32 logits tensor [4,096, V] (vocablens's chunked paths never hold it)",
         lambda x: gib(x["logits_4096"])),
    ]
    lines = [f"| weights (bf16 unless named) | {' | '.join(f)} |", "|---|" + "---:|" * len(f)]
    lines += [f"| {label} | {' | '.join(fn(x) for x in f.values())} |" for label, fn in rows]
    return "\n".join(lines)


def page_block(text: str) -> str:
    """What the page holds between its markers (stripped)."""
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def main() -> None:
    t = table()
    if "--write" in sys.argv[1:]:
        text = PAGE.read_text(encoding="utf-8")
        head, rest = text.split(START, 1)
        PAGE.write_text(f"{head}{START}\n{t}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
    print(t)


if __name__ == "__main__":
    main()
