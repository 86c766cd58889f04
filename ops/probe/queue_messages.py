"""Hostile queue messages against a real worker: ``python -m ops.probe.queue_messages``.

Starts a private redis-server (and with ``--broker amqp`` a private RabbitMQ node as the
broker) and a real ``python -m worker --device cpu`` (the ``rrf`` provider: no model to
load), takes real messages from the queue, and injects one hostile variant at a time into
the worker's queue (``ops.probe.queue_cases``): every header Celery reads with a value rerankq
does not send, body shapes Celery's strategy cannot unpack, bodies that do not decode, other
content types and encodings, a bz2 bomb, Celery's built-in task names, a far-future ETA,
arguments that name no window and, on Redis, list entries that are not a kombu envelope. Then
remote-control commands a client of the broker can send (``ops.probe.control_commands``), and
a real message of another stream replayed with a hostile time limit.

After each it opens a good stream and checks that its window is scored, that the worker is
the same process, that its main process did not grow by more than ``MEMORY_BOUND_MB``, that
the hostile message was let go (not held unacknowledged; on RabbitMQ, dead-lettered to
``<queue>.dead``), and that the worker counted it on ``rerankq_task_messages_refused_total``.
A worker that died is started again, so each probe is judged on its own.

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
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import redis

from ops.probe.queue_cases import (
    ACKED_REFUSALS,
    TaskMessage,
    hostile_amqp_messages,
    hostile_envelopes,
    hostile_messages,
    redis_entry,
)
from producer import RerankClient, load_settings
from worker.embedded.redis_server import EmbeddedRedis, free_port
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
REFUSED_METRIC = "rerankq_task_messages_refused_total"
#: kombu's Redis transport keeps unacknowledged messages in this hash (one per Redis db).
UNACKED_HASH = "unacked"
#: How much the worker's main process may grow while it handles one hostile message.
MEMORY_BOUND_MB = 64.0
#: How long the probe waits for RabbitMQ to confirm (or refuse) a message it publishes.
CONFIRM_TIMEOUT_S = 30.0
#: What a TaskMessage carries in fields of its own, not among its AMQP ``properties``.
AMQP_OWN_FIELDS = frozenset({"content_type", "content_encoding", "application_headers"})
#: The replayed message's hostile time limit ([hard, soft] seconds): it once killed every
#: process that ran the window, counted each as an attempt and failed the window for good.
HOSTILE_TIMELIMIT = [0.1, 0.05]


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


def refused_counts(port: int) -> dict[str, float]:
    """The worker's refused-message counter by reason (empty when absent or unreachable)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == REFUSED_METRIC:
                reason = sample.labels.get("reason", "")
                counts[reason] = counts.get(reason, 0.0) + sample.value
    return counts


def refused_count(port: int) -> float:
    """The worker's refused-message counter, summed over its labels."""
    return sum(refused_counts(port).values())


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@contextmanager
def peak_rss_mb(pid: int, every_s: float = 0.02) -> Iterator[list[float]]:
    """Samples the process's resident memory while the block runs: ``[baseline, peak]`` in MiB."""
    import psutil

    process = psutil.Process(pid)
    baseline = process.memory_info().rss / 2**20
    seen = [baseline, baseline]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            try:
                seen[1] = max(seen[1], process.memory_info().rss / 2**20)
            except psutil.Error:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield seen
    finally:
        stop.set()
        sampler.join()


class NotSendable(Exception):
    """A message the broker's client cannot encode, or the broker itself refuses: it never
    reaches a worker."""


