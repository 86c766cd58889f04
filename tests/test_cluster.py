"""The store on a Redis Cluster (three masters, three replicas), the broker on one Redis or on
RabbitMQ.

The flow and delivery tests that carry each guarantee run here again, unchanged, on the
cluster (they are imported from their modules; this module's fixtures point the store at the
cluster): scored once, decisions retained, a deep pull reads without provider calls, a worker
process SIGKILLed mid-window, duplicates committed once. Those parametrised over the broker
(``conftest.BROKERS``) run on RabbitMQ + Redis Cluster too, with the lost-message sweep (queued
marks on RabbitMQ, a queue scan on Redis) and what operators read. Then what is the cluster's
own: every script call stays in one slot, the sweep walks every shard on every master, and a
master killed mid-run is replaced by its replica while the streams complete.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
import test_flow
from conftest import BROKERS, make_candidates
from delivery_helpers import commits_per_window, patient, provider_env, pull_until_complete, wait_for
from kombu import Connection
from test_delivery import test_child_killed_mid_window_commits_once_and_stream_completes  # noqa: F401
from test_flow import (  # noqa: F401
    test_deeper_pull_scores_only_the_new_window,
    test_repulling_a_committed_page_is_a_read,
    test_stream_is_scored_end_to_end,
)

from devservers.redis_cluster import EmbeddedRedisCluster
from kernel.errors import StoreError, StreamNotFound
from kernel.keys import SHARDS, Keys, shard_tag
from kernel.redis_clients import store_client

pytestmark = pytest.mark.deployment


@pytest.fixture(scope="module")
def redis_cluster():
    cluster = EmbeddedRedisCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def base_env(base_env, redis_cluster, redis_server, broker):
    """The conftest's environment with the store on the cluster; the broker is one Redis, or the
    session's RabbitMQ node where a test is parametrised with ``amqp``."""
    broker_url = base_env["RERANKQ_BROKER_URL"] if broker == "amqp" else redis_server.url
    return {**base_env, "RERANKQ_REDIS_URL": redis_cluster.url, "RERANKQ_BROKER_URL": broker_url}


@pytest.fixture
def raw_redis(redis_cluster):
    """The store's keys, read straight from the cluster."""
    client = store_client(redis_cluster.url)
    yield client
    client.close()


@pytest.fixture
def broker_redis(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def flow(start_worker, make_client):
    """test_flow's shared worker, here a worker of each test's own on the cluster's store."""
    start_worker()
    return test_flow.Flow({}, lambda _env: make_client())


@pytest.fixture
def query(request) -> str:
    return f"payment gateway error ({request.node.name})"


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_duplicate_delivery_commits_once(flow, query, raw_redis, broker):
    test_flow.test_duplicate_delivery_commits_once(flow, query, raw_redis)


def lose_every_message(broker: str, settings, broker_redis) -> None:
    """Every message of the cpu queue vanishes before any worker fetched it: only the sweep can
    bring the windows back (on RabbitMQ, once their queued marks are too old to trust)."""
    if broker == "amqp":
        with Connection(settings.store.broker) as conn:
            assert conn.default_channel.queue_purge(settings.queues.cpu_queue) > 0
    else:
        assert broker_redis.delete(settings.queues.cpu_queue) == 1


def test_every_script_call_names_keys_of_one_slot():
    """redis-py's cluster client refuses a script whose keys span slots; check the key layout for
    many ids rather than wait for a stream that happens to cross one."""
    from redis.crc import key_slot

    keys = Keys("rerankq")
    for i in range(2000):
        stream = f"s_{uuid.UUID(int=i * 7919).hex}"
        slots = {key_slot(k.encode()) for k in keys.stream(stream).all()}
        assert len(slots) == 1, (stream, slots)
    # The per-shard keys are spread: 1024 tags over the 16384 slots, no two tags on one slot.
    assert len({key_slot(keys.active(tag).encode()) for tag in keys.shard_tags()}) == SHARDS


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_streams_spread_over_every_master_and_the_sweep_recovers_lost_messages_on_all(
    start_worker, make_client, raw_redis, broker_redis, broker, redis_cluster
):
    client = make_client(redeliver_after_s=2)
    streams = [
        client.open("payment gateway error", make_candidates(10, prefix=f"x{i}-"), window_size=10) for i in range(24)
    ]
    # Only the sweep, walking every shard of every master, can bring the windows back.
    lose_every_message(broker, client.settings, broker_redis)
    masters = {raw_redis.get_node_from_key(client.store.keys.stream(s).meta).port for s in streams}
    assert len(masters) == 3, "the streams landed on every master"
    start_worker(env=provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1, queued_max_age_s=3))

    for stream in streams:
        assert pull_until_complete(client, stream, 10, timeout_s=40).total == 10
        assert commits_per_window(raw_redis, client, stream) == {0: 1}
    assert client.store.counters()["windows_redelivered"] == len(streams)
    assert client.store.counters()["windows_committed"] == len(streams)
    assert len({shard_tag(s) for s in streams}) > 1


