"""A small HTTP server for /metrics and health paths, shared by the exporter and the workers.

Each path maps to a function that builds the whole answer; the server runs on a daemon
thread, answers GET only, and never lets a failing check take the process down.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from producer.logs import get_logger

log = get_logger("rerankq.metrics_http")

#: An answer: status, content type, body. A route gets the request's Accept header.
Answer = tuple[int, str, bytes]
Route = Callable[[str], Answer]


def metrics_route(registry_factory: Callable[[], Any]) -> Route:
    """``/metrics`` from a registry built per scrape, in the format the scraper accepts."""
    from prometheus_client.exposition import choose_encoder

    def answer(accept: str) -> Answer:
        encoder, content_type = choose_encoder(accept)
        return 200, content_type, encoder(registry_factory())

    return answer


def check_route(check: Callable[[], tuple[bool, Mapping[str, Any]]]) -> Route:
    """A health path: 200 when the check passes, 503 when not, with what was checked as JSON."""

    def answer(accept: str) -> Answer:
        ok, details = check()
        body = json.dumps({"ok": ok, **details}, sort_keys=True, default=str).encode()
        return (200 if ok else 503), "application/json", body

    return answer


def health_client(url: str) -> redis.Redis:
    """A client for health checks alone: short timeouts and no retries, so a check answers
    within an orchestrator's probe timeout even when Redis does not (any deployment shape)."""
    from producer.redis_clients import health_client as client_for

    return client_for(url)


def reachable(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


class MetricsServer:
    def __init__(self, host: str, port: int, routes: Mapping[str, Route]) -> None:
        self.routes = dict(routes)
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="rerankq-metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving; from another thread than the one serving (``shutdown`` waits for it)."""
        self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, path: str, accept: str) -> Answer:
        route = self.routes.get(path.split("?", 1)[0])
        if route is None:
            return 404, "text/plain; charset=utf-8", f"not found; try {', '.join(sorted(self.routes))}\n".encode()
        try:
            return route(accept)
        except Exception as exc:  # noqa: BLE001 - a broken check is a 500, never a dead server
            log.warning("metrics_route_failed", path=path, error=type(exc).__name__, detail=str(exc)[:200])
            return 500, "text/plain; charset=utf-8", f"{type(exc).__name__}\n".encode()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                status, content_type, body = server.answer(self.path, self.headers.get("Accept", ""))
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the scraper went away

            def log_message(self, *args: Any) -> None:
                pass  # one line per scrape is noise

        return Handler
