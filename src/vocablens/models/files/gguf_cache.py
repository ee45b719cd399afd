"""The cache of dequantized GGUF models: a float32 safetensors directory per GGUF file version.

Dequantizing a GGUF file with transformers takes seconds to minutes; the result is saved once under
:func:`cache_root` (``gguf/<stem>-<hash>``, the hash over the SHA-256 of the file's whole content
(:func:`file_identity`) and the vocablens and transformers versions) and loaded from there next time in
about a second. The directory is written through :func:`vocablens.files.atomic_dir`, so a reader never
sees half of it. Disk: about 4 bytes per parameter (SmolLM2-135M: 0.54 GB).

Before dequantizing, the header is checked against itself (:mod:`vocablens.models.files.gguf_header`): V is
the embedding tensor's rows whatever ``{arch}.vocab_size`` says (the disagreement becomes a note of the
provenance), and a file no model can be built from is one line naming the two numbers.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from vocablens.models.files.provenance import Provenance

#: the file that marks a complete cache entry (written last, inside the swapped-in directory)
CACHE_MARK = "vocablens-provenance.json"
#: CPU seconds the first load of a GGUF file takes per MiB of the file (dequantizing it with transformers
#: and writing the float32 cache); docs/performance.md gives the measurement it comes from
FIRST_LOAD_S_PER_MIB = 0.25


def first_load_seconds(path: Path) -> float:
    """The first load's estimate for the GGUF file ``path``: its size times :data:`FIRST_LOAD_S_PER_MIB`
    (seconds; a busy machine takes longer, a fast one less)."""
    return path.stat().st_size / 2**20 * FIRST_LOAD_S_PER_MIB


def cache_root() -> Path | None:
    """Where dequantized GGUF models are cached: ``$VOCABLENS_CACHE``, else
    ``$XDG_CACHE_HOME/vocablens`` or ``~/.cache/vocablens``; None when ``VOCABLENS_CACHE=off``."""
    v = os.environ.get("VOCABLENS_CACHE", "")
    if v.lower() in ("0", "off", "no", "false", "none"):
        return None
    if v:
        return Path(v).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vocablens"


def cache_dir(path: Path) -> Path | None:
    """The cache directory for one GGUF file version, or None when caching is off (the file is then
    not hashed here). Hashes the whole file the first time it is seen (:func:`file_identity`)."""
    import transformers

    from vocablens.version import __version__

    root = cache_root()
    if root is None:
        return None
    key = f"{file_identity(path)}|{__version__}|{transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / "gguf" / f"{path.stem}-{digest}"


#: bytes per read while hashing (large reads: hashlib releases the GIL and runs at its own speed)
_CHUNK = 1 << 22
#: in-process memo: resolved path -> (stat stamp, SHA-256)
_MEMO: dict[str, tuple[tuple, str]] = {}


def _stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What must not change for a stored hash to stand: device, inode, size, mtime and ctime (ns).
    ctime, which no user call can set back, also catches a file rewritten in place whose mtime was
    restored (``cp -p``, ``touch -d``)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def file_identity(path: Path) -> str:
    """The SHA-256 of a GGUF file's whole content, as hex: what names its cache entry.

    Computed once per file version (its cost per GB: ``benchmarks/gguf_identity.py``) and kept beside the file's stat (device, inode,
    size, mtime_ns, ctime_ns) under ``cache_root()/hashes`` and in memory; it is reused without
    reading the file only while that stat is exactly the same, so a file changed in any byte is
    hashed (and dequantized) again. Not its location: the same content elsewhere hashes the same.
    """
    import json

    path = Path(path)
    real = str(path.resolve())
    stamp = _stamp(path.stat())
    hit = _MEMO.get(real)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    root = cache_root()
    memo = root / "hashes" / (hashlib.sha256(real.encode()).hexdigest()[:32] + ".json") if root else None
    try:
        rec = json.loads(memo.read_text()) if memo is not None and memo.is_file() else None
        if isinstance(rec, dict) and tuple(rec.get("stat", ())) == stamp and isinstance(rec.get("sha256"), str):
            _MEMO[real] = (stamp, rec["sha256"])
            return rec["sha256"]
    except (OSError, ValueError):
        pass
    digest = _sha256(path)
    if _stamp(path.stat()) != stamp:  # written to while hashed: hash again next time
        return digest
    _MEMO[real] = (stamp, digest)
    if memo is not None:
        from vocablens.files import atomic_write

        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(memo, json.dumps({"path": real, "stat": list(stamp), "sha256": digest}))
        except Exception:  # a read-only cache: the hash is computed again next process
            pass
    return digest


def read_cache(cdir: Path | None, spec: str, dtype):
    """``(tokenizer, model, provenance)`` from a complete cache entry, or None (missing or damaged)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cdir is None or not (cdir / CACHE_MARK).is_file():
        return None
    try:
        prov = mark_provenance(cdir)
        tok = AutoTokenizer.from_pretrained(str(cdir), trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(str(cdir), dtype=dtype or torch.float32, trust_remote_code=False)
    except Exception:  # a damaged cache entry: the caller falls back to the GGUF file
        return None
    return tok, model, Provenance(**{**prov.__dict__, "spec": spec, "loaded_from": str(cdir)})


def mark_provenance(cdir: Path) -> Provenance:
    """The provenance a cache entry was written with (its notes as a tuple).

    Raises:
        OSError, ValueError, TypeError: a missing or damaged mark.
    """
    d = json.loads((cdir / CACHE_MARK).read_text())
    return Provenance(**{**d, "notes": tuple(d.get("notes", ()))})


def _sweep(root: Path, age_s: float = 3600.0) -> None:
    """Remove what a killed writer left under ``root``: temporary (``.NAME.tmp-*``) and moved-aside
    (``.NAME.old-*``) entries older than ``age_s`` (younger ones may belong to a writer still at work)."""
    import shutil
    import time

    for p in root.glob(".*.*-*") if root.is_dir() else ():
        try:
            if (".tmp-" in p.name or ".old-" in p.name) and time.time() - p.stat().st_mtime > age_s:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def write_cache(cdir: Path, model, tok, prov: Provenance) -> bool:
    """Save a dequantized model as a cache entry; returns whether it was written.

    An entry a killed process left half-written is never read: the directory is swapped in whole
    (:func:`vocablens.files.atomic_dir`) and read only with its mark; its leftovers are swept after
    an hour. Caching is an optimisation: a full disk, a read-only cache or any other failure is
    swallowed (the load that called it has its model already).
    """
    from vocablens.files import atomic_dir

    _sweep(cdir.parent)
    try:
        with atomic_dir(cdir) as tmp:
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            (tmp / CACHE_MARK).write_text(json.dumps({**prov.__dict__, "dtype": "", "loaded_from": ""}))
    except Exception:
        return False
    return True


def shown_gguf(path: Path, spec: str) -> str:
    """How error lines name a GGUF file: the path the user gave, or the default model's package and name."""
    from vocablens.models.files.spec import DEFAULT_GGUF_PACKAGE, DEFAULT_MODEL

    if spec.lower() in (DEFAULT_MODEL, "smollm2-135m-instruct", "default"):
        return f"PyPI package {DEFAULT_GGUF_PACKAGE.replace('_', '-')}: {path.name}"
    return str(path)


def checked_facts(path: Path, spec: str):
    """The file's :class:`~vocablens.models.files.gguf_header.GGUFFacts`, after :func:`gguf_problem` found none.

    Raises:
        CorruptModelFile: not a GGUF file, cut short, or a model cannot be built from it (one line
            naming the two numbers that disagree).
    """
    from vocablens.errors import CorruptModelFile
    from vocablens.models.files.gguf_header import gguf_facts, gguf_problem

    shown = shown_gguf(path, spec)
    facts = gguf_facts(path, shown)
    problem = gguf_problem(facts, shown)
    if problem:
        raise CorruptModelFile(problem)
    return facts


def config_override(path: Path, facts):
    """A config for transformers with V from the embedding tensor, or None when the one it reads from
    the header (``{arch}.vocab_size``, else the token list's length) already says so."""
    said = facts.meta_vocab_size if facts.meta_vocab_size is not None else facts.n_tokens
    if facts.vocab_size is None or said == facts.vocab_size:
        return None
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    cfg.vocab_size = facts.vocab_size
    return cfg


def loading_problem(info: dict, shown: str) -> str | None:
    """One line for a model transformers built from a GGUF file's metadata but could not fill from its
    tensors (``output_loading_info``): a tensor of another shape, or parameters the file lacks (they
    would be left at random values), or None."""
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    if mismatched:
        name, held, built = mismatched[0][:3]
        return (f"{shown}: its metadata builds {name} as {list(built)}, the file holds it as {list(held)}; "
                "no model can be built from it")
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        return (f"{shown}: the file holds no tensor for {missing[0]} ({len(missing):,} parameter tensors its "
                "metadata's model needs are missing); no model can be built from it")
    return None


def load_gguf(source, tdtype):
    """Dequantize the GGUF file of ``source`` (a :class:`~vocablens.models.files.source.Source` of kind
    ``gguf``) to float32 with transformers and write its cache entry, or read the entry when there is
    one: ``(tokenizer, model, provenance)``, the model cast to ``tdtype`` when given. The header is checked first (:func:`checked_facts`); the provenance names the file's
    SHA-256 and the metadata's disagreements with the tensors (``notes``).

    Raises:
        CorruptModelFile: a file cut short, a header no model can be built from, a tokenizer that
            cannot be built (:func:`vocablens.models.files.tokenizer_files.building_tokenizer`). Other errors
            of the readers propagate (the caller wraps them: :func:`vocablens.models.files.spec.reading`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vocablens.errors import CorruptModelFile
    from vocablens.models.files.gguf_header import facts_of, gguf_notes, gguf_problem, header_provenance, read_header
    from vocablens.models.files.tokenizer_files import building_tokenizer, gguf_tokenizer_problem

    path, spec = source.path, source.spec
    cdir = cache_dir(path)
    hit = read_cache(cdir, spec, tdtype)
    if hit is not None:  # the entry is keyed by content, shared by every copy of the file: the source
        tok, model, prov = hit  # is the file given now, not the copy that wrote the entry
        return tok, model, Provenance(**{**prov.__dict__, "source": str(path)})
    shown, identity = shown_gguf(path, spec), file_identity(path)
    header = read_header(path, shown)  # read once: the checks (checked_facts), the notes and the provenance
    facts = facts_of(header)
    problem = gguf_problem(facts, shown)
    if problem:
        raise CorruptModelFile(problem)
    notes = tuple(gguf_notes(facts))
    prov = Provenance(**{**header_provenance(header, path, spec).__dict__, "content_sha256": identity, "notes": notes})
    d, f = str(path.parent), path.name
    with building_tokenizer(shown, lambda: gguf_tokenizer_problem(path)):
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f, trust_remote_code=False)
    cfg = config_override(path, facts)
    model, info = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, trust_remote_code=False,
                                                       output_loading_info=True, ignore_mismatched_sizes=True,
                                                       **({"config": cfg} if cfg is not None else {}))
    unbuilt = loading_problem(info, shown)
    if unbuilt:
        raise CorruptModelFile(unbuilt)
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


__all__ = ["CACHE_MARK", "FIRST_LOAD_S_PER_MIB", "first_load_seconds", "cache_root", "cache_dir", "checked_facts", "config_override", "file_identity", "load_gguf",
           "loading_problem", "mark_provenance", "read_cache", "shown_gguf", "write_cache"]
