"""The chain through a real worker: what reaches Redis when members misbehave.

Real rerank servers on loopback, a real ``python -m worker``, a real Redis; assertions
read committed windows, counters and the worker's own log.
"""

from __future__ import annotations

import shutil
import time

import pytest
from conftest import make_candidates, pipeline_keys
from delivery_helpers import patient, wait_committed
from rerank_servers import closed_port_url, expected_score

from kernel.errors import ValidationError
from producer import RerankClient, load_settings

KEY = "sk-live-CHAIN-7d1e0c9a"
DEBUG = ["--device", "cpu", "--loglevel", "DEBUG"]


def log_lines(worker, event: str) -> list[str]:
    return [line for line in worker.log().splitlines() if event in line]


def test_timeout_fails_over_to_hosted_member(server, start_worker, make_client):
    tei, cohere = server("tei"), server("cohere")
    tei.mode = "hang"
    worker = start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": tei.url,
            "RERANKQ_RERANKER_API_KEY": KEY,
            "RERANKQ_RERANKER_TIMEOUT_S": "1",
            "RERANKQ_RERANKER_1_PROVIDER": "cohere",
            "RERANKQ_RERANKER_1_URL": cohere.url,
            "RERANKQ_RERANKER_1_MODEL": "rerank-v3.5",
            "RERANKQ_RERANKER_1_API_KEY": KEY,
            "RERANKQ_RERANKER_1_TIMEOUT_S": "2",
            "RERANKQ_RERANKER_2_PROVIDER": "rrf",
        },
        args=DEBUG,
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    stream = client.open("gateway error", make_candidates(10), window_size=5, first_windows=2, tenant="acme-eu")
    status = wait_committed(client, stream)

    assert [w.served_by for w in status.windows] == ["1:cohere", "1:cohere"]
    assert [w.ranked for w in status.windows] == [5, 5]
    assert [w.failovers for w in status.windows] == [["0:tei: timeout"]] * 2  # where a pipeline looks
    results = client.store.snapshot(stream).results
    assert [results[w].failovers for w in (0, 1)] == [["0:tei: timeout"]] * 2
    for decision in results[0].decisions + results[1].decisions:
        assert decision.served_by == "1:cohere"
        assert decision.score == pytest.approx(expected_score(decision.document))
    counters = client.store.counters()
    assert counters["provider_calls:0:tei"] == 2 and counters["failovers:0:tei"] == 2
    assert counters["provider_timeouts:0:tei"] == 2  # a TIMEOUT_S too short shows in a counter
    assert "provider_timeouts:1:cohere" not in counters
    assert counters["provider_calls:1:cohere"] == 2 and "failovers:1:cohere" not in counters
    assert tei.count == 2 and cohere.count == 2
    # The tenant stays home: neither member was trusted with it.
    assert all("x-rerankq-tenant" not in r.headers for r in tei.requests + cohere.requests)
    assert cohere.requests[0].headers["authorization"] == f"Bearer {KEY}"

    failovers = log_lines(worker, "reranker_failover")
    assert len(failovers) == 2
    for window, line in enumerate(failovers):
        assert "warning" in line.lower() and "member=0:tei" in line and "reason=timeout" in line
        assert f"stream={stream}" in line and f"window={window}" in line
    assert KEY not in worker.log()


def test_chain_fails_open_to_fusion_order(server, start_worker, make_client):
    cohere = server("cohere")
    cohere.mode = "malformed"
    worker = start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": closed_port_url(),
            "RERANKQ_RERANKER_TIMEOUT_S": "1",
            "RERANKQ_RERANKER_1_PROVIDER": "cohere",
            "RERANKQ_RERANKER_1_URL": cohere.url + "/rerank",
            "RERANKQ_RERANKER_1_API_KEY": KEY,
            "RERANKQ_RERANKER_1_TIMEOUT_S": "1",
            "RERANKQ_RERANKER_2_PROVIDER": "rrf",
        },
        args=DEBUG,
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    stream = client.open("gateway error", make_candidates(6), window_size=6)
    wait_committed(client, stream)
    result = client.store.snapshot(stream).results[0]
    assert result.served_by == "2:rrf" and result.passthrough
    assert result.failovers == ["0:tei: connect_error", "1:cohere: unparsable"]
    assert [d.id for d in result.decisions] == [f"c{i}" for i in range(6)]  # fusion order kept
    page = client.pull(stream, 0, 6, timeout=5)
    assert {row.served_by for row in page.rows} == {"2:rrf"}
    counters = client.store.counters()
    assert counters["failovers:0:tei"] == 1 and counters["failovers:1:cohere"] == 1
    assert KEY not in worker.log()


