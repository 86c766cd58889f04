"""A small HTTP server for /metrics and health paths, shared by the exporter and the workers.

Each path maps to a function that builds the whole answer; the server runs on a daemon
thread, answers GET only, bounds what a connection may cost (no thread per connection, a
timeout, a cap on open connections), and never lets a failing check take the process down.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from kernel.logs import get_logger

log = get_logger("rerankq.metrics_http")

#: An answer: status, content type, body. A route gets the request's Accept header.
Answer = tuple[int, str, bytes]
Route = Callable[[str], Answer]

#: Connections open at once; a new one past it displaces the oldest still sending its request.
MAX_CONNECTIONS = 64
#: How long a connection has to send its request head, and again to take the answer.
REQUEST_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 16 * 1024
ANSWER_THREADS = 2


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
    from kernel.redis_clients import health_client as client_for

    client: redis.Redis = client_for(url)
    return client


def reachable(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


class MetricsServer:
    """An asyncio server on its own thread and event loop: an idle or slow connection costs a
    socket, never a thread. Each connection has ``REQUEST_TIMEOUT_S`` to send its request head
    (at most ``MAX_REQUEST_BYTES``) and as long again to take the answer; with
    ``MAX_CONNECTIONS`` open, a new one takes the place of the one that has waited longest
    without sending its request. Answers are built on
    ``ANSWER_THREADS`` threads (a scrape reads files and Redis), one request per connection.
    """

    def __init__(self, host: str, port: int, routes: Mapping[str, Route]) -> None:
        self.routes = dict(routes)
        # Bound here, so a port that is taken fails the caller at once.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=128)
        self._socket.setblocking(False)
        self._pool = ThreadPoolExecutor(max_workers=ANSWER_THREADS, thread_name_prefix="rerankq-metrics-answer")
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Future[None] | None = None
        self._ready = threading.Event()
        self._done = threading.Event()
        self._open = 0
        self._reading: dict[asyncio.StreamWriter, None] = {}  # still sending their request, oldest first
        self._thread = threading.Thread(target=self.serve_forever, name="rerankq-metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def serve_forever(self) -> None:
        """Serve until ``stop``; on this thread."""
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            server = loop.run_until_complete(
                asyncio.start_server(self._serve, sock=self._socket, limit=MAX_REQUEST_BYTES)
            )
            self._stop = loop.create_future()
            self._ready.set()
            loop.run_until_complete(self._stop)
            server.close()
            loop.run_until_complete(server.wait_closed())
        finally:
            self._ready.set()
            loop.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._done.set()

    def stop(self) -> None:
        """Stop serving (from any thread) and wait, briefly, until it has."""
        self._ready.wait(10)
        stop = self._stop
        if stop is not None and not self._loop.is_closed():

            def finish() -> None:
                if not stop.done():
                    stop.set_result(None)

            self._loop.call_soon_threadsafe(finish)
            self._done.wait(10)
        self._socket.close()

    def answer(self, path: str, accept: str) -> Answer:
        route = self.routes.get(path.split("?", 1)[0])
        if route is None:
            return 404, "text/plain; charset=utf-8", f"not found; try {', '.join(sorted(self.routes))}\n".encode()
        try:
            return route(accept)
        except Exception as exc:  # noqa: BLE001 - a broken check is a 500, never a dead server
            log.warning("metrics_route_failed", path=path, error=type(exc).__name__, detail=str(exc)[:200])
            return 500, "text/plain; charset=utf-8", f"{type(exc).__name__}\n".encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            if not self._reading:
                writer.transport.abort()
                return
            # Full: the connection that has waited longest without sending its request makes
            # room, so idle connections cannot lock a scraper out.
            oldest = next(iter(self._reading))
            del self._reading[oldest]
            oldest.transport.abort()
        self._open += 1
        self._reading[writer] = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            self._reading.pop(writer, None)
            status, content_type, body = await self._answer_head(head)
            writer.write(_response(status, content_type, body))
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            pass  # too slow, too long, or gone: closed unanswered
        finally:
            self._reading.pop(writer, None)
            self._open -= 1
            writer.close()

    async def _answer_head(self, head: bytes) -> Answer:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, "text/plain; charset=utf-8", b"bad request\n"
        method, path, _ = parts
        if method != "GET":
            return 405, "text/plain; charset=utf-8", b"GET only\n"
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.answer, path, accept)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _response(status: int, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