def _open_retrying(client, key: str, text: str):
    """Open with an idempotency key, retrying through a failover (a retry is safe with a key)."""
    deadline = time.monotonic() + patient(30)
    while True:
        try:
            return client.open(
                "payment gateway error",
                make_candidates(20, text=text),
                window_size=10,
                first_windows=2,
                idempotency_key=key,
            )
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_master_killed_mid_run_is_replaced_by_its_replica_and_every_stream_completes(
    start_worker, make_client, raw_redis, redis_cluster
):
    """What survives: every stream completes, each window once in its log. What may not: a write
    the dead master acknowledged and had not yet sent to its replica. Then a stream's open is
    gone (StreamNotFound; opened again under its key) or a commit is gone (its window is
    pending again and the sweep re-sends it); the assertions below allow exactly that, and say
    how often it happened."""
    worker = start_worker(env=provider_env("SlowProvider", sleep_s=0.2, redeliver_after_s=3, sweep_interval_s=1))
    client = make_client(redeliver_after_s=3)
    keys = [f"failover-{i}" for i in range(12)]
    streams = {key: _open_retrying(client, key, "cache miss {i} " + key) for key in keys}
    time.sleep(0.5)
    dead = redis_cluster.kill_master()
    new_master = redis_cluster.wait_promoted(dead)
    assert new_master != dead
    for key in keys:
        streams[key] = _open_retrying(client, key, "cache miss {i} " + key)  # same job: same stream

    reopened = 0
    deadline = time.monotonic() + patient(90)
    for key, stream in streams.items():
        while True:
            try:
                page = pull_until_complete(client, stream, 20, timeout_s=max(1.0, deadline - time.monotonic()))
                break
            except StreamNotFound:
                reopened += 1  # its open was acknowledged by the dead master and not replicated
                _open_retrying(client, key, "cache miss {i} " + key)
            except StoreError:
                time.sleep(0.2)
        assert page.total == 20 and all(r.kind == "ranked" for r in page.rows)
        assert commits_per_window(raw_redis, client, stream) == {0: 1, 1: 1}
    assert worker.proc.poll() is None
    print(f"streams opened again after the failover: {reopened}")
    redis_cluster.restart(dead)
    wait_for(redis_cluster.healthy, 30, "the old master back as a replica")


