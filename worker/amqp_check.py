"""A worker's start on a RabbitMQ broker: check what the broker will do, declare what it needs."""

from __future__ import annotations

import structlog
from kombu.connection import Connection
from kombu.exceptions import OperationalError

from kernel.amqp_broker import check_broker, kombu_queues
from kernel.settings import Settings
from worker.message_door import Consumer as CheckingConsumer

log = structlog.get_logger("rerankq.worker")


def prepare_amqp_broker(settings: Settings, timeout_s: float = 60.0) -> str | None:
    """Why this worker must not serve this broker, or None once its queues are declared.

    Connects (retrying up to ``timeout_s``: a broker still starting is waited for, one that never
    answers is a fatal start error), checks that the delivery acknowledgement timeout exceeds the
    window time limit, and declares every lane queue and its dead-letter queue, so a message a
    worker refuses has somewhere to go.
    """
    with Connection(settings.store.broker, connect_timeout=5) as connection:
        try:
            connection.ensure_connection(
                max_retries=max(1, int(timeout_s // 2)), interval_start=1, interval_step=1, interval_max=2
            )
        except (OperationalError, *connection.connection_errors) as exc:
            return f"cannot reach the RabbitMQ broker: {type(exc).__name__}: {exc}"
        check = check_broker(settings, connection)
        log.info(
            "amqp_broker_checked",
            server_version=check.server_version,
            consumer_timeout_source=check.consumer_timeout_source,
            consumer_timeout_s=check.consumer_timeout_s,
            task_time_limit_s=check.task_time_limit_s,
        )
        if check.problem:
            return check.problem
        channel = connection.default_channel
        for queue in kombu_queues(settings):
            queue(channel).declare()
    return None


class AmqpConsumer(CheckingConsumer):
    """The checking consumer (``worker.message_door``) without its native delayed delivery step.

    Celery turns that step on wherever it sees a quorum queue: at every start it declares a
    ladder of 28 delay queues and exchanges and binds ours to them, for ETA and countdown tasks.
    rerankq sends neither (a window message is due now), so the step would only cost start time
    and broker resources, and warn about our direct exchanges.
    """

    class Blueprint(CheckingConsumer.Blueprint):
        default_steps = [
            step for step in CheckingConsumer.Blueprint.default_steps if not step.endswith(":DelayedDelivery")
        ]
