"""`vocablens serve` hardening (issue 24) and API consistency (issue 25), on a tiny model:

- the Host header (DNS rebinding): 421 for any name the server was not bound for;
- the body cap: 413 from Content-Length before the body is read, and a streamed cap without one;
- every string field capped: oversized fields get 422 fast, without the model lock;
- the prompt's two limits (characters, tokens) both name the token limit;
- one rule for a text of several tokens on every endpoint; the forward pass cached apart from the readout.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from serve_tiny import client, tiny_state

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROMPT = "The class statement"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("serve-security")


@pytest.fixture(scope="module")
def state(root):
    s = tiny_state(root, max_tokens=16)
    yield s
    s.argmax.cancel()


@pytest.fixture(scope="module")
def app(state):
    from vocablens.serve import create_app

    return create_app(state)


@pytest.fixture(scope="module")
def c(app):
    return client(app)


def one_line_error(r, status: int | tuple[int, ...]) -> str:
    statuses = status if isinstance(status, tuple) else (status,)
    assert r.status_code in statuses, (r.status_code, r.text[:300])
    d = r.json()
    assert list(d) == ["error"] and isinstance(d["error"], str) and d["error"], d
    assert "\n" not in d["error"] and "Traceback" not in d["error"], d
    return d["error"]


# ------------------------------------------------------------------------------------ the Host header
ALLOWED = ["127.0.0.1", "127.0.0.1:8765", "localhost", "LocalHost:1", "[::1]", "[::1]:8765"]
REFUSED = ["evil.example.com", "evil.example.com:8765", "127.0.0.1.evil.example.com", "localhost.evil.example.com",
           "10.0.0.1", "192.168.1.10:8765", "", "127.0.0.1:http", "[::1", "::1", "localhost:8765:1",
           "127.0.0.1:1234567", "[::2]:8765", "localhost\xe9"]


@pytest.mark.parametrize("host", ALLOWED)
def test_a_loopback_host_is_answered(c, host):
    r = c.get("/api/health", headers={"Host": host})
    assert r.status_code == 200 and r.json()["n_layers"] == 2


@pytest.mark.parametrize("host", REFUSED)
def test_any_other_host_gets_421_before_the_app(c, state, host):
    n, taken = state.forward_passes, state.lock.taken
    for method, path, body in (("GET", "/api/health", None), ("POST", "/api/lens", {"prompt": PROMPT}),
                               ("GET", "/", None), ("GET", "/openapi.json", None)):
        r = c.request(method, path, json=body, headers={"Host": host.encode("latin-1")})
        msg = one_line_error(r, 421)
        assert "DNS rebinding" in msg and "--host NAME" in msg, msg
        assert "127.0.0.1" in msg and "localhost" in msg and "[::1]" in msg
    assert (state.forward_passes, state.lock.taken) == (n, taken)


def test_host_policy_widens_only_with_host():
    from vocablens.serve.guard import HostPolicy, split_host

    assert split_host("[::1]:80") == "[::1]" and split_host("LocalHost") == "localhost"
    assert split_host("a:b:c") is None and split_host("x:99999999") is None
    for bind in ("127.0.0.1", "localhost", "::1"):
        p = HostPolicy(bind)
        assert p.names == {"127.0.0.1", "localhost", "[::1]"} and not p.allows("10.0.0.1")
    p = HostPolicy("myhost.lan")
    assert p.allows("myhost.lan") and p.allows("localhost") and not p.allows("evil.example.com")
    assert not p.allows("10.0.0.1")
    p = HostPolicy("fe80::1")
    assert p.allows("[fe80::1]") and not p.allows("evil.example.com")
    # a wildcard bind: this machine's name and any address literal, never a foreign domain name
    p = HostPolicy("0.0.0.0")
    assert p.allows("192.168.1.10") and p.allows("[fe80::1]") and p.allows(socket.gethostname().lower())
    assert not p.allows("evil.example.com")


def test_the_app_bound_to_a_name_answers_that_name(state):
    from vocablens.serve import create_app

    c2 = client(create_app(state, host="myhost.lan"))
    assert c2.get("/api/health", headers={"Host": "myhost.lan:8765"}).status_code == 200
    assert c2.get("/api/health", headers={"Host": "localhost"}).status_code == 200
    one_line_error(c2.get("/api/health", headers={"Host": "evil.example.com"}), 421)


def test_serve_help_says_how_to_widen_the_host_check(capsys):
    from tiny_dirs import run_cli

    code, out, _ = run_cli(capsys, "serve", "--help")
    text = " ".join(out.replace("│", " ").split())
    assert code == 0 and "DNS rebinding" in text and "--host NAME also answers NAME" in text
    assert "421" in text


# ----------------------------------------------------------------------------------- the body cap
class _Inner:
    """An ASGI app that records whether it was called and what body it read."""

    def __init__(self) -> None:
        self.called = False
        self.body = b""

    async def __call__(self, scope, receive, send):
        self.called = True
        while True:
            m = await receive()
            self.body += m.get("body", b"")
            if not m.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _drive(mw, headers, chunks):
    """Run ``mw`` on one request whose body arrives as ``chunks`` (an iterator of bytes, more_body until
    it ends); return (status, body sent, bytes the middleware pulled from the client)."""
    sent, pulled = [], [0]
    it = iter(chunks)

    async def receive():
        try:
            b = next(it)
        except StopIteration:
            return {"type": "http.disconnect"}
        pulled[0] += len(b)
        return {"type": "http.request", "body": b, "more_body": True if b else False}

    async def send(m):
        sent.append(m)

    scope = {"type": "http", "method": "POST", "path": "/api/lens", "headers": headers}
    asyncio.run(mw(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), pulled[0]


def _forever(chunk: bytes):
    while True:
        yield chunk


def test_content_length_over_the_cap_is_413_before_a_byte_is_read():
    from vocablens.serve.guard import BodyLimit

    inner = _Inner()
    status, body, pulled = _drive(BodyLimit(inner, 10_000), [(b"content-length", b"200000000")], _forever(b"x" * 4096))
    assert status == 413 and pulled == 0 and not inner.called
    assert "200000000 bytes" in json.loads(body)["error"] and "at most 10000 bytes" in json.loads(body)["error"]


def test_a_chunked_body_stops_at_the_cap():
    from vocablens.serve.guard import BodyLimit

    inner = _Inner()
    status, body, pulled = _drive(BodyLimit(inner, 10_000), [], _forever(b"x" * 1000))
    assert status == 413 and not inner.called
    assert 10_000 < pulled <= 10_000 + 1000  # the chunk that passed the cap, and not one more
    assert "over 10000 bytes" in json.loads(body)["error"]


def test_a_body_within_the_cap_reaches_the_app_whole():
    from vocablens.serve.guard import BodyLimit

    inner = _Inner()
    status, body, pulled = _drive(BodyLimit(inner, 10_000), [], iter([b"a" * 6000, b"b" * 4000, b""]))
    assert status == 200 and body == b"ok" and inner.body == b"a" * 6000 + b"b" * 4000 and pulled == 10_000
    inner = _Inner()
    status, _, _ = _drive(BodyLimit(inner, 10_000), [(b"content-length", b"12x")], iter([b"{}", b""]))
    assert status == 400 and not inner.called


def test_the_servers_cap_fits_the_longest_valid_prompt(c, state):
    """The longest prompt the schema accepts, every character escaped (12 bytes each), is under the body
    cap; one byte more than the cap is 413."""
    from vocablens.serve.app import body_bytes, prompt_chars

    n = prompt_chars(state.max_tokens)
    body = json.dumps({"prompt": "\U0001F600" * n, "k": 5}).encode()  # ensure_ascii: \ud83d\ude00 each
    assert len(body) <= body_bytes(state.max_tokens)
    r = c.post("/api/lens", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "tokens" in r.json()["error"]  # read, parsed, then too many tokens
    big = b'{"prompt": "' + b"x" * body_bytes(state.max_tokens) + b'"}'
    msg = one_line_error(c.post("/api/lens", content=big, headers={"Content-Type": "application/json"}), 413)
    assert f"at most {body_bytes(state.max_tokens)} bytes" in msg


# ---------------------------------------------------------------------------------- field caps
def _oversized(max_tokens: int):
    from vocablens.serve.app import MAX_TOKEN_CHARS, prompt_chars

    long_prompt, long_token = "word " * (prompt_chars(max_tokens) // 5 + 1), "x" * (MAX_TOKEN_CHARS + 1)
    return [
        ("/api/lens", {"prompt": long_prompt}, "prompt"),
        ("/api/explain", {"prompt": long_prompt}, "prompt"),
        ("/api/explain", {"prompt": PROMPT, "target": long_token}, "target"),
        ("/api/trajectory", {"prompt": long_prompt, "token": " the"}, "prompt"),
        ("/api/patch", {"prompt": long_prompt, "position": 0}, "prompt"),
        ("/api/trajectory", {"prompt": PROMPT, "token": long_token}, "token"),
        ("/api/neighbors", {"token": long_token}, "token"),
        ("/api/project", {"token": long_token}, "token"),
        ("/api/argmax", {"token": long_token}, "token"),
        ("/api/lens", {"prompt": PROMPT, "k": 51}, "k"),
        ("/api/neighbors", {"token": " the", "k": 201}, "k"),
        ("/api/project", {"token": " the", "k": 10 ** 30}, "k"),
    ]


def test_every_string_and_list_field_has_a_cap_in_the_schema(app):
    schemas = app.openapi()["components"]["schemas"]
    bodies = {n: s for n, s in schemas.items() if n.endswith("Req")}
    assert set(bodies) == {"LensReq", "TokenKReq", "ExplainReq", "TrajectoryReq", "ArgmaxReq", "PatchReq"}

    def capped(s) -> bool:
        alts = s.get("anyOf", [s])
        return all(a.get("type") != "string" or "maxLength" in a or "enum" in a for a in alts) and \
            all(a.get("type") != "array" or "maxItems" in a for a in alts)

    for name, s in bodies.items():
        for field, f in s["properties"].items():
            assert capped(f), (name, field, f)
            if f.get("type") == "integer" and field == "k":
                assert "maximum" in f and "minimum" in f


def test_oversized_fields_get_422_fast_without_the_model(c, state):
    n, taken = state.forward_passes, state.lock.taken
    for path, body, field in _oversized(state.max_tokens):
        t0 = time.perf_counter()
        msg = one_line_error(c.post(path, json=body), 422)
        assert time.perf_counter() - t0 < 2.0, (path, field)
        assert msg.startswith(f"{field}:"), (path, msg)
    assert (state.forward_passes, state.lock.taken) == (n, taken)  # the model lock was never taken


def test_the_2_4_mb_token_of_the_issue_is_refused_before_the_lock(c, state):
    """issue 24: a 2.4 MB token held the lock for 34 s; now the body cap answers first."""
    taken = state.lock.taken
    t0 = time.perf_counter()
    msg = one_line_error(c.post("/api/neighbors", json={"token": "ab" * 1_200_000, "k": 5}), 413)
    assert time.perf_counter() - t0 < 5.0 and "bytes" in msg and state.lock.taken == taken


def test_the_longest_valid_token_text_holds_the_lock_briefly(c, state):
    """A token text at the cap is read (several tokens: 400) in well under a second of lock time."""
    from vocablens.serve.app import MAX_TOKEN_CHARS

    for path in ("/api/neighbors", "/api/project", "/api/argmax"):
        t0 = time.perf_counter()
        msg = one_line_error(c.post(path, json={"token": "ab" * (MAX_TOKEN_CHARS // 2)}), 400)
        assert time.perf_counter() - t0 < 2.0 and "give a single token" in msg


# ----------------------------------------------------------------------------- the prompt's limits
def test_both_prompt_limits_name_the_token_limit(c, state):
    from vocablens.serve.app import prompt_chars

    chars = one_line_error(c.post("/api/lens", json={"prompt": "x" * (prompt_chars(16) + 1)}), 422)
    tokens = one_line_error(c.post("/api/lens", json={"prompt": "the " * 40}), 400)
    for msg in (chars, tokens):
        assert "at most 16 tokens" in msg and "--max-tokens" in msg, msg
    assert "String should have at most" not in chars and f"over {prompt_chars(16)} characters" in chars
    assert "the prompt has 41 tokens" in tokens or "the prompt has" in tokens


# ----------------------------------------------------------------------- one rule for a token text
def test_a_text_of_several_tokens_is_one_rule_on_every_endpoint(c, state):
    """The same 400 and the same message everywhere a token is taken; never "using its first token"."""
    many = " the class"
    calls = [("/api/neighbors", {"token": many}), ("/api/project", {"token": many}),
             ("/api/trajectory", {"prompt": PROMPT, "token": many}),
             ("/api/explain", {"prompt": PROMPT, "target": many}), ("/api/argmax", {"token": many})]
    msgs = {one_line_error(c.post(p, json=b), 400) for p, b in calls}
    assert len(msgs) == 1, msgs
    msg = msgs.pop()
    n = len(state.lm.tokenizer(many, add_special_tokens=False).input_ids)
    assert f"is {n} tokens" in msg and "give a single token" in msg and "using" not in msg
    # one token, by text or by id: answered by every endpoint alike
    tid = state.lm.tokenizer(" the", add_special_tokens=False).input_ids
    assert len(tid) == 1
    for token in (" the", tid[0]):
        for p, b in calls:
            key = "target" if "target" in b else "token"
            r = c.post(p, json={**b, key: token})
            assert r.status_code == 200, (p, token, r.text[:200])


# ----------------------------------------------------------------------- the forward-pass cache
def test_another_k_or_kind_reuses_the_forward_pass(c, state):
    """The readout (k, kind) is redone from the cached forward; the answers equal the lens run afresh."""
    import vocablens
    from vocablens.render.lens import lens_to_dict

    from vocablens.serve.adapters import clean, encode

    prompt = "An object is an instance"
    n0 = state.forward_passes
    first = c.post("/api/lens", json={"prompt": prompt, "kind": "both", "k": 3})
    assert first.status_code == 200 and state.forward_passes == n0 + 1
    answers = {}
    for kind, k in (("both", 7), ("logit", 3), ("logit", 12), ("tuned", 5)):
        r = c.post("/api/lens", json={"prompt": prompt, "kind": kind, "k": k})
        assert r.status_code == 200
        answers[kind, k] = r.json()
    assert c.post("/api/trajectory", json={"prompt": prompt, "token": " the", "position": 2}).status_code == 200
    assert state.forward_passes == n0 + 1  # one forward pass for all of them
    # the oracle: the lens run on its own (its own forward pass), outside the server
    ids = encode(state.lm, prompt, False, 16)
    fresh = clean(lens_to_dict(vocablens.logit_lens(state.lm.borders, ids, positions="all", k=12), state.lm.tokenizer))
    got = answers["logit", 12]
    assert got["tokens"] == fresh["tokens"]
    for a, b in zip(got["layers"], fresh["layers"]):
        assert [p["top_tokens"] for p in a["positions"]] == [p["top_tokens"] for p in b["positions"]]
        for pa, pb in zip(a["positions"], b["positions"]):
            assert torch.allclose(torch.tensor(pa["top_probs"]), torch.tensor(pb["top_probs"]), atol=1e-6)
    assert got["model_max_abs_diff"] == pytest.approx(fresh["model_max_abs_diff"], abs=1e-6)
    # k=3 is the first 3 of k=12, and "both"'s logit half is the logit lens
    for a, b in zip(answers["logit", 3]["layers"], got["layers"]):
        assert [p["top_tokens"] for p in a["positions"]] == [p["top_tokens"][:3] for p in b["positions"]]
    assert [ly["positions"][0]["top_tokens"][:3] for ly in answers["both", 7]["logit"]["layers"]] == \
        [ly["positions"][0]["top_tokens"] for ly in answers["logit", 3]["layers"]]
    # another prompt is another forward pass
    n1 = state.forward_passes
    assert c.post("/api/lens", json={"prompt": "An object", "kind": "logit", "k": 3}).status_code == 200
    assert state.forward_passes == n1 + 1


def test_the_prompt_cache_is_bounded_in_bytes():
    from vocablens.serve.state import PromptCache

    cache = PromptCache(size=16, max_bytes=3 * 4000)
    for i in range(6):
        e = cache.get((f"p{i}", False), lambda: torch.zeros(1, 3, dtype=torch.long))
        e.stream = (torch.zeros(1000), torch.zeros(0))  # 4,000 bytes each
        cache.trim()
    assert len(cache) == 3 and list(cache._d) == [("p3", False), ("p4", False), ("p5", False)]
    big = PromptCache(size=16, max_bytes=10)
    e = big.get(("huge", False), lambda: torch.zeros(1, 3, dtype=torch.long))
    e.stream = (torch.zeros(1000), torch.zeros(0))
    big.trim()
    assert len(big) == 1  # the newest prompt is kept, whatever its size


# --------------------------------------------------------------------- a real uvicorn on loopback
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_server(root, state):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "vocablens", "serve", "-m", str(root / "tiny"), "--port", str(port),
                             "--no-argmax", "--max-tokens", "16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    t0 = time.time()
    while time.time() - t0 < 300:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read()[-2000:])
        try:
            status, _ = _raw(port, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            if status == 200:
                break
        except OSError:
            time.sleep(0.3)
    yield port
    proc.kill()
    proc.wait()


def _raw(port: int, head: bytes, chunks=(), timeout: float = 20.0) -> tuple[int, dict]:
    """Send ``head`` (and ``chunks``) on a fresh connection; read the response (status, JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head)
        for ch in chunks:
            try:
                s.sendall(ch)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.find(b"\r\n\r\n") + 4 + _length(data):
            part = s.recv(65536)
            if not part:
                break
            data += part
    status = int(data.split(b" ", 2)[1])
    body = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(body) if body.startswith(b"{") else {}


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_real_server_refuses_a_foreign_host(real_server):
    status, d = _raw(real_server, b"GET /api/health HTTP/1.1\r\nHost: evil.example.com\r\n\r\n")
    assert status == 421 and "DNS rebinding" in d["error"]
    for host in (b"127.0.0.1", f"localhost:{real_server}".encode(), f"[::1]:{real_server}".encode()):
        assert _raw(real_server, b"GET /api/health HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")[0] == 200
    status, d = _raw(real_server, b"GET /api/health HTTP/1.0\r\n\r\n")  # HTTP/1.0 without a Host
    assert status == 400 and "Host" in d["error"]


