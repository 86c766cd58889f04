"""Remote providers against real HTTP servers on loopback, in process (no worker).

Each case runs the real provider class through a real Chain ending in rrf, so what is
asserted is what the chain decides: who served, and why each member was skipped.
"""

from __future__ import annotations

import json
import time

import pytest
import structlog
from rerank_servers import closed_port_url, expected_score

from kernel.settings import MemberSettings, Secret, Settings, load_settings, override
from worker.chain import Chain, ChainOutcome
from worker.providers import build_provider
from worker.providers.base import ProviderStartError, ScoreRequest

KEY = "sk-test-SECRET-4f9a2b"


def documents(n: int) -> list[str]:
    return [f"payment gateway error number {i}" for i in range(n)]


def request(n: int, **kw: object) -> ScoreRequest:
    return ScoreRequest(query="gateway error", documents=documents(n), stream_id="s_test", window=0, **kw)  # type: ignore[arg-type]


def run(member: MemberSettings, n: int = 10, settings: Settings | None = None, **kw: object) -> ChainOutcome:
    chain = Chain.from_settings(override(settings or Settings(), members=[member, MemberSettings(provider="rrf")]))
    try:
        return chain.run(request(n, **kw))
    finally:
        chain.close()


def member_for(shape: str, url: str, **kw: object) -> MemberSettings:
    if shape == "tei":
        return MemberSettings(provider="tei", url=url, timeout_s=1, **kw)  # type: ignore[arg-type]
    if shape == "cohere":
        return MemberSettings(provider="cohere", url=url, model="rerank-test", timeout_s=1, **kw)  # type: ignore[arg-type]
    if shape == "infinity":  # Infinity serves /rerank only: it takes its full URL
        return MemberSettings(provider="cohere", url=url + "/rerank", model="rerank-test", timeout_s=1, **kw)  # type: ignore[arg-type]
    return MemberSettings(provider="http", url=url + "/rerank", timeout_s=1, **kw)  # type: ignore[arg-type]


# -- the shapes ----------------------------------------------------------------


def test_tei_splits_a_window_into_batches_and_merges_them(server):
    tei = server("tei")
    outcome = run(MemberSettings(provider="tei", url=tei.url, batch_size=4, timeout_s=2), n=10)
    assert outcome.served_by == "0:tei" and outcome.scale == "probability"
    assert outcome.scores == pytest.approx([expected_score(d) for d in documents(10)])
    assert [len(r.body["texts"]) for r in tei.requests] == [4, 4, 2]
    assert {r.path for r in tei.requests} == {"/rerank"}
    assert all(r.body["raw_scores"] is False and r.body["truncate"] is True for r in tei.requests)


def test_tei_receives_a_documents_control_strings_as_text(server):
    # TEI runs the model's tokenizer on the pair, which would read these as the model's separators.
    tei = server("tei")
    sent = ["relevant </s></s> yes", "gateway [SEP] [CLS] error", "payment gateway error"]
    received = ["relevant < /s>< /s> yes", "gateway [ SEP] [ CLS] error", "payment gateway error"]
    chain = Chain.from_settings(
        override(Settings(), members=[member_for("tei", tei.url), MemberSettings(provider="rrf")])
    )
    outcome = chain.run(ScoreRequest(query="gateway <s> error", documents=sent, stream_id="s_t", window=0))
    chain.close()
    assert outcome.served_by == "0:tei", outcome.failovers
    assert (tei.requests[0].body["query"], tei.requests[0].body["texts"]) == ("gateway < s> error", received)
    assert outcome.scores == pytest.approx([expected_score(d) for d in received])


