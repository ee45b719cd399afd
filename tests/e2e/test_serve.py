"""`vocablens serve`: the real server in a subprocess, every endpoint against the CLI's --json, bad requests,
four concurrent clients, the per-prompt cache, the assets, and a clean stop on Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROMPT = "The capital of France is"


# ------------------------------------------------------------------------------------------ helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*args: str, timeout: float = 600.0):
    """Start ``vocablens serve`` on a free 127.0.0.1 port; return (process, base URL) once /api/health answers."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "vocablens", "serve", "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            get(url, "/api/health")
            return proc, url
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.5)
    proc.kill()
    raise AssertionError("the server did not answer /api/health in time")


def _open(req) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(req, timeout=900) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get(url: str, path: str):
    code, body = _open(urllib.request.Request(url + path))
    assert code == 200, (path, code, body[:300])
    return json.loads(body) if path.startswith("/api") or path.endswith(".json") else body


def post(url: str, path: str, body, raw: bool = False) -> tuple[int, dict]:
    data = body if raw else json.dumps(body).encode()
    code, out = _open(urllib.request.Request(url + path, data=data, method="POST",
                                             headers={"Content-Type": "application/json"}))
    return code, json.loads(out)


# Fields that measure float32 rounding itself (max |a - b| of two sums that are equal in exact
# arithmetic): two processes with other BLAS thread counts sum in another order, so these differ by
# their own size. Both sides must be rounding-sized, never equal to each other.
ROUNDING_RESIDUALS = {"resid_error": 1e-3, "sub_update_error": 1e-3, "model_max_abs_diff": 1e-3}


