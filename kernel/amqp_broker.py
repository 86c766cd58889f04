"""RabbitMQ as the broker (``RERANKQ_BROKER_URL=amqp://...``); Redis stays the store.

Each device queue is a durable quorum queue, replicated by RabbitMQ's Raft and written to
disk before the publisher's confirm comes back. What differs from the Redis transport, and why:

- **Lanes are queues.** Quorum queues on RabbitMQ 3.10/3.11 have no message priorities, so the
  batch lane is a queue of its own, ``<queue>.batch``, beside ``<queue>`` (the interactive
  lane). A worker consumes both with prefetch 1 per consumer (quorum queues refuse a channel
  wide prefetch): a waiting interactive window is delivered as soon as the interactive
  consumer has room, never behind the batch queue. What it can wait behind is the batch
  window already running, and the one batch message each process may hold reserved.
- **Refused messages are dead-lettered.** A message a worker rejects (its arguments name no
  window, its content type is not JSON, its task is unknown) goes to ``<queue>.dead`` instead
  of vanishing, with RabbitMQ's at-least-once dead-lettering.
- **The delivery acknowledgement timeout.** RabbitMQ closes the channel of a consumer that holds
  a message unacked longer than its consumer timeout. A window may run ``task_time_limit``
  (``RERANKQ_REDELIVER_AFTER_S``), so the timeout must be longer: rerankq asks for
  ``RERANKQ_AMQP_CONSUMER_TIMEOUT_S`` per consumer (``x-consumer-timeout``, RabbitMQ 3.12 and
  3.11.15 on); an older server has only its server-wide ``consumer_timeout``, which cannot be read
  over AMQP, so there ``RERANKQ_AMQP_CONSUMER_TIMEOUT_S`` states the server's value (RabbitMQ's
  default, 30 minutes, unless said otherwise). The worker checks this at start.
- **Nothing to scan.** A RabbitMQ queue's messages cannot be listed cheaply, so the sweep does
  not look into the queues: the store keeps a per-window "queued" mark instead
  (``kernel/store.lua``), see ``worker.sweep``. Queue depths come from a passive declare.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any
from urllib.parse import urlparse

import msgspec
from amqp.exceptions import MessageNacked
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.exceptions import OperationalError
from kombu.messaging import Producer

from kernel.settings import Settings
from kernel.wire import LANES, Lane

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
BATCH_SUFFIX = ".batch"
DEAD_SUFFIX = ".dead"
#: Servers from which a consumer may ask for its own delivery acknowledgement timeout.
PER_CONSUMER_TIMEOUT_SINCE = ((3, 11, 15), (3, 12, 0))


def is_amqp(url: str) -> bool:
    return urlparse(url).scheme in AMQP_SCHEMES


def lane_queue(queue: str, lane: Lane) -> str:
    """The RabbitMQ queue of one lane of a device queue."""
    return queue + BATCH_SUFFIX if lane == "batch" else queue


def dead_letter_queue(queue: str) -> str:
    return queue + DEAD_SUFFIX


def consumed_queues(queues: list[str]) -> list[str]:
    """What a worker serving ``queues`` consumes: both lanes of each."""
    return [lane_queue(queue, lane) for queue in queues for lane in LANES]


def quorum_arguments(queue: str) -> dict[str, Any]:
    """Queue arguments of both lanes of ``queue``. Fixed, never derived from a tunable setting:
    RabbitMQ refuses to redeclare a queue with other arguments, so every producer and worker
    version must declare the same ones (tune the rest with policies)."""
    return {
        "x-queue-type": "quorum",
        # The default exchange routes by queue name, so no exchange of our own is needed.
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead_letter_queue(queue),
        # At-least-once dead-lettering (RabbitMQ 3.10+) needs reject-publish overflow.
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def kombu_queues(settings: Settings) -> list[Queue]:
    """Every lane queue of every device queue, and their dead-letter queues, as Celery declares them."""
    out: list[Queue] = []
    consumer_args = {"x-consumer-timeout": settings.queues.amqp_consumer_timeout_s * 1000}
    for queue in dict.fromkeys(settings.queues.all_queues()):
        for lane in LANES:
            name = lane_queue(queue, lane)
            out.append(
                Queue(
                    name,
                    Exchange(name, type="direct", durable=True),
                    routing_key=name,
                    durable=True,
                    queue_arguments=quorum_arguments(queue),
                    consumer_arguments=consumer_args,
                )
            )
        dead = dead_letter_queue(queue)
        out.append(
            Queue(
                dead,
                Exchange(dead, type="direct", durable=True),
                routing_key=dead,
                durable=True,
                queue_arguments={"x-queue-type": "quorum"},
            )
        )
    return out


def transport_options(settings: Settings) -> dict[str, Any]:
    return {
        # A publish returns only once RabbitMQ has the message on a quorum of disks.
        "confirm_publish": True,
        # Bound a publish that cannot reach the broker (kombu retries, then raises).
        "max_retries": 3,
        "interval_start": 0,
        "interval_step": 0.5,
        "interval_max": 1,
    }


def celery_options(settings: Settings) -> dict[str, Any]:
    """What the amqp broker changes in ``kernel.celery_config``."""
    return {
        "broker_transport": None,
        "broker_transport_options": transport_options(settings),
        "task_queues": kombu_queues(settings),
        "task_create_missing_queues": False,
        # Quorum queues refuse a channel-wide prefetch: Celery sees them and uses per-consumer QoS.
        "worker_detect_quorum_queues": True,
        "broker_heartbeat": 30,
        "task_default_queue": settings.queues.cpu_queue,
        "task_default_exchange": settings.queues.cpu_queue,
        "task_default_routing_key": settings.queues.cpu_queue,
    }


def server_version(connection: Connection) -> tuple[int, ...]:
    props = connection.connection.server_properties or {}
    raw = props.get("version", b"")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def per_consumer_timeout(version: tuple[int, ...]) -> bool:
    since_311, since_312 = PER_CONSUMER_TIMEOUT_SINCE
    return version >= since_312 or (version[:2] == since_311[:2] and version >= since_311)


class BrokerCheck(msgspec.Struct, frozen=True):
    """What a worker found and configured on its RabbitMQ broker at start."""

    broker: str
    server_version: str
    #: ``per_consumer`` (asked for by rerankq) or ``server`` (the server's, as stated in settings).
    consumer_timeout_source: str
    consumer_timeout_s: int
    task_time_limit_s: int
    problem: str | None = None


def check_broker(settings: Settings, connection: Connection) -> BrokerCheck:
    """Whether the broker will let a window run its whole time limit before it takes its message back."""
    version = server_version(connection)
    source = "per_consumer" if per_consumer_timeout(version) else "server"
    timeout = settings.queues.amqp_consumer_timeout_s
    problem = None
    if timeout <= settings.queues.redeliver_after_s:
        where = (
            "asked per consumer"
            if source == "per_consumer"
            else "the server's consumer_timeout (set server-wide on RabbitMQ before 3.11.15)"
        )
        problem = (
            f"the delivery acknowledgement timeout, {timeout} s ({where}, RERANKQ_AMQP_CONSUMER_TIMEOUT_S), "
            f"must exceed the window time limit RERANKQ_REDELIVER_AFTER_S={settings.queues.redeliver_after_s}; "
            "otherwise RabbitMQ takes a running window's message back and hands it to another worker"
        )
    return BrokerCheck(
        broker="amqp",
        server_version=".".join(map(str, version)),
        consumer_timeout_source=source,
        consumer_timeout_s=timeout,
        task_time_limit_s=settings.queues.redeliver_after_s,
        problem=problem,
    )


class QueueCount(msgspec.Struct, frozen=True):
    queue: str
    lane: Lane
    waiting: int
    consumers: int


class AmqpQueueProbe:
    """Queue depths from RabbitMQ (a passive declare per lane queue: ready messages, consumers).

    It cannot say which windows are queued (nothing lists a RabbitMQ queue's messages without
    taking them), nor how long the oldest has waited: ``queued_windows`` is None, and the sweep
    uses the store's queued marks instead.
    """

    def __init__(self, url: str) -> None:
        self.connection = Connection(url, connect_timeout=5, transport_options={"max_retries": 1})
        self._channel: Any = None

    def counts(self, queues: list[str]) -> list[QueueCount]:
        out = []
        for queue in queues:
            for lane in LANES:
                name = lane_queue(queue, lane)
                if self._channel is None:
                    self.connection.ensure_connection(max_retries=1)
                    self._channel = self.connection.channel()
                try:
                    _, waiting, consumers = self._channel.queue_declare(name, passive=True)
                except self.connection.channel_errors:
                    # Not declared yet (no producer or worker has used it): nothing waits there.
                    # RabbitMQ closed the channel over it; the next declare opens another.
                    self._channel = None
                    waiting = consumers = 0
                except self.connection.connection_errors:
                    self._channel = None
                    self.connection.collect()
                    raise
                out.append(QueueCount(queue=queue, lane=lane, waiting=int(waiting), consumers=int(consumers)))
        return out

    def depth(self, queues: list[str]) -> int:
        return sum(c.waiting for c in self.counts(queues))

    def queued_windows(self, queues: list[str]) -> None:
        return None

    def close(self) -> None:
        self.connection.release()


def wait_for_broker(url: str, timeout_s: float) -> None:
    """Until the broker accepts a connection (tests, chaos): raises the last error at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Connection(url, connect_timeout=2) as conn:
                conn.connect()
                return
        except Exception:  # noqa: BLE001 - any failure to connect means "not yet"
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class ConfirmedBursts:
    """Publishes one send's messages (an open's first windows, a sweep's re-sends) in a burst,
    then waits once until RabbitMQ has confirmed them all.

    Celery's ``confirm_publish`` waits for each message's confirm before it sends the next, so an
    open with N first windows would pay N waits for a quorum of RabbitMQ's disks. Here each thread has
    a connection of its own, without ``confirm_publish``, and a channel put in confirm mode with
    py-amqp's public API (``confirm_select``, the channel's ``basic_ack``/``basic_nack`` events,
    ``drain_events``); Celery builds and publishes the messages through it (``send_task`` with
    ``producer=``, no retry: a revived channel would not be in confirm mode). A send returns only
    when every message of it is confirmed, and a failure is kombu's ``OperationalError``, as
    with Celery's own publish. A lost connection has the burst tried again whole on a fresh one, up to
    ``max_retries`` times, so a message may be queued twice, which ``begin`` turns away; a nack
    (a queue over its length limit) is not tried again: the caller hands the windows to the sweep.
    """

    def __init__(self, url: str, transport_options: dict[str, Any], timeout_s: float = 30.0) -> None:
        self.url = url
        self.options = {k: v for k, v in transport_options.items() if k != "confirm_publish"}
        self.retries = int(transport_options.get("max_retries", 3))
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[_ConfirmChannel] = []

    def publish(self, sends: list[Any]) -> None:
        """Run each ``send(producer=...)`` (a ``send_task`` through that producer), then wait for every confirm."""
        for attempt in range(self.retries + 1):
            channel = self._channel()
            try:
                channel.publish_all(sends, self.timeout_s)
                return
            except (MessageNacked, *channel.errors) as exc:
                self._drop(channel)
                if attempt == self.retries or isinstance(exc, MessageNacked):
                    raise OperationalError(f"RabbitMQ did not confirm a send: {type(exc).__name__}: {exc}") from exc
                time.sleep(min(1.0, 0.5 * attempt))
            except BaseException:
                self._drop(channel)
                raise

    def _channel(self) -> _ConfirmChannel:
        channel = getattr(self._local, "channel", None)
        if channel is None:
            channel = _ConfirmChannel(self.url, self.options)
            with self._lock:
                self._open.append(channel)
            self._local.channel = channel
        return channel

    def _drop(self, channel: _ConfirmChannel) -> None:
        self._local.channel = None
        with self._lock:
            if channel in self._open:
                self._open.remove(channel)
        channel.close()

    def close(self) -> None:
        with self._lock:
            channels, self._open = self._open, []
        for channel in channels:
            channel.close()


