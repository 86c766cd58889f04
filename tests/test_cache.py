"""The pair-score cache, through real workers: a repeated query skips the provider and
the reader cannot tell a cached score from a fresh one."""

from __future__ import annotations

import shutil

import msgspec
import pytest
from conftest import make_candidates, namespace_keys
from delivery_helpers import wait_committed
from rerank_servers import expected_score

QUERY = "payment gateway error after a certificate expired"


def provider_calls(client, member: str = "0:local") -> int:
    return client.store.counters().get(f"provider_calls:{member}", 0)


def read_all(client, stream: str, n: int) -> bytes:
    page = client.pull(stream, 0, n, timeout=60)
    assert len(page.rows) == n
    return msgspec.json.encode(page.rows)


def counted(client) -> dict[str, int]:
    counters = client.store.counters()
    return {name: counters.get(name, 0) for name in ("provider_calls:0:local", "pair_cache_hits", "pair_cache_misses")}


def grown(client, before: dict[str, int]) -> dict[str, int]:
    """How much each count grew since ``before`` (the shared worker's counts are the namespace's)."""
    return {name: count - before[name] for name, count in counted(client).items()}


def score_keys(raw_redis, namespace: str) -> set[bytes]:
    return {k for k in namespace_keys(raw_redis, namespace) if b":score:" in k}


def test_repeated_query_is_served_from_the_cache(shared_client, own_query):
    client = shared_client
    raw_redis, namespace = client.store.client, client.settings.store.namespace
    candidates = make_candidates(30)
    keys_before = score_keys(raw_redis, namespace)
    before = counted(client)

    first = read_all(client, client.open(own_query, candidates, window_size=10, first_windows=3), 30)
    assert grown(client, before) == {"provider_calls:0:local": 3, "pair_cache_hits": 0, "pair_cache_misses": 30}

    second = read_all(client, client.open(own_query, candidates, window_size=10, first_windows=3), 30)
    # No window reached the model: every pair was answered from the cache.
    assert grown(client, before) == {"provider_calls:0:local": 3, "pair_cache_hits": 30, "pair_cache_misses": 30}
    assert second == first  # same served_by, same scores, same order

    new_keys = score_keys(raw_redis, namespace) - keys_before
    assert len(new_keys) == 30
    assert all(0 < raw_redis.ttl(k) <= client.settings.chain.cache_ttl_s for k in new_keys)


def test_partial_hit_sends_only_the_misses(shared_client, own_query):
    client = shared_client
    warm = make_candidates(10)
    read_all(client, client.open(own_query, warm, window_size=25, allow_shallow=True), 10)
    before = counted(client)

    mixed = warm + make_candidates(15, prefix="n", text="checkout outage report {i}")
    read_all(client, client.open(own_query, mixed, window_size=25), 25)
    assert grown(client, before) == {"provider_calls:0:local": 1, "pair_cache_hits": 10, "pair_cache_misses": 15}


@pytest.mark.slow
def test_same_decisions_with_and_without_the_cache(start_worker, make_client, namespace):
    candidates = make_candidates(30)
    uncached_worker = start_worker(env={"RERANKQ_PAIR_CACHE": "false"})
    client = make_client()
    uncached = [read_all(client, client.open(QUERY, candidates, window_size=10, first_windows=3), 30) for _ in range(2)]
    assert provider_calls(client) == 6  # no cache: every window paid for twice
    uncached_worker.stop()

    start_worker()
    cached = [read_all(client, client.open(QUERY, candidates, window_size=10, first_windows=3), 30) for _ in range(2)]
    assert provider_calls(client) == 6 + 3
    assert cached[0] == cached[1] == uncached[0] == uncached[1]


