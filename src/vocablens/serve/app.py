"""The ASGI application: the page, its assets and the JSON API (FastAPI on Starlette, served by uvicorn).

Every ``POST /api/*`` takes a JSON body checked by a strict schema (extra fields, wrong types, k <= 0
are 422) and answers the dict of the matching CLI command's ``--json`` (see
:mod:`vocablens.serve.adapters`). Errors are ``{"error": "one line"}``: 400 for a
:class:`~vocablens.errors.VocabLensError` (empty or over-long prompt, unknown token, position out of
range), 404 for an unknown path, 422 for a malformed body. ``/api/argmax`` answers 202
``{"status": "pending"}`` until the background scan is done.

Assets are read once from the package (and plotly.js from the installed ``plotly``) into memory and
looked up by exact name; no part of a request ever becomes a file path.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException

from vocablens.errors import VocabLensError
from vocablens.serve import adapters
from vocablens.serve.state import ServerState

MAX_PROMPT_CHARS = 4000
Token = Union[StrictStr, StrictInt]

_ASSETS = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LensReq(_Req):
    prompt: StrictStr = Field(max_length=MAX_PROMPT_CHARS)
    kind: Literal["logit", "tuned", "both"] = "both"
    k: StrictInt = Field(5, ge=1, le=50)
    chat: StrictBool = False


class TokenKReq(_Req):
    token: Token
    k: StrictInt = Field(10, ge=1, le=200)


class ExplainReq(_Req):
    prompt: StrictStr = Field(max_length=MAX_PROMPT_CHARS)
    position: StrictInt = -1
    target: Token | None = None
    chat: StrictBool = False


class TrajectoryReq(_Req):
    prompt: StrictStr = Field(max_length=MAX_PROMPT_CHARS)
    position: StrictInt = -1
    token: Token
    chat: StrictBool = False


class ArgmaxReq(_Req):
    token: Token


def _err(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(msg).split())[:500]}, status_code=status)


def _validation_line(exc: RequestValidationError) -> str:
    errs = exc.errors()
    if not errs:
        return "bad request body"
    e = errs[0]
    if e.get("type") == "json_invalid":
        return "the body is not valid JSON"
    loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
    if loc == "" and e.get("type") in ("missing", "model_attributes_type", "dict_type"):
        return "send a JSON object as the request body (Content-Type: application/json)"
    return f"{loc or 'body'}: {e.get('msg', 'invalid')}"


def _asset(name: str) -> bytes:
    return resources.files("vocablens.serve").joinpath("static", name).read_bytes()


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI app around a loaded :class:`ServerState` (the argmax scan starts with the app)."""
    from contextlib import asynccontextmanager

    import plotly.offline

    assets = {name: (_asset(name), mime) for name, mime in _ASSETS.items()}
    assets["plotly.min.js"] = (plotly.offline.get_plotlyjs().encode("utf-8"), "text/javascript")

    @asynccontextmanager
    async def lifespan(_app):
        state.start()
        yield

    # no /docs or /redoc: FastAPI's Swagger and ReDoc pages load their scripts from a CDN
    app = FastAPI(title="vocablens serve", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="The embedding and the unembedding of one model, explored in the browser. "
                              "Each POST endpoint answers the JSON of the matching CLI command's --json.")
    app.state.vl = state

    @app.exception_handler(RequestValidationError)
    async def _bad_body(_req: Request, exc: RequestValidationError):
        return _err(422, _validation_line(exc))

    @app.exception_handler(HTTPException)
    async def _http(_req: Request, exc: HTTPException):
        return _err(exc.status_code, exc.detail if isinstance(exc.detail, str) else "request failed")

    @app.exception_handler(VocabLensError)
    async def _vl(_req: Request, exc: VocabLensError):
        return _err(400, str(exc))

    @app.exception_handler(Exception)
    async def _any(_req: Request, exc: Exception):
        return _err(500, f"internal error ({type(exc).__name__}); the server keeps serving")

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

    @app.get("/api/health")
    def health():
        """The model and its provenance, the argmax scan's state, forward passes run so far."""
        d = adapters.health_json(state.lm, state.tuned_note)
        job = state.argmax
        d["argmax"] = ("off" if not state.want_argmax else "done" if job.done else "failed" if job.error
                       else "pending")
        d["forward_passes"] = state.forward_passes
        d["max_tokens"] = state.max_tokens
        return JSONResponse(d)

    def cached(e, key: tuple, make):
        if key not in e.answers:
            e.answers[key] = make()
        return e.answers[key]

    @app.post("/api/lens")
    def lens(req: LensReq):
        """Every layer x every position of the prompt through the logit and/or tuned lens, top-k each."""
        with state.lock:
            tuned = state.need_tuned() if req.kind != "logit" else None
            e = state.entry(req.prompt, req.chat)
            d = cached(e, ("lens", req.kind, req.k),
                       lambda: adapters.lens_json(state.lm, e.ids, req.kind, req.k, tuned))
            state.resid(e)  # the clicks that follow read the prompt's residual stream without a forward pass
            return JSONResponse(d)

    @app.post("/api/trajectory")
    def trajectory(req: TrajectoryReq):
        """One token's rank and probability at every layer at one position, both lenses."""
        with state.lock:
            tid = adapters.token_id(state.lm, req.token)
            e = state.entry(req.prompt, req.chat)
            p = adapters.position(e.ids, req.position)
            return JSONResponse(cached(e, ("trajectory", p, tid), lambda: adapters.trajectory_json(
                state.lm, e.ids, state.resid(e), p, tid, state.tuned)))

    @app.post("/api/explain")
    def explain(req: ExplainReq):
        """Attribution of the prediction at one position to blocks, heads and FFN sub-updates."""
        with state.lock:
            tid = None if req.target is None else adapters.token_id(state.lm, req.target)
            e = state.entry(req.prompt, req.chat)
            p = adapters.position(e.ids, req.position)
            return JSONResponse(cached(e, ("explain", p, tid),
                                       lambda: adapters.explain_json(state.lm, e.ids, p, tid)))

    @app.post("/api/neighbors")
    def neighbors(req: TokenKReq):
        """Cosine nearest neighbours of one token in the embedding (and an untied head)."""
        with state.lock:
            return JSONResponse(adapters.neighbors_json(state.lm, adapters.token_query(state.lm, req.token), req.k))

    @app.post("/api/project")
    def project(req: TokenKReq):
        """The FFN value vectors that most promote / suppress one token."""
        with state.lock:
            return JSONResponse(adapters.project_json(state.lm, adapters.token_id(state.lm, req.token), req.k))

    @app.post("/api/argmax", responses={202: {"description": "the scan is still running"}})
    def argmax(req: ArgmaxReq):
        """Can this token ever be the top prediction: its verdict from the cached whole-vocabulary scan."""
        with state.lock:  # the tokenizer is shared with the model's requests
            tid = adapters.token_id(state.lm, req.token)
        job = state.argmax
        if job.error:
            return _err(503, job.error)
        if not state.want_argmax:
            return _err(503, "the argmax scan is off (the server was started with --no-argmax)")
        if not job.done:
            return JSONResponse({"status": "pending", "progress": job.progress}, status_code=202)
        return JSONResponse(adapters.argmax_token_json(state.lm, job.ma, job.full, tid))

    return app
