"""Tiny random causal LMs built from configs, one per family (no download).

``make_tiny(family)`` returns a float32 model in eval mode; ``FAMILIES`` lists what is covered.
Sizes are small (d=32..64, 2 layers, V~100-128) so a forward takes milliseconds.
"""

from __future__ import annotations

import torch

V = 96
D = 64


def _common(**kw):
    base = dict(vocab_size=V, hidden_size=D, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=128)
    base.update(kw)
    return base


def _config(family: str):
    import transformers as T

    if family == "llama":
        return T.LlamaConfig(**_common(num_key_value_heads=2, tie_word_embeddings=False))
    if family == "llama_tied":
        return T.LlamaConfig(**_common(num_key_value_heads=2, tie_word_embeddings=True))
    if family == "mistral":
        return T.MistralConfig(**_common(num_key_value_heads=2, tie_word_embeddings=False))
    if family == "mixtral":
        return T.MixtralConfig(**_common(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2))
    if family == "qwen2":
        return T.Qwen2Config(**_common(num_key_value_heads=2, tie_word_embeddings=True))
    if family == "qwen3":
        return T.Qwen3Config(**_common(num_key_value_heads=2, head_dim=16, tie_word_embeddings=True))
    if family == "qwen3_moe":
        return T.Qwen3MoeConfig(**_common(num_key_value_heads=2, head_dim=16, num_experts=4,
                                          num_experts_per_tok=2, moe_intermediate_size=32))
    if family == "gemma":
        return T.GemmaConfig(**_common(num_key_value_heads=1, head_dim=16))
    if family == "gemma2":
        return T.Gemma2Config(**_common(num_key_value_heads=2, head_dim=16, final_logit_softcapping=5.0,
                                        attn_logit_softcapping=50.0, sliding_window=16))
    if family == "gemma3_text":
        return T.Gemma3TextConfig(**_common(num_key_value_heads=2, head_dim=16, final_logit_softcapping=4.0,
                                            sliding_window=16))
    if family == "gpt2":
        return T.GPT2Config(vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=128)
    if family == "gpt_neox":
        return T.GPTNeoXConfig(**_common(tie_word_embeddings=False))
    if family == "gptj":
        return T.GPTJConfig(vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=128, rotary_dim=8)
    if family == "opt":
        return T.OPTConfig(vocab_size=V, hidden_size=D, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=128, word_embed_proj_dim=D)
    if family == "opt_project":
        return T.OPTConfig(vocab_size=V, hidden_size=D, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=128, word_embed_proj_dim=32, do_layer_norm_before=False)
    if family == "phi":
        return T.PhiConfig(**_common(tie_word_embeddings=False))
    if family == "phi3":
        return T.Phi3Config(**_common(num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=0))
    if family == "falcon":
        return T.FalconConfig(vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=4,
                              new_decoder_architecture=False, multi_query=True)
    if family == "bloom":
        return T.BloomConfig(vocab_size=V, hidden_size=D, n_layer=2, n_head=4)
    if family == "olmo2":
        return T.Olmo2Config(**_common(num_key_value_heads=2, pad_token_id=0))
    if family == "stablelm":
        return T.StableLmConfig(**_common(num_key_value_heads=2))
    if family == "starcoder2":
        return T.Starcoder2Config(**_common(num_key_value_heads=2))
    if family == "cohere":
        return T.CohereConfig(**_common(num_key_value_heads=2, logit_scale=0.25, pad_token_id=0))
    if family == "granite":
        return T.GraniteConfig(**_common(num_key_value_heads=2, embedding_multiplier=3.0, logits_scaling=2.5,
                                         residual_multiplier=0.5, attention_multiplier=0.3))
    raise KeyError(family)


FAMILIES = [
    "llama", "llama_tied", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "gpt2", "gpt_neox", "gptj", "opt", "opt_project", "phi", "phi3", "falcon", "bloom",
    "olmo2", "stablelm", "starcoder2", "cohere", "granite",
]


def make_tiny(family: str, seed: int = 0):
    """A tiny random causal LM of ``family`` in eval mode, float32, with perturbed norms and biases."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = _config(family)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Random norms (not all ones) and biases, so a missed or doubled final norm shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or "ln" in name.split(".")[-2:-1][0:1] and p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(0.05 * torch.randn_like(p))
    model.eval()
    return model


def ids(batch: int = 2, T: int = 7, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (batch, T), generator=g)


def writes_through(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether a write into row 0 of ``src`` shows in row 0 of ``dst`` (one matrix in memory): the
    behaviour that "tied" means, observed instead of read off a rule (``is``, ``data_ptr``). Both
    tensors are left as they were."""
    if src.is_meta or dst.is_meta:
        raise ValueError("meta tensors hold no values")
    with torch.no_grad():
        row, before = src[0].clone(), dst[0].clone()
        try:
            src[0].copy_(before + 1.0 + before.abs())  # differs from dst's row in every entry
            return not torch.equal(dst[0], before)
        finally:
            src[0].copy_(row)
