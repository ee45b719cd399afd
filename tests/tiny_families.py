"""Tiny random models of any type in transformers' causal-LM and image-text-to-text auto mappings,
built from the configs transformers ships with every size knob made small: the top config and each
sub-config (text, vision, audio, projector ...) get hidden 64, 2 layers, 4 heads, few experts, a 32-pixel
image of 8-pixel patches; per-layer lists (``layer_types``) are cut to 2 entries that keep both kinds
where the list mixes kinds (a hybrid keeps one linear-attention and one full-attention layer); layer
indices (``deepstack_visual_indexes``, ``vision_feature_layer``) are moved into the 2 layers; token ids
past the vocabulary are moved into it.

``build(model_type, V, mapping)`` returns the model (float32, eval) or the reason it cannot be built
tiny (a string); ``kind(model_type, model)`` says which kind a built model is (composite text,
vision-language, mixture of experts, hybrid, plain).
"""

from __future__ import annotations

import warnings
import zlib

import torch

#: size knobs, wherever a config or sub-config has them
SIZES = dict(
    hidden_size=64, n_embd=64, d_model=64, embed_dim=64, out_hidden_size=64, projection_dim=64, text_hidden_size=64,
    vision_output_dim=64, projector_input_dim=64, projector_output_dim=64, encoder_hidden_size=64,
    num_hidden_layers=2, n_layer=2, num_layers=2, depth=2, encoder_layers=2, decoder_layers=2, n_layers=2,
    max_window_layers=2,
    num_attention_heads=4, n_head=4, num_heads=4, encoder_attention_heads=4, decoder_attention_heads=4,
    attention_heads=4, num_key_value_heads=2, head_dim=16, d_kv=16,
    intermediate_size=96, ffn_dim=96, n_inner=96, encoder_ffn_dim=96, decoder_ffn_dim=96, mlp_dim=96, d_ff=96,
    intermediate_size_mlp=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    shared_experts_intermediate_size=32, dense_intermediate_size=96,
    num_local_experts=4, num_experts=4, n_routed_experts=4, moe_num_experts=4, num_experts_per_tok=2,
    n_group=1, topk_group=1,
    linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
    kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, qk_head_dim=32,
    index_head_dim=16, index_n_heads=2, index_topk=8,
    max_position_embeddings=128, n_positions=128, image_size=32, patch_size=8,
    first_k_dense_replace=1, hidden_size_per_layer_input=8, codebook_dim=64,
    mamba_n_heads=8, mamba_d_head=16, mamba_expand=2, mamba_n_groups=1, mamba_d_state=16,
)
#: the sizes the causal-LM family test used before composite configs were built (issue 42): tried
#: first on a config without sub-configs, so every family it built is built the same way
PLAIN_SIZES = dict(hidden_size=64, n_embd=64, d_model=64, num_hidden_layers=2, n_layer=2, num_layers=2,
                   num_attention_heads=4, n_head=4, num_heads=4, num_key_value_heads=2, intermediate_size=96,
                   ffn_dim=96, n_inner=96, head_dim=16, max_position_embeddings=128, n_positions=128)
#: sizes a family needs beyond the others to be a model its own config accepts. Dory (a looped nGPT)
#: runs n_input_layers, then n_recurrent_layers n_recurrent_loops times, then n_output_layers, which
#: must add up to num_hidden_layers; with its defaults (8, 20, 8) left beside num_hidden_layers=2, the
#: input and the output sections were the same two layers run twice, and with the KV cache on (the
#: model's default forward) their second pass also attended over the keys of their first pass: the
#: model's own logits moved by ~8e-4 from its own use_cache=False forward (which our readout runs).
#: That was the ~1.5e-3 nats `score_ids` "deviation" the family test once listed as KNOWN.
FAMILY_SIZES = {"dory": dict(num_hidden_layers=3, n_input_layers=1, n_recurrent_layers=1, n_output_layers=1)}
#: the whole model's parameters outside the two vocabulary matrices (vision tower included) may not
#: exceed this: a config whose size knobs these sizes do not reach is listed, not run
MAX_BLOCK_PARAMS = 3_000_000
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "depth", "n_layers")
_OLD = "_old_layers"


def _per_layer(v: list) -> list:
    """A per-layer list cut to 2 entries, both kinds kept when it mixes kinds (hybrids)."""
    other = next((i for i, x in enumerate(v) if x != v[0]), None)
    return [v[0], v[other]] if other is not None else v[:2]


def _layer_index(x, n: int = 2):
    """A layer index moved into ``n`` layers (negative indices count from the end)."""
    return x if not isinstance(x, int) or isinstance(x, bool) else (max(x, -n) if x < 0 else min(x, n - 1))


