"""The Celery configuration both sides share, so producer and worker agree on it.

Each delivery setting is here for a reason; README's "Guarantees" explains them.
"""

from __future__ import annotations

from typing import Any

from producer.settings import Settings

TASK_NAME = "rerankq.score_window"


def celery_config(settings: Settings) -> dict[str, Any]:
    transport = {
        # An unacknowledged message returns to its queue after this long. It must
        # exceed the longest window scoring time, and be the same on every client.
        "visibility_timeout": settings.visibility_timeout_s,
        "socket_keepalive": True,
        "retry_on_timeout": True,
    }
    return {
        "broker_url": settings.broker,
        "broker_transport_options": transport,
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A message is a trigger: (stream_id, window). No pickle, ever.
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "event_serializer": "json",
        # Redis keys are the result; Celery's result backend stays unused.
        "result_backend": None,
        "task_ignore_result": True,
        "task_store_errors_even_if_ignored": False,
        # At-least-once: ack after the task ran, requeue if the process died mid-task.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        # Long tasks: a process reserves only the message it works on.
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # On a warm shutdown, give running windows time to commit, then requeue the rest.
        "worker_soft_shutdown_timeout": 10.0,
        "worker_enable_soft_shutdown_on_idle": True,
        "worker_hijack_root_logger": False,
        "task_default_queue": settings.cpu_queue,
        "task_create_missing_queues": True,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }
