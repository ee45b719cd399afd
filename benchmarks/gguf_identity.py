"""What finding a GGUF file's cache entry by its whole content costs (issue 43), on one file.

Measured side by side in one run, each the best of ``--repeat`` alternating rounds, the file in the
page cache (a cold read adds the disk's own time, the same for every hash):

* hashes of the whole file with large reads (4 MiB, ``readinto``): sha256, blake2b, sha1, md5, in
  seconds per GB (10^9 bytes) — the standard library's choices; sha256 uses the CPU's SHA
  instructions where it has them;
* the cache key as it was (name, size and SHA-256 of the first, middle and last MiB) against
  :func:`vocablens.models.files.gguf_cache.file_identity` the first time (the whole file hashed, the stat
  stored) and later (the stored stat matches: no read of the file);
* reading the header: ``gguf.GGUFReader`` (what provenance used) against
  :func:`vocablens.models.files.gguf_header.read_header`.

Run: ``PYTHONPATH=src python benchmarks/gguf_identity.py [--model FILE.gguf] [--repeat 3]``
(default: the default model's Q4_1 file, 98 MB).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path


def hash_file(path: Path, name: str, chunk: int = 1 << 22) -> str:
    h = hashlib.new(name)
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def sampled_identity(path: Path, sample: int = 1 << 20) -> str:
    """The key before issue 43: name, size, SHA-256 of the first, middle and last ``sample`` bytes."""
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}|{size}".encode())
    with open(path, "rb") as f:
        for start in sorted({0, max(0, size // 2 - sample // 2), max(0, size - sample)}):
            f.seek(start)
            h.update(f.read(sample))
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a .gguf file (default: the default model's)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from vocablens.models.files.spec import default_gguf_path

    path = Path(args.model) if args.model else default_gguf_path()
    size = path.stat().st_size
    os.environ["VOCABLENS_CACHE"] = tempfile.mkdtemp(prefix="vocablens-bench-")
    import vocablens.models.files.gguf_cache as G
    from vocablens.models.files.gguf_header import read_header

    hash_file(path, "sha256")  # into the page cache
    best: dict[str, float] = {}

    def timed(label, fn):
        t = time.perf_counter()
        fn()
        best[label] = min(best.get(label, float("inf")), time.perf_counter() - t)

    from gguf import GGUFReader

    for _ in range(args.repeat):
        for name in ("sha256", "blake2b", "sha1", "md5"):
            timed(f"hash {name}", lambda n=name: hash_file(path, n))
        timed("key before: name, size, 3 x 1 MiB", lambda: sampled_identity(path))
        G._MEMO.clear()
        for p in (Path(os.environ["VOCABLENS_CACHE"]) / "hashes").glob("*.json"):
            p.unlink()
        timed("file_identity, first time (whole file)", lambda: G.file_identity(path))
        G._MEMO.clear()  # a later process: the stored stat answers
        timed("file_identity, later process (stored stat)", lambda: G.file_identity(path))
        timed("header: gguf.GGUFReader", lambda: GGUFReader(str(path)))
        timed("header: gguf_header.read_header", lambda: read_header(path))
    print(f"{path.name}: {size / 1e9:.3f} GB; load average {open('/proc/loadavg').read().split()[0]}"
          if os.path.exists("/proc/loadavg") else f"{path.name}: {size / 1e9:.3f} GB")
    for label, s in best.items():
        per_gb = f"  ({s / (size / 1e9):.2f} s/GB)" if label.startswith("hash") else ""
        print(f"  {label:48s} {s * 1e3:9.1f} ms{per_gb}")


if __name__ == "__main__":
    main()