def test_rrf_passthrough_is_never_cached(start_worker, make_client, raw_redis, namespace):
    start_worker(env={"RERANKQ_RERANKER_PROVIDER": "rrf"}, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client()
    stream = client.open(QUERY, make_candidates(30), window_size=10)
    page = client.pull(stream, 0, 10, timeout=60)
    assert all(r.served_by == "0:rrf" for r in page.rows)
    assert provider_calls(client, "0:rrf") == 1
    assert not [k for k in namespace_keys(raw_redis, namespace) if b":score:" in k]


def test_a_score_is_keyed_by_the_provider_beneath_any_wrapper():
    from kernel.settings import MemberSettings
    from worker.chain.cache import pair_digest, provider_identity

    class Model:
        cache_identity = "local|some-model|bf16"
        scale = "probability"

    class Custom:
        scale = "probability"

    class Wrapper:
        def __init__(self, inner):
            self.inner = inner
            self.scale = inner.scale

    member = MemberSettings(provider="local", model="some-model")
    assert provider_identity(member, Wrapper(Wrapper(Model()))) == "local|some-model|bf16"
    # A provider that declares nothing is keyed on every setting that could change its answer ...
    custom = MemberSettings(provider="pkg.mod:Custom", url="http://r:80")
    identity = provider_identity(custom, Wrapper(Custom()))
    for changed in (
        {"url": "http://r:81"},
        {"model": "m"},
        {"scale": "logit"},
        {"top_n": 3},
        {"batch_size": 8},
        {"max_tokens_per_doc": 64},
        {"api_version": "v1"},
    ):
        assert provider_identity(msgspec.structs.replace(custom, **changed), Wrapper(Custom())) != identity, changed
    # ... and not on how long to wait for it.
    assert provider_identity(msgspec.structs.replace(custom, timeout_s=99.0), Wrapper(Custom())) == identity
    # The parts are framed, so no document can collide with another split of the same text.
    assert pair_digest("p", "a b", "c") != pair_digest("p", "a", "b c")


# -- what a cached answer must not change ------------------------------------------


def test_a_subset_member_answers_a_repeat_exactly_as_the_first_time(server, start_worker, make_client):
    # TOP_N=10 over a window of 25: the member keeps 10. Served per pair from the cache,
    # a repeat once ranked 10 cached pairs plus 10 of the 15 misses (20/5), then 25/0.
    cohere = server("cohere")
    cohere.mode = "subset"
    cohere.subset_size = 25  # asked for no top_n, it answers every document
    start_worker(
        env={
            "RERANKQ_RERANKER_PROVIDER": "cohere",
            "RERANKQ_RERANKER_URL": cohere.url,
            "RERANKQ_RERANKER_MODEL": "rerank-v3.5",
            "RERANKQ_RERANKER_TOP_N": "10",
            "RERANKQ_RERANKER_TIMEOUT_S": "2",
            "RERANKQ_RERANKER_1_PROVIDER": "rrf",
        }
    )
    client = make_client()
    candidates = make_candidates(25)
    counts, rows = [], []
    for _ in range(3):
        stream = client.open(QUERY, candidates, window_size=25)
        window = wait_committed(client, stream).windows[0]
        counts.append((window.served_by, window.ranked, window.omitted))
        rows.append(read_all(client, stream, 10))
    assert counts == [("0:cohere", 10, 15)] * 3
    assert rows[0] == rows[1] == rows[2]
    assert cohere.count == 1 and provider_calls(client, "0:cohere") == 1  # the repeats were cache hits
    assert client.store.counters()["pair_cache_hits"] == 50


# Member settings, one member each, all scoring the same window; (variables, expected):
# "miss" when the setting changes what is asked or how the answer is read, "hit" when it
# does not. Group baselines come first, so every variant finds its baseline's entries.
VARIANTS = [
    ("tei", {}, "miss"),
    ("tei", {"TIMEOUT_S": "3"}, "hit"),
    ("tei", {"BATCH_SIZE": "3"}, "hit"),  # TEI scores each pair on its own
    ("tei", {"URL": "{tei2}"}, "miss"),
    ("tei", {"SCALE": "logit"}, "miss"),  # asks for raw scores, reads them as logits
    ("tei", {"MODEL": "bge-reranker-base"}, "miss"),
    ("cohere", {}, "miss"),
    ("cohere", {"API_KEY": "sk-other-account"}, "hit"),
    ("cohere", {"API_VERSION": "v1"}, "miss"),
    ("cohere", {"TOP_N": "5"}, "miss"),
    ("cohere", {"MAX_TOKENS_PER_DOC": "64"}, "miss"),
    ("cohere", {"MODEL": "rerank-english-v3.0"}, "miss"),
    ("cohere", {"SCALE": "logit"}, "miss"),
    ("cohere", {"URL": "{cohere2}"}, "miss"),
    ("http", {}, "miss"),
    ("http", {"MAX_RETRIES": "0"}, "hit"),
    ("http", {"URL": "{rankings}/v2/rank"}, "miss"),
    ("http", {"MODEL": "m2"}, "miss"),
    ("http", {"TOP_N": "5"}, "miss"),
    ("http", {"SCALE": "logit"}, "miss"),
    ("local", {}, "miss"),
    ("local", {"TIMEOUT_S": "3"}, "hit"),
    ("local", {"SCALE": "logit"}, "miss"),
    ("local", {"MODEL": "{model_copy}"}, "miss"),
]


@pytest.mark.slow
def test_every_setting_that_changes_an_answer_misses_the_cache(
    server, start_worker, make_client, tiny_model_dir, tmp_path
):
    servers = {
        "tei": server("tei"),
        "tei2": server("tei"),
        "cohere": server("cohere"),
        "cohere2": server("cohere"),
        "rankings": server("rankings"),
    }
    model_copy = tmp_path / "same-weights-other-name"
    shutil.copytree(tiny_model_dir, model_copy)
    urls = {name: s.url for name, s in servers.items()} | {"model_copy": str(model_copy)}
    baseline = {
        "tei": {"URL": "{tei}"},
        "cohere": {"URL": "{cohere}", "MODEL": "rerank-v3.5"},
        "http": {"URL": "{rankings}/rerank"},
        "local": {"MODEL": str(tiny_model_dir)},
    }
    env = {}
    for i, (provider, changed, _) in enumerate(VARIANTS):
        prefix = "RERANKQ_RERANKER_" if i == 0 else f"RERANKQ_RERANKER_{i}_"
        member = {"PROVIDER": provider, "TIMEOUT_S": "2", **baseline[provider], **changed}
        env |= {prefix + k: v.format(**urls) for k, v in member.items()}
        env[f"RERANKQ_CHAIN_M{i}"] = str(i)
    start_worker(env=env, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(env)
    candidates = make_candidates(8)

    def score_with(i: int) -> str:
        stream = client.open(QUERY, candidates, window_size=8, chain=f"m{i}")
        return wait_committed(client, stream).windows[0].served_by

    seen = []
    for i, (provider, changed, _) in enumerate(VARIANTS):
        assert score_with(i) == f"{i}:{provider}", changed
        seen.append("miss" if provider_calls(client, f"{i}:{provider}") else "hit")
    assert seen == [expected for _, _, expected in VARIANTS]
    assert score_with(0) == "0:tei" and provider_calls(client, "0:tei") == 1  # the baseline itself hits


def test_a_scale_switch_never_reads_a_score_on_the_other_scale(server, start_worker, make_client):
    # TEI at its default scale answers probabilities; with SCALE=logit it is asked for raw
    # scores and they go through a sigmoid. A cached probability read as a logit would turn
    # 0.007 into 0.50175.
    tei = server("tei")
    env = {"RERANKQ_RERANKER_PROVIDER": "tei", "RERANKQ_RERANKER_URL": tei.url, "RERANKQ_RERANKER_TIMEOUT_S": "2"}
    client = make_client()
    candidates = make_candidates(8)
    for scale in ("probability", "logit"):
        worker = start_worker(env={**env, "RERANKQ_RERANKER_SCALE": scale}, drop=("RERANKQ_RERANKER_MODEL",))
        stream = client.open(QUERY, candidates, window_size=8)
        wait_committed(client, stream)
        decisions = client.store.snapshot(stream).results[0].decisions
        assert [d.score for d in decisions] == pytest.approx([expected_score(d.document) for d in decisions])
        worker.stop()
    assert tei.count == 2 and [r.body["raw_scores"] for r in tei.requests] == [False, True]


def test_one_tenant_repeating_anothers_query_and_documents_is_not_a_cache_hit(server, start_worker, make_client):
    # A hit is answered without the member's round trip: if B's repeat of A's query and
    # documents hit A's entries, B could time (or count) its way to what A sent.
    tei = server("tei")
    tei.mode, tei.hang_s = "ok", 0.0
    start_worker(
        env={"RERANKQ_RERANKER_PROVIDER": "tei", "RERANKQ_RERANKER_URL": tei.url, "RERANKQ_RERANKER_TIMEOUT_S": "2"},
        drop=("RERANKQ_RERANKER_MODEL",),
    )
    client = make_client()
    candidates = make_candidates(6)
    for tenant in ("acme", "globex", "acme", None, None):
        stream = client.open(QUERY, candidates, window_size=6, tenant=tenant)
        assert wait_committed(client, stream).windows[0].served_by == "0:tei"
    # acme, globex and the tenant-less stream each asked the member once; each repeat hit its own.
    assert tei.count == 3
    assert client.store.counters()["pair_cache_hits"] == 12


def test_a_member_trusted_with_the_tenant_is_cached_per_tenant(server, start_worker, make_client):
    # With SEND_TENANT the server sees the tenant and may answer per tenant (its own model
    # or index per customer): one tenant's scores must not answer for another's, even where
    # the operator shares the cache across tenants.
    shared, per_tenant = server("cohere"), server("cohere")
    chain = {
        "RERANKQ_PAIR_CACHE_SHARED_ACROSS_TENANTS": "true",
        "RERANKQ_RERANKER_PROVIDER": "cohere",
        "RERANKQ_RERANKER_URL": shared.url,
        "RERANKQ_RERANKER_TIMEOUT_S": "2",
        "RERANKQ_RERANKER_1_PROVIDER": "cohere",
        "RERANKQ_RERANKER_1_URL": per_tenant.url,
        "RERANKQ_RERANKER_1_SEND_TENANT": "true",
        "RERANKQ_RERANKER_1_TIMEOUT_S": "2",
        "RERANKQ_CHAIN_SHARED": "0",
        "RERANKQ_CHAIN_PER_TENANT": "1",
    }
    start_worker(env=chain, drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client(chain)
    candidates = make_candidates(6)
    for tenant in ("acme", "globex", "acme"):
        for profile in ("shared", "per_tenant"):
            stream = client.open(QUERY, candidates, window_size=6, chain=profile, tenant=tenant)
            assert wait_committed(client, stream).windows[0].served_by is not None
    assert shared.count == 1  # shared, and the tenant never left the process: one answer serves all
    assert [r.headers["x-rerankq-tenant"] for r in per_tenant.requests] == ["acme", "globex"]
