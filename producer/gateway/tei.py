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
``instruction`` is rerankq's own field, the stream option of that name (TEI takes none); it is
part of the job, so the same texts under another instruction are scored again.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from producer.gateway.limits import read_body
from producer.gateway.problems import STREAM_HEADER, Problem, decode
from producer.gateway.service import Gateway, endpoint
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


def raw(score: float) -> float:
    p = min(max(score, SCORE_EPSILON), 1 - SCORE_EPSILON)
    return math.log(p / (1 - p))


@endpoint(render)
async def rerank(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    principal = gateway.principal(request)
    device = gateway.device(request, principal)
    timeout_s = gateway.timeout_s(request)
    payload = decode(await read_body(request, gateway.config.max_body_bytes), TeiRequest)
    assert isinstance(payload, TeiRequest)
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
    job = gateway.job(payload.query, payload.texts, device, principal, instruction=payload.instruction)
    if payload.truncate is False:
        for i, text in enumerate(payload.texts):
            if len(text) > job.document_budget:
                raise Problem(
                    "invalid",
                    f"texts[{i}]: {len(text)} characters, longer than the {job.document_budget} "
                    "this server reranks; send truncate: true to cut it",
                    field=f"texts[{i}]",
                )
    stream_id, scores = await gateway.bridge.rerank(job, timeout_s)
    ranks = [
        TeiRank(
            index=s.index,
            score=raw(s.score) if payload.raw_scores else s.score,
            text=payload.texts[s.index] if payload.return_text else msgspec.UNSET,
        )
        for s in scores
    ]
    return Response(msgspec.json.encode(ranks), media_type="application/json", headers={STREAM_HEADER: stream_id})
