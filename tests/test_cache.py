"""The pair-score cache, through real workers: a repeated query skips the provider and
the reader cannot tell a cached score from a fresh one."""

from __future__ import annotations

import msgspec
from conftest import make_candidates, namespace_keys

QUERY = "payment gateway error after a certificate expired"


def provider_calls(client, member: str = "0:local") -> int:
    return client.store.counters().get(f"provider_calls:{member}", 0)


def read_all(client, stream: str, n: int) -> bytes:
    page = client.pull(stream, 0, n, timeout=60)
    assert len(page.rows) == n
    return msgspec.json.encode(page.rows)


def test_repeated_query_is_served_from_the_cache(start_worker, make_client, raw_redis, namespace, settings):
    start_worker()
    client = make_client()
    candidates = make_candidates(30)

    first = read_all(client, client.open(QUERY, candidates, window_size=10, first_windows=3), 30)
    calls = provider_calls(client)
    assert calls == 3

    second = read_all(client, client.open(QUERY, candidates, window_size=10, first_windows=3), 30)
    assert provider_calls(client) == calls  # no window reached the model
    assert client.store.counters().get("pair_cache_hits", 0) == 30
    assert second == first  # same served_by, same scores, same order

    score_keys = [k for k in namespace_keys(raw_redis, namespace) if b":score:" in k]
    assert len(score_keys) == 30
    assert all(0 < raw_redis.ttl(k) <= settings.cache_ttl_s for k in score_keys)


def test_partial_hit_sends_only_the_misses(start_worker, make_client):
    start_worker()
    client = make_client()
    warm = make_candidates(10)
    read_all(client, client.open(QUERY, warm, window_size=25, allow_shallow=True), 10)
    calls = provider_calls(client)

    mixed = warm + make_candidates(15, prefix="n", text="checkout outage report {i}")
    read_all(client, client.open(QUERY, mixed, window_size=25), 25)
    counters = client.store.counters()
    assert provider_calls(client) == calls + 1
    assert counters.get("pair_cache_hits", 0) == 10
    assert counters.get("pair_cache_misses", 0) == 10 + 15


def test_same_decisions_with_and_without_the_cache(start_worker, make_client, namespace):
    candidates = make_candidates(30)
    uncached_worker = start_worker(env={"RERANKQ_PAIR_CACHE": "false"})
    client = make_client()
    uncached = [read_all(client, client.open(QUERY, candidates, window_size=10, first_windows=3), 30)
                for _ in range(2)]
    assert provider_calls(client) == 6  # no cache: every window paid for twice
    uncached_worker.stop()

    start_worker()
    cached = [read_all(client, client.open(QUERY, candidates, window_size=10, first_windows=3), 30)
              for _ in range(2)]
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
    from producer.settings import MemberSettings
    from worker.chain.cache import pair_digest, provider_identity

    class Model:
        cache_identity = "local|some-model|bf16"

    class Wrapper:
        def __init__(self, inner):
            self.inner = inner

    member = MemberSettings(provider="local", model="some-model")
    assert provider_identity(member, Wrapper(Wrapper(Model()))) == "local|some-model|bf16"
    assert provider_identity(MemberSettings(provider="tei", url="http://tei:80"), Wrapper(object())) == "tei||http://tei:80"
    # The three parts are framed, so no document can collide with another split of the same text.
    assert pair_digest("p", "a b", "c") != pair_digest("p", "a", "b c")
