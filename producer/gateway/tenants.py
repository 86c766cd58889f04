"""Each tenant's share of a gateway process: its open event streams and its requests in flight.

Every wait holds one of the process's Redis connections while it blocks
(``RERANKQ_GATEWAY_REDIS_MAX_CONNECTIONS``), and an event stream waits for as long as its
client stays. So a tenant may hold at most ``RERANKQ_GATEWAY_TENANT_MAX_STREAMS`` event streams
and ``RERANKQ_GATEWAY_TENANT_MAX_REQUESTS`` other requests at once; past either it is answered
429 with ``Retry-After``, in the shape of the API it called, and what it already holds goes on.
Their sum stays under the pool (the settings refuse otherwise), so another tenant, and
``/ready``, always find connections left. Without auth every caller is one tenant.

The counts are this process's: with ``RERANKQ_GATEWAY_WORKERS`` processes a tenant's share is
that many times larger, as the pool is.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from producer.gateway import cohere, streams, tei
from producer.gateway.auth import KeyRing, Principal
from producer.gateway.config import GatewaySettings
from producer.gateway.problems import Problem
from producer.gateway.service import PRINCIPAL_STATE

#: Routes no tenant's share covers: they hold no wait, and /ready must answer for everyone.
UNCOUNTED = frozenset({"/health", "/ready", "/openapi.json"})
#: A refused request may come back as soon as any of the tenant's own requests ends.
RETRY_AFTER_S = 1
_DEVICE_PREFIXES = ("/cpu/", "/gpu/", "/any/")


def _authorization(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            header: bytes = value  # ASGI header values are bytes
            return header.decode("latin-1")
    return None


def is_event_stream(method: str, path: str) -> bool:
    return method == "GET" and path.startswith("/v1/streams/") and path.endswith("/events")


def render_for(path: str) -> Any:
    """The error shape of the API a path belongs to."""
    if path.startswith(_DEVICE_PREFIXES):
        path = path[4:]
    if path in ("/v1/rerank", "/v2/rerank"):
        return cohere.render
    if path == "/rerank":
        return tei.render
    return streams.render


class TenantShares:
    """ASGI middleware counting each tenant's event streams and other requests in flight."""

    def __init__(self, app: ASGIApp, keyring: KeyRing, config: GatewaySettings) -> None:
        self.app = app
        self.keyring = keyring
        self.max_streams = config.tenant_max_streams
        self.max_requests = config.tenant_max_requests
        self.streams: Counter[str | None] = Counter()
        self.requests: Counter[str | None] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        try:
            principal: Principal = self.keyring.authenticate(_authorization(scope))
        except Problem:
            await self.app(scope, receive, send)  # the route answers 401 in its own shape
            return
        # The route reads it back (``Gateway.principal``) instead of hashing the key again.
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal
        tenant = principal.tenant
        if is_event_stream(scope["method"], scope["path"]):
            counts, limit, what = self.streams, self.max_streams, "open event streams"
        else:
            counts, limit, what = self.requests, self.max_requests, "requests in flight"
        if counts[tenant] >= limit:
            await self._refuse(
                scope,
                receive,
                send,
                f"too many {what} for this API key's tenant (at most {limit} at once); retry after {RETRY_AFTER_S} s",
            )
            return
        counts[tenant] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            counts[tenant] -= 1
            if counts[tenant] <= 0:
                del counts[tenant]

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, message: str) -> None:
        problem = Problem("overloaded", message, retry_after_s=RETRY_AFTER_S)
        response: Response = render_for(scope["path"])(problem)
        response.headers.update(problem.headers())
        await response(scope, receive, send)
