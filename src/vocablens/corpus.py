"""Text corpora that are available without the hub (layer 1, beside ``models``).

A corpus is a list of :class:`Document`. Sources:

- ``-``: one text read from standard input;
- a path: a ``.txt``/``.md``/``.rst`` file, a ``.jsonl`` file (one JSON object per line with a
  ``text`` field, or a JSON string per line), an ``.html``/``.htm`` file (converted to text with
  BeautifulSoup), or a directory holding any of these (recursively, sorted);
- a named corpus (:data:`NAMED_CORPORA`): ``pydoc-topics`` (English prose about Python, ships with
  CPython: always available), ``cpython-stdlib`` (code, ships with CPython: always available),
  ``python-docs`` (English prose, Debian ``python3.11-doc``) and ``debian-handbook`` (English
  prose, Debian ``debian-handbook``) and ``fortunes`` (general English: quotations, literature, wisdom,
  Debian ``fortunes``, one document per fortune); each says the command that installs it.

Train/validation splits are by document, deterministic (a hash of the document name). A document's
name is relative to the corpus (a file's own name, a path inside the directory, ``stdlib/abc.py``),
never where the corpus lies on disk, so a corpus moved or copied elsewhere splits the same. A corpus that
is one long text (a single file: ``--corpus my_notes.txt``) is cut into documents of about
:data:`PART_CHARS` characters at paragraph (else line, else sentence) boundaries, so it splits into
training and validation parts like any other (:func:`split_text`).

:func:`corpus_record` describes a corpus for files that vocablens writes (a tuned lens's config): its
name (a named corpus, or the file or directory's own name, never a local path) and a content hash.
"""

from __future__ import annotations

import hashlib
import json
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from vocablens.errors import BadInput
from vocablens.files import STDIN, read_text

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
CODE_SUFFIXES = (".py",)


@dataclass(frozen=True)
class Document:
    """One document: a stable name (path or key) and its text."""

    name: str
    text: str


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


#: name -> (description, where, install command)
NAMED_CORPORA: dict[str, dict[str, str]] = {
    "pydoc-topics": {
        "kind": "prose",
        "description": "CPython's pydoc_data/topics.py: the language reference topics (English prose)",
        "install": "(ships with CPython)",
    },
    "cpython-stdlib": {
        "kind": "code",
        "description": "CPython's standard-library source, top-level modules (Python code)",
        "install": "(ships with CPython)",
    },
    "python-docs": {
        "kind": "prose",
        "description": "The Python 3.11 documentation in HTML (about 7 MB of English prose)",
        "path": "/usr/share/doc/python3.11/html",
        "install": "apt-get install -y python3.11-doc",
    },
    "debian-handbook": {
        "kind": "prose",
        "description": "The Debian Administrator's Handbook, en-US HTML (about 1 MB of English prose)",
        "path": "/usr/share/doc/debian-handbook/html/en-US",
        "install": "apt-get install -y debian-handbook",
    },
    "fortunes": {
        "kind": "prose",
        "description": "fortune(6)'s English collections (quotations, literature, people, wisdom, science, "
                       "politics ...; no computing or ASCII-art files), one document per fortune (about 1.3 MB)",
        "path": "/usr/share/games/fortunes",
        "install": "apt-get install -y fortunes",
    },
}

#: the files of the ``fortunes`` corpus: the general-English collections of Debian's ``fortunes``
FORTUNE_FILES = ("education", "food", "fortunes", "humorists", "kids", "law", "literature", "love", "medicine",
                 "men-women", "miscellaneous", "news", "people", "pets", "platitudes", "politics", "riddles",
                 "science", "songs-poems", "sports", "wisdom", "work")