def test_chain_without_a_fail_open_member_commits_failed_once(server, start_worker, make_client):
    tei = server("tei")
    tei.mode = "500"
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": tei.url,
            "RERANKQ_RERANKER_TIMEOUT_S": "1",
            "RERANKQ_RERANKER_MAX_RETRIES": "1",
        },
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    stream = client.open("gateway error", make_candidates(4), window_size=4)
    window = wait_committed(client, stream).windows[0]
    assert window.served_by is None and window.failed == 4 and window.ranked == 0
    assert "0:tei: http_500" in (window.reason or "")
    assert window.attempts == 1 and tei.count == 2  # one call, one retry of the 500
    page = client.pull(stream, 0, 4, timeout=2)
    assert [row.kind for row in page.rows] == ["failed"] * 4
    assert all("0:tei: http_500" in row.reason for row in page.rows)
    time.sleep(1.0)  # nothing comes back for it: committed means done
    assert tei.count == 2 and client.status(stream).windows[0].attempts == 1


def test_valid_subset_commits_omitted_and_tenant_goes_only_where_enabled(server, start_worker, make_client):
    generic = server("rankings")
    generic.mode = "subset"
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "http",
            "RERANKQ_RERANKER_URL": generic.url + "/rerank",
            "RERANKQ_RERANKER_TOP_N": "3",
            "RERANKQ_RERANKER_SEND_TENANT": "true",
            "RERANKQ_RERANKER_TIMEOUT_S": "1",
            "RERANKQ_RERANKER_1_PROVIDER": "rrf",
        },
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    stream = client.open("gateway error", make_candidates(8), window_size=8, tenant="acme-eu")
    window = wait_committed(client, stream).windows[0]
    assert window.served_by == "0:http" and window.ranked == 3 and window.omitted == 5
    result = client.store.snapshot(stream).results[0]
    assert [type(d).__name__ for d in result.decisions] == ["Ranked"] * 3 + ["Omitted"] * 5
    assert generic.requests[0].body["top_n"] == 3
    assert generic.requests[0].headers["x-rerankq-tenant"] == "acme-eu"


def test_member_that_cannot_start_is_retried_lazily(start_worker, make_client, tiny_model_dir, tmp_path):
    model_dir = tmp_path / "model-not-there-yet"
    worker = start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "local",
            "RERANKQ_RERANKER_MODEL": str(model_dir),
            "RERANKQ_RERANKER_1_PROVIDER": "rrf",
            "RERANKQ_MEMBER_RESTART_S": "2",
            # Started on purpose before its model is there (the model arrives below).
            "RERANKQ_SERVE_WITHOUT_SCORING": "true",
        }
    )
    # Said loudly once at start, before any window: no member that scores could start.
    deadline = time.monotonic() + patient(30)
    while not log_lines(worker, "no_scoring_member_started") and time.monotonic() < deadline:
        time.sleep(0.1)
    [error] = log_lines(worker, "no_scoring_member_started")
    assert "[error" in error and "0:local" in error and "model_load" in error and "1:rrf" in error
    client = make_client()
    stream = client.open("gateway error", make_candidates(9), window_size=3, first_windows=3)
    status = wait_committed(client, stream)
    assert [w.served_by for w in status.windows] == ["1:rrf"] * 3
    reasons = [f for r in client.store.snapshot(stream).results.values() for f in r.failovers]
    assert set(reasons) <= {"0:local: model_load", "0:local: not_started"}
    assert reasons.count("0:local: not_started") >= 2  # not reloaded on every window
    assert 1 <= len(log_lines(worker, "member_start_failed")) <= 2
    assert len(log_lines(worker, "no_scoring_member_started")) == 1  # once, not once per window

    shutil.copytree(tiny_model_dir, model_dir)  # the model arrives; no restart needed
    time.sleep(2.1)
    stream = client.open("gateway error", make_candidates(3, prefix="d"), window_size=3)
    assert wait_committed(client, stream).windows[0].served_by == "0:local"


def test_chain_profiles_select_members_and_never_widen(server, start_worker, base_env):
    cohere = server("cohere")
    chain = {
        "RERANKQ_RERANKER_PROVIDER": "tei",
        "RERANKQ_RERANKER_URL": closed_port_url(),
        "RERANKQ_RERANKER_TIMEOUT_S": "1",
        "RERANKQ_RERANKER_1_PROVIDER": "cohere",
        "RERANKQ_RERANKER_1_URL": cohere.url,
        "RERANKQ_RERANKER_1_TIMEOUT_S": "1",
        "RERANKQ_RERANKER_2_PROVIDER": "rrf",
        "RERANKQ_CHAIN_PRIVATE": "0,2",
        "RERANKQ_CHAIN_HOSTED": "1",
    }
    start_worker(env=chain, drop=("RERANKQ_RERANKER_MODEL",))
    # Where streams are opened the profiles are configured too; "missing" only here, not on the worker.
    client = RerankClient(load_settings({**base_env, **chain, "RERANKQ_CHAIN_MISSING": "0"}))
    served = {}
    for profile in ("private", "HOSTED", None, "missing"):
        # Distinct texts per stream, so no pair score is served from the cache.
        candidates = make_candidates(3, prefix=str(profile), text=f"{profile} gateway error {{i}}")
        stream = client.open("gateway error", candidates, window_size=3, chain=profile)
        served[profile] = wait_committed(client, stream).windows[0]
    assert served["private"].served_by == "2:rrf"  # tei refused; the hosted member is not in this profile
    assert served["HOSTED"].served_by == "1:cohere"
    assert served[None].served_by == "1:cohere"
    # A worker without the profile fails the window rather than widen it to the whole chain.
    assert served["missing"].served_by is None and served["missing"].failed == 3
    assert "RERANKQ_CHAIN_MISSING" in (served["missing"].reason or "")
    assert cohere.count == 2  # the hosted and the whole chain; never the private stream
    client.close()


