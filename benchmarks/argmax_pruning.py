"""How much of the all-pairs stage a head/tail bound could skip (a design measurement for issue 26).

The exact argmax scan's first stage compares every pair of whitened rows (``y = z_t`` against every
``z_j``; :mod:`vocablens.argmax.certificates`). A FEXIPRO-style bound (Li et al. 2017, §4: an exact
product over the first k coordinates plus Cauchy-Schwarz on the rest) clears a pair without its
full product when

    z_t[:k] . z_j[:k] + ||z_t[k:]|| ||z_j[k:]||  <  T_t,

where ``T_t`` is the row's threshold: its own score minus the certificate's rounding slack. Rows
that fail the bound somewhere in a block need the full product against that block.

This script measures, on a sample of the scan's blocks (1,024 rows x 512 columns of the upper
triangle, rows sorted by norm so that a block holds rows of similar length), the multiply-adds such
a stage would do as a fraction of the full-width triangle, for several k and two thresholds:

- ``float``: the float32 row as the direction (slack ~1e-4 of the own score: the float32 GEMM's
  rounding bound, gamma_r ||z_j|| ||z_t||, and Z's storage);
- ``int8``: the int8 grid row ``y_t = qs q_t`` as the direction, as the scan does today, with the
  grid's slack ``max_j ||e_j|| ||y_t||`` (``e = z - qs q``) taken off the own score; the bound is
  applied to ``z_j . y_t`` itself, where the scan would apply it to the grid rows' integer products
  (an estimate of that test, not the test).

It prints, per k, the work fraction (product over the first k coordinates for every pair, plus the
remaining ``r - k`` for every failing row and column of a block) and the share of failing rows.
No timing: the fraction is what a kernel could at best save; the elementwise bound checks and the
gathers of failing rows cost extra.

    python benchmarks/argmax_pruning.py                  # the default model's head
    python benchmarks/argmax_pruning.py --trained-like --V 32768 --d 576
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def whitened(W: np.ndarray) -> np.ndarray:
    """Centred and whitened rows (float64 eigen-decomposition of the covariance), float32 [V, r]."""
    X = W.astype(np.float64)
    X -= X.mean(0)
    lam, vec = np.linalg.eigh(X.T @ X)
    keep = lam > lam[-1] * 1e-12
    return (X @ (vec[:, keep] / np.sqrt(lam[keep]))).astype(np.float32)


def thresholds(Z: np.ndarray, kind: str) -> np.ndarray:
    """float64 [V]: the score a competitor must stay under for row t's certificate to hold."""
    z64 = Z.astype(np.float64)
    own = np.einsum("ij,ij->i", z64, z64)
    if kind == "float":
        return own * (1 - 1e-4)
    qs = np.abs(Z).max() * (1 + 1e-6) / 127.0
    q = np.rint(z64 / qs)
    e = np.sqrt(((z64 - qs * q) ** 2).sum(1))
    y = qs * q
    own_q = np.einsum("ij,ij->i", z64, y)
    return own_q - e.max() * np.sqrt((y * y).sum(1))            # both sides in units of z . y


def work_fraction(Z: np.ndarray, T: np.ndarray, k: int, blocks, kind: str) -> tuple[float, float]:
    """(multiply-adds / full-width ones, failing rows per block row) over the sampled blocks."""
    n, r = Z.shape
    if kind == "int8":          # the int8 direction y = qs q_t: the bound's left side in z . y units
        qs = np.abs(Z).max() * (1 + 1e-6) / 127.0
        Y = (qs * np.rint(Z.astype(np.float64) / qs)).astype(np.float32)
    else:
        Y = Z
    tail_z = np.sqrt((Z[:, k:].astype(np.float64) ** 2).sum(1))
    tail_y = np.sqrt((Y[:, k:].astype(np.float64) ** 2).sum(1))
    work = full = 0.0
    failing = 0.0
    for i0, c0 in blocks:
        I, J = slice(i0, min(n, i0 + 1024)), slice(c0, min(n, c0 + 512))
        # row side (direction y_i, competitor z_j) and column side (direction y_j, competitor z_i)
        rows = Y[I, :k] @ Z[J, :k].T + np.outer(tail_y[I], tail_z[J])
        cols = Z[I, :k] @ Y[J, :k].T + np.outer(tail_z[I], tail_y[J])
        ii = np.arange(I.start, I.stop)[:, None] == np.arange(J.start, J.stop)[None, :]
        rows[ii] = cols[ii] = -np.inf
        fr = int((rows >= T[I, None]).any(1).sum())
        fc = int((cols >= T[None, J]).any(0).sum())
        bi, bj = rows.shape
        work += k * bi * bj + (r - k) * (fr * bj + fc * bi)
        full += r * bi * bj
        failing += fr / bi
    return work / full, failing / len(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trained-like", action="store_true", help="the synthetic trained-like head of benchmarks/argmax.py")
    ap.add_argument("--V", type=int, default=32768)
    ap.add_argument("--d", type=int, default=576)
    ap.add_argument("--blocks", type=int, default=120, help="sampled blocks of the upper triangle")
    ap.add_argument("--ks", default="", help="comma-separated k (default: r/6, r/4, r/3, r/2, 2r/3)")
    args = ap.parse_args()
    if args.trained_like:
        from argmax import trained_like          # benchmarks/argmax.py, beside this file

        f = args.V / 151936
        W, _ = trained_like(args.V, args.d, clusters=max(8, int(3000 * f)), n_reserved=max(8, int(5000 * f)),
                            n_planted=max(8, int(2000 * f)))
        W, name = W.numpy(), f"trained-like {args.V:,} x {args.d:,}"
    else:
        import vocablens

        lm = vocablens.load("smollm2")
        W, name = lm.borders.unembedding.weight.detach().float().numpy(), "default model (smollm2)"
        del lm
    Z = whitened(W)
    Z = Z[np.argsort(np.einsum("ij,ij->i", Z, Z), kind="stable")]      # rows by norm
    n, r = Z.shape
    rng = np.random.default_rng(0)
    all_blocks = [(i0, c0) for i0 in range(0, n, 1024) for c0 in range(i0, n, 512)]
    blocks = [all_blocks[i] for i in rng.choice(len(all_blocks), min(args.blocks, len(all_blocks)), replace=False)]
    ks = [int(x) for x in args.ks.split(",")] if args.ks else [r // 6, r // 4, r // 3, r // 2, 2 * r // 3]
    print(f"{name}: whitened [{n} x {r}], {len(blocks)} of {len(all_blocks)} blocks "
          f"(load average {os.getloadavg()[0]:.1f})")
    for kind in ("float", "int8"):
        T = thresholds(Z, kind)
        for k in ks:
            frac, fail = work_fraction(Z, T, k, blocks, kind)
            print(f"  {kind:5s} k = {k:4d}: work {frac:.3f} of the full-width triangle; "
                  f"failing rows per block {fail:.3f}", flush=True)


if __name__ == "__main__":
    main()