def test_tei_declared_logit_asks_for_raw_scores(server):
    tei = server("tei")
    outcome = run(MemberSettings(provider="tei", url=tei.url + "/rerank", scale="logit", timeout_s=1), n=3)
    assert outcome.scale == "logit" and tei.requests[0].body["raw_scores"] is True


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cohere_request_shape_per_api_version(server, version):
    cohere = server("cohere")
    member = MemberSettings(
        provider="cohere",
        url=cohere.url,
        model="rerank-v3.5",
        api_key=Secret(KEY),
        api_version=version,
        max_tokens_per_doc=512,
        timeout_s=1,
    )
    outcome = run(member, n=5)
    assert outcome.served_by == "0:cohere" and outcome.scale == "probability"
    assert outcome.scores == pytest.approx([expected_score(d) for d in documents(5)])
    seen = cohere.requests[0]
    assert seen.path == f"/{version}/rerank"
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body["model"] == "rerank-v3.5" and seen.body["documents"] == documents(5)
    assert "top_n" not in seen.body
    if version == "v2":
        assert seen.body["max_tokens_per_doc"] == 512 and "return_documents" not in seen.body
    else:
        assert seen.body["return_documents"] is False and "max_tokens_per_doc" not in seen.body


def test_infinity_plain_string_documents_through_cohere_base_url(server):
    infinity = server("infinity")
    outcome = run(MemberSettings(provider="cohere", url=infinity.url + "/rerank", timeout_s=1), n=6)
    assert outcome.served_by == "0:cohere"
    assert outcome.scores == pytest.approx([expected_score(d) for d in documents(6)])
    assert infinity.requests[0].path == "/rerank" and "authorization" not in infinity.requests[0].headers


@pytest.mark.parametrize("shape", ["scores", "rankings", "cohere", "tei"])
def test_generic_http_reads_every_shape(server, shape):
    endpoint = server(shape)
    outcome = run(MemberSettings(provider="http", url=endpoint.url + "/rerank", model="m", timeout_s=1), n=7)
    assert outcome.served_by == "0:http", outcome.failovers
    assert outcome.scores == pytest.approx([expected_score(d) for d in documents(7)])
    assert endpoint.requests[0].body["query"] == "gateway error"


# -- unusable answers: each one fails over, with its reason -------------------

UNUSABLE = [
    ("tei", "malformed", "unparsable"),
    ("tei", "wrong_count", "wrong_count"),
    ("tei", "repeated_index", "repeated_index"),
    ("tei", "out_of_range", "index_out_of_range"),
    ("tei", "nan", "non_finite"),
    ("tei", "flat", "flat_scores"),
    ("tei", "subset", "wrong_count"),  # a subset nobody asked for is a wrong count
    ("cohere", "malformed", "unparsable"),
    ("cohere", "wrong_count", "wrong_count"),
    ("cohere", "repeated_index", "repeated_index"),
    ("cohere", "nan", "non_finite"),
    ("cohere", "flat", "flat_scores"),
    ("infinity", "out_of_range", "index_out_of_range"),
    ("infinity", "flat", "flat_scores"),
    ("scores", "wrong_count", "wrong_count"),
    ("scores", "nan", "non_finite"),
    ("scores", "flat", "flat_scores"),
    ("rankings", "repeated_index", "repeated_index"),
    ("rankings", "out_of_range", "index_out_of_range"),
    ("rankings", "logits", "out_of_scale"),  # declared probability, answered logits
]


@pytest.mark.parametrize(("shape", "mode", "reason"), UNUSABLE)
def test_unusable_answer_fails_over(server, shape, mode, reason):
    endpoint = server(shape)
    endpoint.mode = mode
    member = member_for(shape, endpoint.url, max_retries=0)
    outcome = run(member, n=10)
    assert outcome.served_by == "1:rrf" and outcome.passthrough
    assert outcome.failovers == [f"0:{member.provider}: {reason}"]
    assert endpoint.count == 1  # an unusable answer is not retried


def test_declared_logit_scale_accepts_logits(server):
    endpoint = server("rankings")
    endpoint.mode = "logits"
    outcome = run(member_for("rankings", endpoint.url, scale="logit"), n=10)
    assert outcome.served_by == "0:http" and outcome.scale == "logit"


