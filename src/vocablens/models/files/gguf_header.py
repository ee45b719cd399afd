"""What a GGUF file holds, read from its header alone, and how its metadata agrees with it.

The header (format: ggml's ``docs/gguf.md``) is the magic ``GGUF``, a version, the tensor and
key-value counts, the key-value pairs (metadata, the token list and merges among them) and one
record per tensor (name, dimensions, storage type, offset); the tensor data follow, aligned. This
module walks it with :mod:`struct` over a memory map, without decoding the strings it is not asked
for: the default model's header (49,152 tokens, 48,900 merges) reads in tens of milliseconds,
where ``gguf.GGUFReader`` builds every field (seconds).

:func:`gguf_facts` gives the numbers that can disagree: V (the embedding tensor's rows), the
metadata's vocabulary size, the token list's length, the head's rows, the widths, and the bytes the
tensors need. :func:`gguf_notes` says which disagreements a model survives (read from the tensors);
:func:`gguf_problem` is the one line for those it does not. :func:`gguf_provenance` names the file, its
type and each tensor group's storage type (a :class:`~vocablens.models.files.provenance.Provenance`).
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from vocablens.errors import CorruptModelFile
from vocablens.models.files.provenance import Provenance

#: GGUF value types -> struct format of a scalar (8: string, 9: array are walked apart)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's header.

    Attributes:
        values: metadata key -> scalar value or string; an array's entry is its length (an int).
        strings: the string arrays asked for, decoded: key -> list of str.
        tensors: tensor name -> (dims in ggml order: ``ne[0]`` is the row length, ``ne[1]`` the rows; ggml type id).
        data_end: bytes the file needs to hold every tensor's data (header, alignment and data).
        size: the file's size in bytes.
    """

    values: dict
    strings: dict
    tensors: dict
    data_end: int
    size: int


def _not_gguf(shown: str, why: str) -> CorruptModelFile:
    return CorruptModelFile(f"cannot read GGUF file {shown}: it is truncated or not a GGUF file ({why}); "
                            "download it again")


def read_header(path: Path, shown: str | None = None, strings: tuple[str, ...] = ()) -> GGUFHeader:
    """Read a GGUF file's header: metadata, the string arrays named in ``strings``, tensor records.

    Args:
        path: the ``.gguf`` file.
        shown: how error lines name the file (default: ``path``).
        strings: keys of string arrays to decode (e.g. ``tokenizer.ggml.tokens``).

    Raises:
        CorruptModelFile: not a GGUF file, or cut short inside its header.
    """
    shown = shown or str(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, set(strings))
    except (struct.error, ValueError, IndexError, OSError, UnicodeDecodeError) as e:
        raise _not_gguf(shown, (str(e).splitlines() or [type(e).__name__])[0][:100]) from None


