"""The Celery app: one queue per device kind, JSON only, no result backend."""

from __future__ import annotations

import structlog
from celery import Celery, signals
from celery.exceptions import Reject

from producer.celery_config import TASK_NAME, celery_config
from producer.errors import ValidationError
from producer.settings import Settings
from worker import card, message_door, remote_control  # noqa: F401 - registers the rerankq_worker inspect command
from worker.metrics import MONITORING_OFF, Monitoring
from worker.runtime import get_runtime, reset_runtime
from worker.sweep import SweepTimer

log = structlog.get_logger("rerankq.task")


def valid_task_args(stream_id: object, window: object, settings: Settings) -> bool:
    """A real stream id and a window number that some stream could have (not a bool, not negative)."""
    from producer.validation import check_stream_id

    try:
        check_stream_id(stream_id)  # type: ignore[arg-type]
    except ValidationError:
        return False
    return type(window) is int and 0 <= window < settings.streams.max_candidates


def create_app(
    settings: Settings, *, eager_runtime: bool = True, sweep: bool = True, monitoring: Monitoring = MONITORING_OFF
) -> Celery:
    app = Celery("rerankq", set_as_current=False)
    app.conf.update(celery_config(settings))
    # Every message is checked before Celery acts on it (worker.message_door).
    if settings.store.broker_kind == "amqp":
        app.conf.worker_consumer = "worker.amqp_check:AmqpConsumer"
    else:
        app.conf.worker_consumer = "worker.message_door:Consumer"
        app.conf.broker_transport = message_door.guarded_transport(app.conf.broker_transport)
        message_door.guard_sentinel_failover()
    recorder = monitoring.recorder
    app.rerankq_recorder = recorder  # type: ignore[attr-defined] - read by the consumer's door
    app.rerankq_settings = settings  # type: ignore[attr-defined] - read by the remote-control command

    @app.task(name=TASK_NAME, bind=True, ignore_result=True)
    def score_window(self, stream_id: object, window: object) -> str:  # type: ignore[no-untyped-def]
        # The queue is an input like any other: a message naming no real window is dropped
        # before Redis is touched (the store checks the window's range against the stream too).
        if not valid_task_args(stream_id, window, settings):
            log.warning("task_refused", reason="arguments name no window", args=repr((stream_id, window))[:200])
            # Rejected, not requeued: RabbitMQ dead-letters it (<queue>.dead), Redis drops it.
            raise Reject("arguments name no window", requeue=False)
        runtime = get_runtime(settings, recorder)
        return runtime.scorer.process(stream_id, window, delivery=str(self.request.id))  # type: ignore[arg-type]

    @signals.celeryd_init.connect(weak=False)
    def _learn_hostname(sender: object = None, **_: object) -> None:
        # The main process, before the pool forks: its children inherit the name for their cards.
        if isinstance(sender, str):
            card.set_hostname(sender)

    def load_and_publish() -> None:
        runtime = get_runtime(settings, recorder)
        name = card.hostname()
        if name is not None:
            card.publish(runtime.store, name, card.describe(runtime))

    if eager_runtime:

        @signals.worker_process_init.connect(weak=False)
        def _load_in_child(**_: object) -> None:
            reset_runtime()
            load_and_publish()

        @signals.worker_ready.connect(weak=False)
        def _load_in_main(sender: object = None, **_: object) -> None:
            # prefork loads in each child instead; never in the parent that forks them.
            pool = getattr(getattr(sender, "pool", None), "__class__", type(None)).__module__
            if "prefork" not in pool:
                load_and_publish()
            name = card.hostname()
            if name is not None:
                # The queues this worker consumes, as Celery resolved them from --queues.
                declared = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
                queues = list(getattr(declared, "consume_from", None) or {})
                keeper = card.CardKeeper(settings, name, queues).start()
                signals.worker_shutting_down.connect(lambda **_: keeper.request_stop(), weak=False)

    health = monitoring.health
    if health is not None:
        # worker_ready's sender is the consumer: /healthz asks it whether the broker is connected.
        @signals.worker_ready.connect(weak=False)
        def _consumer_up(sender: object = None, **_: object) -> None:
            health.consumer_started(sender)

        @signals.worker_shutting_down.connect(weak=False)
        def _consumer_down(**_: object) -> None:
            health.consumer_stopped()

    if sweep:
        timer = SweepTimer(settings, recorder)

        # The main process sweeps (worker_ready fires there only, after the pool forked).
        @signals.worker_ready.connect(weak=False)
        def _start_sweep(**_: object) -> None:
            timer.start()

        @signals.worker_shutting_down.connect(weak=False)
        def _stop_sweep(**_: object) -> None:
            timer.request_stop()  # no join: this runs inside a signal handler

    app.score_window = score_window  # type: ignore[attr-defined]
    return app
