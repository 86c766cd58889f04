"""The worker's answer to ``rerankq inspect``: one remote-control command, ``rerankq_worker``.

Celery's remote control (a broadcast over the broker, answered by each worker's main process)
works with gossip, mingle and heartbeats off, as the workers run. One command returns what
the main process knows, so an operator's view takes one broadcast instead of several.
"""

from __future__ import annotations

from typing import Any

from celery.worker import state as worker_state
from celery.worker.control import inspect_command

COMMAND = "rerankq_worker"


@inspect_command(name=COMMAND)  # type: ignore[untyped-decorator]  # Celery's, unannotated
def rerankq_worker(state: Any, **_: Any) -> dict[str, Any]:
    """rerankq: device, queues, pool and windows in progress."""
    consumer = state.consumer
    settings = getattr(state.app, "rerankq_settings", None)
    pool = consumer.pool
    queues = sorted(q.name for q in consumer.task_consumer.queues) if consumer.task_consumer else []
    return {
        "device": settings.worker.device if settings is not None else None,
        "queues": queues,
        "pool": type(pool).__module__.rsplit(".", 1)[-1] if pool is not None else None,
        "concurrency": getattr(pool, "limit", None),
        "active": len(worker_state.active_requests),
        "processed": sum(worker_state.total_count.values()),
    }