def html_to_text(html: str) -> str:
    """Visible text of an HTML page (scripts, styles and navigation dropped), paragraphs kept."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "nav", "header", "footer", "noscript"]):
        tag.decompose()
    for cls in ("related", "sphinxsidebar", "footer", "navigation"):
        for tag in soup.select(f".{cls}"):
            tag.decompose()
    text = soup.get_text("\n")
    lines = [" ".join(ln.split()) for ln in text.splitlines()]
    out, blank = [], False
    for ln in lines:
        if ln:
            out.append(ln)
            blank = False
        elif not blank:
            out.append("")
            blank = True
    return "\n".join(out).strip()


def _read_file(p: Path, name: str | None = None) -> list[Document]:
    """The documents of one file, named ``name`` (default: the file's own name), ``name#i`` for the
    i-th line of a JSONL file."""
    suf = p.suffix.lower()
    name = p.name if name is None else name
    raw = read_text(p)
    if suf in HTML_SUFFIXES:
        return [Document(name, html_to_text(raw))]
    if suf in JSONL_SUFFIXES:
        docs = []
        for i, line in enumerate(raw.splitlines()):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise BadInput(f"{p}:{i + 1} is not valid JSON") from None
            text = obj.get("text") if isinstance(obj, dict) else obj if isinstance(obj, str) else None
            if not isinstance(text, str):
                raise BadInput(f"{p}:{i + 1} has no 'text' field")
            docs.append(Document(f"{name}#{i + 1}", text))
        return docs
    return [Document(name, raw)]


def _named(name: str, max_docs: int | None) -> list[Document]:
    info = NAMED_CORPORA[name]
    if name == "pydoc-topics":
        from pydoc_data.topics import topics

        return [Document(f"pydoc:{k}", topics[k]) for k in sorted(topics)][:max_docs]
    if name == "cpython-stdlib":
        files = sorted(_stdlib_dir().glob("*.py"))[: max_docs or None]
        return [Document(f"stdlib/{f.name}", read_text(f)) for f in files]
    root = Path(info["path"])
    if not root.is_dir():
        raise BadInput(f"corpus {name!r} is not installed; install it with: {info['install']}")
    if name == "fortunes":
        return _fortunes(root, max_docs)
    # the HTML pages only (python-docs also ships its reStructuredText sources under _sources/)
    files = sorted(f for f in root.rglob("*.html") if not any(part.startswith("_") for part in f.relative_to(root).parts))
    docs: list[Document] = []
    for f in files:
        docs.extend(_read_file(f, f.relative_to(root).as_posix()))
        if max_docs and len(docs) >= max_docs:
            break
    return docs


def _fortunes(root: Path, max_docs: int | None) -> list[Document]:
    """One document per fortune (entries are separated by a line ``%``), named ``FILE#i``."""
    docs: list[Document] = []
    for f in FORTUNE_FILES:
        if not (root / f).is_file():
            continue
        parts = re.split(r"^%$", read_text(root / f), flags=re.MULTILINE)
        docs.extend(Document(f"{f}#{i + 1}", t.strip()) for i, t in enumerate(parts) if t.strip())
    return docs[: max_docs or None]


def load_documents(spec: str | Path, max_docs: int | None = None) -> list[Document]:
    """Read a corpus: a named corpus, a file, or a directory (recursively).

    Args:
        spec: a key of :data:`NAMED_CORPORA`, a path, or ``-`` (standard input). Files are read by
            :func:`vocablens.files.read_text` (a byte-order mark skipped or decoded, undecodable
            bytes refused).
        max_docs: keep at most this many documents (in sorted order).

    Returns:
        Non-empty documents, in a deterministic order.

    Raises:
        BadInput: the path does not exist, a file does not decode (name and byte offset), a named corpus is not installed (with the command that
            installs it), the corpus holds no text, or ``max_docs`` is negative.
    """
    if max_docs is not None and max_docs < 0:
        raise BadInput(f"the number of documents to read must be >= 0 (0 = all); got {max_docs}")
    if str(spec) in NAMED_CORPORA:
        docs = _named(str(spec), max_docs)
    elif str(spec) == STDIN:  # one text from standard input
        docs = [Document("stdin", read_text(STDIN, "`corpus`"))]
    else:
        p = Path(spec).expanduser()
        if not p.exists():
            names = ", ".join(NAMED_CORPORA)
            raise BadInput(f"corpus {str(spec)!r} does not exist (give a file, a directory, or one of: {names})")
        if p.is_file():
            docs = _read_file(p)
        else:
            suffixes = TEXT_SUFFIXES + HTML_SUFFIXES + JSONL_SUFFIXES + CODE_SUFFIXES
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in suffixes)
            docs = []
            for f in files:
                docs.extend(_read_file(f, f.relative_to(p).as_posix()))
                if max_docs and len(docs) >= max_docs:
                    break
    docs = [d for d in docs if d.text.strip()][: max_docs or None]
    if not docs:
        raise BadInput(f"corpus {str(spec)!r} holds no text")
    if len(docs) == 1:  # one long text (a notes file): documents as a reader would cut it
        docs = split_text(docs[0])[: max_docs or None]
    return docs


#: target size of the documents a single long text is cut into (characters; about 500 tokens of prose).
PART_CHARS = 2000


