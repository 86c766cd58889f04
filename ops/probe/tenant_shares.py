"""Probe what one tenant can make the queue do to another, and what a stream can make a member read.

    python -m ops.probe.tenant_shares [--keep] [--only NAME]

The gateway doors' deployment (``ops.probe.gateway_doors``: a private Redis, one worker,
``rerankq serve`` with tenants A and B, a slow loopback TEI member counting what it is sent),
with the fair share small enough to see: 2 windows a tenant (``RERANKQ_TENANT_QUEUED_WINDOWS``),
the default 262,144 tokens, 120 windows waiting before a tenant's own 429, and a declared
scoring rate of 1,500 tokens a second, so a window of 405,000 tokens is past the 300 s time
limit. The member takes 250 ms a call and 0.2 ms a text. Each probe, bounded in count and time:

- ``passage_header_amplification``: the issue's stream (10 documents whose context is 60,000
  characters, ``passage_tokens=16``, ``passage_stride=1``, ``max_passages=128``): the member is
  sent no text longer than a header's half of the document budget and 16 tokens of text, and
  no request over 2 MB (it was 1,280 texts of 60 KB, 77 MB);
- ``passage_headers_at_open``: a stream whose passages and headers would pass the per-window
  ceiling is a 422 naming ``max_passages``, nothing written;
- ``window_past_time_limit``: a stream with a window that could outlive the time limit is a
  422 naming ``window_size``, nothing written;
- ``cost_flood``: A's passages stream of 256 documents of 1,200 words (windows of 214,000
  tokens: one fits A's share) holds B's ``/v2/rerank`` back by at most one of A's windows, and
  is still running when B is answered (then the probe waits for it to drain);
- ``count_flood``: A's four streams of 40 one-candidate windows open at once (201) and hold
  B's call back by at most A's share (2 windows);
- ``tenant_backlog``: A, with 158 windows waiting, is answered 429 naming its tenant's
  backlog, while B's stream opens.

A probe fails (exit status 1) on starvation past the documented bound, on amplification past
it, or on any 5xx; 2 when the deployment would not start.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import httpx

from kernel.fair_share import bucket_for
from ops.probe.gateway_doors import MEMBER_DELAY_S, Deployment, run_probes
from ops.probe.runner import check
from producer import RerankClient, load_settings

SHARE_WINDOWS = 2
SETTINGS = {
    "RERANKQ_TENANT_QUEUED_WINDOWS": str(SHARE_WINDOWS),
    "RERANKQ_TENANT_MAX_WAITING": "120",
    "RERANKQ_SCORING_TOKENS_PER_S": "1500",
    "RERANKQ_GATEWAY_DRAIN_SAMPLE_S": "0.1",
    "RERANKQ_RERANKER_BATCH_SIZE": "4096",
}
PER_TEXT_S = 0.0002
WORDS = "the checkout service returned errors after a certificate rotation on the payment gateway".split()


def text(words: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + j) % len(WORDS)] for j in range(words))


def open_stream(d: Deployment, tenant: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(d.url + "/v1/streams", json=body, headers=d.auth(tenant), timeout=60)


def opened(d: Deployment, tenant: str, body: dict[str, object]) -> str:
    answer = open_stream(d, tenant, body)
    check(answer.status_code == 201, f"tenant {tenant}'s open answered {answer.status_code}: {answer.text[:200]}")
    return str(answer.json()["stream_id"])


def keys_in(d: Deployment) -> int:
    """Every key of the deployment's Redis: a refused open writes none."""
    client = RerankClient(load_settings(d.env))
    try:
        return int(client.store.client.dbsize())
    finally:
        client.close()


def wait_drained(d: Deployment, tenant: str, timeout_s: float = 60) -> None:
    """Until the tenant has nothing waiting for its share, or sent and not committed, on the cpu queue."""
    client = RerankClient(load_settings(d.env))
    bucket = bucket_for(tenant, "interactive", "")
    queued = client.store.keys.fair_share("cpu").queued
    deadline = time.monotonic() + timeout_s
    try:
        while any(client.store.client.hmget(queued, f"{bucket} n", f"{bucket} w")):
            check(time.monotonic() < deadline, f"tenant {tenant}'s backlog did not drain in {timeout_s:.0f} s")
            time.sleep(0.2)
    finally:
        client.close()


def committed_between(d: Deployment, streams: list[str], start: float, end: float) -> int:
    client = RerankClient(load_settings(d.env))
    try:
        return sum(
            1
            for stream in streams
            for result in client.store.snapshot(stream).results.values()
            if start < result.committed_at < end
        )
    finally:
        client.close()


def b_waits(d: Deployment) -> tuple[float, float]:
    """One of tenant B's rerank calls; when it started and ended (epoch seconds)."""
    started = time.time()
    answer = httpx.post(
        d.url + "/v2/rerank",
        json={"model": "m", "query": f"b asks {uuid.uuid4().hex}", "documents": ["a runbook", "the printer"]},
        headers={**d.auth("b"), "X-Rerankq-Timeout": "60"},
        timeout=90,
    )
    check(answer.status_code == 200, f"tenant B's rerank answered {answer.status_code}: {answer.text[:200]}")
    return started, time.time()


