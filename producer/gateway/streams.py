"""The stream API: the asynchronous path the queue is for, over HTTP.

- ``POST /v1/streams`` takes the arguments of ``RerankClient.open``: ``query``,
  ``candidates`` and every field of ``StreamOptions``, and answers 201 ``{"stream_id"}``.
  The tenant is the API key's (a ``tenant`` field must name it); the device, when absent, is
  the key's default. An ``idempotency_key`` is scoped to the key's tenant, so two tenants
  using the same key never meet.
- ``GET /v1/streams/{id}/page?offset=&limit=&wait=`` is ``pull``: the same page (rows of the
  committed prefix, ``total``, ``complete``, ``pending_windows``), admitting deeper windows
  when the committed ones cannot fill it, and waiting up to ``wait`` seconds for them.
- ``GET /v1/streams/{id}`` is ``status``.
- ``DELETE /v1/streams/{id}`` is ``cancel``: every window not yet committed is committed as
  ``cancelled``, and the answer is 200 ``{"stream_id", "cancelled_windows", "n_windows"}``;
  again, or on a complete stream, it cancels nothing and answers the same way (idempotent).
- ``GET /v1/streams/{id}/events`` is a Server-Sent Events stream: ``commit`` (a window's
  status, with the event-log id as the SSE id, so ``Last-Event-ID`` resumes), then
  ``complete`` once every window has committed (or ``gone`` if the stream expired).

Errors are ``{"error": {"type", "message", "field"?, "stream_id"?}}``: 400 for a body that is
not JSON, 422 for a bad field (named by its path, as ``open`` names it), 401, 403, 404 (no
such stream, or another tenant's), 409 (an idempotency key reused for another job), 413, 429
with ``Retry-After``, 503.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import redis
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kernel.errors import IdempotencyConflict, StoreError, ValidationError
from kernel.ids import check_idempotency_key
from kernel.logs import get_logger
from producer.gateway.problems import STREAM_HEADER, Problem
from producer.gateway.service import Gateway, caller, endpoint
from producer.options import StreamOptions, given

log = get_logger("rerankq.gateway")

_EVENT_ID = re.compile(r"\d{1,20}-\d{1,20}")


class OpenStreamRequest(StreamOptions, frozen=True):
    """The arguments of RerankClient.open: the query, the candidates, and the stream's options."""

    query: str
    candidates: list[dict[str, Any]]


class Opened(msgspec.Struct):
    stream_id: str


class ErrorBody(msgspec.Struct, omit_defaults=True):
    type: str
    message: str
    field: str | None = None
    stream_id: str | None = None


class StreamError(msgspec.Struct):
    error: ErrorBody


STATUS = {
    "invalid": 422,
    "empty": 422,
    "too_many": 422,
    "malformed": 400,
    "too_large": 413,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "overloaded": 429,
    "failed": 502,
    "timeout": 504,
    "unserved": 503,
    "unavailable": 503,
}


def render(problem: Problem) -> Response:
    body = StreamError(
        error=ErrorBody(type=problem.kind, message=problem.message, field=problem.field, stream_id=problem.stream_id)
    )
    return Response(msgspec.json.encode(body), status_code=STATUS[problem.kind], media_type="application/json")


def _json(value: Any, status: int = 200, stream_id: str | None = None) -> Response:
    headers = {STREAM_HEADER: stream_id} if stream_id else None
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json", headers=headers)


def tenant_key(tenant: str | None, key: str) -> str:
    """The caller's idempotency key, made the tenant's own (a hash fits the 64-character key limit)."""
    check_idempotency_key(key)
    if tenant is None:
        return key
    return "t" + hashlib.blake2b(f"{tenant}\x00{key}".encode(), digest_size=16).hexdigest()


