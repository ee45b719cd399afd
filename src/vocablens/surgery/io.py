"""Files for vocabulary surgery: write an edited model as a plain Hugging Face directory, atomically,
and pick held-out texts from a corpus.

The directory holds ``model.safetensors`` (+ ``config.json``, ``generation_config.json``) and the
tokenizer files, so ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)``
reload it with no vocablens code. It is written through :func:`vocablens.files.atomic_dir` (a
temporary sibling directory renamed into place); an existing ``out`` is replaced only with ``force``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vocablens.errors import BadInput, OutputExists


def check_out(out: str | os.PathLike, force: bool) -> Path:
    """Raise :class:`OutputExists` when ``out`` exists and ``force`` is off; returns the path.

    Raises:
        BadInput: no ``out`` given, or ``out`` is a file. OutputExists: as above.
    """
    if not str(out or "").strip():
        raise BadInput("`out` DIR is required")
    p = Path(out).expanduser()
    if p.exists() and not force:
        raise OutputExists(f"{p} exists; pass `force` to replace it (nothing written)")
    if p.exists() and not p.is_dir():
        raise BadInput(f"{p} exists and is not a directory; remove it or choose another `out`")
    return p


def _drop_gguf_quantizer(model) -> None:
    """A GGUF model is dequantized on load (float weights) but keeps transformers' GGUF quantizer,
    which refuses to save; the weights are plain tensors, so drop it (on this model object only)."""
    q = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(q, "quantization_config", None), "quant_method", None)
    if q is not None and str(getattr(method, "value", method)).lower() == "gguf":
        model.hf_quantizer = None
        for attr in ("is_quantized",):
            if getattr(model, attr, False):
                try:
                    setattr(model, attr, False)
                except AttributeError:
                    pass
        if hasattr(model.config, "quantization_config"):
            try:
                delattr(model.config, "quantization_config")
            except AttributeError:
                pass


_PROBE = "Hello world! naïve café, 日本語 ∑ x=1;\n\tdef f(): return 'ok'  \u200b end"


def _check_tokenizer_reload(d: Path, tokenizer, texts: list[str] | None) -> None:
    from transformers import AutoTokenizer

    from vocablens.errors import CheckpointMismatch

    t2 = AutoTokenizer.from_pretrained(str(d), trust_remote_code=False)
    for text in [_PROBE, *(texts or [])]:
        a = tokenizer(text, add_special_tokens=False).input_ids
        b = t2(text, add_special_tokens=False).input_ids
        if list(a) != list(b) or len(t2) != len(tokenizer):
            raise CheckpointMismatch(
                f"AutoTokenizer reloads the written tokenizer as {type(t2).__name__}, which encodes differently "
                f"from the edited one (len {len(t2)} vs {len(tokenizer)}); nothing written")


def save_model_dir(model, tokenizer, out: str | os.PathLike, force: bool = False,
                   extra_json: dict[str, Any] | None = None, probe_texts: list[str] | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face directory at ``out``, atomically.

    Args:
        extra_json: file name -> JSON-serialisable object written beside the model (e.g. the
            old -> new id map of a trim).
        probe_texts: texts the reloaded tokenizer must encode exactly like ``tokenizer``
            (a fixed multilingual probe is always checked).

    Returns:
        The output path.

    Raises:
        OutputExists: ``out`` exists and ``force`` is off (checked again just before the rename).
        CheckpointMismatch: ``AutoTokenizer`` reloads the written directory as a tokenizer that
            encodes differently (transformers picks tokenizer classes by ``model_type``); nothing
            is written.
    """
    from vocablens.files import atomic_dir

    p = check_out(out, force)
    with atomic_dir(p) as tmp:
        _drop_gguf_quantizer(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _check_tokenizer_reload(tmp, tokenizer, probe_texts)
        for name, obj in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        check_out(p, force)  # again: something may have appeared at ``out`` while we wrote
    return p


def heldout_texts(corpus: str, n_texts: int = 4, chars: int = 800, val_fraction: float = 0.1,
                  max_docs: int | None = 400) -> list[str]:
    """``n_texts`` chunks of about ``chars`` characters from the validation split of a corpus.

    Uses :func:`vocablens.corpus.load_documents` and :func:`~vocablens.corpus.split_documents`
    (deterministic, by document); chunks end at a whitespace.

    Raises:
        BadInput: the corpus does not exist or holds no text.
    """
    from vocablens.corpus import load_documents, split_documents

    docs = load_documents(corpus, max_docs=max_docs)
    _, val = split_documents(docs, val_fraction) if len(docs) >= 2 else (docs, docs)
    return chunk_texts([d.text for d in val], n_texts, chars)


def chunk_texts(texts: list[str], n_texts: int, chars: int) -> list[str]:
    """Cut texts into up to ``n_texts`` chunks of about ``chars`` characters (ending at whitespace)."""
    out: list[str] = []
    for t in texts:
        t = t.strip()
        while t and len(out) < n_texts:
            if len(t) <= chars:
                piece, t = t, ""
            else:
                cut = t.rfind(" ", chars // 2, chars)
                cut = cut if cut > 0 else chars
                piece, t = t[:cut], t[cut:]
            if piece.strip():
                out.append(piece)
        if len(out) >= n_texts:
            break
    if not out:
        raise BadInput("no held-out text")
    return out