def test_an_unknown_chain_profile_is_refused_at_open_and_nothing_is_sent(
    server, start_worker, make_client, raw_redis, namespace
):
    # A loopback member: the profile is under test, not the model (a worker loading one starts 5x slower).
    tei = server("tei")
    start_worker(
        env={"RERANKQ_RERANKER_PROVIDER": "tei", "RERANKQ_RERANKER_URL": tei.url, "RERANKQ_CHAIN_FAST": "0"},
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client(chain_profiles={"fast": [0]})
    before = pipeline_keys(raw_redis, namespace)
    with pytest.raises(ValidationError) as refused:
        client.open("gateway error", make_candidates(3), window_size=3, chain="nope")
    assert refused.value.field == "chain"
    assert "RERANKQ_CHAIN_NOPE" in refused.value.message and "fast" in refused.value.message
    assert pipeline_keys(raw_redis, namespace) == before  # no stream written, no window queued
    assert raw_redis.llen(f"{namespace}.cpu") == 0
    # A configured one (any case) is served by a real worker.
    stream = client.open("gateway error", make_candidates(3), window_size=3, chain="FAST")
    assert wait_committed(client, stream).windows[0].served_by == "0:tei"


def test_an_unusable_answer_is_never_cached(server, start_worker, make_client):
    # Flat or NaN scores must not reach the pair-score cache, or the same pairs would be
    # "answered" from the cache, rejected again, and never sent to the recovered member.
    tei = server("tei")
    tei.plan = ["flat", "nan"]
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": tei.url,
            "RERANKQ_RERANKER_TIMEOUT_S": "1",
            "RERANKQ_RERANKER_1_PROVIDER": "rrf",
        },
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    served = []
    for _ in range(3):  # the same query and texts each time
        stream = client.open("gateway error", make_candidates(8), window_size=8)
        served.append(wait_committed(client, stream).windows[0].served_by)
    assert served == ["1:rrf", "1:rrf", "0:tei"] and tei.count == 3
    stream = client.open("gateway error", make_candidates(8), window_size=8)
    assert wait_committed(client, stream).windows[0].served_by == "0:tei"
    assert tei.count == 3  # the good answer was cached


def test_an_error_body_echoing_the_window_reaches_no_warning_and_no_window(server, start_worker, make_client):
    tei = server("tei")
    tei.mode = "echo_422"  # the refused request (query and documents) is quoted back
    query = "confidential merger with acme corp"
    worker = start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": tei.url,
            "RERANKQ_RERANKER_TIMEOUT_S": "1",
        },
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    candidates = make_candidates(3, text="board minutes {i} about the takeover")
    stream = client.open(query, candidates, window_size=3)
    window = wait_committed(client, stream).windows[0]
    assert window.failed == 3 and tei.count == 1
    assert "board minutes" in str(tei.requests[0].body)  # it was sent, and echoed ...
    result = client.store.snapshot(stream).results[0]
    assert result.failovers == ["0:tei: http_422"]
    committed = [result.reason or "", *result.failovers, *(d.reason for d in result.decisions)]
    [failover] = log_lines(worker, "reranker_failover")
    assert "answered 422 (application/json," in failover
    for text in (*committed, worker.log()):
        assert query not in text and "board minutes" not in text and "takeover" not in text  # ... and kept nowhere


def test_credentials_in_a_member_url_are_refused_at_start(server, start_worker):
    cohere = server("cohere")
    # A member that cannot be configured fails the worker's start, naming the variable.
    with pytest.raises(RuntimeError) as exited:
        start_worker(
            env={
                "RERANKQ_RERANKER_PROVIDER": "rrf",
                "RERANKQ_RERANKER_1_PROVIDER": "cohere",
                "RERANKQ_RERANKER_1_URL": cohere.url.replace("http://", f"http://operator:{KEY}@"),
                "RERANKQ_RERANKER_1_API_KEY": "sk-the-configured-bearer-key",
                "RERANKQ_RERANKER_1_TIMEOUT_S": "1",
                "RERANKQ_CHAIN_HOSTED": "1",
            },
            drop=("RERANKQ_RERANKER_MODEL",),
        )
    said = str(exited.value)
    assert said.startswith("worker exited 1")
    assert "RERANKQ_RERANKER_1_URL: must not carry credentials" in said
    # Not called with Basic auth made from the URL in place of the Bearer key: not called.
    assert cohere.count == 0
    assert KEY not in said and "operator" not in said