def test_what_operators_read_works_on_the_cluster(make_client, settings, broker_redis):
    """The exporter's backlog (1024 shards, pipelined over the masters), the shared breaker and
    the worker cards `rerankq inspect` reads, with the store on the cluster."""
    from producer.exporter.backlog import BacklogReader
    from worker.card import publish, read_cards
    from worker.chain.breaker import Breaker, Gate

    client = make_client()
    for i in range(6):
        client.open(
            "payment gateway error",
            make_candidates(50, prefix=f"o{i}-"),
            window_size=25,
            first_windows=2,
            device="gpu" if i % 2 else "cpu",
        )
    backlog = BacklogReader(settings, client.store.client, broker_redis).read()
    assert backlog.active_streams == 6
    assert backlog.uncommitted == {"cpu": 6, "gpu": 6, "any": 0}
    assert sum(q.messages for q in backlog.queues) == 12

    breaker = Breaker.from_settings(client.store.client, settings)
    for _ in range(settings.breaker.failures):
        breaker.record_failure("1:tei:abcd")
    assert breaker.acquire("1:tei:abcd", probe_lease_s=1) is Gate.SKIP

    publish(client.store, "host-a", {"pid": 42, "members": []})
    assert read_cards(client.store.client, client.store.keys.worker_card("host-a")) == [{"pid": 42, "members": []}]


@pytest.mark.parametrize("broker", ["amqp"], indirect=True)
def test_inspect_the_exporter_and_the_gateway_work_on_rabbitmq_and_the_cluster(
    start_worker, make_client, base_env, tmp_path
):
    """The operators' tools as shipped, each in its own process, on RabbitMQ + Redis Cluster: the
    exporter's scrape (RabbitMQ's counts, the cluster's 1024 shards), ``rerankq inspect`` (queues
    from RabbitMQ, workers by remote control over it, cards from the cluster) and a rerank
    request through the gateway, answered by a worker."""
    import json
    import subprocess
    import sys

    import httpx
    from cli_helpers import rerankq
    from conftest import ROOT
    from gateway_helpers import GatewayProcess, write_keys

    client = make_client()
    for i in range(2):  # a backlog, no worker yet: 2 streams x 2 windows wait in RabbitMQ
        client.open(f"nightly {i}", make_candidates(20, prefix=f"n{i}-"), window_size=10, first_windows=2)
    once = subprocess.run(
        [sys.executable, "-m", "producer.exporter", "--once"],
        env=base_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 0, once.stderr
    metrics = [line for line in once.stdout.splitlines() if line and not line.startswith("#")]
    assert "rerankq_exporter_redis_up 1.0" in metrics
    assert f'rerankq_queue_messages{{device="cpu",queue="{base_env["RERANKQ_CPU_QUEUE"]}"}} 4.0' in metrics, metrics
    assert 'rerankq_windows_uncommitted{device="cpu"} 4.0' in metrics and "rerankq_streams_active 2.0" in metrics

    start_worker(provider_env("FastProvider"))
    wait_for(lambda: client.store.counters().get("windows_committed") == 4, 60, "the backlog scored")
    keys = write_keys(tmp_path / "keys.json", [{"name": "ops", "tenant": "ops"}])
    gateway = GatewayProcess(
        {**base_env, "RERANKQ_GATEWAY_KEYS_FILE": str(tmp_path / "keys.json")}, tmp_path / "gateway.log"
    ).start()
    try:
        answer = httpx.post(
            gateway.url + "/v2/rerank",
            timeout=60,
            headers={"Authorization": f"Bearer {keys['ops']}"},
            json={"model": "m", "query": "checkout 502", "documents": ["a cat", "checkout 502 fix"]},
        )
        assert answer.status_code == 200, (answer.text, gateway.log()[-3000:])
        assert sorted(r["index"] for r in answer.json()["results"]) == [0, 1]
    finally:
        gateway.stop()

    done = rerankq(["inspect", "--json"], base_env)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    queues = {(q["device"], q["lane"]): q for q in view["queues"]}
    assert queues["cpu", "interactive"]["waiting"] == 0 and queues["cpu", "interactive"]["oldest_age_s"] is None
    [worker] = view["workers"]
    assert worker["kind"] == "cpu" and worker["processed"] >= 5 and worker["processes"], worker
    assert view["counters"]["windows_committed"] == 5