def _units(text: str, limit: int) -> list[str]:
    """Paragraphs of ``text``; a paragraph over ``limit`` characters is cut at lines, then sentences,
    then whitespace."""
    import re

    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        if not para.strip():
            continue
        pieces = [para]
        for sep in ("\n", ". ", " "):
            nxt = []
            for piece in pieces:
                if len(piece) <= limit:
                    nxt.append(piece)
                    continue
                parts = piece.split(sep)
                nxt += [x + (sep if i < len(parts) - 1 and sep != "\n" else "") for i, x in enumerate(parts)]
            pieces = nxt
        for piece in pieces:  # a single word longer than the limit: hard cut
            out += [piece[i: i + limit] for i in range(0, len(piece), limit)] if len(piece) > limit else [piece]
    return [u for u in out if u.strip()]


def split_text(doc: Document, part_chars: int = PART_CHARS) -> list[Document]:
    """Cut one long document into consecutive documents of about ``part_chars`` characters (at least
    ``part_chars``, except the last), at paragraph boundaries where it can; names ``NAME#1``, ``NAME#2``...

    A text no longer than twice ``part_chars`` stays one document.

    Raises:
        BadInput: ``part_chars`` < 1.
    """
    if part_chars < 1:
        raise BadInput(f"part_chars must be at least 1; got {part_chars}")
    if len(doc.text) <= 2 * part_chars:
        return [doc]
    parts: list[str] = []
    cur: list[str] = []
    size = 0
    for u in _units(doc.text, part_chars):
        cur.append(u)
        size += len(u)
        if size >= part_chars:
            parts.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        if parts and size < part_chars // 2:
            parts[-1] += "\n\n" + "\n\n".join(cur)
        else:
            parts.append("\n\n".join(cur))
    return [Document(f"{doc.name}#{i + 1}", t) for i, t in enumerate(parts)]


def corpus_record(spec: str | Path, docs: list[Document]) -> dict:
    """How a file that vocablens writes names a corpus: ``{"corpus": NAME, "corpus_sha256": HEX,
    "documents": N}``.

    NAME is the named corpus, or the last component of the path the user gave (never the path: a
    lens file travels to other machines). The hash is SHA-256 over the SHA-256 of each document's
    UTF-8 text, in load order, so the same content hashes the same wherever it lies.
    """
    name = str(spec) if str(spec) in NAMED_CORPORA else (Path(str(spec)).expanduser().name or str(spec))
    h = hashlib.sha256()
    for d in docs:
        h.update(hashlib.sha256(d.text.encode("utf-8")).digest())
    return {"corpus": name, "corpus_sha256": h.hexdigest(), "documents": len(docs)}


def split_documents(docs: list[Document], val_fraction: float = 0.1, seed: int = 0
                    ) -> tuple[list[Document], list[Document]]:
    """Split by document, deterministically: a document goes to validation when a hash of its name
    (salted with ``seed``) falls below ``val_fraction``. Both parts non-empty when len(docs) >= 2."""
    if not 0 <= val_fraction < 1:
        raise BadInput(f"val_fraction must be in [0, 1); got {val_fraction}")

    def u(d: Document) -> float:
        h = hashlib.sha256(f"{seed}:{d.name}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64

    train = [d for d in docs if u(d) >= val_fraction]
    val = [d for d in docs if u(d) < val_fraction]
    if val_fraction > 0 and len(docs) >= 2:
        if not val:
            val, train = [min(train, key=u)], [d for d in train if d is not min(train, key=u)]
        if not train:
            train, val = [max(val, key=u)], [d for d in val if d is not max(val, key=u)]
    return train, val


def pack_tokens(docs: Iterable[Document], tokenizer, seq_len: int, eos_id: int | None = None,
                max_tokens: int | None = None, shrink: bool = False) -> torch.Tensor:
    """Token-pack documents into rows of ``seq_len`` ids with EOS between documents.

    Args:
        shrink: when the text holds fewer than ``seq_len`` (but at least 2) tokens, return one
            shorter row of all of them instead of failing (evaluation on a small held-out part).

    Returns:
        [N, seq_len] int64 (or [1, n < seq_len] with ``shrink``); the tail that does not fill a row
        is dropped.

    Raises:
        BadInput: ``seq_len`` < 2, or too little text for one row.
    """
    if seq_len < 2:
        raise BadInput(f"seq_len must be at least 2; got {seq_len}")
    if eos_id is None:
        eos_id = tokenizer.eos_token_id
    stream: list[int] = []
    for d in docs:
        stream.extend(tokenizer(d.text, add_special_tokens=False).input_ids)
        if eos_id is not None:
            stream.append(int(eos_id))
        if max_tokens is not None and len(stream) >= max_tokens:
            stream = stream[:max_tokens]
            break
    if shrink and 2 <= len(stream) < seq_len:
        seq_len = len(stream)
    n = len(stream) // seq_len
    if n == 0:
        raise BadInput(f"corpus has {len(stream)} tokens, fewer than one row of {seq_len}")
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)
