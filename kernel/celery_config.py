"""The Celery configuration both sides share, so producer and worker agree on it.

Each delivery setting is here for a reason; docs/guarantees.md explains them. The broker
is Redis unless ``RERANKQ_BROKER_URL`` is an ``amqp://`` URL; what RabbitMQ changes is in
``kernel.amqp_broker`` (``celery_options``), and ``delivery_summary`` says which applies.
Checked against Celery 5.7 / kombu 5.7 (the Redis transport's ack emulation):
an unacknowledged message sits in the ``unacked`` hash until it is acked,
rejected with requeue (put back at once), restored when its channel closes
cleanly, or restored by any worker once it is older than the visibility timeout.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qs, urlparse

from kernel import amqp_broker
from kernel.broker_queues import PRIORITY_STEPS
from kernel.redis_clients import SENTINEL_SCHEME, kombu_broker, scheme
from kernel.redis_transport import SENTINEL_TRANSPORT
from kernel.redis_transport import TRANSPORT as REDIS_TRANSPORT
from kernel.settings import Settings

TASK_NAME = "rerankq.score_window"


def transport_options(settings: Settings) -> dict[str, Any]:
    """The Redis transport options; the one place the visibility timeout is set."""
    return {
        # An unacknowledged message is handed out again after this long. It must exceed
        # the longest a window may run (task_time_limit below), and every client of the
        # broker must use the same value: kombu's restore of old unacked messages runs
        # in whichever worker gets there first, with its own value.
        "visibility_timeout": settings.queues.visibility_timeout_s,
        "socket_keepalive": True,
        "retry_on_timeout": True,
        # A publish must not hang forever on a half-open connection (failover, NAT).
        "socket_timeout": 30,
        "socket_connect_timeout": 5,
        "health_check_interval": 25,
        # The lanes' lists (kernel.broker_queues): pinned, so every producer, worker and the
        # sweep's probe name the same lists whatever kombu's default steps become.
        "priority_steps": list(PRIORITY_STEPS),
    }


_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def broker_tls(url: str) -> dict[str, Any] | None:
    """TLS options for a ``rediss://`` broker, read from the same URL the Redis client uses.

    kombu given a bare ``rediss://`` URL connects with ``CERT_NONE`` (no certificate
    check) and only warns; redis-py verifies by default. We verify too, unless the URL
    says ``?ssl_cert_reqs=none``; ``ssl_ca_certs`` / ``ssl_certfile`` / ``ssl_keyfile``
    in the query reach both clients.
    """
    parsed = urlparse(url)
    if parsed.scheme != "rediss":
        return None
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    options: dict[str, Any] = {
        "ssl_cert_reqs": _CERT_REQS.get(query.get("ssl_cert_reqs", "required").lower(), ssl.CERT_REQUIRED)
    }
    options.update({k: query[k] for k in _TLS_FILES if k in query})
    return options


def broker_transport(url: str) -> str | None:
    """Our Redis transport (it waits out a full Redis, ``kernel.redis_transport``) for Redis
    URLs, its Sentinel flavour for ``redis+sentinel://``; kombu's own choice for anything else."""
    if urlparse(url).scheme in ("redis", "rediss"):
        return REDIS_TRANSPORT
    if scheme(url) == SENTINEL_SCHEME:
        return SENTINEL_TRANSPORT
    return None


def celery_config(settings: Settings) -> dict[str, Any]:
    config = _common_config(settings)
    if settings.store.broker_kind == "amqp":
        # Nothing Redis-only survives: no visibility timeout (RabbitMQ takes an unacked message
        # back when its consumer's channel closes, or at its consumer timeout), no priority steps
        # (lanes are queues), no disable_prefetch (Redis-only; quorum queues give per-consumer prefetch).
        for key in ("result_backend_transport_options", "worker_disable_prefetch", "broker_use_ssl"):
            config.pop(key)
        config.update(amqp_broker.celery_options(settings))
    return config