def _parse(mm, want: set[str]) -> GGUFHeader:
    if mm[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    e = "<" if struct.unpack_from("<I", mm, 4)[0] < 0x10000 else ">"  # big-endian files swap the version
    version, n_tensors, n_kv = struct.unpack_from(e + "IQQ", mm, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    off = 24

    def string(o: int) -> tuple[str | None, int]:
        (n,) = struct.unpack_from(e + "Q", mm, o)
        if o + 8 + n > len(mm):
            raise ValueError("a string runs past the end of the file")
        return None, o + 8 + n

    def text(o: int) -> tuple[str, int]:
        _, end = string(o)
        return bytes(mm[o + 8:end]).decode("utf-8"), end

    values: dict = {}
    decoded: dict = {}
    for _ in range(n_kv):
        key, off = text(off)
        (vt,) = struct.unpack_from(e + "I", mm, off)
        off += 4
        if vt == _STRING:
            values[key], off = text(off)
        elif vt == _ARRAY:
            et, n = struct.unpack_from(e + "IQ", mm, off)
            off += 12
            values[key] = n
            if et == _STRING:
                out = [] if key in want else None
                for _ in range(n):
                    if out is not None:
                        s, off = text(off)
                        out.append(s)
                    else:
                        _, off = string(off)
                if out is not None:
                    decoded[key] = out
            elif et in _SCALAR:
                off += n * struct.calcsize(_SCALAR[et])
            else:
                raise ValueError(f"array of value type {et} under {key}")
        elif vt in _SCALAR:
            (values[key],) = struct.unpack_from(e + _SCALAR[vt], mm, off)
            off += struct.calcsize(_SCALAR[vt])
        else:
            raise ValueError(f"unknown value type {vt} under {key}")
    tensors: dict = {}
    ends = []
    for _ in range(n_tensors):
        name, off = text(off)
        (nd,) = struct.unpack_from(e + "I", mm, off)
        dims = struct.unpack_from(e + "Q" * nd, mm, off + 4)
        ttype, start = struct.unpack_from(e + "IQ", mm, off + 4 + 8 * nd)
        off += 4 + 8 * nd + 12
        tensors[name] = (tuple(int(x) for x in dims), int(ttype))
        ends.append(start + _nbytes(dims, ttype))
    align = int(values.get("general.alignment", 32)) or 32
    data_start = -(-off // align) * align
    return GGUFHeader(values, decoded, tensors, data_start + max(ends, default=0), len(mm))


def _nbytes(dims, ttype: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):  # a storage type newer than this gguf-py: its size is not bounded here
        return 0
    n = 1
    for x in dims:
        n *= int(x)
    return n // block * size


@dataclass(frozen=True)
class GGUFFacts:
    """The numbers of a GGUF file that its metadata and its tensors both state.

    Attributes:
        arch: ``general.architecture`` (``llama``).
        vocab_size: V, the rows of the embedding tensor ``token_embd.weight`` (None: no such tensor).
        width: the embedding rows' length (None: no such tensor).
        meta_vocab_size: ``{arch}.vocab_size`` of the metadata (None: not given).
        meta_width: ``{arch}.embedding_length`` of the metadata (None: not given).
        n_tokens: entries of the token list ``tokenizer.ggml.tokens`` (None: no token list).
        head_rows: rows of the untied LM head ``output.weight`` (None: tied, no such tensor).
        meta_blocks: ``{arch}.block_count`` of the metadata (None: not given).
        blocks: the block indices ``N`` of the ``blk.N.*`` tensors the file holds.
        meta_ff: ``{arch}.feed_forward_length`` (None: not given, or one per block).
        ff: rows of ``blk.0.ffn_up.weight`` (None: no such tensor, e.g. a mixture of experts).
        data_end: bytes the file needs to hold every tensor's data.
        size: bytes the file holds.
    """

    arch: str
    vocab_size: int | None
    width: int | None
    meta_vocab_size: int | None
    meta_width: int | None
    n_tokens: int | None
    head_rows: int | None
    meta_blocks: int | None
    blocks: frozenset
    meta_ff: int | None
    ff: int | None
    data_end: int
    size: int


def facts_of(h: GGUFHeader) -> GGUFFacts:
    """The :class:`GGUFFacts` of a header read by :func:`read_header`."""
    arch = str(h.values.get("general.architecture", ""))

    def num(key):
        v = h.values.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    emb = h.tensors.get("token_embd.weight", ((), 0))[0]
    head = h.tensors.get("output.weight", ((), 0))[0]
    tokens = h.values.get("tokenizer.ggml.tokens")
    up = h.tensors.get("blk.0.ffn_up.weight", ((), 0))[0]
    blocks = frozenset(int(n.split(".")[1]) for n in h.tensors if n.startswith("blk.") and n.split(".")[1].isdigit())
    return GGUFFacts(
        arch=arch, vocab_size=emb[1] if len(emb) == 2 else None, width=emb[0] if len(emb) == 2 else None,
        meta_vocab_size=num(f"{arch}.vocab_size"), meta_width=num(f"{arch}.embedding_length"),
        n_tokens=tokens if isinstance(tokens, int) else None,
        head_rows=head[1] if len(head) == 2 else None, meta_blocks=num(f"{arch}.block_count"), blocks=blocks,
        meta_ff=num(f"{arch}.feed_forward_length"), ff=up[1] if len(up) == 2 else None,
        data_end=h.data_end, size=h.size,
    )


@lru_cache(maxsize=16)
def _facts(path: str, shown: str, stamp: tuple) -> GGUFFacts:
    return facts_of(read_header(Path(path), shown))


def gguf_facts(path: Path, shown: str | None = None) -> GGUFFacts:
    """:class:`GGUFFacts` of a GGUF file, read once per file version (device, inode, size, mtime).

    Raises:
        CorruptModelFile: not a GGUF file, or cut short inside its header.
    """
    st = path.stat()
    return _facts(str(path), shown or str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


def gguf_problem(f: GGUFFacts, shown: str) -> str | None:
    """One line for what makes the file unusable as a model, or None: data cut short, a head whose
    rows are not the embedding's, an embedding whose width is not the metadata's ``embedding_length``,
    fewer blocks than ``block_count`` (transformers would fill the others with random weights), a
    feed-forward width unlike ``feed_forward_length``."""
    if f.data_end > f.size:
        return (f"the GGUF file {shown} is truncated: its tensors end at byte {f.data_end:,}, the file holds "
                f"{f.size:,}; download it again")
    if f.vocab_size is not None and f.head_rows is not None and f.head_rows != f.vocab_size:
        return (f"{shown}: its LM head output.weight has {f.head_rows:,} rows and its embedding token_embd.weight "
                f"{f.vocab_size:,}; both must have V rows, so no model can be built from it")
    if f.width is not None and f.meta_width is not None and f.width != f.meta_width:
        return (f"{shown}: its metadata says {f.arch}.embedding_length {f.meta_width:,}, its embedding "
                f"token_embd.weight has rows of {f.width:,}; no model can be built from it")
    if f.meta_blocks is not None and not set(range(f.meta_blocks)) <= f.blocks:
        return (f"{shown}: its metadata says {f.arch}.block_count {f.meta_blocks:,}, the file holds tensors for "
                f"{len(f.blocks & set(range(f.meta_blocks))):,} of those blocks; no model can be built from it")
    if f.ff is not None and f.meta_ff is not None and f.ff != f.meta_ff:
        return (f"{shown}: its metadata says {f.arch}.feed_forward_length {f.meta_ff:,}, its blk.0.ffn_up.weight "
                f"has {f.ff:,} rows; no model can be built from it")
    return None


def gguf_notes(f: GGUFFacts) -> list[str]:
    """What the metadata says that the tensors or the token list do not, where the model is still built
    (V is read from the embedding tensor, the tokenizer's size from the token list)."""
    notes = []
    if f.vocab_size is not None and f.meta_vocab_size is not None and f.meta_vocab_size != f.vocab_size:
        notes.append(f"the GGUF metadata says {f.arch}.vocab_size {f.meta_vocab_size:,}, the embedding "
                     f"token_embd.weight has {f.vocab_size:,} rows: V is {f.vocab_size:,}")
    if f.vocab_size is not None and f.n_tokens is not None and f.n_tokens > f.vocab_size:
        notes.append(f"the GGUF token list has {f.n_tokens:,} tokens, the embedding {f.vocab_size:,} rows: "
                     f"the {f.n_tokens - f.vocab_size:,} tokens from id {f.vocab_size:,} on have no row")
    return notes


_GGUF_NAME_SUFFIXES = ("-Q", ".Q", "-q", ".q", "-F16", ".F16", "-f16", ".f16", "-BF16", ".BF16", "-F32", ".F32")


def gguf_provenance(path: Path, spec: str) -> Provenance:
    """Read a GGUF file's header: model name, file type and the storage type of each tensor group.

    Raises:
        CorruptModelFile: the file is not a readable GGUF file.
    """
    return header_provenance(read_header(path), path, spec)


def header_provenance(header, path: Path, spec: str) -> Provenance:
    """:func:`gguf_provenance` of a header already read (:func:`read_header`)."""
    from gguf import GGMLQuantizationType

    groups: dict[str, Counter] = {}
    for name, (_dims, ttype) in header.tensors.items():
        if name.startswith("token_embd"):
            g = "embedding"
        elif name.startswith("output."):
            g = "lm_head"
        elif "norm" in name:
            g = "norms"
        elif name.startswith("blk."):
            g = "blocks"
        else:
            g = "other"
        try:
            tname = GGMLQuantizationType(ttype).name
        except ValueError:
            tname = f"type {ttype}"
        groups.setdefault(g, Counter())[tname] += 1
    tensor_types = {
        g: "/".join(k for k, _ in c.most_common()) for g, c in groups.items() if g != "other"
    }
    # The file's headline type: general.file_type when present, else the blocks' type.
    file_type = None
    ft = header.values.get("general.file_type")
    if isinstance(ft, int):
        try:
            from gguf import LlamaFileType

            file_type = LlamaFileType(ft).name.replace("MOSTLY_", "")
        except ValueError:
            file_type = None
    if not file_type:
        file_type = tensor_types.get("blocks", "unknown")
    stem = path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.stem
    name = stem
    for suf in _GGUF_NAME_SUFFIXES:
        i = stem.find(suf)
        if i > 0:
            name = stem[:i]
            break
    return Provenance(
        spec=spec,
        name=name,
        source=str(path),
        format="gguf",
        quantization=f"{file_type} GGUF",
        tensor_types=tensor_types,
        dequantized=True,
    )


__all__ = ["GGUFFacts", "GGUFHeader", "facts_of", "gguf_facts", "gguf_notes", "gguf_problem", "gguf_provenance",
           "header_provenance", "read_header"]