class _ConfirmChannel:
    """One connection and one channel in confirm mode; counts its publishes (RabbitMQ numbers
    them 1, 2, ... per channel) and the confirms that came back."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.connection = Connection(url, connect_timeout=5, transport_options=options)
        self.errors = (*self.connection.connection_errors, *self.connection.channel_errors, OSError)
        self.channel: Any = None
        self.producer: Producer | None = None
        self.published = 0
        self.unconfirmed: set[int] = set()
        self.nacked = 0

    def _open(self) -> None:
        self.connection.ensure_connection(max_retries=1)
        self.channel = self.connection.channel()
        self.channel.confirm_select()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.producer = Producer(self.channel)

    def _settle(self, tag: int, multiple: bool) -> int:
        settled = {t for t in self.unconfirmed if t <= tag} if multiple else {tag} & self.unconfirmed
        self.unconfirmed -= settled
        return len(settled)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self.nacked += self._settle(tag, multiple)

    def publish_all(self, sends: list[Any], timeout_s: float) -> None:
        if self.channel is None:
            self._open()
        for send in sends:
            send(producer=self.producer)
            self.published += 1
            self.unconfirmed.add(self.published)
        deadline = time.monotonic() + timeout_s
        while self.unconfirmed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(self.unconfirmed)} publishes not confirmed in {timeout_s:.0f} s")
            self.connection.drain_events(timeout=left)
        if self.nacked:
            nacked, self.nacked = self.nacked, 0
            raise MessageNacked(f"{nacked} of the burst refused by RabbitMQ")

    def close(self) -> None:
        try:
            self.connection.release()
        except Exception:  # noqa: BLE001 - closing a connection that is already gone
            pass


class AsyncAmqpBroker:
    """The gateway's view of a RabbitMQ broker: queue depths and a ping, run off the event loop
    (kombu's connection is blocking; one lock keeps its calls one at a time)."""

    def __init__(self, url: str) -> None:
        self.probe = AmqpQueueProbe(url)
        self._lock = threading.Lock()

    def _depths(self, queues: list[str]) -> dict[str, int]:
        with self._lock:
            counts = self.probe.counts(queues)
        out = dict.fromkeys(queues, 0)
        for count in counts:
            out[count.queue] += count.waiting
        return out

    def _ping(self) -> None:
        with self._lock:
            self.probe.connection.ensure_connection(max_retries=1)

    async def depths(self, queues: list[str]) -> dict[str, int]:
        return await asyncio.to_thread(self._depths, queues)

    async def ping(self) -> None:
        await asyncio.to_thread(self._ping)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.probe.close)
