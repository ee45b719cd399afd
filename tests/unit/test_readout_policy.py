"""Policy: one readout path over the vocabulary (issue 23 §2).

Outside ``vocablens/ops`` and ``vocablens/models`` no module normalizes scores over V itself
(``log_softmax`` / ``logsumexp`` / ``softmax`` / ``logaddexp`` in any form, the losses built on them) or
builds the [V, d] readout (``.readout(``): they go through :class:`vocablens.models.unembed.Unembedding`
(``scores``, ``readout_rows``, ``logits``, ``constant``) and ``vocablens.ops`` (``token_logprobs``,
``kl_readout``, ``ops.rows``, ``ops.gram``).
"""

import ast
from pathlib import Path

import vocablens

SRC = Path(vocablens.__file__).parent
#: normalizations over a dimension (functional, method, private-kernel, in-place-free module forms),
#: the losses that contain one, and the whole-readout accessor
BANNED = {
    "log_softmax", "logsumexp", "softmax", "_softmax", "_log_softmax", "logaddexp", "logaddexp2",
    "logcumsumexp", "gumbel_softmax", "cross_entropy", "nll_loss", "kl_div",
    "Softmax", "LogSoftmax", "Softmax2d", "CrossEntropyLoss", "NLLLoss", "KLDivLoss", "readout",
}
# (module, callee text, line text fragment) -> reason: none left (every normalization over V outside
# ops/models goes through ops.rows / ops.token_logprobs / ops.kl_readout / ops.gram; the argmax
# optimizer's softmax over its M candidate rows is ops.rows.row_softmax; NormLinearization's pull-back
# is ``pull_back``, not ``readout``). A new entry needs a reason why its dimension is not the vocabulary.
ALLOWED: dict[tuple[str, str, str], str] = {}


