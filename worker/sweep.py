"""The workers' sweep: re-send windows admitted but not committed past their deadline,
unless their message is still waiting in a queue.

A Celery message on Redis can vanish between the broker fetch and the ack (a worker's
main process killed, a Redis restart that lost the last second of AOF), and a producer
can die between admitting a window and sending its message. The stream's pending set
still names every such window with a deadline, so re-sending the overdue ones whose
message is nowhere in the queues (``kernel.broker_queues``) is enough to make every
admitted window end committed, without re-sending what a backlog is only delaying. A
duplicate send is harmless: ``begin`` turns it away while a live attempt holds the
window, and ``commit`` writes a window only once.

On RabbitMQ nothing lists a queue's messages without taking them, so the sweep asks the store
instead: each window carries a queued mark from the moment its message is sent until a
delivery begins it (``kernel/store.lua``). An overdue window still marked queued is left
alone until its mark is ``RERANKQ_QUEUED_MAX_AGE_S`` old: a confirmed message in a durable
quorum queue is not lost by the broker, so what the mark cannot see is a producer that died
between admitting a window and sending it, or a message an operator purged, and those wait
that long. A window begun and then abandoned (its worker died after the broker handed its
message back) carries no mark and is re-sent once its lease runs out, which can send it twice:
``begin`` and ``commit`` keep that to one commit.

Runs in each worker's main process on a background thread. A Redis lock that is never
released but expires after one interval (``SET NX PX``) makes one worker in the whole
fleet sweep per interval, whichever gets there first; a worker that dies costs at most
one missed interval.
"""

from __future__ import annotations

import threading

import redis
import structlog
from kombu.exceptions import OperationalError

from kernel.amqp_broker import AmqpQueueProbe
from kernel.broker_queues import QueueProbe
from kernel.dispatch import Dispatcher
from kernel.fair_share import FairShare, member, send_released
from kernel.keys import DEVICES
from kernel.redis_clients import broker_client, is_redis_broker
from kernel.settings import Settings
from kernel.store import DueWindows, Store, connect
from worker.metrics.recorder import NO_METRICS, Recorder

log = structlog.get_logger("rerankq.sweep")

# Streams checked per round trip: one pipeline of `due` calls, each still atomic.
SWEEP_BATCH = 500
SEND_ERRORS = (redis.RedisError, OperationalError, OSError)


def sweep_once(
    store: Store,
    dispatcher: Dispatcher,
    probe: QueueProbe | AmqpQueueProbe | None,
    settings: Settings,
    recorder: Recorder = NO_METRICS,
) -> int:
    """Re-send every overdue window of every live stream that has no message queued.

    Returns how many were sent. One stream that cannot be sent to is logged and skipped;
    it never stops the others.
    """
    streams = store.active_streams()
    due: dict[str, DueWindows] = {}
    # Where the queues cannot be read (RabbitMQ), the store's queued marks stand in for them.
    trust_s = settings.queues.queued_max_age_s if settings.store.broker_kind == "amqp" else 0
    for i in range(0, len(streams), SWEEP_BATCH):
        due.update(
            store.due_windows_many(
                streams[i : i + SWEEP_BATCH], retry_in_s=settings.queues.redeliver_after_s, trust_queued_s=trust_s
            )
        )
    if not due:
        return 0
    listed = probe.queued_windows(settings.queues.all_queues()) if probe is not None else None
    queued = listed or set()
    held_back = _held_back(FairShare(store, settings), due)
    sent = 0
    waiting = sum(claimed.held for claimed in due.values())
    for stream_id, claimed in due.items():
        # A window waiting for its tenant's share is the ledger's to send, when it fits.
        lost = [w for w in claimed.windows if (stream_id, w) not in queued and member(stream_id, w) not in held_back]
        waiting += len(claimed.windows) - len(lost)
        if not lost:
            continue
        try:
            # The lane the stream was opened in: a batch window re-sent never jumps the interactive ones.
            dispatcher.send(stream_id, lost, claimed.device, claimed.lane)  # type: ignore[arg-type]
        except SEND_ERRORS as exc:
            # Claimed already: the next period after this one tries again. Not sent, so not
            # queued: clear the marks the claim set, or a RabbitMQ sweep would trust them.
            log.warning("sweep_send_failed", stream=stream_id, windows=lost, error=type(exc).__name__)
            try:
                store.hurry(stream_id, lost)
            except redis.RedisError:
                pass  # the store is down too: the claim's deadline brings the windows back
            continue
        except Exception:  # noqa: BLE001 - one bad stream must not starve the others
            log.exception("sweep_send_crashed", stream=stream_id, windows=lost)
            continue
        sent += len(lost)
        store.incr_counter("windows_redelivered", len(lost), stream_id=stream_id)
        recorder.windows_redelivered(len(lost))
        log.warning("windows_redelivered", stream=stream_id, windows=lost)
    if waiting:
        log.info("sweep_left_queued", windows=waiting)
    if held_back:
        log.info("sweep_left_waiting_for_share", windows=len(held_back))
    return sent