def probe_passage_header_amplification(d: Deployment) -> None:
    context = (text(40) + " ") * 220
    body = {
        "query": "why did checkout fail",
        "candidates": [{"id": f"d{i}", "text": text(200, i), "context": context[:60_000]} for i in range(10)],
        "long_documents": "passages",
        "passage_cut": "tokens",
        "passage_tokens": 16,
        "passage_stride": 1,
        "max_passages": 128,
    }
    stream = opened(d, "a", body)
    page = httpx.get(f"{d.url}/v1/streams/{stream}/page", params={"wait": 60}, headers=d.auth("a"), timeout=90)
    check(page.status_code == 200 and page.json()["complete"], f"the stream did not complete: {page.text[:200]}")
    # A header is at most half the document budget (2,048); 16 tokens of these words are under 200.
    check(d.member.longest_text <= 1024 + 200, f"the member was sent a text of {d.member.longest_text} characters")
    check(d.member.largest_body < 2_000_000, f"the member was sent a request of {d.member.largest_body} bytes")


def probe_passage_headers_at_open(d: Deployment) -> None:
    body = {
        "query": "q",
        "candidates": [{"id": f"c{i}", "text": "t", "context": "Runbooks"} for i in range(64)],
        "window_size": 64,
        "long_documents": "passages",
    }
    before = keys_in(d)
    answer = open_stream(d, "a", body)
    check(answer.status_code == 422, f"answered {answer.status_code}")
    check("max_passages" in answer.text and "header" in answer.text, f"the answer: {answer.text[:200]}")
    check(keys_in(d) == before, "the refused open wrote keys")


def probe_window_past_time_limit(d: Deployment) -> None:
    body = {"query": "q", "candidates": [{"id": f"c{i}", "text": text(400, i)} for i in range(200)], "window_size": 200}
    before = keys_in(d)
    answer = open_stream(d, "a", body)
    check(answer.status_code == 422, f"answered {answer.status_code}")
    check("window_size" in answer.text and "time limit" in answer.text, f"the answer: {answer.text[:200]}")
    check(keys_in(d) == before, "the refused open wrote keys")


def probe_cost_flood(d: Deployment) -> None:
    body = {
        "query": "a cost flood: why did checkout fail",
        "candidates": [{"id": f"c{i}", "text": text(1200, i)} for i in range(256)],
        "long_documents": "passages",
        "passage_tokens": 16,
        "max_passages": 128,
        "first_windows": 11,
    }
    flood = [opened(d, "a", body)]
    time.sleep(2 * MEMBER_DELAY_S)  # A's first window is being scored
    started, ended = b_waits(d)
    meanwhile = committed_between(d, flood, started, ended)
    check(meanwhile <= 1, f"tenant A committed {meanwhile} costly windows while tenant B waited (its share holds 1)")
    status = httpx.get(f"{d.url}/v1/streams/{flood[0]}", headers=d.auth("a"), timeout=30).json()
    check(any(w["state"] != "committed" for w in status["windows"]), "tenant A's stream was done before B asked")
    wait_drained(d, "tenant-a")  # the next probes start from an empty queue


def probe_count_flood(d: Deployment) -> None:
    flood, opening = [], time.monotonic()
    for i in range(4):
        body = {
            "query": f"a flood {i} {uuid.uuid4().hex[:6]}",
            "candidates": [{"id": f"a{i}-{j}", "text": f"note {j}"} for j in range(40)],
            "window_size": 1,
            "first_windows": 40,
        }
        flood.append(opened(d, "a", body))
    check(time.monotonic() - opening < 10, f"tenant A's four opens took {time.monotonic() - opening:.1f} s")
    started, ended = b_waits(d)
    meanwhile = committed_between(d, flood, started, ended)
    check(
        meanwhile <= SHARE_WINDOWS,
        f"tenant A committed {meanwhile} windows while tenant B waited (its share is {SHARE_WINDOWS})",
    )


def probe_tenant_backlog(d: Deployment) -> None:
    body = {"query": "one more", "candidates": [{"id": "x", "text": "t"}], "window_size": 1}
    deadline = time.monotonic() + 10
    while (answer := open_stream(d, "a", body)).status_code != 429:
        check(answer.status_code == 201, f"tenant A answered {answer.status_code}")
        check(time.monotonic() < deadline, "tenant A, past its backlog's bound, was never refused")
        time.sleep(0.2)
    check("tenant has" in answer.text and "retry-after" in answer.headers, f"the 429: {answer.text[:200]}")
    b = open_stream(d, "b", body)
    check(b.status_code == 201, f"tenant B's open answered {b.status_code} while tenant A was refused")


def probes() -> list[tuple[str, Callable[[Deployment], None]]]:
    return [
        ("passage_header_amplification", probe_passage_header_amplification),
        ("passage_headers_at_open", probe_passage_headers_at_open),
        ("window_past_time_limit", probe_window_past_time_limit),
        ("cost_flood", probe_cost_flood),
        ("count_flood", probe_count_flood),
        ("tenant_backlog", probe_tenant_backlog),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.probe.tenant_shares",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--keep", action="store_true", help="keep the deployment's logs")
    parser.add_argument("--only", action="append", help="run only this probe (repeatable)")
    args = parser.parse_args(argv)
    return run_probes(probes(), args.only, keep=args.keep, env=SETTINGS, member_per_text_s=PER_TEXT_S)


if __name__ == "__main__":
    raise SystemExit(main())
