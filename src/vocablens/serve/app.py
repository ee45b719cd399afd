"""The ASGI application: the page, its assets and the JSON API (FastAPI on Starlette, served by uvicorn).

Every ``POST /api/*`` takes a JSON body checked by a strict schema (extra fields, wrong types, k <= 0,
a string over its cap are 422; every string field has a cap, so no request holds the model lock
longer than valid input can) and answers the dict of the matching CLI command's ``--json`` (see
:mod:`vocablens.serve.adapters`). Errors are ``{"error": "one line"}``: 400 for a
:class:`~vocablens.errors.VocabLensError` (empty or over-long prompt, unknown token, a text of several
tokens, position out of range), 404 for an unknown path, 405 for a wrong method, 413 for a body over
the cap, 421 for a Host the server does not answer (:mod:`vocablens.serve.guard`), 422 for a malformed
body. ``/api/argmax`` answers 202 ``{"status": "pending"}`` until the background scan is done, 409
when the server runs without it (``--no-argmax``), 503 when it failed or was stopped.

Assets are read once from the package (and plotly.js from the installed ``plotly``) into memory and
looked up by exact name; no part of a request ever becomes a file path.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from vocablens.errors import BadInput, VocabLensError
from vocablens.serve import adapters
from vocablens.serve.state import ServerState, served_words

MAX_TOKEN_CHARS = 1024      # one token's text: the longest entry of common vocabularies is < 300 characters
CHARS_PER_TOKEN = 32        # the prompt's character cap is this many per token of --max-tokens

_ASSETS = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}


def prompt_chars(max_tokens: int) -> int:
    """The longest prompt text accepted, in characters, for a server that reads ``max_tokens`` tokens
    (checked before tokenizing: tokenizing never holds the lock long)."""
    return CHARS_PER_TOKEN * int(max_tokens)


def body_bytes(max_tokens: int) -> int:
    """The largest request body accepted, in bytes: the longest prompt with every character
    JSON-escaped as a surrogate pair (12 bytes), plus 16 KiB for the other fields."""
    return 12 * prompt_chars(max_tokens) + 16 * 1024


def _json_int(v):
    """An integer as JSON has it: ``5`` or ``5.0`` (JSON Schema's integer), never ``true``, ``"5"`` or ``5.5``."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return v


StrictInt = Annotated[int, BeforeValidator(_json_int)]


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def request_models(max_tokens: int) -> dict[str, type[BaseModel]]:
    """The request bodies of the POST endpoints, their string fields capped for ``max_tokens``.

    Every field is bounded: the prompt by :func:`prompt_chars`, a token's text by
    :data:`MAX_TOKEN_CHARS`, ``k`` by its range; what is left (kind, chat) is an enum or a bool.
    """
    n = prompt_chars(max_tokens)
    Prompt = Annotated[StrictStr, Field(max_length=n, description=f"the text, at most {max_tokens} tokens "
                                                                  f"(--max-tokens) and {n} characters")]
    TokenText = Annotated[StrictStr, Field(max_length=MAX_TOKEN_CHARS)]
    TokenF = Annotated[Union[TokenText, StrictInt], Field(
        description="one token: its text (with its leading space, e.g. \" Paris\"; \"4\" is the text 4), or "
                    "its id as an integer or the string \"id:N\"; a text that is several tokens is refused (400)")]

    class LensReq(_Req):
        prompt: Prompt
        kind: Literal["logit", "tuned", "both", "jacobian", "logit,jacobian", "tuned,jacobian",
                      "logit,tuned,jacobian"] = "both"
        k: StrictInt = Field(5, ge=1, le=50)
        chat: StrictBool = False

    class TokenKReq(_Req):
        token: TokenF
        k: StrictInt = Field(10, ge=1, le=200)

    class ExplainReq(_Req):
        prompt: Prompt
        position: StrictInt = -1
        target: Optional[TokenF] = None
        chat: StrictBool = False

    class TrajectoryReq(_Req):
        prompt: Prompt
        position: StrictInt = -1
        token: TokenF
        chat: StrictBool = False

    class ArgmaxReq(_Req):
        token: TokenF

    class PatchReq(_Req):
        prompt: Prompt
        position: StrictInt

    return {"lens": LensReq, "token_k": TokenKReq, "explain": ExplainReq, "trajectory": TrajectoryReq,
            "argmax": ArgmaxReq, "patch": PatchReq}


def _err(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(msg).split())[:500]}, status_code=status)