def _calls(root: Path = SRC):
    """``(module, text, line, lineno)`` of every banned name outside ops/ and models/: called
    (``torch.softmax(z)``, ``z.softmax(-1)``, ``F.log_softmax``, ``torch.special.logsumexp``), referenced
    as a value (``fn = torch.log_softmax``), or imported from torch (``from torch import softmax``)."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("ops/", "models/")):
            continue
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                for a in node.names:
                    if a.name in BANNED:
                        yield rel, f"from {node.module} import {a.name}", lines[node.lineno - 1].strip(), node.lineno
            elif isinstance(node, ast.Attribute) and node.attr in BANNED:
                yield rel, ast.unparse(node), lines[node.lineno - 1].strip(), node.lineno
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BANNED:
                yield rel, node.func.id, lines[node.lineno - 1].strip(), node.lineno


def test_no_vocabulary_normalization_or_readout_outside_ops_and_models():
    bad, used = [], set()
    for rel, callee, line, no in _calls():
        key = next((k for k in ALLOWED if k[0] == rel and k[1] == callee and k[2] in line), None)
        if key is None:
            bad.append(f"{rel}:{no}: {callee}(...)  [{line}]")
        else:
            used.add(key)
    assert not bad, "readout / normalization over V outside ops and models:\n" + "\n".join(bad)
    assert used == set(ALLOWED), f"stale allow-list entries: {set(ALLOWED) - used}"


def test_the_scan_sees_a_banned_call(tmp_path):
    """The scanner itself: a planted use of each form outside ops/models is found (functional, method,
    F. and special forms, a reference, a bare imported name, a module class, a private kernel, a
    streamed logaddexp, a loss), the same code inside ops/ and models/ is not (the check is not vacuous)."""
    src = ("import torch\nimport torch.nn.functional as F\nfrom torch.nn.functional import log_softmax\n"
           "x = torch.log_softmax(z, -1)\ny = torch.logsumexp(z, 0)\nw = U.readout(True)\nq = z.softmax(-1)\n"
           "a = F.log_softmax(z, 1)\nb = torch.special.logsumexp(z, 1)\nfn = torch.softmax\nc = log_softmax(z, 1)\n"
           "m = torch.nn.LogSoftmax(1)\nk = torch._log_softmax(z, 1, False)\nl = torch.logaddexp(l, s)\n"
           "e = F.cross_entropy(z, t)\n")
    for sub in ("lens", "ops", "models"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "m.py").write_text(src)
    found = sorted((no, callee) for rel, callee, _, no in _calls(tmp_path) if rel == "lens/m.py")
    assert all(rel == "lens/m.py" for rel, *_ in _calls(tmp_path))
    assert found == [(3, "from torch.nn.functional import log_softmax"), (4, "torch.log_softmax"),
                     (5, "torch.logsumexp"), (6, "U.readout"), (7, "z.softmax"), (8, "F.log_softmax"),
                     (9, "torch.special.logsumexp"), (10, "torch.softmax"), (11, "log_softmax"),
                     (12, "torch.nn.LogSoftmax"), (13, "torch._log_softmax"), (14, "torch.logaddexp"),
                     (15, "F.cross_entropy")]


def test_row_logprobs_and_top1_against_float64_log_softmax():
    import math

    import torch

    from vocablens.ops import row_logprobs, row_top1_prob

    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 97, generator=g) * 30
    z[:, 90:] = float("-inf")  # padding rows stay -inf
    ref = torch.log_softmax(z.double(), -1)
    got = row_logprobs(z, dtype=torch.float64)
    assert got.dtype == torch.float64 and torch.isneginf(got[:, 90:]).all()
    assert (got[:, :90] - ref[:, :90]).abs().max() <= 1e-12
    assert (row_logprobs(z.double().T.contiguous(), 0).T - ref)[:, :90].abs().max() <= 1e-12
    zz = z.clone()
    out = row_logprobs(zz, inplace=True)
    assert out.data_ptr() == zz.data_ptr() and (out[:, :90].double() - ref[:, :90]).abs().max() <= 1e-4
    p1 = row_top1_prob(z.double())
    assert (p1 - ref.exp().amax(-1)).abs().max() <= 1e-12 and 0 < float(p1.min()) and float(p1.max()) <= 1 + 1e-12
    assert abs(float(row_top1_prob(torch.zeros(4)) ) - 0.25) <= 1e-7 and math.isfinite(float(p1.sum()))


def test_row_statistics_stream_blocks_and_equal_float64_whole_rows():
    """ops.rows' block-by-block float64 statistics (logsumexp over the first n / chosen columns, log-probs
    at chosen entries, KL with a wider normalizer, max |Δ log p| at gathered columns) against one
    whole float64 log_softmax of each matrix, with blocks of 2 rows."""
    import torch

    from vocablens.ops.rows import row_kl, row_logprobs_at, row_logsumexp, row_max_abs_logprob_diff

    g = torch.Generator().manual_seed(1)
    a = torch.randn(7, 50, generator=g) * 9
    b = a + 0.3 * torch.randn(7, 50, generator=g)
    blk = 2 * 8 * 50
    ref_a = torch.log_softmax(a.double()[:, :40], -1)              # the first 40 columns are real
    lse_a = row_logsumexp(a, 40, dtype=torch.float64, block_bytes=blk)
    assert lse_a.dtype == torch.float64 and (lse_a - torch.logsumexp(a.double()[:, :40], -1)).abs().max() <= 1e-13
    t = torch.tensor([0, 5, 39, 7, 7, 1, 20])
    assert (row_logprobs_at(a, t[:, None], lse_a)[:, 0] - ref_a.gather(1, t[:, None])[:, 0]).abs().max() <= 1e-13
    lse_b = row_logsumexp(b, dtype=torch.float64, block_bytes=blk)     # q over all 50 columns
    lq = torch.log_softmax(b.double(), -1)[:, :40]
    kl = row_kl(a[:, :40], b[:, :40], ref_lse=lse_a, lse=lse_b, dtype=torch.float64, block_bytes=blk)
    assert (kl - (ref_a.exp() * (ref_a - lq)).sum(-1)).abs().max() <= 1e-13 and bool((kl > 0).all())
    same = row_kl(a, a, dtype=torch.float64, block_bytes=blk)
    assert same.abs().max() <= 1e-13
    cols = torch.tensor([3, 1, 4, 15, 9, 26])
    lse_k = row_logsumexp(b, cols, dtype=torch.float64, block_bytes=blk)
    lse_c = row_logsumexp(a[:, :6], dtype=torch.float64)
    d = row_max_abs_logprob_diff(a[:, :6], b, a_lse=lse_c, b_lse=lse_k, b_cols=cols, block_bytes=blk)
    want = (torch.log_softmax(a.double()[:, :6], -1) - torch.log_softmax(b.double()[:, cols], -1)).abs().amax(-1)
    assert (d - want).abs().max() <= 1e-13