def test_real_server_answers_413_without_reading_the_body(real_server):
    from vocablens.serve.app import body_bytes

    cap = body_bytes(16)
    # a 200 MB Content-Length, and no body sent at all: the answer comes at once
    t0 = time.perf_counter()
    status, d = _raw(real_server, b"POST /api/lens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 200000000\r\n\r\n", timeout=10)
    assert status == 413 and "200000000 bytes" in d["error"] and time.perf_counter() - t0 < 10
    # chunked, no length: one chunk past the cap and no end chunk; a server waiting for the end never answers
    chunk = b"x" * 4096
    n = cap // len(chunk) + 1
    status, d = _raw(real_server, b"POST /api/lens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n",
                     [b"%x\r\n" % len(chunk) + chunk + b"\r\n"] * n, timeout=10)
    assert status == 413 and f"over {cap} bytes" in d["error"]
    # and it goes on serving
    assert _raw(real_server, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")[0] == 200


def test_lens_kinds_include_the_jacobian_lens(c, state):
    """/api/lens takes jacobian and comma lists; with none loaded or shipped, one line; J = I reads as the logit lens."""
    import torch

    from vocablens.lens.jacobian import JacobianLens

    held = state.lm.translators
    saved = held.pop("jacobian", None)
    try:
        assert "no Jacobian lens" in one_line_error(c.post("/api/lens", json={"prompt": PROMPT, "kind": "jacobian"}), 400)
        b = state.lm.borders
        J = JacobianLens(torch.eye(b.d_model).repeat(b.n_layers, 1, 1), list(range(b.n_layers)), b.n_layers)
        J.check_model(b)  # as every load does: it records no model
        state.lm.add_lens("jacobian", J)  # the model's lens: what /api/lens reads through
        r = c.post("/api/lens", json={"prompt": PROMPT, "kind": "logit,tuned,jacobian", "k": 2})
        assert r.status_code == 200, r.text[:300]
        d = r.json()
        assert d["kind"] == "logit,tuned,jacobian" and d["jacobian"]["kind"] == "jacobian"
        rec = {x["kind"]: x for x in d["lenses"]}["jacobian"]  # its provenance travels with the answer
        assert rec["verified"] == "unverified: the file names no model" and rec["format"] == "vocablens"
        for a, j in zip(d["logit"]["layers"], d["jacobian"]["layers"]):
            assert a["positions"][-1]["top_ids"] == j["positions"][-1]["top_ids"]
        assert one_line_error(c.post("/api/lens", json={"prompt": PROMPT, "kind": "jacobian,logit"}), 422)
    finally:
        held.pop("jacobian", None)
        if saved is not None:
            held["jacobian"] = saved
