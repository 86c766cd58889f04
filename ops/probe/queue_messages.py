"""Hostile queue messages against a real worker: ``python -m ops.probe.queue_messages``.

Starts a private redis-server (and with ``--broker amqp`` a private RabbitMQ node as the
broker) and a real ``python -m worker --device cpu`` (the ``rrf`` provider: no model to
load), takes a real message from the queue, and injects one hostile variant at a time into
the worker's queue: body shapes Celery's strategy cannot unpack, bodies that do not decode,
Celery's built-in task names, a far-future ETA, a chained callback and, on Redis, list
entries that are not a kombu envelope (a JSON list, not JSON, an invalid base64 body).
After each it opens a good stream and checks that its window is scored, that the worker is
the same process, that the hostile message was let go (not held unacknowledged; on
RabbitMQ, dead-lettered to ``<queue>.dead``), and that the worker counted it on
``rerankq_task_messages_refused_total``. A worker that died is started again, so each
probe is judged on its own.

One line per probe, ``probe <name>: ok`` or ``probe <name>: FAIL <why>``; the exit status is
non-zero on any failure. Loopback only; ``--timeout-s`` bounds each probe's good window.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

import redis

from producer import RerankClient, load_settings
from producer.celery_config import TASK_NAME
from worker.embedded.redis_server import EmbeddedRedis, free_port
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
REFUSED_METRIC = "rerankq_task_messages_refused_total"
#: kombu's Redis transport keeps unacknowledged messages in this hash (one per Redis db).
UNACKED_HASH = "unacked"
FAR_FUTURE = "2999-01-01T00:00:00+00:00"
NO_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
JSON = "application/json"


@dataclass(frozen=True)
class TaskMessage:
    """What a broker carries for one task: its headers, its body's bytes and content type."""

    headers: dict[str, Any]
    body: bytes
    content_type: str = JSON

    def with_body(self, body: Any) -> TaskMessage:
        return replace(self, body=json.dumps(body).encode())

    def with_headers(self, body: Any | None = None, **headers: Any) -> TaskMessage:
        message = replace(self, headers={**self.headers, **headers})
        return message if body is None else message.with_body(body)

    def args(self) -> list[Any]:
        return json.loads(self.body)[0]


def hostile_messages(template: TaskMessage) -> list[tuple[str, TaskMessage]]:
    """(name, message) for each hostile task message, built from a real one; for either broker."""
    args = template.args()
    return [
        ("body-object", template.with_body({"a": 1})),
        ("body-pair", template.with_body([1, 2])),
        ("body-args-kwargs", template.with_body([args, {}])),
        ("body-string", template.with_body("hello")),
        ("body-null", template.with_body(None)),
        ("body-args-not-a-list", template.with_body([{"stream_id": 1}, {}, NO_EMBED])),
        ("body-embed-not-a-map", template.with_body([args, {}, [1]])),
        ("body-three-args", template.with_body([[*args, 1], {}, NO_EMBED])),
        (
            "body-callback",
            template.with_body(
                [
                    args,
                    {},
                    {**NO_EMBED, "callbacks": [{"task": "celery.accumulate", "args": [], "kwargs": {}, "options": {}}]},
                ]
            ),
        ),
        ("body-invalid-json", replace(template, body=b"{not json")),
        ("content-python-serialize", replace(template, content_type="application/x-python-serialize")),
        ("headers-timelimit", template.with_headers(timelimit=[1])),
        ("headers-no-id", template.with_headers(id=None)),
        ("task-celery.accumulate", template.with_headers([[1, 2], {}, NO_EMBED], task="celery.accumulate")),
        ("task-celery.backend_cleanup", template.with_headers([[], {}, NO_EMBED], task="celery.backend_cleanup")),
        (
            "task-celery.map",
            template.with_headers(
                [[{"task": TASK_NAME, "args": [], "kwargs": {}, "options": {}}, [args]], {}, NO_EMBED],
                task="celery.map",
            ),
        ),
        ("task-celery.chord_unlock", template.with_headers([["g"], {}, NO_EMBED], task="celery.chord_unlock")),
        ("task-unknown", template.with_headers(task="not.a.task")),
        ("eta-far-future", template.with_headers(eta=FAR_FUTURE)),
    ]


def redis_entry(envelope: dict[str, Any], message: TaskMessage) -> bytes:
    """A Redis list entry: kombu's envelope ``envelope`` carrying ``message``."""
    return json.dumps(
        {
            **envelope,
            "headers": message.headers,
            "content-type": message.content_type,
            "body": base64.b64encode(message.body).decode(),
        }
    ).encode()


