"""Hugging Face Text Embeddings Inference's ``POST /rerank``, answered from the queue.

Shapes as TEI's router defines them (``router/src/http/types.rs``: ``RerankRequest``,
``Rank``, ``RerankResponse``; ``router/src/lib.rs``: ``ErrorResponse``, ``ErrorType`` and its
status codes; the published ``docs/openapi.json``):

- ``{"query", "texts": [str], "truncate"?: bool|null, "truncation_direction"?: "left"|"right",
  "raw_scores"?: false, "return_text"?: false}``; like TEI's serde struct, unknown fields are
  ignored.
- A bare array ``[{"index", "score", "text"?}]``, best first; ``text`` only with
  ``return_text``, and then the text as sent.
- ``{"error": str, "error_type": "Validation"|"Empty"|"Overloaded"|"Backend"|"Unhealthy"}``
  (serde writes the variant names): 400 Empty (no texts), 413 Validation (more texts than a
  request may carry, as TEI's OpenAPI documents its batch-size error, though its router maps
  that Validation error to 422; or a body over the byte limit), 422 Validation (a bad field,
  a text too long), 429 Overloaded (with ``Retry-After``), 424 Backend (every reranker
  failed), 503 Unhealthy (Redis), 504 Backend (timed out; the stream id is in
  ``X-Rerankq-Stream-Id``). A missing or wrong key is a bare 401, as TEI's ``--api-key``
  check answers.

Scores: without ``raw_scores`` the queue's normalised score in [0, 1], which is what TEI
gives for a reranker (its sigmoid applied); with ``raw_scores`` its logit, the score before
that sigmoid, so a client that applies the sigmoid itself gets the same number back.
``truncate`` (default true, as TEI started with ``--auto-truncate``) cuts each text to the
stream's document budget around the first query-term match; ``truncate: false`` refuses a
longer text with 422 instead, as TEI refuses an input past the model's length.
``truncation_direction`` is checked and otherwise unused: the cut keeps the matching part.
``GET /info`` answers TEI's ``Info`` (router/src/lib.rs), which tooling probes to learn what it
talks to: a ``reranker`` model type, and the gateway's own bounds where TEI gives its model's
(``max_input_length`` in tokens is the document budget at ``service.CHARS_PER_TOKEN``;
``max_client_batch_size`` the documents a request may carry; ``auto_truncate`` true, as
``truncate`` defaults). It takes the same key as ``/rerank``.
``instruction`` is rerankq's own field, the stream option of that name (TEI takes none); it is
part of the job, so the same texts under another instruction are scored again.
"""

from __future__ import annotations

import math
from importlib.metadata import PackageNotFoundError, version
from typing import Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from producer.gateway.problems import STREAM_HEADER, Problem
from producer.gateway.service import CHARS_PER_TOKEN, caller, endpoint, rerank_call
from producer.options import InstructionOption

#: Logits of scores at 0 or 1 would be infinite, which JSON cannot carry.
SCORE_EPSILON = 1e-12


class TeiRequest(msgspec.Struct, kw_only=True):
    query: str
    texts: list[str]
    truncate: bool | None = None
    truncation_direction: Literal["left", "right", "Left", "Right"] = "right"
    raw_scores: bool = False
    return_text: bool = False
    instruction: InstructionOption = None


class TeiRank(msgspec.Struct, omit_defaults=True):
    index: int
    score: float
    text: str | msgspec.UnsetType = msgspec.UNSET


ErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class TeiError(msgspec.Struct):
    error: str
    error_type: ErrorType


STATUS: dict[str, tuple[int, ErrorType]] = {
    "invalid": (422, "Validation"),
    "malformed": (422, "Validation"),
    "empty": (400, "Empty"),
    "too_many": (413, "Validation"),
    "too_large": (413, "Validation"),
    "forbidden": (403, "Validation"),
    "not_found": (404, "Validation"),
    "conflict": (409, "Validation"),
    "overloaded": (429, "Overloaded"),
    "failed": (424, "Backend"),
    "timeout": (504, "Backend"),
    "unserved": (503, "Unhealthy"),
    "unavailable": (503, "Unhealthy"),
}


def render(problem: Problem) -> Response:
    if problem.kind == "unauthenticated":
        return Response(status_code=401)
    status, error_type = STATUS[problem.kind]
    return Response(
        msgspec.json.encode(TeiError(error=problem.message, error_type=error_type)),
        status_code=status,
        media_type="application/json",
    )


class RerankerLabels(msgspec.Struct):
    id2label: dict[str, str]
    label2id: dict[str, int]


class ModelType(msgspec.Struct):
    reranker: RerankerLabels


class TeiInfo(msgspec.Struct):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: ModelType
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None


def _version() -> str:
    try:
        return version("rerankq")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "0"


@endpoint(render)
async def info(request: Request) -> Response:
    gateway, _ = caller(request)
    streams = gateway.settings.streams
    max_input_length = max(1, streams.document_budget // CHARS_PER_TOKEN)
    body = TeiInfo(
        model_id="rerankq",
        model_sha=None,
        model_dtype="float32",
        model_type=ModelType(reranker=RerankerLabels(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})),
        max_concurrent_requests=gateway.config.tenant_max_requests,
        max_input_length=max_input_length,
        max_batch_tokens=max_input_length * streams.max_window_size,
        max_batch_requests=None,
        max_client_batch_size=gateway.config.documents(gateway.settings.streams),
        auto_truncate=True,
        tokenization_workers=gateway.config.threads,
        version=_version(),
        sha=None,
        docker_label=None,
    )
    return Response(msgspec.json.encode(body), media_type="application/json")


def raw(score: float) -> float:
    p = min(max(score, SCORE_EPSILON), 1 - SCORE_EPSILON)
    return math.log(p / (1 - p))


@endpoint(render)
async def rerank(request: Request) -> Response:
    call = await rerank_call(request, TeiRequest)
    gateway, payload = call.gateway, call.payload
    gateway.check_query(payload.query)
    # TEI's own words for these two (router/src/http/server.rs).
    if not payload.texts:
        raise Problem("empty", "`texts` cannot be empty", field="texts")
    limit = gateway.config.documents(gateway.settings.streams)
    if len(payload.texts) > limit:
        raise Problem(
            "too_many", f"batch size {len(payload.texts)} > maximum allowed batch size {limit}", field="texts"
        )
    gateway.check_documents(payload.texts, "texts")
    job = gateway.job(payload.query, payload.texts, call.device, call.principal, instruction=payload.instruction)
    if payload.truncate is False:
        for i, text in enumerate(payload.texts):
            if len(text) > job.document_budget:
                raise Problem(
                    "invalid",
                    f"texts[{i}]: {len(text)} characters, longer than the {job.document_budget} "
                    "this server reranks; send truncate: true to cut it",
                    field=f"texts[{i}]",
                )
    stream_id, scores = await gateway.bridge.rerank(job, call.timeout_s)
    ranks = [
        TeiRank(
            index=s.index,
            score=raw(s.score) if payload.raw_scores else s.score,
            text=payload.texts[s.index] if payload.return_text else msgspec.UNSET,
        )
        for s in scores
    ]
    return Response(msgspec.json.encode(ranks), media_type="application/json", headers={STREAM_HEADER: stream_id})