class RedisQueue:
    """The worker's queue as Redis lists (kombu's Redis transport)."""

    broker = "redis"

    def __init__(self, raw: redis.Redis, queue: str) -> None:
        self.raw = raw
        self.queue = queue
        self.envelope: dict[str, Any] = {}

    @staticmethod
    def _message(envelope: dict[str, Any]) -> TaskMessage:
        return TaskMessage(
            headers=envelope["headers"],
            body=base64.b64decode(envelope["body"]),
            content_type=envelope["content-type"],
            content_encoding=envelope["content-encoding"],
        )

    def take_template(self) -> TaskMessage:
        """The oldest message, left in the queue (its window is scored once the worker runs)."""
        entry = self.raw.lindex(self.queue, -1)
        assert entry is not None, f"no message in {self.queue}"
        self.envelope = json.loads(entry)
        return self._message(self.envelope)

    def take(self) -> TaskMessage:
        """The oldest message, taken out of the queue for good."""
        entry = self.raw.rpop(self.queue)
        assert entry is not None, f"no message in {self.queue}"
        envelope = json.loads(entry)
        self.envelope = self.envelope or envelope
        return self._message(envelope)

    def entry(self, message: TaskMessage) -> bytes:
        """``message`` as a list entry of its own (a fresh delivery tag, as kombu gives each)."""
        properties = {**self.envelope["properties"], "delivery_tag": str(uuid.uuid4())}
        return redis_entry({**self.envelope, "properties": properties}, message)

    def entries(self, template: TaskMessage) -> list[tuple[str, bytes]]:
        messages = [(name, redis_entry(self.envelope, m)) for name, m in hostile_messages(template)]
        return messages + hostile_envelopes(self.envelope)

    def inject(self, entry: Any) -> None:
        self.raw.lpush(self.queue, entry if isinstance(entry, bytes) else self.entry(entry))

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

    broker = "amqp"

    def __init__(self, url: str, queue: str) -> None:
        from kombu import Connection

        # Confirmed publishes: a message the broker itself refuses (an ``expiration`` that is
        # not a number, a ``user_id`` that is not the connection's) raises here, not later.
        self.connection = Connection(url, connect_timeout=5, transport_options={"confirm_publish": True})
        self.channel = self.connection.channel()
        self.queue = queue
        self.dead = queue + ".dead"

    def _get(self) -> Any:
        from kombu import Queue

        message = Queue(self.queue, no_declare=True)(self.channel).get(no_ack=False)
        assert message is not None, f"no message in {self.queue}"
        return message

    @staticmethod
    def _message(message: Any) -> TaskMessage:
        body = message.body.encode() if isinstance(message.body, str) else bytes(message.body)
        headers = {k: v for k, v in message.headers.items() if k != "x-delivery-count"}
        properties = {k: v for k, v in message.properties.items() if k not in AMQP_OWN_FIELDS}
        return TaskMessage(
            headers=headers,
            body=body,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            properties=properties,
        )

    def take_template(self) -> TaskMessage:
        message = self._get()
        template = self._message(message)
        message.requeue()  # its window is scored once the worker runs
        return template

    def take(self) -> TaskMessage:
        message = self._get()
        taken = self._message(message)
        message.ack()
        return taken

    def entry(self, message: TaskMessage) -> TaskMessage:
        return message

    def entries(self, template: TaskMessage) -> list[tuple[str, TaskMessage]]:
        return hostile_messages(template) + hostile_amqp_messages(template)

    def inject(self, message: TaskMessage) -> None:
        """Publish ``message`` as it is (no serializer, no property rewritten) and wait for the
        broker's confirm. ``NotSendable`` when py-amqp cannot encode it or the broker refuses it
        (its channel is then replaced); a broker that does not answer raises ``TimeoutError``."""
        properties = dict(message.properties)
        priority = properties.pop("priority", None)
        try:
            raw = self.channel.prepare_message(
                message.body,
                priority=priority,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                headers=message.headers,
                properties=properties,
            )
            self.channel.basic_publish(raw, exchange="", routing_key=self.queue, confirm_timeout=CONFIRM_TIMEOUT_S)
        except TimeoutError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever py-amqp or the broker refused
            # A refusing broker closes the channel (its reply may not even decode: an
            # ``expiration`` of raw bytes is quoted back raw); a closed channel takes nothing more.
            self.channel = self.connection.channel()
            raise NotSendable(f"{type(exc).__name__}: {str(exc)[:200]}") from None

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
        worker_env_extra: dict[str, str] | None = None,
        worker_args: tuple[str, ...] = ("--device", "cpu"),
    ) -> None:
        """``redis_url``, ``broker_url``: servers already running (the tests'), else private ones."""
        self.directory = directory
        self.timeout_s = timeout_s
        self.broker = broker
        self.redis_url = redis_url
        self.broker_url = broker_url
        self.worker_env_extra = worker_env_extra or {}
        self.worker_args = worker_args
        self.redis: EmbeddedRedis | None = None
        self.namespace = "probe" + uuid.uuid4().hex[:8]
        self.queue_name = f"{self.namespace}.cpu"
        self.metrics_port = free_port()
        self.worker: WorkerProcess | None = None
        self.rabbitmq: Any = None
        self.starts = 0
        #: A stream whose one window's message was taken out of the queue: (stream id, message).
        self.held_back: tuple[str, TaskMessage] | None = None

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
        self.env = {
            **worker_env(redis_url, self.namespace, self.metrics_port, broker_url if self.broker == "amqp" else None),
            **self.worker_env_extra,
        }
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

    def take_real_messages(self, count: int) -> list[tuple[str, TaskMessage]]:
        """``count`` one-window streams whose messages are taken out of the queue (no worker may
        run yet): real messages of real pending windows, to replay or mutate."""
        taken = []
        for i in range(count):
            stream = self.client.open(f"held back query {i}", _candidates(3), window_size=3)
            taken.append((stream, self.queue.take()))
        return taken

    def entries(self) -> list[tuple[str, Any]]:
        """Every hostile message, built from a real one: a stream opened with no worker
        running leaves its message in the queue."""
        [self.held_back] = self.take_real_messages(1)
        self.client.open("template query", _candidates(3), window_size=3)
        return self.queue.entries(self.queue.take_template())

    def start_worker(self) -> None:
        self.starts += 1
        log = self.directory / f"worker-{self.starts}.log"
        self.worker = WorkerProcess.rerankq(self.env, log, *self.worker_args, cwd=ROOT).start()

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

    def attempt(
        self,
        act: Callable[[], None],
        *,
        let_go: Callable[[], bool] | None,
        refusals: int = 1,
        reason: str | None = None,
    ) -> str | None:
        """Run ``act`` (which sends something hostile); why the worker failed it, or None.

        The worker must stay the same process within ``MEMORY_BOUND_MB``, serve a good window
        after it, let go of what it was sent (when ``let_go`` can tell) and count ``refusals``
        (of ``reason``, or of any).
        """
        assert self.worker is not None and self.worker.proc is not None
        pid = self.worker.proc.pid

        def counted() -> float:
            counts = refused_counts(self.metrics_port)
            return counts.get(reason, 0.0) if reason is not None else sum(counts.values())

        before = counted()
        with peak_rss_mb(pid) as rss:
            act()
            scored = self.good_window_scored()
        if not scored:
            return "a good window sent after it was not scored" + ("" if self.worker_alive() else " (worker exited)")
        if not self.worker_alive() or self.worker.proc.pid != pid:
            return "the worker exited"
        if rss[1] - rss[0] > MEMORY_BOUND_MB:
            return f"the worker's main process grew {rss[1] - rss[0]:.0f} MiB (bound {MEMORY_BOUND_MB:.0f})"
        if let_go is not None and not wait_until(let_go, 5.0):
            return (
                "the message is held unacknowledged (handed back at every shutdown)"
                if self.broker == "redis"
                else "the message was not dead-lettered"
            )
        if not wait_until(lambda: counted() >= before + refusals, 3.0):
            label = f'reason="{reason}"' if reason else "any reason"
            return f"{counted() - before:.0f} of {refusals} counted on {REFUSED_METRIC} ({label})"
        return None

    def run(self, entry: Any, name: str = "") -> str | None:
        """Inject one hostile message; why the worker failed it, or None."""
        dead_lettered = not (self.broker == "amqp" and name in ACKED_REFUSALS)
        return self.attempt(lambda: self.queue.inject(entry), let_go=self.queue.let_go() if dead_lettered else None)

    def replay_with_hostile_time_limit(self, copies: int = 3) -> str | None:
        """Another stream's real message, replayed ``copies`` times with a time limit rerankq
        never sends: each copy is refused, the window stays pending with no attempt counted, and
        the real message then scores it (once this failed the window: "poison")."""
        assert self.held_back is not None, "entries() holds a message back"
        stream, real = self.held_back
        hostile = real.with_headers(timelimit=HOSTILE_TIMELIMIT)

        def replay() -> None:
            for _ in range(copies):
                self.queue.inject(self.queue.entry(hostile))

        why = self.attempt(replay, let_go=None, refusals=copies)
        if why is not None:
            return why
        window = self.client.status(stream).windows[0]
        if window.state == "committed" or window.attempts:
            return f"the replayed window was touched: {window.state}, {window.attempts} attempt(s)"
        self.queue.inject(self.queue.entry(real))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            window = self.client.status(stream).windows[0]
            if window.state == "committed":
                break
            time.sleep(0.1)
        if window.state != "committed" or window.failed or window.attempts != 1:
            return (
                f"the real message then left the window {window.state}, "
                f"{window.failed} failed, {window.attempts} attempt(s)"
            )
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
    from ops.probe.control_commands import control_probes

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
        probes: list[tuple[str, Callable[[], str | None]]] = [
            (name, lambda entry=entry, name=name: probe.run(entry, name)) for name, entry in entries
        ]
        probes += control_probes(probe)
        probes.append(("replay-hostile-timelimit", probe.replay_with_hostile_time_limit))
        for name, run in probes:
            if args.only and name not in args.only:
                continue
            why = run()
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
