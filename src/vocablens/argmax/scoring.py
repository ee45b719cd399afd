"""Scores of many certificate directions against all rows on the int8 grid, the near calls exact.

The reflect stage scores each open row's direction ``y`` against every row: ``z_j . y`` for all j,
``m`` directions at a time. In float32 that is one ``[m, r] x [r, n]`` GEMM per pass; here the
directions go on int8 grids of their own (``y = s_y q_y + e_y``) and the product ``Q q_y`` runs in
exact int32 arithmetic (``torch._int_mm``: 3-5x the float32 GEMM's throughput on AVX-512 VNNI,
measured), with the rigorous bound

    |z_j . y - qs s_y (q_j . q_y)| <= qs ||q_j|| ||e_y|| + ||e_j|| ||y||      (z_j = qs q_j + e_j)

taken at its largest over j (``||q_j|| <= max``, ``||e_j|| <= enorm``). A direction is certified
when every other row's upper bound is below the row's own score (computed in float64 with a bound
on the float32 storage of Z); rows whose upper bound reaches it (a near-duplicate twin, a cluster
mate) are scored exactly from Z in float64, at most :data:`NEAR_MAX` of them per direction.
Every certificate from this stage is re-checked in float64 in the original coordinates by stage
``verify`` as before.
"""

from __future__ import annotations

import numpy as np
import torch

from vocablens.argmax.state import U32, ScanState, run_in_workers

#: rows scored exactly per direction at most (their int8 upper bound reaches the row's own score)
NEAR_MAX = 64
U64 = 2.0 ** -53


def int8_ready(st: ScanState) -> bool:
    """Whether the int8 path can run: Q resident, r a multiple of 8, ``torch._int_mm`` present and
    equal to an int64 reference on a sample of Q's rows (checked once per scan)."""
    if getattr(st, "_int8_ok", None) is None:
        ok = st.Qt is not None and st.r % 8 == 0 and hasattr(torch, "_int_mm") and st.n >= 64
        if ok:
            A = st.Qt[:32]
            B = st.Qt[: min(st.n, 256)]
            try:
                ok = torch.equal(torch._int_mm(A.contiguous(), B.T).long(), A.long() @ B.long().T)
            except RuntimeError:
                ok = False
        st._int8_ok = bool(ok)
        if ok:
            st._qn_max = float(np.sqrt((st.Qt.to(torch.int32) ** 2).sum(1).max().item()))
    return st._int8_ok


def int8_scores(st: ScanState, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(S, beta)``: S float32 [m, n] with ``|z_j . y_q - S[q, j]| <= beta[q]`` (float64 [m]) for
    every row j, for directions Y float32 [m, r] (m >= 32). Needs :func:`int8_ready`."""
    m, r = Y.shape
    Y64 = Y.astype(np.float64)
    sy = np.abs(Y64).max(1) / 127.0
    sy[sy == 0] = 1.0
    Qy = np.rint(Y64 / sy[:, None])
    ey = np.linalg.norm(Y64 - sy[:, None] * Qy, axis=1)
    Qy_t = torch.from_numpy(Qy.astype(np.int8))
    yn = np.linalg.norm(Y64, axis=1)
    qs = st.qs
    scale = (qs * sy).astype(np.float32)
    n = st.n
    S = np.empty((m, n), dtype=np.float32)
    workers = max(1, min(torch.get_num_threads(), n // 4096))
    cuts = np.linspace(0, n, workers + 1).astype(np.int64)

    def part(w: int, _w: int) -> None:
        a, b = int(cuts[w]), int(cuts[w + 1])
        P = torch._int_mm(Qy_t, st.Qt[a:b].T)                 # exact int32 [m, b - a]
        np.multiply(P.numpy(), scale[:, None], out=S[:, a:b], casting="unsafe")

    run_in_workers(range(workers), part, workers, static=True)
    # the int32 products are exact and below 2^24 (127^2 r, r <= 1,040): the float32 copy is exact;
    # the scaling rounds once (relative U32 of a score at most qs s_y 127^2 r)
    beta = (qs * st._qn_max * ey + (float(st.enorm.max()) + st.emax) * yn +
            2 * U32 * qs * sy * 127.0 * 127.0 * r) * 1.01
    return S, beta


def certify(st: ScanState, cols: np.ndarray, Y: np.ndarray, S: np.ndarray, beta: np.ndarray):
    """Judge directions Y [m, r] for rows ``cols`` from int8 scores (``S`` [m, n], own entries
    masked to -inf by the caller) and their bounds: ``(done bool [m], margin float64 [m], jstar
    int64 [m])``, jstar the best competitor (exact where the near rows were scored exactly)."""
    m = len(cols)
    Y64 = Y.astype(np.float64)
    Zn = st.Zt.numpy()
    zt = Zn[cols].astype(np.float64)
    yn = np.linalg.norm(Y64, axis=1)
    own = (zt * Y64).sum(1)
    own_lo = own - (2 * U32 + 2 * st.r * U64) * np.linalg.norm(zt, axis=1) * yn
    jstar = S.argmax(1)
    best_up = S[np.arange(m), jstar].astype(np.float64) + beta
    done = best_up < own_lo
    margin = np.where(done, own_lo - best_up, 0.0)
    for q in np.nonzero(~done)[0]:
        near = np.nonzero(S[q].astype(np.float64) + beta[q] >= own_lo[q])[0]
        if len(near) > NEAR_MAX:
            continue
        zn = Zn[near].astype(np.float64)
        ex = zn @ Y64[q] + (2 * U32 + 2 * st.r * U64) * np.linalg.norm(zn, axis=1) * yn[q]
        k = int(np.argmax(ex))
        jstar[q] = near[k]
        # rows outside ``near`` are below own_lo by their int8 bound; the near ones by their exact score
        if ex[k] < own_lo[q]:
            done[q] = True
            rest = S[q].astype(np.float64) + beta[q]
            rest[near] = -np.inf
            margin[q] = own_lo[q] - max(float(ex[k]), float(rest.max()))
    return done, margin, jstar


__all__ = ["NEAR_MAX", "certify", "int8_ready", "int8_scores"]
