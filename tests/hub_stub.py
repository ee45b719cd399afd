"""A stand-in for the Hugging Face Hub on 127.0.0.1 (for ``HF_ENDPOINT``): the endpoints huggingface_hub
calls to resolve a revision and download a file, serving repositories held in memory. Never the real hub.

- ``GET /api/{models,spaces,datasets}/OWNER/NAME[/revision/REV]``: ``{"id", "sha", "siblings"}``; an unknown
  repository or revision is a 404 with the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``);
- ``HEAD``/``GET /[spaces/|datasets/]OWNER/NAME/resolve/REV/PATH``: the file with ``ETag``,
  ``X-Repo-Commit`` and ``Content-Length`` (a ``Range: bytes=N-`` request gets the rest, 206), else
  ``EntryNotFound``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_PREFIX = {"models": "", "spaces": "spaces/", "datasets": "datasets/"}


class StubHub:
    """``StubHub({("model", "org/repo"): {"path": b"bytes"}}, sha=...)`` serving on ``self.endpoint``;
    ``self.requests`` lists ``(method, path, range header)`` served. Use as a context manager."""

    def __init__(self, repos: dict[tuple[str, str], dict[str, bytes]], sha: str = "c0ffee" * 6 + "abcd",
                 branches: tuple[str, ...] = ("main",)):
        self.repos, self.sha, self.branches = repos, sha, branches
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._serve(self, body=True)

            def do_HEAD(self):
                hub._serve(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "StubHub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _revision_ok(self, rev: str) -> bool:
        return rev in self.branches or rev == self.sha

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?")[0]
        self.requests.append((h.command, path, h.headers.get("Range")))
        m = re.fullmatch(r"/api/(models|spaces|datasets)/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(h, m.group(1)[:-1], m.group(2), m.group(3) or "main", body)
        m = re.fullmatch(r"/(spaces/|datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            rtype = {"spaces/": "space", "datasets/": "dataset"}.get(m.group(1) or "", "model")
            return self._file(h, rtype, m.group(2), m.group(3), m.group(4), body)
        self._reply(h, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)

    def _info(self, h, rtype: str, repo: str, rev: str, body: bool) -> None:
        files = self.repos.get((rtype, repo))
        if files is None:
            return self._reply(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, body)
        if not self._revision_ok(rev):
            return self._reply(h, 404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, body)
        doc = {"id": repo, "modelId": repo, "sha": self.sha, "private": False,
               "siblings": [{"rfilename": f} for f in sorted(files)]}
        self._reply(h, 200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, body)

    def _file(self, h, rtype: str, repo: str, rev: str, inner: str, body: bool) -> None:
        files = self.repos.get((rtype, repo))
        if files is None or not self._revision_ok(rev):
            return self._reply(h, 404, b"{}", {"X-Error-Code": "RepoNotFound" if files is None else "RevisionNotFound"}, body)
        data = files.get(inner)
        if data is None:
            return self._reply(h, 404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"}, body)
        headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": self.sha,
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        rng = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range") or "")
        if rng and body:
            start = int(rng.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._reply(h, 206, data[start:], headers, body)
        self._reply(h, 200, data, headers, body)

    @staticmethod
    def _reply(h, code: int, data: bytes, headers: dict, body: bool) -> None:
        h.send_response(code)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
