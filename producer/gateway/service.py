"""What every route shares: the settings, the keys, the bridge to the queue, and the steps
common to the three rerank APIs (who is asking, which device, how long to wait, the job)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import wraps
from typing import Generic, TypeVar, cast

import msgspec
import redis
from starlette.requests import Request
from starlette.responses import Response

from kernel import stream_defaults
from kernel.blank_text import is_blank
from kernel.cost import window_size_within
from kernel.errors import StoreError, StreamNotFound, ValidationError
from kernel.logs import get_logger
from kernel.passage_budget import fitting_window_size
from kernel.settings import Settings
from kernel.wire import Candidate, Device
from producer.gateway.auth import KeyRing, Principal
from producer.gateway.bridge import QueueBridge, store_problem
from producer.gateway.config import GatewaySettings
from producer.gateway.jobs import RerankJob
from producer.gateway.limits import read_body
from producer.gateway.problems import Problem, decode
from producer.options import StreamOptions
from producer.stream_spec import resolve_spec

log = get_logger("rerankq.gateway")

DEVICE_HEADER = "x-rerankq-device"
TIMEOUT_HEADER = "x-rerankq-timeout"
#: Cohere's max_tokens_per_doc is in tokens, the stream's document budget in code points; an
#: English subword token is about four characters, so a budget of 4 per token keeps at least
#: as much text as the caller allowed (the operator's RERANKQ_DOCUMENT_BUDGET stays the ceiling).
CHARS_PER_TOKEN = 4

#: The key ``producer.gateway.tenants`` keeps a request's principal under in its state.
PRINCIPAL_STATE = "rerankq_principal"

Handler = Callable[[Request], Awaitable[Response]]
Body = TypeVar("Body")


@dataclass
class Gateway:
    settings: Settings
    config: GatewaySettings
    keyring: KeyRing
    bridge: QueueBridge

    def principal(self, request: Request) -> Principal:
        known = request.scope.get("state", {}).get(PRINCIPAL_STATE)  # authenticated already (tenants.py)
        return known if known is not None else self.keyring.authenticate(request.headers.get("authorization"))

    async def body(self, request: Request, type_: type[Body]) -> Body:
        """The request's JSON body as ``type_``, within the byte limit."""
        return cast(Body, decode(await read_body(request, self.config.max_body_bytes), type_))

    def device(self, request: Request, principal: Principal, asked: str | None = None) -> Device:
        """The device asked for (a body field), else the route's (``/gpu/v2/rerank``), else the
        ``X-Rerankq-Device`` header, else the key's default; one the key may not use is refused."""
        asked = asked or request.path_params.get("device") or request.headers.get(DEVICE_HEADER)
        return principal.device(asked.lower() if asked else None, self.config.device)

    def timeout_s(self, request: Request) -> float:
        asked = request.headers.get(TIMEOUT_HEADER)
        if asked is None:
            return self.config.timeout_s
        try:
            value = float(asked)
        except ValueError:
            value = math.nan
        if not 0 < value <= self.config.max_timeout_s:
            raise Problem(
                "invalid",
                f"{TIMEOUT_HEADER}: must be seconds in (0, {self.config.max_timeout_s}]",
                field=TIMEOUT_HEADER,
            )
        return value

    def check_query(self, query: str) -> None:
        if is_blank(query):
            raise Problem(
                "invalid",
                "query must not be empty or blank (white space, control or format characters only)",
                field="query",
            )
        if len(query) > self.settings.streams.max_query_chars:
            raise Problem(
                "invalid",
                f"query: {len(query)} characters, over the limit of {self.settings.streams.max_query_chars}",
                field="query",
            )

    def check_documents(self, texts: list[str], field: str) -> None:
        """Count and size of the documents: each API names ``field`` its own way (documents, texts)."""
        if not texts:
            raise Problem("empty", f"list of {field} must not be empty", field=field)
        limit = self.config.documents(self.settings.streams)
        if len(texts) > limit:
            raise Problem(
                "too_many", f"{field}: {len(texts)} given, over the limit of {limit} per request", field=field
            )
        chars = self.config.document_chars(self.settings.streams)
        # A blank document is accepted, as the real services score an empty text: the worker
        # scores it minus infinity, last, without sending it (kernel.blank_text).
        for i, text in enumerate(texts):
            if len(text) > chars:
                raise Problem(
                    "invalid", f"{field}[{i}]: {len(text)} characters, over the limit of {chars}", field=f"{field}[{i}]"
                )

    def job(
        self,
        query: str,
        texts: list[str],
        device: Device,
        principal: Principal,
        *,
        max_tokens_per_doc: int | None = None,
        instruction: str | None = None,
        max_passages: int | None = None,
        passages: bool = False,
    ) -> RerankJob:
        """A rerank route's request as a stream: its ``StreamOptions`` are what the route's
        fields, the API key and the gateway's settings say. With ``max_passages`` the documents
        are split into passages, and windows are made small enough for the per-window ceiling;
        any window small enough to be scored within the task's time limit (``kernel.cost``)."""
        budget = self.settings.streams.document_budget
        if max_tokens_per_doc is not None:
            budget = max(1, min(budget, max_tokens_per_doc * CHARS_PER_TOKEN))
        window_size = min(len(texts), self.settings.streams.max_window_size)
        passages = passages or max_passages is not None
        if passages:
            per_document = max_passages or stream_defaults.MAX_PASSAGES
            fits = fitting_window_size(self.settings.streams.max_window_passage_tokens, per_document)
            window_size = max(1, min(window_size, fits))
        asked = StreamOptions(
            device=device,
            chain=principal.chain,
            tenant=principal.tenant,
            window_size=window_size,
            document_budget=budget,
            ttl_s=self.config.stream_ttl_s,
            instruction=instruction,
            long_documents="passages" if passages else None,
            max_passages=max_passages,
        )
        sized = resolve_spec(query, asked, self.settings, n_candidates=len(texts))
        window_size = window_size_within(self.settings, sized, [Candidate(id="", text=text) for text in texts])
        # The resolved filters and TTL go into the options, and so into the job's key
        # (RerankJob.idempotency_key): a job under other settings is another job.
        options = msgspec.structs.replace(
            asked,
            window_size=window_size,
            ttl_s=sized.ttl_s,
            min_score=sized.min_score,
            min_final_score=sized.min_final_score,
        )
        return RerankJob(query=query, texts=texts, options=options)