def hostile_envelopes(envelope: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(name, Redis list entry) where the envelope itself is hostile (Redis only)."""
    return [
        ("envelope-invalid-base64", json.dumps({**envelope, "body": "@@@@x"}).encode()),
        ("envelope-list", json.dumps([envelope, "x", "y"]).encode()),
        ("envelope-no-properties", json.dumps({k: v for k, v in envelope.items() if k != "properties"}).encode()),
        ("envelope-headers-list", json.dumps({**envelope, "headers": [1, 2]}).encode()),
        (
            "envelope-delivery-info-list",
            json.dumps({**envelope, "properties": {**envelope["properties"], "delivery_info": [1]}}).encode(),
        ),
        ("raw-not-json", b"not json at all \xff"),
    ]


def worker_env(redis_url: str, namespace: str, metrics_port: int, broker_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(
        {
            "RERANKQ_REDIS_URL": redis_url,
            "RERANKQ_NAMESPACE": namespace,
            "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
            "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
            "RERANKQ_ANY_QUEUE": f"{namespace}.any",
            "RERANKQ_RERANKER_PROVIDER": "rrf",
            "RERANKQ_METRICS_PORT": str(metrics_port),
            "RERANKQ_SWEEP_INTERVAL_S": "1",
            "PYTHONPATH": str(ROOT),
        }
    )
    if broker_url:
        env["RERANKQ_BROKER_URL"] = broker_url
    return env


def refused_count(port: int) -> float:
    """The worker's refused-message counter, summed over its labels (0 when absent or unreachable)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return 0.0
    return sum(
        s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == REFUSED_METRIC
    )


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class RedisQueue:
    """The worker's queue as Redis lists (kombu's Redis transport)."""

    def __init__(self, raw: redis.Redis, queue: str) -> None:
        self.raw = raw
        self.queue = queue
        self.envelope: dict[str, Any] = {}

    def take_template(self) -> TaskMessage:
        entry = self.raw.lindex(self.queue, 0)
        assert entry is not None, f"no message in {self.queue}"
        self.envelope = json.loads(entry)
        return TaskMessage(
            headers=self.envelope["headers"],
            body=base64.b64decode(self.envelope["body"]),
            content_type=self.envelope["content-type"],
        )

    def entries(self, template: TaskMessage) -> list[tuple[str, bytes]]:
        messages = [(name, redis_entry(self.envelope, m)) for name, m in hostile_messages(template)]
        return messages + hostile_envelopes(self.envelope)

    def inject(self, entry: bytes) -> None:
        self.raw.lpush(self.queue, entry)

    def let_go(self) -> Callable[[], bool]:
        """Whether the injected message is no longer held unacknowledged."""
        return lambda: not self.held()

    def held(self) -> list[Any]:
        """Delivery tags of this queue's messages in kombu's unacked hash."""
        out = []
        for tag, value in self.raw.hgetall(UNACKED_HASH).items():
            try:
                _, _, routing_key = json.loads(value)
            except (ValueError, TypeError):
                continue
            if routing_key == self.queue:
                out.append(tag)
        return out

    def reset(self) -> None:
        """Forget what a crashed worker left: the queue and its unacked messages (which would
        otherwise be handed back to the next worker)."""
        tags = self.held()
        with self.raw.pipeline(transaction=True) as pipe:
            pipe.delete(self.queue)
            if tags:
                pipe.hdel(UNACKED_HASH, *tags)
                pipe.zrem(UNACKED_HASH + "_index", *tags)
            pipe.execute()

    def close(self) -> None:
        pass


class AmqpQueue:
    """The worker's interactive lane queue on RabbitMQ, and its dead-letter queue."""

    def __init__(self, url: str, queue: str) -> None:
        from kombu import Connection

        self.connection = Connection(url, connect_timeout=5)
        self.channel = self.connection.channel()
        self.queue = queue
        self.dead = queue + ".dead"

    def take_template(self) -> TaskMessage:
        from kombu import Queue

        message = Queue(self.queue, no_declare=True)(self.channel).get(no_ack=False)
        assert message is not None, f"no message in {self.queue}"
        body = message.body.encode() if isinstance(message.body, str) else bytes(message.body)
        template = TaskMessage(headers=dict(message.headers), body=body, content_type=message.content_type)
        message.requeue()  # its window is scored once the worker runs
        return template

    def entries(self, template: TaskMessage) -> list[tuple[str, TaskMessage]]:
        return hostile_messages(template)

    def inject(self, message: TaskMessage) -> None:
        from kombu import Producer

        Producer(self.channel).publish(
            message.body,
            routing_key=self.queue,
            exchange="",
            headers=message.headers,
            content_type=message.content_type,
            content_encoding="utf-8",
            serializer=None,
        )

    def dead_count(self) -> int:
        try:
            return int(self.channel.queue_declare(self.dead, passive=True).message_count)
        except self.connection.channel_errors:
            self.channel = self.connection.channel()  # not declared yet: RabbitMQ closed the channel over it
            return 0

    def let_go(self) -> Callable[[], bool]:
        """Whether the injected message reached the dead-letter queue."""
        before = self.dead_count()
        return lambda: self.dead_count() > before

    def reset(self) -> None:
        self.channel.queue_purge(self.queue)

    def close(self) -> None:
        self.connection.release()


class QueueProbe:
    """One private Redis (and RabbitMQ), one worker; probes run one at a time against them."""

    def __init__(
        self,
        directory: Path,
        timeout_s: float,
        broker: str = "redis",
        *,
        redis_url: str | None = None,
        broker_url: str | None = None,
    ) -> None:
        """``redis_url``, ``broker_url``: servers already running (the tests'), else private ones."""
        self.directory = directory
        self.timeout_s = timeout_s
        self.broker = broker
        self.redis_url = redis_url
        self.broker_url = broker_url
        self.redis: EmbeddedRedis | None = None
        self.namespace = "probe" + uuid.uuid4().hex[:8]
        self.queue_name = f"{self.namespace}.cpu"
        self.metrics_port = free_port()
        self.worker: WorkerProcess | None = None
        self.rabbitmq: Any = None
        self.starts = 0

    def __enter__(self) -> Self:
        redis_url = self.redis_url
        if redis_url is None:
            (self.directory / "redis").mkdir(parents=True, exist_ok=True)
            self.redis = EmbeddedRedis(directory=str(self.directory / "redis")).start()
            redis_url = self.redis.url
        broker_url = self.broker_url
        if self.broker == "amqp" and broker_url is None:
            from devservers.rabbitmq_server import EmbeddedRabbitMQ

            self.rabbitmq = EmbeddedRabbitMQ(directory=str(self.directory / "rabbitmq")).start()
            broker_url = self.rabbitmq.url
        self.env = worker_env(
            redis_url, self.namespace, self.metrics_port, broker_url if self.broker == "amqp" else None
        )
        self.raw = redis.Redis.from_url(redis_url)
        self.client = RerankClient(load_settings(self.env))
        self.queue: RedisQueue | AmqpQueue = (
            AmqpQueue(broker_url, self.queue_name)
            if broker_url is not None and self.broker == "amqp"
            else RedisQueue(self.raw, self.queue_name)
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.queue.close()
        self.client.close()
        self.raw.close()
        if self.rabbitmq is not None:
            self.rabbitmq.remove()
        if self.redis is not None:
            self.redis.stop()

    def entries(self) -> list[tuple[str, Any]]:
        """Every hostile message, built from a real one: a stream opened with no worker
        running leaves its message in the queue."""
        self.client.open("template query", _candidates(3), window_size=3)
        return self.queue.entries(self.queue.take_template())

    def start_worker(self) -> None:
        self.starts += 1
        log = self.directory / f"worker-{self.starts}.log"
        self.worker = WorkerProcess.rerankq(self.env, log, "--device", "cpu", cwd=ROOT).start()

    def restart_worker(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.queue.reset()
        self.start_worker()

    def worker_alive(self) -> bool:
        return self.worker is not None and self.worker.proc is not None and self.worker.proc.poll() is None

    def good_window_scored(self) -> bool:
        stream = self.client.open("payment gateway error", _candidates(4), window_size=4)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            page = self.client.pull(stream, 0, 4, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            if page.complete:
                return all(row.kind == "ranked" for row in page.rows)
            if not self.worker_alive():
                return False
        return False

    def run(self, entry: Any) -> str | None:
        """Inject one hostile message; why the worker failed it, or None."""
        assert self.worker is not None and self.worker.proc is not None
        pid = self.worker.proc.pid
        before = refused_count(self.metrics_port)
        let_go = self.queue.let_go()
        self.queue.inject(entry)
        if not self.good_window_scored():
            return "a good window sent after it was not scored" + ("" if self.worker_alive() else " (worker exited)")
        if not self.worker_alive() or self.worker.proc.pid != pid:
            return "the worker exited"
        if not wait_until(let_go, 5.0):
            return (
                "the message is held unacknowledged (handed back at every shutdown)"
                if self.broker == "redis"
                else "the message was not dead-lettered"
            )
        if not wait_until(lambda: refused_count(self.metrics_port) > before, 3.0):
            return f"not counted on {REFUSED_METRIC}"
        return None


def _candidates(n: int) -> list[dict[str, str]]:
    return [{"id": f"c{i}", "text": f"payment gateway error number {i}"} for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.probe.queue_messages", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--broker",
        choices=("redis", "amqp"),
        default="redis",
        help="amqp: a private RabbitMQ node as the broker (rabbitmq-server must be installed)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=20.0, help="how long a good window may take after each probe"
    )
    parser.add_argument("--only", nargs="*", help="run only these probes (names as printed)")
    parser.add_argument("--keep", action="store_true", help="print where the logs are even when every probe passed")
    args = parser.parse_args(argv)
    # The template stream is opened before any worker runs, on purpose: the client's warning
    # about that is not a finding.
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")
    directory = Path(tempfile.mkdtemp(prefix="rerankq-probe-queue-"))
    failures = 0
    with QueueProbe(directory, args.timeout_s, args.broker) as probe:
        entries = probe.entries()
        probe.start_worker()
        if not probe.good_window_scored():
            print(f"probe baseline: FAIL the worker scores no window; logs: {directory}")
            return 1
        for name, entry in entries:
            if args.only and name not in args.only:
                continue
            why = probe.run(entry)
            print(f"probe {name}: ok" if why is None else f"probe {name}: FAIL {why}", flush=True)
            if why is not None:
                failures += 1
                if not probe.worker_alive():
                    probe.restart_worker()
    if args.keep or failures:
        print(f"logs: {directory}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
