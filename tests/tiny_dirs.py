"""Tiny model directories on disk (a random llama with a byte-level BPE tokenizer trained here), for
CLI tests that need ``--model DIR``: built in well under a second, no download."""

from __future__ import annotations

from pathlib import Path

import torch


def _corpus() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)[:30]]


def tiny_tokenizer(vocab: int = 300, words: list[str] | None = None):
    """A byte-level BPE (``vocab`` entries, BOS ``<s>``, EOS ``</s>``) trained on pydoc topics, plus
    ``words`` as added tokens (e.g. the words the report's PCA wants as single tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>", "<pad>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(_corpus(), tr)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if words:
        tok.add_tokens(list(words))
    return tok


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """Run the CLI in-process: ``code, stdout, stderr = run_cli(capsys, "score", "x", "-m", d)``."""
    from vocablens.cli.common import run_app

    capsys.readouterr()
    code = run_app([str(a) for a in argv])
    o = capsys.readouterr()
    return code, o.out, o.err


def save_tiny(d: Path, tok, family: str = "llama", seed: int = 0) -> Path:
    """A tiny random ``family`` model with ``tok``'s vocabulary, saved (safetensors) with it in ``d``."""
    from tiny_models import _config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = _config(family)
    cfg.vocab_size = len(tok)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 0, 1, 2
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(20.0)
    m.eval()
    d.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def save_tiny_gguf(path: Path, tok, seed: int = 0, intermediate_size: int | None = None,
                   meta_vocab_size: int | None = None, drop_tokens: int = 0, extra_rows: int = 0,
                   head_rows: int | None = None, bos_token_id: int = 0, meta: dict | None = None) -> Path:
    """A tiny tied llama as a float32 ``.gguf`` file (``gguf.GGUFWriter``) with ``tok``'s BPE vocabulary,
    readable by transformers' GGUF loader (config, tokenizer and weights).

    Variants: ``extra_rows`` embedding rows past the token list (a padded head, V = len(tok) + extra_rows);
    ``intermediate_size`` makes the file bigger (4 bytes x 3 x d x it per block). Faults on demand:
    ``meta_vocab_size`` written as ``llama.vocab_size`` instead of V (0: the key left out), the last
    ``drop_tokens`` entries cut from ``tokenizer.ggml.tokens`` (merges unchanged), an untied head
    ``output.weight`` of ``head_rows`` rows, a ``bos_token_id`` past the token list, other numbers in
    the metadata than the tensors have (``meta``: ``block_count``, ``feed_forward_length``, ``head_count_kv``)."""
    import json

    import gguf
    from tiny_models import _config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = _config("llama_tied")
    cfg.vocab_size = len(tok) + extra_rows
    if intermediate_size:
        cfg.intermediate_size = intermediate_size
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    said = {"block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
            "head_count_kv": cfg.num_key_value_heads, **(meta or {})}
    w.add_block_count(said["block_count"])
    w.add_feed_forward_length(said["feed_forward_length"])
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(said["head_count_kv"])
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if meta_vocab_size != 0:
        w.add_vocab_size(meta_vocab_size or cfg.vocab_size)
    tj = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = vocab[: len(vocab) - drop_tokens]
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in ("<s>", "</s>", "<pad>") else 1 for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(bos_token_id)
    w.add_eos_token_id(1)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, p in m.state_dict().items():
        if name == "lm_head.weight":
            continue
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            gname = f"blk.{i}.{parts[rest.rsplit('.', 1)[0]]}.weight"
        else:
            gname = names[name]
        w.add_tensor(gname, p.detach().numpy().copy())
    if head_rows is not None:
        w.add_tensor("output.weight", torch.randn(head_rows, cfg.hidden_size).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