def _validation_line(exc: RequestValidationError, max_tokens: int) -> str:
    """One line for a body the schema refuses: the first problem, named by its field."""
    errs = exc.errors()
    if not errs:
        return "bad request body"
    e = errs[0]
    kind = e.get("type")
    if kind == "json_invalid":
        return "the body is not valid JSON"
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    field = loc[0] if loc else ""
    if field == "" and kind in ("missing", "model_attributes_type", "dict_type", "model_type"):
        return "send a JSON object as the request body (Content-Type: application/json)"
    if any(x.get("type") == "string_unicode" for x in errs):
        return f"{field or 'body'}: not valid Unicode text (a lone surrogate such as \\ud800 has no character)"
    if kind == "string_too_long" and field == "prompt":
        n = prompt_chars(max_tokens)
        return (f"prompt: over {n} characters; this server reads prompts of at most {max_tokens} tokens "
                f"(start it with --max-tokens N for more; the text may hold {CHARS_PER_TOKEN} characters per token)")
    if kind == "string_too_long":
        return f"{field}: over {MAX_TOKEN_CHARS} characters: give one token's text or its id"
    if field in ("token", "target") and len(loc) > 1:  # a union: say what the field takes, not each branch
        return f"{field}: give one token as a string (its text, or \"id:N\") or an integer (its id)"
    return f"{field or 'body'}: {e.get('msg', 'invalid')}"


def _asset(name: str) -> bytes:
    return resources.files("vocablens.serve").joinpath("static", name).read_bytes()


def _body(model: type[BaseModel]):
    """Give an endpoint's ``req`` parameter its (per-server) body model."""
    def wrap(fn):
        fn.__annotations__["req"] = model
        return fn
    return wrap


def _cached(e, key: tuple, make):
    """The answer stored under ``key`` on a prompt's cache entry ``e``, made (``make()``) once."""
    if key not in e.answers:
        e.answers[key] = make()
    return e.answers[key]


def _load_assets() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, media type) of the page's files and plotly.js, read once into memory."""
    import plotly.offline

    assets = {name: (_asset(name), mime) for name, mime in _ASSETS.items()}
    assets["plotly.min.js"] = (plotly.offline.get_plotlyjs().encode("utf-8"), "text/javascript")
    return assets