def test_flat_threshold_comes_from_settings(server):
    tei = server("tei")
    tei.mode = "flat"
    member = member_for("tei", tei.url)
    # Five flat scores are too few to judge by default (8) ...
    assert run(member, n=5).served_by == "0:tei"
    # ... but not with RERANKQ_FLAT_MIN_WINDOW=4.
    strict = load_settings({"RERANKQ_FLAT_MIN_WINDOW": "4", "RERANKQ_FLAT_RANGE": "0.01"})
    assert strict.chain.flat_min_window == 4 and strict.chain.flat_range == 0.01
    assert run(member, n=5, settings=strict).failovers == ["0:tei: flat_scores"]


@pytest.mark.parametrize("shape", ["cohere", "rankings"])
def test_valid_subset_marks_the_rest_omitted(server, shape):
    endpoint = server(shape)
    endpoint.mode = "subset"
    outcome = run(member_for(shape, endpoint.url, top_n=3), n=10)
    assert outcome.served_by.startswith("0:"), outcome.failovers
    assert endpoint.requests[0].body["top_n"] == 3
    kept = [i for i, s in enumerate(outcome.scores) if s is not None]
    assert len(kept) == 3
    best = sorted(range(10), key=lambda i: -expected_score(documents(10)[i]))[:3]
    assert sorted(kept) == sorted(best)


# -- transport failures, retries, deadlines -------------------------------------


def test_hang_past_timeout_fails_over_within_the_deadline(server):
    tei = server("tei")
    tei.mode = "hang"
    began = time.monotonic()
    outcome = run(MemberSettings(provider="tei", url=tei.url, timeout_s=0.5), n=4)
    assert outcome.failovers == ["0:tei: timeout"]
    assert time.monotonic() - began < 1.5


def test_refused_connection_fails_over():
    outcome = run(MemberSettings(provider="tei", url=closed_port_url(), timeout_s=1), n=4)
    assert outcome.failovers == ["0:tei: connect_error"] and outcome.served_by == "1:rrf"


def test_500_is_retried_a_bounded_number_of_times(server):
    tei = server("tei")
    tei.mode = "500"
    outcome = run(MemberSettings(provider="tei", url=tei.url, max_retries=2, timeout_s=3), n=4)
    assert outcome.failovers == ["0:tei: http_500"]
    assert tei.count == 3
    tei.requests.clear()
    tei.plan = ["500"]
    tei.mode = "ok"
    assert run(MemberSettings(provider="tei", url=tei.url, max_retries=2, timeout_s=3), n=4).served_by == "0:tei"
    assert tei.count == 2


def test_429_honours_retry_after(server):
    tei = server("tei")
    tei.plan = ["429"]
    tei.retry_after = "1"
    began = time.monotonic()
    outcome = run(MemberSettings(provider="tei", url=tei.url, max_retries=1, timeout_s=3), n=4)
    assert outcome.served_by == "0:tei" and tei.count == 2
    assert time.monotonic() - began >= 0.95


def test_429_whose_retry_after_outlives_the_deadline_fails_over_at_once(server):
    tei = server("tei")
    tei.mode = "429"
    tei.retry_after = "30"
    began = time.monotonic()
    outcome = run(MemberSettings(provider="tei", url=tei.url, max_retries=3, timeout_s=1), n=4)
    assert outcome.failovers == ["0:tei: http_429"] and tei.count == 1
    assert time.monotonic() - began < 0.9  # not slept to the deadline, let alone 30 s


# -- privacy --------------------------------------------------------------------


@pytest.mark.parametrize("send_tenant", [False, True])
def test_tenant_header_only_when_enabled_for_the_member(server, send_tenant):
    cohere = server("cohere")
    run(member_for("cohere", cohere.url, send_tenant=send_tenant), n=3, tenant="acme-eu")
    assert cohere.requests[0].headers.get("x-rerankq-tenant") == ("acme-eu" if send_tenant else None)
    assert "acme-eu" not in str(cohere.requests[0].body)


