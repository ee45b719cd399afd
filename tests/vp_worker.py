"""Worker run in each spawned process of the vocab-parallel tests (not a test module itself).

Every rank builds the same full tensors from a seed, runs the vocab-parallel ops on its shard and
compares them with the single-process computation on the full tensors; the measured errors go to
``<outdir>/rank<r>.json`` and the parent test asserts on them.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, scenarios: list[dict], outdir: str, timeout: float = 120.0) -> list[dict]:
    """Spawn ``world`` processes running :func:`worker`; kill them and raise on timeout."""
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.start_processes(worker, args=(world, port, scenarios, outdir), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} processes did not finish within {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    out = []
    for r in range(world):
        with open(os.path.join(outdir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs error relative to max(1, max |reference|)."""
    if not a.numel():
        return 0.0
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def special_logits(M: int, V: int, g: torch.Generator) -> torch.Tensor:
    """Rows with ties within and across shards, ±inf, NaN, ±0.0 and all -inf (the vLLM argmax cases)."""
    X = torch.randint(-3, 4, (M, V), generator=g).float()  # many ties
    X[0] = -math.inf
    X[1, V // 2] = math.inf
    X[1, V - 1] = math.inf
    X[2, V - 1] = math.nan
    X[2, 0] = math.nan if V > 2 else X[2, 0]
    X[3] = 0.0
    X[3, : V // 2] = -0.0
    X[4] = 7.0
    X[5, -1] = 100.0
    return X


def _check(sc: dict, rank: int, world: int) -> dict:
    from vocablens.ops.vocab_parallel import (
        VocabParallelEmbedding, VocabParallelLMHead, shard_range, vocab_parallel_argmax,
        vocab_parallel_cross_entropy, vocab_parallel_topk,
    )

    name, V, d, N = sc["name"], sc["V"], sc["d"], sc["N"]
    dtype = getattr(torch, sc.get("dtype", "float32"))
    softcap, ls = sc.get("softcap"), sc.get("label_smoothing", 0.0)
    g = torch.Generator().manual_seed(sc.get("seed", 0))
    W = (torch.randn(V, d, generator=g) * 0.5).to(dtype)
    b = (torch.randn(V, generator=g) * 0.1).to(dtype) if sc.get("bias") else None
    h = torch.randn(N, d, generator=g).to(dtype)
    ids = torch.randint(0, V, (N,), generator=g)
    tg = torch.randint(0, V, (N,), generator=g)
    if sc.get("target"):
        tg[:] = sc["target"]
    if sc.get("ignore_every"):
        tg[:: sc["ignore_every"]] = -100
    if sc.get("all_ignored"):
        tg[:] = -100
    go = torch.randn(N, d, generator=g)
    up = torch.randn(N, generator=g)
    G = torch.randn(N, V, generator=g)
    start, stop = shard_range(V, world, rank)
    from vocablens.ops.vocab_parallel.comm import world as where

    res: dict = {"world": list(where())}  # (rank, world size), the one order

    # embedding: values (exact) and gradient of this shard
    emb = VocabParallelEmbedding.from_full(W)
    out = emb(ids)
    out.float().mul(go).sum().backward()
    Wf = W.clone().requires_grad_()
    ref = F.embedding(ids, Wf)
    ref.float().mul(go).sum().backward()
    res["emb_equal"] = bool(torch.equal(out, ref))
    res["emb_grad_err"] = _err(emb.weight.grad, Wf.grad[start:stop])
    res["emb_shard_rows"] = emb.weight.shape[0]

    # LM head: cross-entropy values and gradients (hidden replicated, weight/bias sharded)
    head = VocabParallelLMHead.from_full(W, b, softcap=softcap)
    for red in ("mean", "sum", "none"):
        head.zero_grad()
        x = h.clone().requires_grad_()
        loss = head.cross_entropy(x, tg, label_smoothing=ls, reduction=red)
        (loss * up).sum().backward() if red == "none" else (loss * 1.5).backward()
        xr = h.double().clone().requires_grad_()
        Wr = W.double().clone().requires_grad_()
        br = b.double().clone().requires_grad_() if b is not None else None
        z = F.linear(xr, Wr, br)
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        lref = F.cross_entropy(z, tg, label_smoothing=ls, reduction=red, ignore_index=-100)
        if red == "mean" and bool((tg == -100).all()):
            lref = z.sum() * 0.0
        (lref * up.double()).sum().backward() if red == "none" else (lref * 1.5).backward()
        scale = max(1.0, float(lref.detach().abs().max()))
        res[f"ce_{red}_err"] = _err(loss, lref) / scale
        res[f"ce_{red}_dx_err"] = _err(x.grad, xr.grad)
        res[f"ce_{red}_dW_err"] = _err(head.weight.grad, Wr.grad[start:stop])
        if b is not None:
            res[f"ce_{red}_db_err"] = _err(head.bias.grad, br.grad[start:stop])

    # logsumexp and log-softmax (with gradients through the sharded output)
    head.zero_grad()
    x = h.clone().requires_grad_()
    lp_local = head.log_softmax(x)
    (lp_local * G[:, start:stop]).sum().backward()
    xr = h.double().clone().requires_grad_()
    z = F.linear(xr, W.double(), None if b is None else b.double())
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    lp = torch.log_softmax(z, -1)
    (lp * G.double()).sum().backward()
    res["log_softmax_err"] = _err(lp_local, lp[:, start:stop])
    res["log_softmax_dx_err"] = _err(x.grad, xr.grad)
    with torch.no_grad():
        res["lse_err"] = _err(head.logsumexp(h), torch.logsumexp(z, -1))
        full = head.gather_logits(h)
        res["gather_err"] = _err(full, z)
        res["gather_shape"] = list(full.shape)
    x = h.clone().requires_grad_()
    (head.gather_logits(x) * G).sum().backward()
    xr2 = h.double().clone().requires_grad_()
    zz = F.linear(xr2, W.double(), None if b is None else b.double())
    if softcap:
        zz = softcap * torch.tanh(zz / softcap)
    (zz * G.double()).sum().backward()
    res["gather_dx_err"] = _err(x.grad, xr2.grad)

    # argmax / top-k on crafted logits: bit-for-bit against torch
    X = special_logits(8, V, g)
    for dt in ("float32", "bfloat16"):
        Xd = X.to(getattr(torch, dt))
        loc = Xd[:, start:stop]
        am = vocab_parallel_argmax(loc, start)
        res[f"argmax_{dt}_equal"] = bool(torch.equal(am, torch.argmax(Xd, -1)))
        k = min(sc.get("k", 5), V)
        tv, ti = vocab_parallel_topk(loc, k, start, V)
        rv = torch.topk(Xd, k, -1).values
        sv, si = torch.sort(Xd, dim=-1, descending=True, stable=True)
        res[f"topk_{dt}_values_equal"] = bool(torch.equal(torch.nan_to_num(tv, nan=12345.0),
                                                          torch.nan_to_num(rv, nan=12345.0))
                                              and torch.equal(tv.isnan(), rv.isnan()))
        res[f"topk_{dt}_ids_equal"] = bool(torch.equal(ti, si[:, :k]))
        # ids equal torch.topk's wherever the k values are all distinct from the rest
        res[f"topk_{dt}_dtype"] = str(tv.dtype)
    # the model's own argmax through the head
    with torch.no_grad():
        zf = F.linear(h, W, b).float()
        if softcap:
            zf = torch.tanh(zf / softcap) * softcap
        res["head_argmax_equal"] = bool(torch.equal(head.argmax(h), torch.argmax(zf, -1)))

    if sc.get("megatron"):
        # Megatron-LM test_cross_entropy: local logits arange(8) repeated (local V=32, 4 ranks -> 128)
        loc = torch.arange(0, 8, dtype=torch.float32).repeat(16, 4)
        tgt = torch.arange(0, 32, 2)
        mstart, _ = shard_range(32 * world, world, rank)
        loss = vocab_parallel_cross_entropy(loc, tgt, mstart, 32 * world, reduction="none")
        res["megatron_loss"] = [round(v, 4) for v in loss.tolist()]
    return {f"{name}/{k}": v for k, v in res.items()}


def worker(rank: int, world: int, port: int, scenarios: list[dict], outdir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        res = {}
        for sc in scenarios:
            res.update(_check(sc, rank, world))
        tmp = os.path.join(outdir, f".rank{rank}.json")
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, os.path.join(outdir, f"rank{rank}.json"))
        dist.barrier()  # no rank tears down its gloo pairs while another still uses them
    finally:
        dist.destroy_process_group()