def _add_error_handlers(app: FastAPI, max_tokens: int) -> None:
    """Every error as ``{"error": "one line"}``: 422 for a body the schema refuses, the HTTP status of
    Starlette's own errors (400 for a body that is not JSON), 400 for a VocabLensError, 500 for
    anything else (the server keeps serving)."""
    @app.exception_handler(RequestValidationError)
    async def _bad_body(_req: Request, exc: RequestValidationError):
        return _err(422, _validation_line(exc, max_tokens))

    @app.exception_handler(HTTPException)
    async def _http(_req: Request, exc: HTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            return _err(400, "the body could not be parsed as JSON (a number too long to read?)")
        return _err(exc.status_code, exc.detail if isinstance(exc.detail, str) else "request failed")

    @app.exception_handler(VocabLensError)
    async def _vl(_req: Request, exc: VocabLensError):
        return _err(400, served_words(str(exc)))

    @app.exception_handler(Exception)
    async def _any(_req: Request, exc: Exception):
        return _err(500, f"internal error ({type(exc).__name__}); the server keeps serving")


def _add_page_routes(app: FastAPI, assets: dict[str, tuple[bytes, str]]) -> None:
    """``GET /`` and the page's static files, each looked up by its exact name in ``assets``."""
    def _send(name: str) -> Response:
        body, mime = assets[name]
        return Response(body, media_type=mime, headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return _send("index.html")

    @app.get("/static/app.js", include_in_schema=False)
    def app_js() -> Response:
        return _send("app.js")

    @app.get("/static/style.css", include_in_schema=False)
    def style_css() -> Response:
        return _send("style.css")

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        return _send("plotly.min.js")


def _add_prompt_routes(app: FastAPI, state: ServerState, M: dict[str, type[BaseModel]]) -> None:
    """``GET /api/health`` and the endpoints that read a prompt (lens, trajectory, explain); their
    answers are cached per prompt, under the model lock."""
    @app.get("/api/health")
    def health():
        """The model and its provenance, the argmax scan's state, forward passes run so far."""
        d = adapters.health_json(state.lm, state.tuned_note, getattr(state, "jacobian_note", None))
        job = state.argmax
        d["argmax"] = ("off" if not state.want_argmax else "done" if job.done else "failed" if job.error
                       else "pending")
        d["forward_passes"] = state.forward_passes
        d["max_tokens"] = state.max_tokens
        d["images"] = len(state.images or [])  # serve --image: every prompt is read with them
        return JSONResponse(d)

    @app.post("/api/lens")
    @_body(M["lens"])
    def lens(req):
        """Every layer x every position of the prompt through the logit, tuned and/or Jacobian lens, top-k each.

        The prompt's forward pass is cached apart from the readout: another ``k`` or ``kind`` on the
        same prompt reads the cached residual stream (no forward pass)."""
        with state.lock:
            if req.kind in ("tuned", "both") or "tuned," in req.kind:
                state.need_tuned()  # the model's tuned lens, or why there is none
            if "jacobian" in req.kind:
                state.need_jacobian()
            e = state.entry(req.prompt, req.chat)
            d = _cached(e, ("lens", req.kind, req.k),
                        lambda: adapters.lens_json(state.lm, e.ids, req.kind, req.k, state.forward(e)))
            return JSONResponse(d)

    @app.post("/api/trajectory")
    @_body(M["trajectory"])
    def trajectory(req):
        """One token's rank and probability at every layer at one position, both lenses."""
        with state.lock:
            tid = adapters.token_id(state.lm, req.token)
            e = state.entry(req.prompt, req.chat)
            p = adapters.position(state.lm, e.ids, req.position)
            return JSONResponse(_cached(e, ("trajectory", p, tid), lambda: adapters.trajectory_json(
                state.lm, e.ids, state.forward(e), p, tid, state.tuned is not None)))

    @app.post("/api/patch")
    @_body(M["patch"])
    def patch(req):
        """The patch of the server's image (``serve --image``) the model saw at an image position."""
        with state.lock:
            if not state.images:
                raise BadInput("this server reads no image (start it with --image FILE)")
            e = state.entry(req.prompt, False)
            return JSONResponse(_cached(e, ("patch", req.position),
                                        lambda: adapters.patch_json(state.lm, e.ids, e.inputs, req.position)))

    @app.post("/api/explain")
    @_body(M["explain"])
    def explain(req):
        """Attribution of the prediction at one position to blocks, heads and FFN sub-updates."""
        with state.lock:
            state.no_images("explain")  # its forward would read the image tokens without their pixels
            tid = None if req.target is None else adapters.token_id(state.lm, req.target)
            e = state.entry(req.prompt, req.chat)
            p = adapters.position(state.lm, e.ids, req.position)
            return JSONResponse(_cached(e, ("explain", p, tid),
                                        lambda: adapters.explain_json(state.lm, e.ids, p, tid)))


def _add_token_routes(app: FastAPI, state: ServerState, M: dict[str, type[BaseModel]]) -> None:
    """The endpoints that read one token: neighbours, value vectors, the argmax verdict (from the
    background scan: 202 while it runs, 409 when off, 503 when it failed) and under-training."""
    @app.post("/api/neighbors")
    @_body(M["token_k"])
    def neighbors(req):
        """Cosine nearest neighbours of one token in the embedding (and an untied head)."""
        with state.lock:
            return JSONResponse(adapters.neighbors_json(state.lm, adapters.token_query(state.lm, req.token), req.k))

    @app.post("/api/project")
    @_body(M["token_k"])
    def project(req):
        """The FFN value vectors that most promote / suppress one token."""
        with state.lock:
            return JSONResponse(adapters.project_json(state.lm, adapters.token_id(state.lm, req.token), req.k))

    @app.post("/api/argmax", responses={202: {"description": "the scan is still running"}})
    @_body(M["argmax"])
    def argmax(req):
        """Can this token ever be the top prediction: its verdict from the cached whole-vocabulary scan."""
        with state.lock:  # the tokenizer is shared with the model's requests
            tid = adapters.token_id(state.lm, req.token)
        job = state.argmax
        if job.error:
            return _err(503, job.error)
        if not state.want_argmax:
            return _err(409, "the argmax scan is off (the server was started with --no-argmax)")
        if not job.done:
            return JSONResponse({"status": "pending", "progress": job.progress}, status_code=202)
        return JSONResponse(adapters.argmax_token_json(state.lm, job.ma, job.full, tid))

    @app.post("/api/undertrained")
    @_body(M["argmax"])
    def undertrained(req):
        """Is this token under-trained: its class and indicator (computed once, on the first request) and,
        when the server was given an earlier verification (--undertrained FILE), its repeat probability."""
        with state.lock:
            tid = adapters.token_id(state.lm, req.token)
            return JSONResponse(adapters.undertrained_token_json(state.lm, state.undertrained_index(),
                                                                 state.undertrained_verified, tid))


def create_app(state: ServerState, host: str = "127.0.0.1") -> FastAPI:
    """The FastAPI app around a loaded :class:`ServerState` (the argmax scan starts with the app).

    Args:
        state: the loaded model and its caches.
        host: the address the server is bound to: names the ``Host`` headers it answers
            (:class:`~vocablens.serve.guard.HostPolicy`; 421 for any other).
    """
    from contextlib import asynccontextmanager

    from vocablens.serve.guard import BodyLimit, HostGuard, HostPolicy

    assets = _load_assets()

    @asynccontextmanager
    async def lifespan(_app):
        state.start()
        yield
        state.argmax.cancel()  # never leave torch running in a thread while the interpreter exits

    # no /docs or /redoc: FastAPI's Swagger and ReDoc pages load their scripts from a CDN
    app = FastAPI(title="vocablens serve", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="The embedding and the unembedding of one model, explored in the browser. "
                              "Each POST endpoint answers the JSON of the matching CLI command's --json.")
    app.state.vl = state
    # outermost first: the Host check, then the body cap, before FastAPI reads anything
    app.add_middleware(BodyLimit, max_bytes=body_bytes(state.max_tokens))
    app.add_middleware(HostGuard, policy=HostPolicy(host))
    _add_error_handlers(app, state.max_tokens)
    _add_page_routes(app, assets)
    M = request_models(state.max_tokens)
    _add_prompt_routes(app, state, M)
    _add_token_routes(app, state, M)
    return app