def delivery_summary(settings: Settings) -> dict[str, Any]:
    """What this configuration sets for delivery, naming the broker it configures (logged at worker start)."""
    conf = celery_config(settings)
    summary: dict[str, Any] = {
        "broker": settings.store.broker_kind,
        "acks_late": conf["task_acks_late"],
        "prefetch_multiplier": conf["worker_prefetch_multiplier"],
        "task_time_limit_s": conf["task_time_limit"],
    }
    if settings.store.broker_kind == "redis":
        summary.update(
            visibility_timeout_s=conf["broker_transport_options"]["visibility_timeout"],
            disable_prefetch=conf["worker_disable_prefetch"],
            lanes="priority_steps 0/9",
        )
    else:
        summary.update(
            queue_type="quorum",
            publisher_confirms=conf["broker_transport_options"]["confirm_publish"],
            consumer_timeout_s=settings.queues.amqp_consumer_timeout_s,
            lanes="queues <queue>, <queue>.batch",
            dead_letter="<queue>.dead",
            queued_max_age_s=settings.queues.queued_max_age_s,
        )
    return summary


def _common_config(settings: Settings) -> dict[str, Any]:
    # A redis+sentinel:// broker becomes kombu's sentinel:// URL list plus its master_name option.
    broker_url, sentinel_options = kombu_broker(settings.store.broker)
    transport = {**transport_options(settings), **sentinel_options}
    return {
        "broker_use_ssl": broker_tls(settings.store.broker),
        "broker_url": broker_url,
        "broker_transport": broker_transport(settings.store.broker),
        "broker_transport_options": transport,
        # Should a Redis result backend ever be configured, it reads the same options.
        "result_backend_transport_options": transport,
        # Reconnect to the broker forever, at start and after a loss, instead of exiting.
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A message is a trigger: (stream_id, window). JSON only: a worker refuses (and
        # drops, unexecuted) a message of any other content type, binary serialisers included.
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "result_serializer": "json",
        "event_serializer": "json",
        # Redis keys are the result; Celery's result backend stays unused.
        "result_backend": None,
        "task_ignore_result": True,
        "task_store_errors_even_if_ignored": False,
        # At-least-once: ack only after the task ran; when the process running it dies
        # (OOM, segfault, SIGKILL) reject with requeue, so the same message comes back
        # at once. A window that kills every process is capped by the attempt counter
        # (RERANKQ_MAX_ATTEMPTS), not left to loop.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # A task that raised is acked: its window is either committed (failures commit
        # as `failed`) or still pending, and then the sweep re-sends it.
        "task_acks_on_failure_or_timeout": True,
        # A window may run at most as long as its lease; then its process is killed and
        # the sweep re-sends it. Keeps every attempt under the visibility timeout.
        # (Enforced by the prefork pool; the GPU worker's threads pool cannot enforce it.)
        "task_time_limit": settings.queues.redeliver_after_s,
        # Long tasks: a process reserves only the message it works on, and a worker
        # fetches a message only when a process is free (Redis-only setting), so a
        # queued window never waits behind a busy worker while another sits idle.
        "worker_prefetch_multiplier": 1,
        "worker_disable_prefetch": True,
        # A pool process loads its model in worker_process_init, before it reports up.
        # Celery's default (4 s) kills a replacement process that is still loading (torch
        # import plus weights on a busy host) and forks another, forever: the worker never
        # serves again after its first lost process. Allow a real model load.
        "worker_proc_alive_timeout": 300.0,
        # On broker connection loss the running windows' acks cannot be delivered and
        # their messages will be redelivered anyway: stop them instead of scoring twice.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Soft shutdown: a cold shutdown (SIGQUIT; SIGTERM too where REMAP_SIGTERM=SIGQUIT,
        # as docker-compose.yml sets) first waits this long (Celery sleeps the whole time
        # when any task is active), then cancels the running windows and restores their
        # unacked messages to the queue at once, instead of after the visibility timeout.
        # Keep it under the orchestrator's stop grace period. Not on idle: we use no ETA
        # tasks, so an idle worker has nothing to hand back and exits at once.
        "worker_soft_shutdown_timeout": settings.worker.soft_shutdown_s,
        "worker_enable_soft_shutdown_on_idle": False,
        "worker_hijack_root_logger": False,
        "task_default_queue": settings.queues.cpu_queue,
        "task_create_missing_queues": True,
        # Task events cost a message per task state change; on only for a monitor (Flower).
        "worker_send_task_events": settings.worker.task_events,
        "task_send_sent_event": settings.worker.task_events,
    }
