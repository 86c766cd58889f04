"""Cohere's rerank API, v1 and v2, answered from the queue.

Shapes as Cohere publishes them (docs.cohere.com/reference/rerank and /v2/reference/rerank,
and the Fern-generated ``cohere`` Python SDK: ``V2RerankResponse``, ``RerankResponse``,
``ApiMeta``):

- ``POST /v2/rerank`` ``{"model", "query", "documents": [str], "top_n"?, "max_tokens_per_doc"?,
  "priority"?, "relevant_spans"?}``; ``POST /v1/rerank`` ``{"query", "documents": [str | {"text", ...}], "model"?,
  "top_n"?, "rank_fields"?, "return_documents"?, "max_chunks_per_doc"?}``.
- ``{"id", "results": [{"index", "relevance_score", "document"? (v1, with return_documents)}],
  "meta": {"api_version": {"version"}, "billed_units": {"search_units"}}}``, best first.
  ``relevance_score`` is the queue's normalised score in [0, 1], as Cohere's are.
- Errors are ``{"message": str}`` with Cohere's codes: 400 invalid request, 401 no or bad key,
  403, 404, 413 (a body over the byte limit), 429 with ``Retry-After``, 503 (every reranker
  failed, or Redis cannot be used), 504 (timed out; the stream id is in
  ``X-Rerankq-Stream-Id``).

Where rerankq differs, it says so: ``model`` is accepted and does not route (the API key's
chain profile decides who scores); ``max_tokens_per_doc`` becomes a document budget in code
points (``service.CHARS_PER_TOKEN``); long documents are cut to the budget, unless v1's
``max_chunks_per_doc`` is given: then each document is split into at most that many passages,
each scored, and a document's score is its best passage's (the stream options
``long_documents="passages"``, ``max_passages``), still one result per document; v2's
``relevant_spans`` scores passages too and answers the winning one (``cohere_passages``); one search unit
is billed per 100 documents (Cohere's
rule for documents under 500 tokens). Unknown fields are refused, naming the field, so a
misspelt ``top_n`` is not silently ignored. One field is rerankq's own: ``instruction``, the
stream option of that name (what an instruction-aware reranker is asked to do); it is part of
the job, so the same documents under another instruction are scored again.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from kernel import stream_defaults
from kernel.limits import MAX_PASSAGES
from producer.gateway.cohere_passages import (
    RelevantSpan,
    RelevantSpansRequest,
    check_relevant_spans,
    relevant_spans,
    unread_warnings,
)
from producer.gateway.jobs import Scored
from producer.gateway.problems import STREAM_HEADER, Problem
from producer.gateway.service import endpoint, rerank_call
from producer.options import InstructionOption

DOCUMENTS_PER_SEARCH_UNIT = 100


class CohereV2Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    priority: int | None = None
    relevant_spans: RelevantSpansRequest | None = None
    instruction: InstructionOption = None
    # v1-era fields, which clients written for v1 send here too (rerankers always sends
    # return_documents); see V1_ERA_FIELDS.
    return_documents: bool | None = None
    rank_fields: list[str] | None = None
    max_chunks_per_doc: int | None = None


#: A v1 field on /v2/rerank that changes nothing in a v2 answer: accepted, ignored, and said so
#: in a ``Warning`` header. v2 documents are strings (no fields to rank by) and v2 results carry
#: no documents (the caller has them, by index).
V1_ERA_FIELDS = {
    "return_documents": "v2 results carry no documents; read them by index",
    "rank_fields": "v2 documents are strings, so there are no fields to rank by",
}


class CohereV1Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    query: str
    documents: list[str | dict[str, Any]]
    model: str | None = None
    top_n: int | None = None
    rank_fields: list[str] | None = None
    return_documents: bool | None = None
    max_chunks_per_doc: int | None = None
    instruction: InstructionOption = None


class CohereResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    relevant_spans: list[RelevantSpan] | msgspec.UnsetType = msgspec.UNSET


class ApiVersion(msgspec.Struct):
    version: str


class BilledUnits(msgspec.Struct):
    search_units: int


class CohereMeta(msgspec.Struct):
    api_version: ApiVersion
    billed_units: BilledUnits
    warnings: list[str] | msgspec.UnsetType = msgspec.UNSET


class CohereResponse(msgspec.Struct):
    id: str
    results: list[CohereResult]
    meta: CohereMeta


class CohereError(msgspec.Struct):
    message: str


STATUS = {
    "invalid": 400,
    "empty": 400,
    "too_many": 400,
    "malformed": 400,
    "too_large": 413,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "overloaded": 429,
    "failed": 503,
    "timeout": 504,
    # 429, not 503: the cohere SDK waits out Retry-After on either, but llama-index retries a 503
    # (and 500, 504) ten more times on top of the SDK's own retries, and a 429 not at all.
    "unserved": 429,
    "unavailable": 503,
}
_INVALID = ("invalid", "empty", "too_many", "malformed")


def render(problem: Problem) -> Response:
    message = f"invalid request: {problem.message}" if problem.kind in _INVALID else problem.message
    return Response(
        msgspec.json.encode(CohereError(message=message)),
        status_code=STATUS[problem.kind],
        media_type="application/json",
    )


def positive(field: str, value: int | None, *, minimum: int = 1) -> int | None:
    if value is not None and value < minimum:
        raise Problem("invalid", f"{field}: must be at least {minimum}, got {value}", field=field)
    return value


def answer(
    gateway_id: str,
    stream_id: str,
    version: str,
    scores: list[Scored],
    texts: list[str],
    top_n: int | None,
    documents: list[dict[str, Any]] | None = None,
    *,
    spans: RelevantSpansRequest | None = None,
    passage_limit: str = "",
) -> Response:
    chosen = scores[:top_n] if top_n is not None else scores
    results = [
        CohereResult(
            index=s.index,
            relevance_score=s.score,
            document=documents[s.index] if documents is not None else msgspec.UNSET,
            relevant_spans=relevant_spans(s, spans) or msgspec.UNSET,
        )
        for s in chosen
    ]
    warnings = unread_warnings(scores, texts, passage_limit)
    body = CohereResponse(
        id=gateway_id,
        results=results,
        meta=CohereMeta(
            api_version=ApiVersion(version=version),
            billed_units=BilledUnits(search_units=math.ceil(len(texts) / DOCUMENTS_PER_SEARCH_UNIT)),
            warnings=warnings or msgspec.UNSET,
        ),
    )
    return Response(msgspec.json.encode(body), media_type="application/json", headers={STREAM_HEADER: stream_id})


@endpoint(render)
async def rerank_v2(request: Request) -> Response:
    call = await rerank_call(request, CohereV2Request)
    gateway, payload = call.gateway, call.payload
    gateway.check_query(payload.query)
    if payload.max_chunks_per_doc is not None:
        # Ignoring it would change the answer (each document's best passage, not its excerpt).
        raise Problem(
            "invalid",
            "max_chunks_per_doc: a v1 field that changes how documents are scored; send it to "
            "/v1/rerank, or use max_tokens_per_doc here",
            field="max_chunks_per_doc",
        )
    ignored = [name for name in V1_ERA_FIELDS if getattr(payload, name) is not None]
    gateway.check_documents(payload.documents, "documents")
    positive("top_n", payload.top_n)
    positive("max_tokens_per_doc", payload.max_tokens_per_doc)
    positive("priority", payload.priority, minimum=0)
    check_relevant_spans(payload.relevant_spans)
    spans = payload.relevant_spans if payload.relevant_spans and payload.relevant_spans.enabled else None
    job = gateway.job(
        payload.query,
        payload.documents,
        call.device,
        call.principal,
        max_tokens_per_doc=payload.max_tokens_per_doc,
        instruction=payload.instruction,
        passages=spans is not None,
    )
    stream_id, scores = await gateway.bridge.rerank(job, call.timeout_s)
    response = answer(
        str(uuid.uuid4()),
        stream_id,
        "2",
        scores,
        payload.documents,
        payload.top_n,
        spans=spans,
        passage_limit=f"at most {stream_defaults.MAX_PASSAGES} a document, the stream default",
    )
    if ignored:
        response.headers["Warning"] = ", ".join(
            f'299 rerankq "{name} is a v1 field, ignored on /v2/rerank: {V1_ERA_FIELDS[name]}"' for name in ignored
        )
    return response


def v1_texts(documents: list[str | dict[str, Any]], rank_fields: list[str] | None) -> list[str]:
    """What is scored for each v1 document: the string, an object's ``text``, or with
    ``rank_fields`` those fields of the object as ``field: value`` lines, in that order.

    An object without ``text`` (or with ``null``: haystack's ``content=None``) is an empty
    text, scored last like any blank one. ``rank_fields`` that no document has is a mistake
    in the request, refused."""
    if rank_fields is not None and not any(
        isinstance(d, dict) and any(d.get(name) is not None for name in rank_fields) for d in documents
    ):
        raise Problem("invalid", f"rank_fields: no document has any of the fields {rank_fields}", field="rank_fields")
    texts = []
    for i, document in enumerate(documents):
        if isinstance(document, str):
            texts.append(document)
            continue
        fields = rank_fields or ["text"]
        lines = []
        for name in fields:
            value = document.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise Problem("invalid", f"documents[{i}].{name}: must be a string", field=f"documents[{i}].{name}")
            lines.append(value if rank_fields is None else f"{name}: {value}")
        texts.append("\n".join(lines))
    return texts


@endpoint(render)
async def rerank_v1(request: Request) -> Response:
    call = await rerank_call(request, CohereV1Request)
    gateway, payload = call.gateway, call.payload
    gateway.check_query(payload.query)
    if payload.rank_fields is not None and not payload.rank_fields:
        raise Problem("invalid", "rank_fields: must name at least one field", field="rank_fields")
    texts = v1_texts(payload.documents, payload.rank_fields)
    gateway.check_documents(texts, "documents")
    positive("top_n", payload.top_n)
    positive("max_chunks_per_doc", payload.max_chunks_per_doc)
    if payload.max_chunks_per_doc is not None and payload.max_chunks_per_doc > MAX_PASSAGES:
        raise Problem(
            "invalid",
            f"max_chunks_per_doc: at most {MAX_PASSAGES}, got {payload.max_chunks_per_doc}",
            field="max_chunks_per_doc",
        )
    job = gateway.job(
        payload.query,
        texts,
        call.device,
        call.principal,
        instruction=payload.instruction,
        max_passages=payload.max_chunks_per_doc,
    )
    stream_id, scores = await gateway.bridge.rerank(job, call.timeout_s)
    documents = None
    if payload.return_documents:
        documents = [{"text": d} if isinstance(d, str) else d for d in payload.documents]
    limit = f"at most max_chunks_per_doc={payload.max_chunks_per_doc} a document; a larger value reads more"
    return answer(str(uuid.uuid4()), stream_id, "1", scores, texts, payload.top_n, documents, passage_limit=limit)
