"""The explorer server fuzzed from its own OpenAPI schema (schemathesis, on hypothesis): for every
operation, bodies that fit the schema and bodies that do not. No request gets a 5xx; every 4xx is
``{"error": "one line"}``; a body the schema refuses is never answered 2xx; a 200 is JSON.

Runs on a tiny model (tests/tiny_dirs.py) with its argmax scan finished, so each request takes
milliseconds; the examples are bounded so the whole file takes well under a minute."""

from __future__ import annotations

import json

import pytest
import schemathesis  # the `test` extra (pyproject)
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from serve_tiny import BASE, tiny_state

EXAMPLES = 40  # per operation and mode: 8 operations x 2 modes x 40 = 640 requests
OPERATIONS = [("GET", "/api/health"), ("POST", "/api/lens"), ("POST", "/api/trajectory"), ("POST", "/api/explain"),
              ("POST", "/api/neighbors"), ("POST", "/api/project"), ("POST", "/api/argmax"),
              ("POST", "/api/undertrained"), ("POST", "/api/patch")]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vocablens.serve import create_app

    state = tiny_state(tmp_path_factory.mktemp("serve-fuzz"), max_tokens=16)
    app = create_app(state)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers={"Host": "127.0.0.1"})
    yield state, app, schema
    state.argmax.cancel()


def test_the_schema_lists_every_endpoint(served):
    _, app, schema = served
    listed = {(op.method.upper(), op.path) for op in (r.ok() for r in schema.get_all_operations())}
    routes = {(m, r.path) for r in app.routes if r.path.startswith("/api/") for m in getattr(r, "methods", ())}
    assert listed == set(OPERATIONS) == routes


def _check(case, r, positive: bool) -> None:
    where = f"{case.method} {case.path} {case.body!r:.300}"
    assert r.status_code < 500, (where, r.status_code, r.text[:300])
    if r.status_code >= 400:
        d = r.json()
        assert isinstance(d, dict) and list(d) == ["error"], (where, d)
        assert isinstance(d["error"], str) and d["error"].strip() and "\n" not in d["error"], (where, d)
        assert "Traceback" not in d["error"]
    else:
        assert not positive or r.status_code in (200, 202), where
        assert r.status_code in (200, 202) and isinstance(json.loads(r.text), dict), (where, r.text[:300])
    if not positive:  # the schema refuses it: so must the server (schemathesis marks such bodies)
        assert r.status_code >= 400 or not _refused_by_schema(case), (where, r.status_code, r.text[:300])


def _refused_by_schema(case) -> bool:
    """Whether the generated body really violates the schema (negative mode can yield a valid one):
    bytes that are not JSON, or JSON that the operation's body schema refuses (jsonschema_rs, not the
    server's own pydantic models)."""
    import jsonschema_rs

    op = case.operation
    body = op.definition.raw.get("requestBody")
    if body is None:
        return False
    value = case.body
    if isinstance(value, (bytes, str)):
        try:
            value = json.loads(value)
        except ValueError:  # UnicodeDecodeError is one
            return True
    raw = body["content"]["application/json"]["schema"]
    v = jsonschema_rs.validator_for({**raw, "components": op.schema.raw_schema.get("components", {})})
    return not v.is_valid(value)


#: (method, path, mode): /api/health takes nothing, so there is no body that violates its schema
RUNS = [pytest.param(m, p, mode, id=f"{p}-{mode.value}") for m, p in OPERATIONS
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if m == "POST" or mode.is_positive]


@pytest.mark.parametrize("method, path, mode", RUNS)
def test_no_request_gets_a_5xx_and_every_4xx_is_one_error_line(served, method, path, mode):
    state, _, schema = served
    op = schema[path][method]

    @given(case=op.as_strategy(mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    def run(case):
        r = case.call(headers={"Host": BASE.split("//")[1]})
        _check(case, r, positive=mode == GenerationMode.POSITIVE)

    run()
    assert state.lock._lock.acquire(blocking=False)  # nothing left the model lock held
    state.lock._lock.release()