def _mrope(v: list, half: int) -> list:
    """Rotary sections cut to sum to ``half`` (half the tiny head size), as many as before."""
    n = len(v)
    return [half // n + (1 if i < half % n else 0) for i in range(n)]


def _shrink(d: dict, V: int, text: bool) -> dict:
    """The config dict ``d`` with its size knobs small (recursively: sub-configs are dicts)."""
    old = next((d[k] for k in _LAYERS if isinstance(d.get(k), int)), None)
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and "layer" in k and all(str(x).isdigit() for x in v):
            out[k] = {x: y for x, y in v.items() if int(x) < 2}  # per-layer settings by layer index
        elif isinstance(v, dict) and not all(str(x).isdigit() for x in v):
            out[k] = _shrink(v, V, text=k in ("text_config", "decoder", "language_config"))
        elif k == "mrope_section" and isinstance(v, list) and v:
            out[k] = _mrope(v, SIZES["head_dim"] // 2)
        elif k.endswith("_period") and isinstance(v, int) and v > 1:  # every n-th layer: one of the two
            out[k] = 2
        elif k.endswith("_offset") and "layer" in k and isinstance(v, int):
            out[k] = min(v, 1)
        elif k in SIZES and isinstance(v, int) and not isinstance(v, bool):
            out[k] = min(v, SIZES[k]) if k in ("first_k_dense_replace",) else SIZES[k]
        elif k == "vocab_size" and text:
            out[k] = V
        elif isinstance(v, list) and old and len(v) == old and v and not isinstance(v[0], (dict, list)):
            out[k] = _per_layer(v)
        elif isinstance(v, (list, int)) and ("layer" in k or "index" in k or "indexes" in k) and \
                not k.endswith("token_index") and k not in ("num_kv_shared_layers",):
            out[k] = [_layer_index(x) for x in v] if isinstance(v, list) else _layer_index(v)
        elif (k.endswith("token_id") or k.endswith("token_index")) and isinstance(v, int) and v >= V:
            out[k] = 0 if k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id") \
                else V - 1 - zlib.crc32(k.encode()) % 16
        else:
            out[k] = v
    if isinstance(out.get("num_kv_shared_layers"), int):
        out["num_kv_shared_layers"] = 0
    if "kv_lora_rank" in out and "num_attention_heads" in out:  # latent attention: one K/V head per head
        out["num_key_value_heads"] = out["num_attention_heads"]
    if "attn_layer_indices" in out and not out["attn_layer_indices"]:  # a hybrid keeps one attention layer
        out["attn_layer_indices"] = [1]
    return out


def _plain_config(cls, V: int):
    """The config at :data:`PLAIN_SIZES`, or None when it has sub-configs."""
    cfg = cls()
    d = cfg.to_dict()
    if any(isinstance(v, dict) and k.endswith("config") for k, v in d.items()):
        return None
    for k, v in {**PLAIN_SIZES, "vocab_size": V}.items():
        if k in d:
            setattr(cfg, k, v)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        if isinstance(d.get(k), int) and d[k] >= V:
            setattr(cfg, k, 0)
    return cfg


def tiny_config(model_type: str, V: int, plain: bool = False):
    """The config of ``model_type`` at tiny sizes (see the module docstring); ``V`` its text vocabulary.
    ``plain``: :data:`PLAIN_SIZES` on the top config only (None for a composite config)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    if plain:
        cfg = _plain_config(cls, V)
        for k, v in FAMILY_SIZES.get(model_type, {}).items() if cfg is not None else ():
            setattr(cfg, k, v)
        return cfg
    d = cls().to_dict()
    composite = any(isinstance(v, dict) and ("num_hidden_layers" in v or k.endswith("config")) for k, v in d.items())
    small = _shrink(d, V, text=not composite or "vocab_size" in d)
    for k in ("model_type", "transformers_version", "architectures", "_name_or_path"):
        small.pop(k, None)
    small.update(FAMILY_SIZES.get(model_type, {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**small)


def _auto(mapping: str):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForCausalLM if mapping == "causal" else AutoModelForImageTextToText


def build(model_type: str, V: int, mapping: str = "causal", works=None):
    """A tiny random model of ``model_type`` from ``mapping`` (``causal`` or ``image-text-to-text``),
    float32 in eval mode, or the reason it cannot be built tiny (str): the plain sizes first (a
    config without sub-configs), then every config and sub-config sized. ``works(model)``: None when
    the model serves, else why not (str): a model that does not serve is not taken while another try
    remains."""
    first = _build(model_type, V, mapping, plain=True) if mapping == "causal" else None
    if first is not None and not isinstance(first, str):
        why = works(first) if works is not None else None
        if why is None:
            return first
        first = why
    second = _build(model_type, V, mapping, plain=False)
    if isinstance(second, str) or second is None:
        return first if isinstance(first, str) else second
    why = works(second) if works is not None else None
    return second if why is None else why


def _build(model_type: str, V: int, mapping: str, plain: bool):
    try:
        cfg = tiny_config(model_type, V, plain)
        if cfg is None:
            return None
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = _auto(mapping).from_config(cfg, dtype=torch.float32).eval()
    except Exception as e:  # noqa: BLE001  (the reason is the result)
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
    from vocablens.models.find import input_embedding_of

    emb = input_embedding_of(m)
    n = sum(p.numel() for p in m.parameters()) - 2 * (emb.weight.numel() if emb is not None else 0)
    if n > MAX_BLOCK_PARAMS:
        return f"{n:,} parameters outside the vocabulary matrices at the tiny sizes (config knobs not reached)"
    return m


def kind(model_type: str, model, mapping: str = "causal") -> str:
    """``vision-language`` (image-text-to-text mapping), ``composite text`` (a causal LM whose config
    has sub-configs), ``hybrid`` (blocks of more than one kind: attention beside linear attention, state
    space or convolution), ``moe`` (a mixture of experts), ``plain``."""
    from transformers import PretrainedConfig

    from vocablens.models.find import text_config

    cfg = model.config
    if mapping != "causal":
        return "vision-language"
    if any(isinstance(getattr(cfg, k, None), PretrainedConfig) for k in ("text_config", "vision_config")):
        return "composite text"
    types = set(getattr(text_config(cfg), "layer_types", None) or [])
    names = {type(m).__name__ for m in model.modules()}
    if len(types - {"full_attention", "sliding_attention", "chunked_attention"}) and len(types) > 1 or \
            any(w in n for n in names for w in ("Mamba", "GatedDeltaNet", "LinearAttention", "ShortConv")):
        return "hybrid"
    if any("Expert" in n or "Moe" in n or "MoE" in n for n in names):
        return "moe"
    return "plain"
