"""The Celery app: one queue per device kind, JSON only, no result backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from celery import Celery, Task, signals

from kernel.celery_config import TASK_NAME, celery_config
from kernel.settings import Settings
from worker import card, envelope, remote_control  # noqa: F401 - registers the rerankq_worker inspect command
from worker.child_gate import ChildGate, gate_step
from worker.metrics import MONITORING_OFF, Monitoring
from worker.readiness import explain
from worker.runtime import Runtime, get_runtime, reset_runtime
from worker.sweep import SweepTimer

if TYPE_CHECKING:
    from worker.metrics.health import WorkerHealth
    from worker.metrics.recorder import Recorder

log = structlog.get_logger("rerankq.task")

WINDOW_REQUEST = "worker.window_request:WindowRequest"

Receiver = TypeVar("Receiver", bound=Callable[..., None])


def receives(signal: Any) -> Callable[[Receiver], Receiver]:
    """``signal.connect(weak=False)`` as a decorator that keeps the receiver's type (Celery's is unannotated)."""

    def connect(receiver: Receiver) -> Receiver:
        signal.connect(receiver, weak=False)
        return receiver

    return connect


def create_app(
    settings: Settings,
    *,
    eager_runtime: bool = True,
    sweep: bool = True,
    monitoring: Monitoring = MONITORING_OFF,
    gate: ChildGate | None = None,
) -> Celery:
    """The worker's app. ``gate``: a prefork worker's pool processes say through it whether their
    chain scores, and the consumer waits for one that does (``worker.child_gate``)."""
    app = Celery("rerankq", set_as_current=False)
    app.conf.update(celery_config(settings))
    _guard_doors(app, settings)
    recorder = monitoring.recorder
    # Read by the consumer's door; the settings also by the doors and the remote-control command.
    app.rerankq_recorder = recorder
    app.rerankq_settings = settings
    score_window = _register_task(app, settings, recorder)

    @receives(signals.celeryd_init)
    def _learn_hostname(sender: object = None, **_: object) -> None:
        # The main process, before the pool forks: its children inherit the name for their cards.
        if isinstance(sender, str):
            card.set_hostname(sender)

    if eager_runtime:
        _load_runtime_at_start(settings, recorder, gate)
    if gate is not None:
        app.steps["worker"].add(gate_step(gate))
    if monitoring.health is not None:
        _report_consumer_health(monitoring.health)
    if sweep:
        _sweep_from_main(settings, recorder)
    app.score_window = score_window
    return app


def _guard_doors(app: Celery, settings: Settings) -> None:
    """Every message is checked before Celery acts on it (worker.message_door)."""
    app.conf.broker_transport = envelope.guarded_transport(app.conf.broker_transport, settings.store.broker_kind)
    if settings.store.broker_kind == "amqp":
        app.conf.worker_consumer = "worker.amqp_check:AmqpConsumer"
    else:
        app.conf.worker_consumer = "worker.message_door:Consumer"
        envelope.guard_sentinel_failover()


def _register_task(app: Celery, settings: Settings, recorder: Recorder) -> Any:
    # The door (worker.message_door) has checked the arguments: a real stream id, a window
    # number some stream could have; the store checks the window against the stream.
    # WindowRequest tells the store, from the main process, how each attempt ended.
    # RabbitMQ's redelivered flag is the broker's own (a publisher cannot set it): the message
    # of a worker that died whole, handed back at once, takes over its lease. On Redis the
    # flag is the envelope's, which anyone who writes to the list writes: never trusted.
    trusts_redelivered = settings.store.broker_kind == "amqp"

    @app.task(name=TASK_NAME, bind=True, ignore_result=True, Request=WINDOW_REQUEST)  # type: ignore[untyped-decorator]  # Celery's
    def score_window(self: Task, stream_id: str, window: int) -> str:
        runtime = get_runtime(settings, recorder)
        redelivered = (self.request.delivery_info or {}).get("redelivered") is True
        return runtime.scorer.process(
            stream_id, window, delivery=str(self.request.id), takeover=trusts_redelivered and redelivered
        )

    return score_window


def _load_runtime_at_start(settings: Settings, recorder: Recorder, gate: ChildGate | None) -> None:
    """Load the models before the first window: in each prefork child (which tells ``gate``
    whether it can score), or in the main process of any other pool; publish the worker's card
    and keep it fresh."""

    def publish(runtime: Runtime) -> None:
        name = card.hostname()
        if name is not None:
            card.publish(runtime.store, name, card.describe(runtime))

    @receives(signals.worker_process_init)
    def _load_in_child(**_: object) -> None:
        reset_runtime()
        try:
            runtime = get_runtime(settings, recorder)
        except BaseException as exc:
            # Said before it propagates: a verdict never sent would hold the consumer back for good.
            if gate is not None:
                gate.report(f"loading the chain raised {type(exc).__name__}: {exc}")
            raise
        if gate is not None:
            gate.report(None if runtime.scoring_started() else explain(runtime.start_causes()))
        publish(runtime)

    @receives(signals.worker_ready)
    def _load_in_main(sender: object = None, **_: object) -> None:
        # prefork loads in each child instead; never in the parent that forks them.
        pool = getattr(getattr(sender, "pool", None), "__class__", type(None)).__module__
        if "prefork" not in pool:
            publish(get_runtime(settings, recorder))
        name = card.hostname()
        if name is not None:
            # The queues this worker consumes, as Celery resolved them from --queues.
            declared = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
            queues = list(getattr(declared, "consume_from", None) or {})
            keeper = card.CardKeeper(settings, name, queues).start()
            signals.worker_shutting_down.connect(lambda **_: keeper.request_stop(), weak=False)


def _report_consumer_health(health: WorkerHealth) -> None:
    # worker_ready's sender is the consumer: /healthz asks it whether the broker is connected.
    @receives(signals.worker_ready)
    def _consumer_up(sender: object = None, **_: object) -> None:
        health.consumer_started(sender)

    @receives(signals.worker_shutting_down)
    def _consumer_down(**_: object) -> None:
        health.consumer_stopped()


def _sweep_from_main(settings: Settings, recorder: Recorder) -> None:
    timer = SweepTimer(settings, recorder)

    # The main process sweeps (worker_ready fires there only, after the pool forked).
    @receives(signals.worker_ready)
    def _start_sweep(**_: object) -> None:
        timer.start()

    @receives(signals.worker_shutting_down)
    def _stop_sweep(**_: object) -> None:
        timer.request_stop()  # no join: this runs inside a signal handler