def _held_back(fair_share: FairShare, due: dict[str, DueWindows]) -> set[str]:
    """The claimed windows that wait in a device's fair-share ledger."""
    by_device: dict[str, list[str]] = {}
    for stream_id, claimed in due.items():
        by_device.setdefault(claimed.device, []).extend(member(stream_id, w) for w in claimed.windows)
    found: set[str] = set()
    for device, members in by_device.items():
        found |= fair_share.deferred(device, members)
    return found


def repair_shares(store: Store, dispatcher: Dispatcher, settings: Settings) -> int:
    """The fair-share ledgers' backstop: give back every share whose window is done (committed,
    or its stream gone) though nobody said so (a worker killed between its commit and the
    ledger, a Redis that lost the last second), then release and send whatever fits. Returns
    how many windows it released."""
    fair_share = FairShare(store, settings)
    released_total = 0
    for device in DEVICES:
        try:
            stale = fair_share.stale(device)
            released = fair_share.done(device, stale) if stale else []
            released += fair_share.release(device)
        except SEND_ERRORS as exc:
            log.warning("fair_share_repair_failed", device=device, error=type(exc).__name__)
            continue
        if stale:
            log.warning("fair_share_given_back", device=device, windows=stale)
        if not released:
            continue
        try:
            send_released(dispatcher, device, released)
        except SEND_ERRORS as exc:
            # Released, so pending like any window: overdue, the sweep sends it.
            log.warning("released_windows_not_sent", device=device, error=type(exc).__name__)
            continue
        released_total += len(released)
        log.info("windows_released", device=device, windows=[member(r.stream_id, r.window) for r in released])
    return released_total


def broker_probe(settings: Settings) -> QueueProbe | None:
    """A probe of the broker's queues, where the broker is a Redis whose lists can be read
    (on RabbitMQ the sweep reads the store's queued marks instead)."""
    if is_redis_broker(settings.store.broker):
        return QueueProbe(broker_client(settings.store.broker))
    return None


class SweepTimer:
    """A daemon thread that sweeps every ``sweep_interval_s`` while it holds the fleet's lock."""

    def __init__(self, settings: Settings, recorder: Recorder = NO_METRICS) -> None:
        self.settings = settings
        self.recorder = recorder
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SweepTimer:
        self._thread = threading.Thread(target=self._run, name="rerankq-sweep", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        # Own connections: nothing here is shared with the Celery consumer or the pool.
        store = Store(
            connect(self.settings.store.redis_url or self.settings.store.broker), self.settings.store.namespace
        )
        dispatcher = Dispatcher(self.settings)
        probe = broker_probe(self.settings)
        interval = self.settings.queues.sweep_interval_s
        try:
            while not self._stop.wait(interval):
                try:
                    if store.try_sweep_lock(interval):
                        sent = sweep_once(store, dispatcher, probe, self.settings, self.recorder)
                        if sent:
                            log.warning("sweep_resent", windows=sent)
                        repair_shares(store, dispatcher, self.settings)
                except SEND_ERRORS as exc:
                    # Redis down, restarting or full: the next interval tries again.
                    log.warning("sweep_failed", error=type(exc).__name__)
                except Exception:  # noqa: BLE001 - the sweep must outlive anything one cycle meets
                    log.exception("sweep_crashed")
        finally:
            dispatcher.close()
            store.client.close()
            if probe is not None:
                probe.client.close()