def assert_close(a, b, path: str = "$", rel: float = 1e-4, abs_: float = 2e-6) -> None:
    """Equal JSON, floats up to float32 rounding (the server and the CLI run the same code in two
    processes) and the JSON's 6 printed decimals: two values a hair apart can print one unit of
    the last decimal apart (CI: ``top_probs`` 0.005719 vs 0.005718, which ``abs_tol=1e-6`` failed
    by the float error of the difference), so the absolute tolerance is two such units."""
    key = path.rsplit(".", 1)[-1]
    if key in ROUNDING_RESIDUALS and a is not None and b is not None:
        bound = ROUNDING_RESIDUALS[key]
        assert 0 <= a <= bound and 0 <= b <= bound, (path, a, b)
    elif isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), (path, a, b)
        assert math.isclose(a, b, rel_tol=rel, abs_tol=abs_), (path, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (path, sorted(a), sorted(b) if isinstance(b, dict) else b)
        for k in a:
            assert_close(a[k], b[k], f"{path}.{k}", rel, abs_)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (path, len(a), b if not isinstance(b, list) else len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]", rel, abs_)
    else:
        assert a == b, (path, a, b)


def cli_json(cli, *args) -> dict:
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------- without the model
def test_serve_refuses_a_taken_port_in_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=SRC)
        r = subprocess.run([sys.executable, "-m", "vocablens", "serve", "--port", str(port)],
                           capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and r.stdout == ""


def test_serve_warns_when_listening_beyond_localhost(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC)
    # a model that does not exist: the warning comes before loading, then a one-line error
    r = subprocess.run([sys.executable, "-m", "vocablens", "serve", "--host", "0.0.0.0", "--port", str(free_port()),
                        "--model", str(tmp_path / "no-such-model")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "anyone who can reach this machine can use the model" in " ".join(r.stderr.split())


# --------------------------------------------------------------------------------- the real server
@pytest.fixture(scope="module")
def server(smollm2):  # the session's model first: on a cold cache its load writes the float32 cache the server reads
    proc, url = start_server()
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_health_and_openapi(server):
    _, url = server
    h = get(url, "/api/health")
    assert h["model"] == "SmolLM2-135M-Instruct" and h["provenance"]["spec"] == "smollm2"
    assert h["n_layers"] == 30 and h["vocab_size"] == 49152 and h["tuned"] == "loaded"
    paths = get(url, "/openapi.json")["paths"]
    for p in ("/api/lens", "/api/neighbors", "/api/explain", "/api/project", "/api/argmax", "/api/trajectory",
              "/api/health"):
        assert p in paths, p


@pytest.mark.slow
def test_page_and_assets_come_from_the_package(server):
    import plotly.offline

    _, url = server
    html = get(url, "/").decode()
    assert 'src="/static/plotly.min.js"' in html and 'src="/static/app.js"' in html
    assert "http://" not in html and "https://" not in html  # no CDN, nothing external
    assert get(url, "/static/plotly.min.js").decode() == plotly.offline.get_plotlyjs()
    js = get(url, "/static/app.js").decode()
    assert "fetch(" in js and "http" not in js.replace("/api/", "")
    for path in ("/docs", "/redoc", "/static/../pyproject.toml", "/static/%2e%2e/app.py", "/static/index.html/..", "/etc/passwd",
                 "/static/adapters.py"):
        code, body = _open(urllib.request.Request(url + path))
        assert code == 404 and json.loads(body) == {"error": "Not Found"}, path


@pytest.mark.slow
def test_lens_matches_cli(server, cli):
    _, url = server
    code, d = post(url, "/api/lens", {"prompt": PROMPT, "kind": "both", "k": 5})
    assert code == 200
    assert d["logit"]["layers"][-1]["positions"][-1]["top_tokens"][0] == " Paris"
    assert_close(d, cli_json(cli, "lens", PROMPT, "--positions", "all", "--kind", "both", "-k", "5"))
    code, d = post(url, "/api/lens", {"prompt": PROMPT, "kind": "logit", "k": 3, "chat": True})
    assert code == 200
    assert_close(d, cli_json(cli, "lens", PROMPT, "--positions", "all", "--kind", "logit", "-k", "3", "--chat"))


@pytest.mark.slow
def test_neighbors_project_explain_match_cli(server, cli):
    _, url = server
    code, d = post(url, "/api/neighbors", {"token": " Paris", "k": 7})
    assert code == 200 and d["queries"][0]["input"][0]["token"] == "Paris"
    assert_close(d, cli_json(cli, "neighbors", " Paris", "-k", "7"))
    # by id: the same neighbours, the query spelled as the vocabulary entry
    code, by_id = post(url, "/api/neighbors", {"token": 7042, "k": 7})
    assert code == 200 and by_id["queries"][0]["input"] == d["queries"][0]["input"]

    code, d = post(url, "/api/project", {"token": " Paris", "k": 4})
    assert code == 200 and len(d["promote"]) == 4 and len(d["suppress"]) == 4
    assert_close(d, cli_json(cli, "project", "--token", " Paris", "-k", "4"))

    for pos, target in ((-1, " Paris"), (2, " the")):
        code, d = post(url, "/api/explain", {"prompt": PROMPT, "position": pos, "target": target})
        assert code == 200, d
        # DLA and d-logprob fields are differences of logits of magnitude ~20 summed in float32
        # (rounding ~1e-5 absolute, measured 1.5e-5 between the two processes): absolute 2e-4
        assert_close(d, cli_json(cli, "explain", PROMPT, f"--position={pos}", "--token", target), abs_=2e-4)
    code, d = post(url, "/api/explain", {"prompt": PROMPT, "position": -1, "target": " Paris"})
    assert d["top1"] == " Paris" and d["target"] == " Paris"


@pytest.mark.slow
def test_trajectory_matches_the_lens(server, cli):
    """The final top-1's trajectory is the lens's final_top1_rank/prob columns; any token's rank is its place
    in the lens's top-k wherever it appears there."""
    _, url = server
    lens = cli_json(cli, "lens", PROMPT, "--positions", "2", "--kind", "both", "-k", "40")
    top1 = lens["logit"]["final_top1"][0]
    code, t = post(url, "/api/trajectory", {"prompt": PROMPT, "position": 2, "token": top1})
    assert code == 200 and t["position"] == 2 and t["token"] == top1
    for name in ("logit", "tuned"):
        layers = [ly["positions"][0] for ly in lens[name]["layers"]]
        assert t[name]["rank"] == [ly["final_top1_rank"] for ly in layers]
        assert_close(t[name]["prob"], [ly["final_top1_prob"] for ly in layers])
        assert t[name]["top1"] == [ly["top_tokens"][0] for ly in layers]
    code, t = post(url, "/api/trajectory", {"prompt": PROMPT, "position": 2, "token": " France"})
    assert code == 200
    seen = 0
    for name in ("logit", "tuned"):
        for ly, rank, p in zip([ly["positions"][0] for ly in lens[name]["layers"]], t[name]["rank"], t[name]["prob"]):
            if " France" in ly["top_tokens"]:
                j = ly["top_tokens"].index(" France")
                assert rank == j and math.isclose(p, ly["top_probs"][j], rel_tol=1e-3, abs_tol=1e-6)
                seen += 1
            else:
                assert rank >= 40
    assert seen > 0
    assert t["logit"]["rank"][-1] == t["tuned"]["rank"][-1]  # layer L is never translated


@pytest.mark.slow
def test_a_second_click_does_no_forward_pass(server):
    _, url = server
    prompt = "A second click on the same prompt reads the cache"
    assert post(url, "/api/lens", {"prompt": prompt, "kind": "both", "k": 5})[0] == 200
    click = [("/api/trajectory", {"prompt": prompt, "position": 3, "token": " the"}),
             ("/api/explain", {"prompt": prompt, "position": 3, "target": " the"})]
    first = [post(url, p, b) for p, b in click]
    n = get(url, "/api/health")["forward_passes"]
    again = [post(url, p, b) for p, b in click]
    assert again == first
    # the trajectory of another cell of the same prompt reuses the prompt's residual stream
    assert post(url, "/api/trajectory", {"prompt": prompt, "position": 5, "token": " same"})[0] == 200
    assert get(url, "/api/health")["forward_passes"] == n


BAD = [
    ("/api/lens", {"prompt": "", "kind": "both", "k": 5}, 400, "empty prompt"),
    ("/api/lens", {"prompt": "   ", "k": 5}, 400, "empty prompt"),
    ("/api/lens", {"prompt": "word " * 300, "k": 5}, 400, "at most 128"),
    ("/api/lens", {"prompt": "x" * 5000, "k": 5}, 422, "prompt"),
    ("/api/lens", {"prompt": PROMPT, "k": 0}, 422, "k"),
    ("/api/lens", {"prompt": PROMPT, "k": -3}, 422, "k"),
    ("/api/lens", {"prompt": PROMPT, "k": "5"}, 422, "k"),
    ("/api/lens", {"prompt": PROMPT, "kind": "sideways"}, 422, "kind"),
    ("/api/lens", {"prompt": 42}, 422, "prompt"),
    ("/api/lens", {"prompt": PROMPT, "extra": 1}, 422, "extra"),
    ("/api/lens", [PROMPT], 422, "JSON object"),
    ("/api/lens", b"{not json", 422, "not valid JSON"),
    ("/api/lens", b"", 422, "JSON object"),
    ("/api/neighbors", {"token": "", "k": 5}, 400, "empty token"),
    ("/api/neighbors", {"token": " Paris", "k": 0}, 422, "k"),
    ("/api/neighbors", {"token": 10 ** 9, "k": 5}, 400, "outside the vocabulary"),
    ("/api/neighbors", {"token": True, "k": 5}, 422, "token"),
    ("/api/project", {"token": " Parisxyzzy", "k": 5}, 400, "single token"),
    ("/api/project", {"token": -1, "k": 5}, 400, "outside the vocabulary"),
    ("/api/explain", {"prompt": PROMPT, "position": 5, "target": " Paris"}, 400, "outside the prompt"),
    ("/api/explain", {"prompt": PROMPT, "position": -6}, 400, "outside the prompt"),
    ("/api/explain", {"prompt": PROMPT, "position": 1.5}, 422, "position"),
    ("/api/trajectory", {"prompt": PROMPT, "position": 99, "token": " Paris"}, 400, "outside the prompt"),
    ("/api/trajectory", {"prompt": PROMPT, "position": 0, "token": " not a token at all"}, 400, "single token"),
    ("/api/trajectory", {"prompt": PROMPT, "position": 0}, 422, "token"),
    ("/api/argmax", {"token": ""}, 400, "empty token"),
    ("/api/argmax", {}, 422, "token"),
]


@pytest.mark.slow
def test_bad_requests_get_one_line_errors_and_the_server_keeps_serving(server):
    _, url = server
    for path, body, status, words in BAD:
        code, d = post(url, path, body, raw=isinstance(body, bytes))
        assert code == status, (path, body, code, d)
        assert list(d) == ["error"] and isinstance(d["error"], str), d
        assert "\n" not in d["error"] and words in d["error"], (path, body, d)
    code, d = _open(urllib.request.Request(url + "/api/lens"))  # GET on a POST endpoint
    assert code == 405 and "error" in json.loads(d)
    code, d = post(url, "/api/lens", {"prompt": PROMPT, "kind": "logit", "k": 1})
    assert code == 200 and d["layers"][-1]["positions"][-1]["top_tokens"] == [" Paris"]


@pytest.mark.slow
def test_four_concurrent_clients_get_right_answers(server, cli):
    _, url = server
    prompts = ["One two three four", "The cat sat on the", "Water boils at a temperature of",
               "def add(a, b):\n    return"]

    def client(prompt):
        a = post(url, "/api/lens", {"prompt": prompt, "kind": "logit", "k": 3})
        b = post(url, "/api/trajectory", {"prompt": prompt, "position": -1, "token": " the"})
        c = post(url, "/api/neighbors", {"token": " cat", "k": 5})
        return a, b, c

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(client, prompts))
    neighbours = cli_json(cli, "neighbors", " cat", "-k", "5")
    for prompt, (a, b, c) in zip(prompts, answers):
        assert a[0] == b[0] == c[0] == 200
        assert_close(a[1], cli_json(cli, "lens", prompt, "--positions", "all", "--kind", "logit", "-k", "3"))
        assert b[1]["tokens"] == a[1]["tokens"] and b[1]["position"] == len(a[1]["tokens"]) - 1
        assert_close(c[1], neighbours)


@pytest.mark.slow
def test_argmax_answers_from_the_cached_scan(server, cli):
    _, url = server
    code, d = post(url, "/api/argmax", {"token": " Paris"})
    assert code in (200, 202)
    if code == 202:
        assert d["status"] == "pending"
    full = cli_json(cli, "argmax")  # the CLI's own scan, meanwhile
    t0 = time.time()
    while code == 202 and time.time() - t0 < 900:
        time.sleep(2)
        code, d = post(url, "/api/argmax", {"token": " Paris"})
    assert code == 200 and d["status"] == "done"
    names = full["per_token"]["verdict_names"]

    def check(tid, d):
        assert d["id"] == tid and d["verdict"] == names[full["per_token"]["verdict"][tid]]
        assert_close(d["margin"], full["per_token"]["margin"][tid])
        flagged = [it for it in full["unargmaxable"] + full["undecided"] if it["id"] == tid]
        for k, v in (flagged[0] if flagged else {}).items():
            assert_close(d[k], v, k)
        for k in ("counts", "vocab_size", "bias", "unique_rows", "rank"):
            assert d["scan"][k] == full[k], k
        probed = [t for t in (full["norm"] or {"tokens": []})["tokens"] if t["id"] == tid]
        if probed:
            assert_close(d["norm"], probed[0])
        else:
            assert d["norm"] is None
        assert d["model"] == full["model"]

    check(7042, d)
    assert d["verdict"] == "argmaxable" and d["token"] == " Paris"
    others = [it["id"] for it in full["unargmaxable"] + full["undecided"]][:2] + \
        [t["id"] for t in (full["norm"] or {"tokens": []})["tokens"]][:1]
    for tid in others:
        code, d = post(url, "/api/argmax", {"token": tid})
        assert code == 200
        check(tid, d)


@pytest.mark.slow
def test_ctrl_c_stops_the_server_cleanly(server):
    proc, url = server
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    # uvicorn either finishes its graceful shutdown and returns (exit 0, "stopped") or re-raises the
    # interrupt (exit 130, the CLI's Ctrl-C code), depending on when the signal lands: both are clean
    assert proc.returncode in (0, 130), err[-2000:]
    assert "terminate called" not in err            # the argmax thread was stopped before exit (no abort)
    assert f"{url}/" in out and "Traceback" not in err


def test_assert_close_allows_two_units_of_the_printed_decimals():
    # the failing input of a CI run: the server and the CLI printed 0.005719 and 0.005718
    assert_close({"top_probs": [0.005719]}, {"top_probs": [0.005718]})
    with pytest.raises(AssertionError):
        assert_close(0.00572, 0.005714)                   # 6 units apart: a real difference
