"""The ASGI app: Starlette routes over the queue bridge.

Starlette rather than Litestar or FastAPI: every route decodes its own body with msgspec
(the project's wire library), because each API answers a bad request in its own error shape
and a framework's validation layer would answer in its own; what is left for a framework to
do is routing, streaming (Server-Sent Events) and the lifespan, and Starlette does that with
the least work per request. Measured here (a msgspec echo of a 25-document body, 50
concurrent keep-alive clients, under uvicorn with uvloop and httptools): Starlette spent
60-62 µs of server CPU per request, Litestar 111-115 µs, on the same 2-core host. The
OpenAPI document comes from the same msgspec structs (``producer.gateway.openapi``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kernel.amqp_broker import AsyncAmqpBroker
from kernel.logs import get_logger
from kernel.settings import Settings, load_settings
from producer.client import RerankClient
from producer.gateway import cohere, streams, tei
from producer.gateway.auth import KeyRing, load_keyring
from producer.gateway.bridge import QueueBridge, async_redis
from producer.gateway.config import GatewaySettings, load_gateway_settings
from producer.gateway.limits import Backlog, CountingDispatcher
from producer.gateway.openapi import openapi_document
from producer.gateway.service import Gateway
from producer.gateway.tenants import TenantShares

log = get_logger("rerankq.gateway")


class DeviceConvertor(Convertor[str]):
    """``/{device:device}/…`` matches the device queues only: any other first segment is a 404."""

    regex = "cpu|gpu|any"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("device", DeviceConvertor())


def _json(value: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json")


async def health(request: Request) -> Response:
    return _json({"status": "ok"})


async def ready(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    try:
        await gateway.bridge.redis.ping()
        await gateway.bridge.backlog.broker.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach Redis is "not ready"
        return _json({"status": "unavailable", "reason": f"Redis unreachable ({type(exc).__name__})"}, 503)
    return _json({"status": "ready"})


def routes() -> list[Route]:
    fixed = [
        Route("/v2/rerank", cohere.rerank_v2, methods=["POST"]),
        Route("/v1/rerank", cohere.rerank_v1, methods=["POST"]),
        Route("/rerank", tei.rerank, methods=["POST"]),
        Route("/info", tei.info, methods=["GET"]),
        Route("/v1/streams", streams.open_stream, methods=["POST"]),
        Route("/v1/streams/{stream_id}", streams.read_status, methods=["GET"]),
        Route("/v1/streams/{stream_id}", streams.cancel_stream, methods=["DELETE"]),
        Route("/v1/streams/{stream_id}/page", streams.read_page, methods=["GET"]),
        Route("/v1/streams/{stream_id}/events", streams.read_events, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
    ]
    document = msgspec.json.encode(openapi_document())

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    # A client that can only be given a base URL picks its device queue by it: http://gw/gpu.
    by_device = [
        Route("/{device:device}/v2/rerank", cohere.rerank_v2, methods=["POST"]),
        Route("/{device:device}/v1/rerank", cohere.rerank_v1, methods=["POST"]),
        Route("/{device:device}/rerank", tei.rerank, methods=["POST"]),
    ]
    return [*fixed, Route("/openapi.json", openapi, methods=["GET"]), *by_device]


def create_app(settings: Settings, config: GatewaySettings, keyring: KeyRing) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        dispatcher = CountingDispatcher(settings)
        client = RerankClient(settings, dispatcher=dispatcher)
        store_redis = async_redis(settings.store.redis_url or "", config)
        if settings.store.broker_kind == "amqp":
            broker_redis: Any = AsyncAmqpBroker(settings.store.broker)
        else:
            broker_redis = (
                store_redis
                if settings.store.broker == settings.store.redis_url
                else async_redis(settings.store.broker, config)
            )
        backlog = Backlog(broker_redis, dispatcher, settings, config, store=store_redis)
        app.state.gateway = Gateway(
            settings,
            config,
            keyring,
            QueueBridge(client, store_redis, backlog, threads=config.threads, heartbeat_s=config.sse_heartbeat_s),
        )
        sampler = asyncio.create_task(backlog.sample_forever())
        log.info("gateway_started", namespace=settings.store.namespace, keys=len(keyring), auth=not keyring.insecure)
        try:
            yield
        finally:
            backlog.stop()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await store_redis.aclose()
            if broker_redis is not store_redis:
                await broker_redis.aclose()
            app.state.gateway.bridge.close()
            client.close()

    return Starlette(
        routes=routes(), lifespan=lifespan, middleware=[Middleware(TenantShares, keyring=keyring, config=config)]
    )


def app_from_environment() -> Starlette:
    """The app as ``RERANKQ_*`` and ``RERANKQ_GATEWAY_*`` describe it (each uvicorn worker process builds its own)."""
    settings = load_settings()
    config = load_gateway_settings()
    return create_app(settings, config, load_keyring(config, settings))