def caller(request: Request) -> tuple[Gateway, Principal]:
    """The gateway and who is asking: every route's first step."""
    gateway: Gateway = request.app.state.gateway
    return gateway, gateway.principal(request)


@dataclass
class RerankCall(Generic[Body]):
    """What a rerank route (Cohere v1, v2, TEI) knows before its own checks."""

    gateway: Gateway
    principal: Principal
    device: Device
    timeout_s: float
    payload: Body


async def rerank_call(request: Request, type_: type[Body]) -> RerankCall[Body]:
    """Who asks, for which device, how long to wait, and the body, in the order each is refused."""
    gateway, principal = caller(request)
    device = gateway.device(request, principal)
    timeout_s = gateway.timeout_s(request)
    return RerankCall(gateway, principal, device, timeout_s, await gateway.body(request, type_))


def endpoint(render: Callable[[Problem], Response]) -> Callable[[Handler], Handler]:
    """Answer every problem a route meets in its API's own error shape; log it without its text
    (a message may quote the caller's documents)."""

    def wrap(handler: Handler) -> Handler:
        @wraps(handler)
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Problem as problem:
                return _answer(render, problem, request)
            except ValidationError as error:
                return _answer(render, Problem.from_validation(error), request)
            except StreamNotFound as error:
                return _answer(render, Problem("not_found", str(error), stream_id=error.stream_id), request)
            except (StoreError, redis.RedisError, OSError) as exc:
                return _answer(render, store_problem(exc), request)
            except RecursionError:
                # Input nested deeper than the interpreter can walk, found past decoding.
                return _answer(render, Problem("invalid", "the request is nested too deeply"), request)

        return run

    return wrap


def _answer(render: Callable[[Problem], Response], problem: Problem, request: Request) -> Response:
    log.debug(
        "gateway_request_refused",
        path=request.url.path,
        kind=problem.kind,
        field=problem.field,
        stream=problem.stream_id,
    )
    response = render(problem)
    response.headers.update(problem.headers())
    if problem.kind == "unauthenticated":
        response.headers["WWW-Authenticate"] = "Bearer"
    return response
