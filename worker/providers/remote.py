"""What every remote provider shares: one pooled HTTP client, bounded retries, a deadline.

A remote member gets one ``httpx.Client`` per process (connection pooling) with its own
connect and read timeouts. Each request is cut to what is left of the member's deadline,
so retries, ``Retry-After`` waits and TEI's batches all fit in one budget per window.

Nothing here puts a secret or the window's text in an error: details are built from our
own words, the URL is shown without its query string, and a URL carrying credentials is
refused. An error body may echo the request (a 422 quoting the query and documents) or
the key, so the WARNING detail only summarises it (status, media type, length, a JSON error
code); the body itself, with the key scrubbed out, is logged at DEBUG.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog

from kernel.settings import MemberSettings
from worker.providers.base import (
    MemberConfigError,
    ProviderUnavailable,
    Remedy,
    ScoreRequest,
    UnusableResponse,
    announce_retry,
)

log = structlog.get_logger("rerankq.provider.remote")

# httpx logs every request URL at INFO; a gateway that takes its key in the query string
# would leak it there, and one line per call is noise in a worker log anyway.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

TENANT_HEADER = "X-Rerankq-Tenant"
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 2.0
# Below this much time left, another attempt cannot finish; give up instead.
MIN_ATTEMPT_S = 0.05
BODY_SNIPPET = 200
# An error body larger than this is not parsed for its error code.
MAX_ERROR_JSON_BYTES = 65536
# What a JSON error code or a media type may look like: a token, never free text.
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MEDIA_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+\-]{1,64}/[A-Za-z0-9!#$&^_.+\-]{1,64}$")
ERROR_CODE_FIELDS = ("code", "error_code", "error_type", "type")


def public_url(url: str) -> str:
    """The URL as it may appear in a log: no credentials, no query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def check_base_url(url: str | None, *, required: bool = True) -> str | None:
    if not url:
        if required:
            raise MemberConfigError("url", "is required for this provider")
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MemberConfigError("url", f"must be an http:// or https:// URL with a host, got {public_url(url)!r}")
    if parts.username is not None or parts.password is not None:
        # httpx turns user:password@ into Basic auth, silently replacing the Bearer API key.
        raise MemberConfigError(
            "url",
            f"must not carry credentials (user:password@); give the key as the"
            f" member's API_KEY and the URL as {public_url(url)!r}",
        )
    return url.rstrip("/")


def check_member_numbers(member: MemberSettings) -> None:
    for field in ("timeout_s", "connect_timeout_s", "batch_size"):
        if getattr(member, field) <= 0:
            raise MemberConfigError(field, f"must be positive, got {getattr(member, field)}")
    if member.max_retries < 0:
        raise MemberConfigError("max_retries", f"must not be negative, got {member.max_retries}")
    if member.top_n is not None and member.top_n <= 0:
        raise MemberConfigError("top_n", f"must be positive, got {member.top_n}")
    if member.max_tokens_per_doc is not None and member.max_tokens_per_doc <= 0:
        raise MemberConfigError("max_tokens_per_doc", f"must be positive, got {member.max_tokens_per_doc}")


def refuse_instruction_field(member: MemberSettings, api: str) -> None:
    """A member whose API has no instruction field refuses the setting rather than ignore it."""
    if member.instruction_field:
        raise MemberConfigError(
            "instruction_field",
            f"{api} has no instruction field; an endpoint that takes"
            " one is served by provider http, which sends it in the field named here",
        )


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_summary(response: httpx.Response) -> str:
    """What may be said of an error body at WARNING: media type, length and, from a JSON body,
    an error code that is a bare token. Free text is never quoted: it may echo the input."""
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    parts = [media_type if _MEDIA_TYPE.match(media_type) else "unknown type", f"{len(response.content)} bytes"]
    code = _error_code(response.content)
    if code is not None:
        parts.append(f"code {code}")
    return ", ".join(parts)


def _error_code(content: bytes) -> str | None:
    if not content or len(content) > MAX_ERROR_JSON_BYTES:
        return None
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    nested = body.get("error")
    for holder in (nested, body) if isinstance(nested, dict) else (body,):
        for field in ERROR_CODE_FIELDS:
            if holder is body and field == "type":
                continue  # a top-level "type" is often the answer's own kind, not an error code
            value = holder.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
            if isinstance(value, str) and _TOKEN.match(value):
                return value
    return None