def test_api_key_never_in_an_error_or_log(server):
    cohere = server("cohere")
    cohere.mode = "echo_auth"  # the server echoes the Authorization header in its error body
    refused = closed_port_url() + f"/rerank?api-key={KEY}"
    with structlog.testing.capture_logs() as logs:
        echoed = run(member_for("cohere", cohere.url, api_key=Secret(KEY)), n=3)
        unreachable = run(MemberSettings(provider="cohere", url=refused, api_key=Secret(KEY), timeout_s=1), n=3)
    assert echoed.failovers == ["0:cohere: http_401"]
    assert unreachable.failovers == ["0:cohere: connect_error"]
    assert cohere.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent ...
    text = repr(logs) + repr(echoed) + repr(unreachable)
    assert "reranker_failover" in text and "***" in text
    assert KEY not in text  # ... and never written down
    assert KEY not in repr(MemberSettings(api_key=Secret(KEY)))


def test_a_key_echoed_across_the_cut_leaks_no_part_of_itself(server):
    # The body is cut to BODY_SNIPPET characters for the log; cut before scrubbing, the
    # key's first half would no longer match the key and be kept.
    from worker.providers.remote import BODY_SNIPPET

    cohere = server("cohere")
    cohere.mode = "echo_auth"
    before_key = len(json.dumps({"error": "bad key", "pad": "", "got": "Bearer "})) - 1
    cohere.echo_pad = BODY_SNIPPET - len(KEY) // 2 - before_key
    with structlog.testing.capture_logs() as logs:
        outcome = run(member_for("cohere", cohere.url, api_key=Secret(KEY), max_retries=0), n=3)
    assert outcome.failovers == ["0:cohere: http_401"]
    assert len(cohere.requests) == 1
    text = repr(logs) + repr(outcome)
    assert KEY[: len(KEY) // 2] not in text  # no half of the key before the cut ...
    assert "provider_error_body" in text  # ... in any line, the body's (at DEBUG) included


def test_an_error_body_that_echoes_the_input_stays_out_of_warnings(server):
    tei = server("tei")
    tei.mode = "echo_422"  # FastAPI-style: the refused request is quoted back
    secret_query = "confidential merger with acme corp"
    docs = ["board minutes about the acme merger", "salary review for jane doe"]
    chain = Chain.from_settings(
        override(Settings(), members=[MemberSettings(provider="tei", url=tei.url, timeout_s=1)])
    )
    with structlog.testing.capture_logs() as logs:
        outcome = chain.run(ScoreRequest(query=secret_query, documents=docs, stream_id="s_test", window=0))
    chain.close()
    assert outcome.failed and outcome.failovers == ["0:tei: http_422"]
    assert "board minutes" in json.dumps(tei.requests[0].body)  # the server did echo it ...
    above_debug = [e for e in logs if e["log_level"] != "debug"]
    failover = next(e for e in above_debug if e["event"] == "reranker_failover")
    for text in (repr(above_debug), repr(outcome.failovers), outcome.reason or ""):
        for words in (secret_query, "acme", *docs):
            assert words not in text  # ... and no warning, failover or reason repeats it
    assert failover["log_level"] == "warning"
    assert failover["detail"].startswith(f"POST {tei.url}/rerank answered 422 (application/json, ")
    debug = [e for e in logs if e["event"] == "provider_error_body"]
    assert debug and debug[0]["log_level"] == "debug" and secret_query in debug[0]["body"]


def test_an_error_code_is_summarised_but_its_message_is_not(server):
    cohere = server("cohere")
    cohere.mode = "echo_400_code"
    with structlog.testing.capture_logs() as logs:
        outcome = run(member_for("cohere", cohere.url), n=3)
    assert outcome.failovers == ["0:cohere: http_400"]
    failover = next(e for e in logs if e["event"] == "reranker_failover")
    assert "gateway error" not in failover["detail"]  # the query, quoted by the server's message
    assert failover["detail"].endswith("bytes, code too_many_tokens)")


def test_credentials_in_a_member_url_are_refused_and_never_echoed(server):
    cohere = server("cohere")
    with_credentials = cohere.url.replace("http://", f"http://operator:{KEY}@")
    member = MemberSettings(provider="cohere", url=with_credentials, api_key=Secret("sk-bearer-key"), timeout_s=1)
    chain = Chain.from_settings(override(Settings(), members=[MemberSettings(provider="rrf"), member]))
    chain.members = chain.members[::-1]  # as member 1 of the config, tried first
    with structlog.testing.capture_logs() as logs:
        outcome = chain.run(request(3))
    chain.close()
    # httpx would have sent Basic auth built from the URL in place of the Bearer key.
    assert cohere.count == 0
    assert outcome.served_by == "0:rrf" and outcome.failovers == ["1:cohere: not_started"]
    started = next(e for e in logs if e["event"] == "member_start_failed")
    assert started["variable"] == "RERANKQ_RERANKER_1_URL"
    assert "credentials" in started["detail"] and cohere.url in started["detail"]
    assert KEY not in repr(logs) and "operator" not in repr(logs)


# -- configuration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("member", "field"),
    [
        (MemberSettings(provider="tei"), "url"),
        (MemberSettings(provider="http", url="ftp://example.com/rerank"), "url"),
        (MemberSettings(provider="cohere", model="rerank-v3.5"), "api_key"),
        (MemberSettings(provider="cohere", api_key=Secret(KEY)), "model"),
        (MemberSettings(provider="tei", url="http://127.0.0.1:1", batch_size=0), "batch_size"),
    ],
)
def test_bad_member_config_names_the_variable(member, field):
    with pytest.raises(ProviderStartError) as raised:
        build_provider(member, Settings())
    assert raised.value.field == field  # type: ignore[attr-defined]
    chain = Chain.from_settings(override(Settings(), members=[MemberSettings(provider="rrf"), member]))
    chain.members = chain.members[::-1]  # the bad one first, as member 1 of the config
    with structlog.testing.capture_logs() as logs:
        outcome = chain.run(request(3))
    # A member that could not start is passed over in one wording; its cause is in the start log.
    assert outcome.served_by == "0:rrf" and outcome.failovers == [f"1:{member.provider}: not_started"]
    started = [e for e in logs if e["event"] == "member_start_failed"]
    assert started[0]["variable"] == f"RERANKQ_RERANKER_1_{field.upper()}"


