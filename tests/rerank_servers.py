"""Real rerank HTTP servers on loopback, one per response shape, that misbehave on demand.

Each server scores a document by a fixed function of its text (``expected_score``), so a
test can check that scores reached Redis against the right candidates. ``mode`` sets how
it answers every request; ``plan`` queues modes for the next requests first. Every request
it sees is recorded (path, headers, JSON body), so a test can count calls.

Like the real servers: TEI answers raw logits when asked for ``raw_scores``; Infinity
serves ``/rerank`` only and answers 404 elsewhere; a 422 echoes the request it refused
(FastAPI's validation errors quote their ``input``).
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SHAPES = ("tei", "cohere", "infinity", "scores", "rankings")
MODES = (
    "ok", "hang", "500", "429", "malformed", "wrong_count", "repeated_index", "out_of_range",
    "nan", "flat", "subset", "logits", "echo_auth", "echo_422", "echo_400_code",
)
# The paths each shape serves; None: any path.
PATHS: dict[str, frozenset[str] | None] = {"infinity": frozenset({"/rerank"})}


def expected_score(document: str) -> float:
    """A score in (0.05, 0.95) that depends only on the text."""
    return 0.05 + 0.9 * (zlib.crc32(document.encode()) % 1000) / 1000


def logit(p: float) -> float:
    return math.log(p / (1 - p))


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class RerankServer:
    def __init__(self, shape: str) -> None:
        assert shape in SHAPES, shape
        self.shape = shape
        self.mode = "ok"
        self.plan: list[str] = []
        self.retry_after = "1"
        self.hang_s = 3.0
        self.subset_size = 3
        # echo_auth: characters of padding before the echoed Authorization header.
        self.echo_pad = 0
        self.paths = PATHS.get(shape)
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a hanging handler must not hold up the test's end
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> RerankServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next_mode(self, seen: Seen) -> str:
        with self._lock:
            self.requests.append(seen)
            return self.plan.pop(0) if self.plan else self.mode

    # -- answers -------------------------------------------------------------

    def answer(self, mode: str, body: Any) -> tuple[int, dict[str, str], bytes]:
        if mode == "500":
            return 500, {}, b'{"error": "internal"}'
        if mode == "429":
            return 429, {"Retry-After": self.retry_after}, b'{"error": "model is overloaded"}'
        if mode == "malformed":
            return 200, {}, b'{"results": [{"index": 0, "relevance'
        if mode == "echo_auth":
            return 401, {}, json.dumps({"error": "bad key", "pad": "x" * self.echo_pad, "got": self._auth}).encode()
        if mode == "echo_422":
            detail = [{"type": "value_error", "loc": ["body"], "msg": "Value error, refused", "input": body}]
            return 422, {}, json.dumps({"detail": detail}).encode()
        if mode == "echo_400_code":
            query = body.get("query") if isinstance(body, dict) else None
            return 400, {}, json.dumps({"error": {"code": "too_many_tokens",
                                                  "message": f"query {query!r} is too long"}}).encode()
        documents = body.get("texts") or body.get("documents") or []
        documents = [d if isinstance(d, str) else d.get("text", "") for d in documents]
        n = len(documents)
        pairs = [(i, expected_score(d)) for i, d in enumerate(documents)]
        if mode == "flat":
            pairs = [(i, 0.5) for i in range(n)]
        elif mode == "nan":
            pairs[0] = (0, float("nan"))
        elif mode == "logits":
            pairs = [(i, s * 12 - 6) for i, s in pairs]
        elif body.get("raw_scores") is True:
            pairs = [(i, logit(s)) for i, s in pairs]  # TEI without its sigmoid
        ranked = sorted(pairs, key=lambda p: -p[1])
        if mode == "subset":
            ranked = ranked[: int(body.get("top_n") or self.subset_size)]
        elif mode == "wrong_count":
            ranked = ranked[:-1]
        elif mode == "repeated_index":
            ranked[-1] = (ranked[0][0], ranked[-1][1])
        elif mode == "out_of_range":
            ranked[-1] = (n, ranked[-1][1])
        return 200, {}, json.dumps(self.render(ranked, documents, mode)).encode()

    def render(self, ranked: list[tuple[int, float]], documents: list[str], mode: str) -> Any:
        if self.shape == "tei":
            return [{"index": i, "score": s} for i, s in ranked]
        if self.shape == "cohere":
            return {"id": "r-1", "results": [{"index": i, "relevance_score": s} for i, s in ranked],
                    "meta": {"api_version": {"version": "2"}}}
        if self.shape == "infinity":
            return {"object": "rerank", "model": "m", "usage": {"total_tokens": 1},
                    "results": [{"index": i, "relevance_score": s, "document": documents[i] if i < len(documents) else ""} for i, s in ranked]}
        if self.shape == "rankings":
            return {"rankings": [{"index": i, "score": s} for i, s in ranked]}
        # "scores": input order; a subset or a dropped one shortens the list.
        by_index = dict(ranked)
        keep = sorted(by_index) if mode in ("subset", "wrong_count") else range(len(documents))
        return {"scores": [by_index.get(i, 0.0) for i in keep]}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so the client's pool is exercised

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                mode = server._next_mode(seen)
                server._auth = seen.headers.get("authorization", "")
                if mode == "hang":
                    time.sleep(server.hang_s)
                    mode = "ok"
                if server.paths is not None and self.path not in server.paths:
                    status, headers, payload = 404, {}, b'{"detail":"Not Found"}'
                else:
                    status, headers, payload = server.answer(mode, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (timeout); nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    _auth = ""


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