class RemoteClient:
    """POST JSON to one member's endpoint with pooling, deadline-cut timeouts and bounded retries."""

    def __init__(self, member: MemberSettings, *, not_found: Remedy | None = None) -> None:
        """``not_found``: what to tell the operator when the endpoint answers 404."""
        check_member_numbers(member)
        self.member = member
        self.not_found = not_found
        self._key = member.api_key.reveal() if member.api_key is not None else None
        self._timeout = httpx.Timeout(member.timeout_s, connect=member.connect_timeout_s)
        self._http = httpx.Client(
            timeout=self._timeout,
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=8, keepalive_expiry=30.0),
            headers={"Accept": "application/json", "User-Agent": "rerankq"},
            # A redirect could carry the Authorization header somewhere unexpected.
            follow_redirects=False,
        )

    def headers(self, request: ScoreRequest) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        # The tenant leaves this process only for a member explicitly trusted with it.
        if self.member.send_tenant and request.tenant:
            headers[TENANT_HEADER] = request.tenant
        return headers

    def scrub(self, text: str) -> str:
        """The text with the key masked. Scrub whole texts, then cut them: a key cut in two
        would no longer match, and its first characters would be kept."""
        if self._key and self._key in text:
            text = text.replace(self._key, "***")
        return text

    def post_json(self, url: str, payload: Any, headers: Mapping[str, str], *, deadline: float) -> Any:
        """The parsed JSON body of a 2xx answer; ProviderError otherwise.

        429 and 5xx are retried ``max_retries`` times with full-jitter backoff, waiting at
        least ``Retry-After``; a wait that would outlive the deadline is not started.
        """
        where = public_url(url)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining < MIN_ATTEMPT_S:
                raise ProviderUnavailable("timeout", f"deadline passed before POST {where}")
            timeout = httpx.Timeout(
                min(self.member.timeout_s, remaining), connect=min(self.member.connect_timeout_s, remaining)
            )
            try:
                response = self._http.post(url, json=payload, headers=dict(headers), timeout=timeout)
            except httpx.TimeoutException as exc:
                raise ProviderUnavailable(
                    "timeout", f"{type(exc).__name__} after {remaining:.2f}s: POST {where}"
                ) from None
            except httpx.ConnectError as exc:
                raise ProviderUnavailable("connect_error", self.scrub(f"POST {where}: {exc}")) from None
            except httpx.HTTPError as exc:
                raise ProviderUnavailable(
                    "http_error", self.scrub(f"{type(exc).__name__}: POST {where}: {exc}")
                ) from None

            status = response.status_code
            if 200 <= status < 300:
                return self._parse(response, where)
            reason = f"http_{status}"
            detail = f"POST {where} answered {status} ({error_summary(response)})"
            log.debug("provider_error_body", url=where, status=status, body=self.scrub(response.text)[:BODY_SNIPPET])
            remedy = self.not_found if status == 404 else None
            if status not in RETRYABLE_STATUS or attempt >= self.member.max_retries:
                raise ProviderUnavailable(reason, detail, remedy=remedy)
            wait = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))
            hinted = retry_after_s(response.headers.get("Retry-After"))
            if hinted is not None:
                wait = max(wait, hinted)
            if time.monotonic() + wait + MIN_ATTEMPT_S > deadline:
                raise ProviderUnavailable(reason, detail + f"; retry in {wait:.2f}s would pass the deadline")
            announce_retry(reason, wait, from_retry_after=hinted is not None)
            time.sleep(wait)
            attempt += 1

    def _parse(self, response: httpx.Response, where: str) -> Any:
        try:
            # The stdlib parser reads NaN and Infinity, so such scores are reported as
            # non-finite rather than as an unparsable body.
            return json.loads(response.content)
        except ValueError as exc:
            raise UnusableResponse("unparsable", self.scrub(f"POST {where}: {exc}")) from None

    def close(self) -> None:
        self._http.close()


# -- reading answers ---------------------------------------------------------


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UnusableResponse("bad_shape", f"{where} is {type(value).__name__}, not a number")
    return float(value)


def scores_from_pairs(items: Any, n_documents: int, *, score_field: str | tuple[str, ...]) -> list[float | None]:
    """``[{index, <score>}, ...]`` in any order → one score per document, None where left out.

    Whether leaving some out was allowed is ``check_subset_size``'s call.
    """
    if not isinstance(items, list):
        raise UnusableResponse("bad_shape", f"expected a list of results, got {type(items).__name__}")
    fields = (score_field,) if isinstance(score_field, str) else score_field
    scores: list[float | None] = [None] * n_documents
    seen: set[int] = set()
    for pos, item in enumerate(items):
        if not isinstance(item, dict):
            raise UnusableResponse("bad_shape", f"result {pos} is {type(item).__name__}, not an object")
        index = item.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            raise UnusableResponse("bad_shape", f"result {pos} has no integer index")
        if not 0 <= index < n_documents:
            raise UnusableResponse("index_out_of_range", f"index {index} for {n_documents} documents")
        if index in seen:
            raise UnusableResponse("repeated_index", f"index {index} appears twice")
        seen.add(index)
        field = next((f for f in fields if f in item), None)
        if field is None:
            raise UnusableResponse("bad_shape", f"result {pos} has none of {', '.join(fields)}")
        scores[index] = _number(item[field], f"result {pos}.{field}")
    return scores


def scores_in_order(items: Any, n_documents: int) -> list[float | None]:
    """``[s0, s1, ...]``: one score per document, in input order."""
    if not isinstance(items, list):
        raise UnusableResponse("bad_shape", f"expected a list of scores, got {type(items).__name__}")
    if len(items) != n_documents:
        raise UnusableResponse("wrong_count", f"{len(items)} scores for {n_documents} documents")
    return [_number(s, f"scores[{i}]") for i, s in enumerate(items)]


def expected_subset(member: MemberSettings, n_documents: int) -> int | None:
    """How many results a ``top_n`` answer holds, or None when the full set is expected."""
    if member.top_n is None or member.top_n >= n_documents:
        return None
    return member.top_n


def check_subset_size(scores: list[float | None], n_documents: int, top_n: int | None) -> None:
    """A subset is valid only when one was asked for, and only of the size asked for."""
    present = sum(s is not None for s in scores)
    if present == n_documents:
        return
    if top_n is None or present != top_n:
        raise UnusableResponse(
            "wrong_count", f"{present} results for {n_documents} documents" + (f" (top_n {top_n})" if top_n else "")
        )