@endpoint(render)
async def open_stream(request: Request) -> Response:
    gateway, principal = caller(request)
    payload = await gateway.body(request, OpenStreamRequest)
    options = given(payload)
    del options["query"], options["candidates"]
    if payload.tenant is not None and payload.tenant != principal.tenant:
        raise Problem("forbidden", "tenant: must be the API key's own tenant (or left out)", field="tenant")
    options["device"] = gateway.device(request, principal, payload.device)
    options["chain"] = principal.check_chain(payload.chain)
    options["tenant"] = principal.tenant
    try:
        if payload.idempotency_key is not None:
            options["idempotency_key"] = tenant_key(principal.tenant, payload.idempotency_key)
        stream_id = await gateway.bridge.open_stream(principal, payload.query, payload.candidates, options)
    except ValidationError as error:
        raise Problem.from_validation(error) from None
    except IdempotencyConflict:
        raise Problem(
            "conflict",
            "idempotency_key already opened a stream with a different query or candidates",
            field="idempotency_key",
        ) from None
    return _json(Opened(stream_id=stream_id), 201, stream_id)


def _number(request: Request, name: str, default: float, *, integer: bool, minimum: float) -> Any:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        value = minimum - 1
    if not value >= minimum:  # also refuses NaN
        kind = "an integer" if integer else "a number"
        raise Problem("invalid", f"{name}: must be {kind} of at least {minimum:g}", field=name)
    return value


@endpoint(render)
async def read_page(request: Request) -> Response:
    gateway, principal = caller(request)
    stream_id = request.path_params["stream_id"]
    offset = _number(request, "offset", 0, integer=True, minimum=0)
    limit = _number(request, "limit", 10, integer=True, minimum=1)
    wait = min(_number(request, "wait", 0.0, integer=False, minimum=0), gateway.config.max_wait_s)
    await gateway.bridge.check_owner(principal, stream_id)
    page = await gateway.bridge.page(stream_id, offset, limit, wait)
    return _json(page, stream_id=stream_id)


@endpoint(render)
async def read_status(request: Request) -> Response:
    gateway, principal = caller(request)
    stream_id = request.path_params["stream_id"]
    await gateway.bridge.check_owner(principal, stream_id)
    return _json(await gateway.bridge.status(stream_id), stream_id=stream_id)


@endpoint(render)
async def cancel_stream(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    principal = gateway.principal(request)
    stream_id = request.path_params["stream_id"]
    await gateway.bridge.check_owner(principal, stream_id)
    outcome = await gateway.bridge.blocking(gateway.bridge.client.cancel, stream_id)
    log.info(
        "gateway_stream_cancelled", stream=stream_id, tenant=principal.tenant, windows=len(outcome.cancelled_windows)
    )
    return _json(outcome, stream_id=stream_id)


@endpoint(render)
async def read_events(request: Request) -> Response:
    gateway, principal = caller(request)
    stream_id = request.path_params["stream_id"]
    after = request.headers.get("last-event-id", "0-0")
    # Redis stream ids are two unsigned 64-bit numbers: a larger one is refused here, not by Redis.
    if not _EVENT_ID.fullmatch(after) or any(int(part) >= 2**64 for part in after.split("-")):
        raise Problem(
            "malformed", "Last-Event-ID: must be an event id this stream sent (digits-digits)", field="Last-Event-ID"
        )
    await gateway.bridge.check_owner(principal, stream_id)
    return StreamingResponse(
        _sse(gateway, stream_id, after.encode()),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", STREAM_HEADER: stream_id},
    )


async def _sse(gateway: Gateway, stream_id: str, after: bytes) -> AsyncIterator[bytes]:
    try:
        async for event, event_id, data in gateway.bridge.commits(stream_id, after):
            if event == "heartbeat":
                yield b": keep-alive\n\n"
                continue
            head = f"id: {event_id}\n" if event_id else ""
            yield f"{head}event: {event}\ndata: ".encode() + data + b"\n\n"
    except (StoreError, redis.RedisError, OSError) as exc:
        body = msgspec.json.encode({"stream_id": stream_id, "message": f"Redis unreachable ({type(exc).__name__})"})
        yield b"event: error\ndata: " + body + b"\n\n"
