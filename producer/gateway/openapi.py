"""The OpenAPI document, built from the same msgspec structs the routes decode and encode,
so the schema cannot drift from what is served (``GET /openapi.json``)."""

from __future__ import annotations

from typing import Any

import msgspec

from kernel.wire import Page, StreamStatus
from producer.cancel import CancelOutcome
from producer.gateway.cohere import CohereError, CohereResponse, CohereV1Request, CohereV2Request
from producer.gateway.problems import STREAM_HEADER
from producer.gateway.service import DEVICE_HEADER, TIMEOUT_HEADER
from producer.gateway.streams import Opened, OpenStreamRequest, StreamError
from producer.gateway.tei import TeiError, TeiInfo, TeiRank, TeiRequest

_REF = "#/components/schemas/{name}"


def _json(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"description": description or "answer", "content": {"application/json": {"schema": schema}}}


def _errors(schema: dict[str, Any], codes: dict[int, str]) -> dict[str, Any]:
    return {str(code): _json(schema, text) for code, text in codes.items()}


def _rerank(
    summary: str, request: dict[str, Any], ok: dict[str, Any], error: dict[str, Any], codes: dict[int, str]
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [
                {
                    "name": DEVICE_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string", "enum": ["cpu", "gpu", "any"]},
                    "description": "the device queue (the API key's default when absent)",
                },
                {
                    "name": TIMEOUT_HEADER,
                    "in": "header",
                    "required": False,
                    "schema": {"type": "number"},
                    "description": "seconds to wait for the windows before answering 504",
                },
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {
                "200": {
                    **_json(ok, "reranked, best first"),
                    "headers": {
                        STREAM_HEADER: {
                            "schema": {"type": "string"},
                            "description": "the stream that holds the decisions",
                        }
                    },
                },
                **_errors(error, codes),
            },
        }
    }


def openapi_document() -> dict[str, Any]:
    types = (
        CohereV2Request,
        CohereV1Request,
        CohereResponse,
        CohereError,
        TeiRequest,
        list[TeiRank],
        TeiError,
        OpenStreamRequest,
        Opened,
        Page,
        StreamStatus,
        StreamError,
        CancelOutcome,
        TeiInfo,
    )
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    (
        cohere_v2,
        cohere_v1,
        cohere_ok,
        cohere_error,
        tei_request,
        tei_ok,
        tei_error,
        open_request,
        opened,
        page,
        status,
        stream_error,
        cancelled,
        tei_info,
    ) = schemas
    cohere_codes = {
        400: "invalid request",
        401: "no or unknown API key",
        403: "device or chain not allowed",
        413: "body too large",
        429: "backlog over its bound (Retry-After)",
        503: "every reranker failed, or Redis unavailable",
        504: "timed out (X-Rerankq-Stream-Id)",
    }
    tei_codes = {
        400: "no texts (Empty)",
        413: "too many texts, or body too large",
        422: "a bad field (Validation)",
        424: "every reranker failed (Backend)",
        429: "backlog over its bound (Overloaded, Retry-After)",
        503: "Redis unavailable (Unhealthy)",
        504: "timed out (X-Rerankq-Stream-Id)",
    }
    stream_codes = {
        400: "not JSON",
        401: "no or unknown API key",
        403: "device or chain not allowed",
        404: "no such stream",
        409: "idempotency key reused",
        413: "body too large",
        422: "a bad field",
        429: "backlog over its bound",
        503: "Redis unavailable",
    }
    stream_param = {"name": "stream_id", "in": "path", "required": True, "schema": {"type": "string"}}
    device_param = {
        "name": "device",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": ["cpu", "gpu", "any"]},
    }
    paths: dict[str, Any] = {
        "/v2/rerank": _rerank("Cohere rerank, v2", cohere_v2, cohere_ok, cohere_error, cohere_codes),
        "/v1/rerank": _rerank("Cohere rerank, v1", cohere_v1, cohere_ok, cohere_error, cohere_codes),
        "/rerank": _rerank("TEI rerank", tei_request, tei_ok, tei_error, tei_codes),
        "/v1/streams": {
            "post": {
                "summary": "open a stream (RerankClient.open)",
                "requestBody": {"required": True, "content": {"application/json": {"schema": open_request}}},
                "responses": {
                    "201": _json(opened, "opened (or found by its idempotency key)"),
                    **_errors(stream_error, stream_codes),
                },
            }
        },
        "/v1/streams/{stream_id}": {
            "get": {
                "summary": "a stream's windows (RerankClient.status)",
                "parameters": [stream_param],
                "responses": {"200": _json(status), **_errors(stream_error, {404: "no such stream"})},
            },
            "delete": {
                "summary": "cancel a stream (RerankClient.cancel): its uncommitted windows commit as cancelled",
                "parameters": [stream_param],
                "responses": {
                    "200": _json(cancelled, "cancelled (none again: it is idempotent)"),
                    **_errors(stream_error, {404: "no such stream"}),
                },
            },
        },
        "/v1/streams/{stream_id}/page": {
            "get": {
                "summary": "a page of ranked rows (RerankClient.pull), waiting up to `wait` seconds",
                "parameters": [stream_param]
                + [
                    {"name": name, "in": "query", "required": False, "schema": {"type": kind}}
                    for name, kind in (("offset", "integer"), ("limit", "integer"), ("wait", "number"))
                ],
                "responses": {
                    "200": _json(page),
                    **_errors(stream_error, {404: "no such stream", 422: "a bad parameter"}),
                },
            }
        },
        "/v1/streams/{stream_id}/events": {
            "get": {
                "summary": "Server-Sent Events: commit (a window's status), complete, gone",
                "parameters": [
                    stream_param,
                    {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {
                        "description": "an event stream",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/info": {
            "get": {
                "summary": "TEI's Info (router/src/lib.rs): model_type reranker and the gateway's bounds",
                "responses": {"200": _json(tei_info), **_errors(tei_error, {401: "no or unknown API key"})},
            }
        },
        "/health": {
            "get": {"summary": "the process is up", "security": [], "responses": {"200": {"description": "up"}}}
        },
        "/ready": {
            "get": {
                "summary": "Redis (store and broker) answers",
                "security": [],
                "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}},
            }
        },
    }
    for route in ("/v2/rerank", "/v1/rerank", "/rerank"):
        operation = dict(paths[route]["post"])
        operation["parameters"] = [device_param] + operation["parameters"][1:]
        paths["/{device}" + route] = {"post": operation}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rerankq gateway",
            "version": "1",
            "description": "Cohere (v1, v2) and TEI rerank APIs and the stream API, served from the queue.",
        },
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
