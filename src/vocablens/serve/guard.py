"""Two ASGI middlewares in front of the app: which ``Host`` a request may name, and how big its body may be.

**Host (DNS rebinding).** A web page the user visits can point a name it controls (``evil.example``)
at 127.0.0.1 and then talk to a loopback server from the user's browser; the request then carries
``Host: evil.example``. :class:`HostGuard` answers 421 to any Host that is not one of the names the
server was bound for: on a loopback bind only ``127.0.0.1``, ``localhost`` and ``[::1]`` (any port);
``--host NAME`` also allows NAME; a wildcard bind (``0.0.0.0``, ``::``) also allows this machine's host
name and any IP-address literal (a rebinding attack always names a domain, never an address).

**Body size.** :class:`BodyLimit` answers 413 from ``Content-Length`` before a byte of the body is
read, and for a body without one (chunked) stops reading at the first chunk that passes the cap: the
app never sees a body over the cap, and the server never holds more than the cap plus one chunk.

Both answer ``{"error": "one line"}`` like every other error of the server. Pure ASGI (no FastAPI).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1", "[::1]")
_WILDCARD_BINDS = ("0.0.0.0", "::", "[::]", "")


def _as_name(host: str) -> str:
    """A bind address or host name as it appears in a Host header: lower case, IPv6 in brackets."""
    h = host.strip().lower().rstrip(".")
    if ":" in h and not h.startswith("["):
        h = f"[{h}]"
    return h


def split_host(value: str) -> str | None:
    """``Host`` header value -> its name (lower case, IPv6 kept in brackets), or None when malformed.

    ``"127.0.0.1:8765"`` -> ``"127.0.0.1"``, ``"[::1]:80"`` -> ``"[::1]"``, ``"LocalHost"`` -> ``"localhost"``.
    """
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            return None
        name, rest = v[:end + 1], v[end + 1:]
    elif v.count(":") == 1:
        name, rest = v.split(":")
        rest = ":" + rest
    elif ":" in v:
        return None
    else:
        name, rest = v, ""
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and len(rest) <= 6):
        return None
    return name or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
        return True
    except ValueError:
        return False


class HostPolicy:
    """The Host names a server bound to ``bind`` answers (see the module docstring).

    Args:
        bind: the ``--host`` the server listens on.
    """

    def __init__(self, bind: str = "127.0.0.1") -> None:
        b = bind.strip().lower()
        self.wildcard = b in _WILDCARD_BINDS
        names = set(LOOPBACK_NAMES)
        if not self.wildcard and b not in _LOOPBACK_BINDS:
            names.add(_as_name(bind))
        if self.wildcard:
            for n in (socket.gethostname(), socket.getfqdn()):
                if n:
                    names.add(_as_name(n))
        self.names = frozenset(names)

    def allows(self, name: str) -> bool:
        return name in self.names or (self.wildcard and _is_ip(name))

    def describe(self) -> str:
        shown = ", ".join(sorted(self.names))
        return shown + (" and any IP address" if self.wildcard else "")


async def _send_error(send: Send, status: int, msg: str) -> None:
    body = json.dumps({"error": msg}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [v for k, v in scope.get("headers", ()) if k.lower() == name]


class HostGuard:
    """ASGI middleware: 421 ``{"error": ...}`` for a request whose Host the :class:`HostPolicy` refuses
    (400 when there is none or several); lifespan and other scopes pass through."""

    def __init__(self, app, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        hosts = _header(scope, b"host")
        if len(hosts) != 1:
            return await _send_error(send, 400, "the request needs exactly one Host header")
        raw = hosts[0].decode("latin-1")
        name = split_host(raw)
        if name is None or not self.policy.allows(name):
            shown = raw if len(raw) <= 80 and raw.isprintable() else ascii(raw[:80])
            return await _send_error(
                send, 421, f"Host {shown!r} is not served here: this server answers only {self.policy.describe()} "
                           f"(a guard against DNS rebinding); start it with --host NAME to answer NAME")
        return await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: at most ``max_bytes`` of request body reach the app.

    A ``Content-Length`` over the cap is answered 413 before the body is read; without one (chunked),
    the body is read chunk by chunk and answered 413 as soon as it passes the cap (the rest is never
    read). A body within the cap is read whole here and handed to the app as one message.
    """

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)

    def _too_big(self, what: str) -> str:
        return (f"the request body is {what}; this server takes at most {self.max_bytes} bytes "
                f"(the longest prompt, JSON-escaped)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        lengths = _header(scope, b"content-length")
        if lengths:
            text = lengths[0].decode("latin-1").strip()
            if len(lengths) > 1 or not text.isdigit():
                return await _send_error(send, 400, "the Content-Length header is not one number")
            if int(text) > self.max_bytes:
                return await _send_error(send, 413, self._too_big(f"{int(text)} bytes"))
        chunks, n = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            n += len(body)
            if n > self.max_bytes:
                return await _send_error(send, 413, self._too_big(f"over {self.max_bytes} bytes"))
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return await self.app(scope, replay, send)