def test_failed_start_is_retried_no_sooner_than_member_restart_s():
    settings = override(
        Settings(), members=[MemberSettings(provider="tei"), MemberSettings(provider="rrf")], member_restart_s=0.3
    )
    chain = Chain.from_settings(settings)
    for _ in range(3):
        assert chain.run(request(2)).served_by == "1:rrf"
    assert chain.members[0].start_attempts == 1
    assert chain.run(request(2)).failovers == ["0:tei: not_started"]
    time.sleep(0.35)
    assert chain.run(request(2)).failovers == ["0:tei: not_started"]
    assert chain.members[0].start_attempts == 2


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RERANKQ_BREAKER_FAILURES": "0"}, "RERANKQ_BREAKER_FAILURES"),
        ({"RERANKQ_BREAKER_COOLDOWN_S": "soon"}, "RERANKQ_BREAKER_COOLDOWN_S"),
        ({"RERANKQ_FLAT_RANGE": "-1"}, "RERANKQ_FLAT_RANGE"),
        ({"RERANKQ_MEMBER_RESTART_S": "0"}, "RERANKQ_MEMBER_RESTART_S"),
        ({"RERANKQ_CHAIN_FAST": "0,two"}, "RERANKQ_CHAIN_FAST"),
        ({"RERANKQ_CHAIN_FAST": "0,3"}, "RERANKQ_CHAIN_FAST"),  # the default chain has members 0, 1 and 2
        ({"RERANKQ_CHAIN_FAST": "1,1"}, "RERANKQ_CHAIN_FAST"),
    ],
)
def test_bad_chain_settings_name_the_variable(environ, variable):
    from kernel.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        load_settings(environ)
    assert raised.value.variable == variable


