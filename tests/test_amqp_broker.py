"""RabbitMQ as the broker, Redis as the store: the guarantees that depend on the broker, on a
private RabbitMQ node (``devservers.rabbitmq_server``) and real workers.

The flow, kill, duplicate and lane tests of test_flow / test_delivery / test_lanes run on both
brokers (parametrised); these are the ones only RabbitMQ has: its queues, the sweep without a
queue scan, dead-lettering, a worker killed whole, and the node restarted under load.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from conftest import make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete, wait_for
from kombu import Connection

from devservers.rabbitmq_server import EmbeddedRabbitMQ
from kernel.amqp_broker import AmqpQueueProbe, AsyncAmqpBroker, dead_letter_queue, lane_queue
from kernel.celery_config import TASK_NAME, celery_config
from kernel.errors import ConfigError
from kernel.settings import load_settings, override
from producer.exporter.backlog import BacklogReader
from rerankq.inspect import queue_view
from worker.sweep import sweep_once

pytestmark = [pytest.mark.deployment, pytest.mark.parametrize("broker", ["amqp"], indirect=True)]


def test_the_amqp_settings_configure_rabbitmq_and_nothing_redis_only(base_env):
    conf = celery_config(load_settings(base_env))
    assert conf["broker_url"].startswith("amqp://") and conf["broker_transport"] is None
    assert conf["broker_transport_options"]["confirm_publish"] is True
    assert "visibility_timeout" not in conf["broker_transport_options"]
    assert "priority_steps" not in conf["broker_transport_options"]
    assert "worker_disable_prefetch" not in conf
    assert conf["task_acks_late"] and conf["worker_prefetch_multiplier"] == 1
    queues = {q.name: q for q in conf["task_queues"]}
    cpu = base_env["RERANKQ_CPU_QUEUE"]
    assert {cpu, cpu + ".batch", cpu + ".dead"} <= set(queues)
    assert queues[cpu].queue_arguments["x-queue-type"] == "quorum" and queues[cpu].durable
    assert queues[cpu].queue_arguments["x-dead-letter-routing-key"] == cpu + ".dead"
    assert queues[cpu].consumer_arguments["x-consumer-timeout"] == 1800 * 1000


def test_a_consumer_timeout_under_the_window_time_limit_is_refused(base_env):
    with pytest.raises(ConfigError) as err:
        load_settings({**base_env, "RERANKQ_REDELIVER_AFTER_S": "600", "RERANKQ_AMQP_CONSUMER_TIMEOUT_S": "300"})
    assert err.value.variable == "RERANKQ_AMQP_CONSUMER_TIMEOUT_S"
    # The Redis broker's visibility timeout means nothing here, so it is not checked.
    load_settings({**base_env, "RERANKQ_REDELIVER_AFTER_S": "600", "RERANKQ_VISIBILITY_TIMEOUT_S": "300"})
    with pytest.raises(ConfigError) as err:
        load_settings({k: v for k, v in base_env.items() if k != "RERANKQ_REDIS_URL"})
    assert err.value.variable == "RERANKQ_REDIS_URL"


def test_the_worker_start_check_names_what_is_wrong(base_env, settings):
    """At start a worker refuses a broker it cannot reach, and a timeout its server would hold
    a running window to (the settings check catches that first; this is the start's own)."""
    from worker.amqp_check import prepare_amqp_broker
    from worker.embedded.redis_server import free_port

    nowhere = override(settings, broker_url=f"amqp://guest:guest@127.0.0.1:{free_port()}//")
    assert "cannot reach the RabbitMQ broker" in prepare_amqp_broker(nowhere, timeout_s=2)
    too_short = override(settings, amqp_consumer_timeout_s=settings.queues.redeliver_after_s)
    problem = prepare_amqp_broker(too_short)
    assert "RERANKQ_AMQP_CONSUMER_TIMEOUT_S" in problem and "server's consumer_timeout" in problem  # 3.10
    assert prepare_amqp_broker(settings) is None


def test_queues_are_durable_quorum_queues_and_the_worker_says_which_broker(
    start_worker, make_client, rabbitmq_server, base_env
):
    worker = start_worker(provider_env("FastProvider"))
    client = make_client()
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    assert pull_until_complete(client, stream, 10, timeout_s=30).total == 10

    cpu = base_env["RERANKQ_CPU_QUEUE"]
    queues = rabbitmq_server.queues()
    for name in (cpu, cpu + ".batch", cpu + ".dead", base_env["RERANKQ_ANY_QUEUE"]):
        assert queues[name]["type"] == "quorum" and queues[name]["durable"] == "true", (name, queues.get(name))
    log = worker.log()
    configured = log.split("broker_configured")[1].split("\n")[0]
    assert "broker=amqp" in configured and "queue_type=quorum" in configured and "publisher_confirms=True" in configured
    assert "visibility_timeout" not in configured and "disable_prefetch" not in configured
    assert "consumer_timeout_source=server" in log and "server_version=3." in log
    assert "delayed delivery" not in log  # no ETA machinery declared for a queue of due-now windows


def test_a_worker_killed_whole_has_its_window_redelivered_and_committed_once(
    start_worker, make_client, tmp_path, raw_redis
):
    """SIGKILL the worker's main process mid-window: RabbitMQ requeues its unacked message when the
    connection drops, at once (no visibility timeout), and another worker commits it once."""
    marks = tmp_path / "marks"
    marks.mkdir()
    doomed = start_worker(provider_env("SlowProvider", mark_dir=marks, sleep_s=30, sweep_interval_s=3600))
    client = make_client(redeliver_after_s=4)
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    wait_for(lambda: list(marks.iterdir()), 30, "the window to start scoring")
    doomed.proc.kill()
    doomed.proc.wait()
    for mark in marks.iterdir():  # its pool child too: a host that died takes every process with it
        try:
            os.kill(int(mark.name.split(".")[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass

    # No sweep anywhere (interval 3600 s): only the broker can bring the message back.
    start_worker(provider_env("FastProvider", mark_dir=marks, sweep_interval_s=3600))
    page = pull_until_complete(client, stream, 10, timeout_s=60)
    assert page.total == 10
    assert commits_per_window(raw_redis, client, stream) == {0: 1}
    assert client.status(stream).windows[0].attempts == 2


def test_the_sweep_trusts_a_queued_window_and_resends_a_lost_one(
    make_client, settings, base_env, start_worker, raw_redis
):
    """No queue scan on RabbitMQ: an overdue window whose message was sent and not begun is left
    alone (a backlog, not a loss) until its queued mark is RERANKQ_QUEUED_MAX_AGE_S old; then it is
    re-sent. A lost message (purged here) is recovered that way, and committed once."""
    client = make_client(redeliver_after_s=1)
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    sweeper = load_settings(base_env, redeliver_after_s=1, queued_max_age_s=2)
    time.sleep(1.2)  # past its enqueue grace: overdue, but its message is queued (no worker runs)

    assert sweep_once(client.store, client.dispatcher, None, sweeper) == 0, "queued: left alone"
    with Connection(settings.store.broker) as conn:
        assert conn.default_channel.queue_purge(settings.queues.cpu_queue) == 1  # now the message is lost
    time.sleep(1.2)
    assert sweep_once(client.store, client.dispatcher, None, sweeper) == 1, "its mark is too old: re-sent"
    assert sweep_once(client.store, client.dispatcher, None, sweeper) == 0, "claimed: not sent twice"

    start_worker(provider_env("FastProvider", sweep_interval_s=3600))
    assert pull_until_complete(client, stream, 10, timeout_s=30).total == 10
    assert commits_per_window(raw_redis, client, stream) == {0: 1}


def test_a_message_the_worker_refuses_is_dead_lettered(start_worker, make_client, settings, rabbitmq_server):
    """Arguments that name no window, and a body in a refused content type (pickle): both kept
    in <queue>.dead for an operator, neither run."""
    worker = start_worker(provider_env("FastProvider"))
    client = make_client()
    client.dispatcher.app.send_task(TASK_NAME, args=["s_../../etc", 0], queue=settings.queues.cpu_queue)
    client.dispatcher.app.send_task(
        TASK_NAME, args=["s_" + "0" * 32, 0], queue=settings.queues.cpu_queue, serializer="pickle"
    )
    dead = dead_letter_queue(settings.queues.cpu_queue)
    wait_for(
        lambda: rabbitmq_server.queues().get(dead, {}).get("ready") == "2",
        30,
        "the refused messages in the dead-letter queue",
        interval_s=0.5,
    )
    # The door refuses a content type rerankq does not send before anything decodes it.
    assert "reason=arguments" in worker.log() and "reason=content" in worker.log()
    # Work after it is served as usual.
    stream = client.open("payment gateway error", make_candidates(10), window_size=10)
    assert pull_until_complete(client, stream, 10, timeout_s=30).total == 10


def test_queue_depth_is_read_from_rabbitmq(make_client, settings):
    client = make_client()
    client.open("nightly", make_candidates(20), window_size=5, first_windows=3, lane="batch")
    client.open("now", make_candidates(10), window_size=5, first_windows=2)
    probe = AmqpQueueProbe(settings.store.broker)
    try:
        counts = {
            (c.queue, c.lane): c.waiting for c in probe.counts([settings.queues.cpu_queue, settings.queues.gpu_queue])
        }
        assert (
            counts[(settings.queues.cpu_queue, "interactive")] == 2
            and counts[(settings.queues.cpu_queue, "batch")] == 3
        )
        assert counts[(settings.queues.gpu_queue, "interactive")] == 0  # never declared: nothing waits
        assert probe.depth([settings.queues.cpu_queue]) == 5
        # What the exporter and `rerankq inspect` report from it.
        backlog = {q.queue: q for q in BacklogReader(settings, client.store.client, None, probe).read_queues()}
        assert backlog[settings.queues.cpu_queue].messages == 5 and backlog[settings.queues.gpu_queue].messages == 0
    finally:
        probe.close()
    # The gateway's backpressure samples the same counts, off its event loop.
    gateway_broker = AsyncAmqpBroker(settings.store.broker)
    try:
        assert asyncio.run(gateway_broker.depths([settings.queues.cpu_queue, settings.queues.any_queue])) == {
            settings.queues.cpu_queue: 5,
            settings.queues.any_queue: 0,
        }
        asyncio.run(gateway_broker.ping())
    finally:
        asyncio.run(gateway_broker.aclose())
    view = {(row["queue"], row["lane"]): row for row in queue_view(settings)}
    assert (
        view[(settings.queues.cpu_queue, "batch")]["waiting"] == 3
        and view[(settings.queues.cpu_queue, "batch")]["device"] == "cpu"
    )
    assert lane_queue(settings.queues.cpu_queue, "batch") == settings.queues.cpu_queue + ".batch"


def test_a_rabbitmq_restart_mid_run_loses_nothing_and_commits_nothing_twice(
    base_env, make_client, start_worker, tmp_path, raw_redis
):
    """Stop the node (its own, not the session's) while windows wait and run; start it again.
    Quorum queues keep confirmed messages; workers reconnect (or exit non-zero and are restarted)."""
    node = EmbeddedRabbitMQ(directory=str(tmp_path / "rabbit")).start()
    try:
        env = {**provider_env("SlowProvider", sleep_s=0.3), "RERANKQ_BROKER_URL": node.url}
        workers = [start_worker(env), start_worker(env)]
        client = make_client(broker_url=node.url, redeliver_after_s=4)
        streams = [client.open(f"query {i}", make_candidates(20), window_size=5, first_windows=4) for i in range(4)]
        wait_for(lambda: client.store.counters().get("windows_committed", 0) >= 2, 30, "work under way")

        node.restart()
        for worker in workers:
            if worker.proc.poll() is not None:
                assert worker.proc.returncode != 0, "a worker that lost its broker exits non-zero"
                workers.append(start_worker(env))

        for stream in streams:
            assert pull_until_complete(client, stream, 20, timeout_s=90).total == 20
            assert set(commits_per_window(raw_redis, client, stream).values()) == {1}
        assert client.store.counters().get("windows_committed") == 16
    finally:
        node.remove()


def test_a_burst_is_confirmed_whole_and_a_refused_publish_is_the_sweeps_to_send(
    make_client, settings, rabbitmq_server, start_worker, raw_redis
):
    """An open's windows go out in one burst and open returns once RabbitMQ confirmed them all.
    A message RabbitMQ refuses (nack: here a queue over its max-length, reject-publish) fails the
    send, never the open: the stream exists, its windows are due at once, and the sweep sends
    them when the queue takes messages again. Each window is committed once."""
    client = make_client(redeliver_after_s=2)
    first = client.open("payment gateway error", make_candidates(40), window_size=10, first_windows=4)
    depth = AmqpQueueProbe(settings.store.broker).depth([settings.queues.cpu_queue])
    assert depth == 4, "all four queued when open returned"

    rabbitmq_server.ctl(
        "set_policy",
        f"{settings.store.namespace}-full",
        f"^{settings.queues.cpu_queue}$",
        '{"max-length": 2, "overflow": "reject-publish"}',
        "--apply-to",
        "queues",
    )
    wait_for(
        lambda: (
            rabbitmq_server.ctl("list_queues", "--quiet", "--no-table-headers", "name", "policy").count(
                f"{settings.store.namespace}-full"
            )
            == 1
        ),
        30,
        "the policy applied",
    )
    refused = client.open("cache miss", make_candidates(30, text="cache miss {i}"), window_size=10, first_windows=3)
    # Over its limit already: RabbitMQ refuses (nacks) all three, and open still returns the stream.
    assert AmqpQueueProbe(settings.store.broker).depth([settings.queues.cpu_queue]) == 4
    rabbitmq_server.ctl("clear_policy", f"{settings.store.namespace}-full")

    start_worker(provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1))
    assert pull_until_complete(client, first, 40, timeout_s=60).total == 40
    assert pull_until_complete(client, refused, 30, timeout_s=60).total == 30
    assert commits_per_window(raw_redis, client, first) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert commits_per_window(raw_redis, client, refused) == {0: 1, 1: 1, 2: 1}
    assert client.store.counters()["windows_redelivered"] >= 2
