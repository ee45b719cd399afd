"""The explorer server around a tiny random model (tests/tiny_dirs.py) and an identity tuned lens, for
fast in-process tests through Starlette's TestClient (every request names ``Host: 127.0.0.1:8765``)."""

from __future__ import annotations

import threading
from pathlib import Path

from tiny_dirs import save_tiny, tiny_tokenizer

BASE = "http://127.0.0.1:8765"


class CountingLock:
    """A ``threading.Lock`` that counts how often it was taken (the model lock of :class:`ServerState`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self):
        self._lock.acquire()
        self.taken += 1
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def tiny_state(root: Path, max_tokens: int = 16, argmax: bool = True):
    """A :class:`ServerState` on a tiny llama (V=300, d=64, 2 blocks) saved under ``root``, with an
    identity tuned lens and a :class:`CountingLock`; the argmax scan (if any) is started and finished."""
    import vocablens
    from vocablens.lens.tuned import TunedLens
    from vocablens.serve import ServerState

    if not (root / "tiny").exists():
        save_tiny(root / "tiny", tiny_tokenizer())
        TunedLens(64, 2).save(root / "lens")
    lm = vocablens.load(str(root / "tiny"))
    state = ServerState(lm, model_spec=str(root / "tiny"), lens_path=str(root / "lens"), max_tokens=max_tokens,
                        argmax=argmax)
    state.lock = CountingLock()
    state.start()
    if argmax:
        assert state.argmax.wait(300), state.argmax.error
    return state


def client(app):
    """A TestClient that sends ``Host: 127.0.0.1:8765`` (what a browser on the default port sends)."""
    from starlette.testclient import TestClient

    return TestClient(app, base_url=BASE, raise_server_exceptions=False)
