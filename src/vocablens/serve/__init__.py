"""Layer 5 (beside the CLI): ``vocablens serve``, a local web explorer of the two borders.

:func:`create_app` builds the ASGI app (FastAPI) around a :class:`ServerState` (the loaded model, its
lock and caches); :func:`serve` runs it with uvicorn until Ctrl-C. The page (``static/``) is vanilla
JavaScript with plotly.js from the installed ``plotly`` package: no build step, no network.
"""

from __future__ import annotations

from vocablens.serve.state import ServerState

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def create_app(state: ServerState, host: str = "127.0.0.1"):
    """The FastAPI app for ``state``, answering the Host names of a server bound to ``host`` (see
    :mod:`vocablens.serve.app` and :mod:`vocablens.serve.guard`)."""
    from vocablens.serve.app import create_app as _create

    return _create(state, host=host)


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 8765, log_level: str = "warning") -> None:
    """Serve ``state`` on ``host:port`` until interrupted (uvicorn handles Ctrl-C and shuts down cleanly).

    Raises:
        OSError: the port is taken (the caller turns it into a one-line error).
    """
    import uvicorn

    config = uvicorn.Config(create_app(state, host=host), host=host, port=port, log_level=log_level, access_log=False,
                            lifespan="on")
    try:
        uvicorn.Server(config).run()
    finally:
        state.argmax.cancel()  # never leave torch running in a thread while the interpreter exits


__all__ = ["LOCAL_HOSTS", "ServerState", "create_app", "serve"]
