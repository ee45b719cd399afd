"""benchmarks/gpu.py (issue 49 D) runs end to end: ``--dry-run`` measures every job on a tiny random
model on the CPU and writes its JSON; without a CUDA device (and without ``--dry-run``) it refuses in
one line. (The figures themselves need a GPU: docs/performance.md, section GPU.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_dry_run_measures_every_job_and_writes_json(tmp_path, capsys):
    import gpu

    out = tmp_path / "gpu.json"
    assert gpu.main(["--dry-run", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["dry_run"] and res["card"] == "CPU (--dry-run)"
    tiny = res["models"]["tiny"]
    assert (tiny["V"], tiny["d"], tiny["blocks"]) == (300, 64, 2)
    jobs = tiny["jobs"]
    assert set(jobs) == {"logit lens, 3 layers x 16 positions", "score, 16 tokens", "score, 64 tokens",
                         "Jacobian-lens fit", "argmax scan of the model's head"}
    for name in ("logit lens, 3 layers x 16 positions", "score, 16 tokens", "score, 64 tokens"):
        assert set(jobs[name]["times_s"]) >= {"vocablens", "transformers"}  # the peer beside it, same run
        assert all(t > 0 for t in jobs[name]["times_s"].values())
        assert set(jobs[name]["ratios"]) >= {"transformers"}
    head = jobs["argmax scan of the model's head"]["counts"]
    assert head["undecided"] == 0 and sum(head.values()) == 300  # every row decided or proved
    rnd = res["random_head"]
    assert rnd["shape"] == [512, 16] and rnd["counts"]["undecided"] == 0 and sum(rnd["counts"].values()) == 512
    text = capsys.readouterr().out
    assert "card: CPU (--dry-run)" in text and "vocablens / transformers" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the benchmark would run")
def test_refuses_without_cuda_in_one_line(tmp_path, capsys):
    import gpu

    assert gpu.main(["--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("benchmarks/gpu.py: no CUDA device here")
    assert not (tmp_path / "x.json").exists()