def test_chain_profile_settings():
    settings = load_settings(
        {
            "RERANKQ_RERANKER_PROVIDER": "tei",
            "RERANKQ_RERANKER_URL": "http://tei:8080",
            "RERANKQ_RERANKER_1_PROVIDER": "cohere",
            "RERANKQ_RERANKER_2_PROVIDER": "rrf",
            "RERANKQ_CHAIN_PRIVATE": "0,2",
            "RERANKQ_BREAKER_FAILURES": "5",
            "RERANKQ_BREAKER_COOLDOWN_S": "7.5",
        }
    )
    assert settings.chain.profiles == {"private": [0, 2]}
    assert (settings.breaker.failures, settings.breaker.cooldown_s) == (5, 7.5)
    chain = Chain.from_settings(settings)
    assert [m.label for m in chain.members_for("PRIVATE")] == ["0:tei", "2:rrf"]
    assert chain.members_for("nope") is None
    chain.close()


# -- wrong endpoints and warm-up --------------------------------------------------


def test_a_404_from_a_derived_endpoint_names_the_url_to_set(server):
    infinity = server("infinity")  # serves /rerank only, like infinity-emb
    member = MemberSettings(provider="cohere", url=infinity.url, timeout_s=1)
    chain = Chain.from_settings(override(Settings(), members=[MemberSettings(provider="rrf"), member]))
    chain.members = chain.members[::-1]
    with structlog.testing.capture_logs() as logs:
        outcome = chain.run(request(3))
    chain.close()
    assert outcome.failovers == ["1:cohere: http_404"] and infinity.requests[0].path == "/v2/rerank"
    failover = next(e for e in logs if e["event"] == "reranker_failover")
    assert failover["variable"] == "RERANKQ_RERANKER_1_URL"
    assert failover["detail"] == (
        f"POST {infinity.url}/v2/rerank answered 404 (application/json, 22 bytes);"
        f" if this server serves /rerank, set RERANKQ_RERANKER_1_URL={infinity.url}/rerank"
    )
    # The advice is right: that URL serves.
    assert (
        run(MemberSettings(provider="cohere", url=f"{infinity.url}/rerank", timeout_s=1), n=3).served_by == "0:cohere"
    )


def test_warm_up_says_once_at_error_when_no_scoring_member_starts():
    broken = override(
        Settings(),
        members=[
            MemberSettings(provider="tei"),
            MemberSettings(provider="http", url="ftp://x"),
            MemberSettings(provider="rrf"),
        ],
    )
    with structlog.testing.capture_logs() as logs:
        Chain.from_settings(broken).warm_up()
        Chain.from_settings(
            override(Settings(), members=[MemberSettings(provider="rrf")])
        ).warm_up()  # rrf alone: meant
        Chain.from_settings(
            override(
                Settings(),
                members=[
                    MemberSettings(provider="tei"),  # one of two starts: fine
                    MemberSettings(provider="tei", url="http://127.0.0.1:1"),
                ],
            )
        ).warm_up()
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1 and errors[0]["event"] == "no_scoring_member_started"
    assert set(errors[0]["members"]) == {"0:tei", "1:http"}
    assert all(reason.startswith("config: url: ") for reason in errors[0]["members"].values())
    assert errors[0]["windows_served_by"] == "2:rrf"
