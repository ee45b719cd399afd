"""Helpers of the benchmarks that time vocablens beside a peer: real text, calls alternated in one process,
and the ratios a busy machine still supports (the median of the per-round ratios).

Not a module of the library: the benchmarks import it from their own folder.
"""

from __future__ import annotations

import statistics
import time


def corpus_text(tokenizer, n_tokens: int) -> str:
    """The first documents of the ``pydoc-topics`` corpus, joined, holding at least ``n_tokens`` tokens."""
    from vocablens.corpus import load_documents

    parts, n = [], 0
    for doc in load_documents("pydoc-topics"):
        parts.append(doc.text)
        n += len(tokenizer(doc.text).input_ids)
        if n >= n_tokens + 64:
            break
    text = "\n\n".join(parts)
    got = len(tokenizer(text).input_ids)
    if got < n_tokens:
        raise SystemExit(f"the corpus holds {got} tokens, fewer than the {n_tokens} the jobs read")
    return text


def timed(torch, methods, arg, reps: int):
    """Each method once (warm-up, the values compared), then ``reps`` rounds, the order reversed every
    other round (ABBA: neither side always runs right after the other's allocations).

    Returns ``(best, out, rounds)``: the minimum wall time per method, the warm-up's values, and per
    method the list of ``(wall s, CPU s)`` of every round (CPU: the process's, all threads)."""
    rounds = {k: [] for k in methods}
    out = {}
    with torch.inference_mode():
        for k, f in list(methods.items()):
            try:
                out[k] = f(arg)  # warm-up, and the values compared
            except Exception as e:  # noqa: BLE001 (a peer's API that fails here is dropped, said why)
                if k.startswith("vocablens") or k in ("transformers", "torch"):
                    raise
                print(f"peer dropped from this job: {k}: {type(e).__name__}: {str(e)[:160]}")
                del methods[k], rounds[k]
        for rep in range(reps):
            for k, f in (list(methods.items()) if rep % 2 == 0 else list(methods.items())[::-1]):
                c0, t0 = time.process_time(), time.perf_counter()
                f(arg)
                rounds[k].append((time.perf_counter() - t0, time.process_time() - c0))
    best = {k: min(w for w, _ in v) for k, v in rounds.items()}
    return best, out, rounds


def paired(rounds, ours: str, peer: str) -> dict:
    """vocablens / peer: ratio of the minima and median of the per-round ratios, wall and CPU."""
    a, b = rounds[ours], rounds[peer]
    return {"min_wall": min(w for w, _ in a) / min(w for w, _ in b),
            "median_wall": statistics.median(x[0] / y[0] for x, y in zip(a, b)),
            "min_cpu": min(c for _, c in a) / min(c for _, c in b),
            "median_cpu": statistics.median(x[1] / y[1] for x, y in zip(a, b))}
