"""A bare Celery app with a no-op task, for the queue benchmark's baseline round trip:
same Redis, same delivery settings as rerankq, a result backend to learn it finished.

    python -m celery -A ops.bench.raw_celery worker ...   (from the repository root)
"""

from __future__ import annotations

import os

from celery import Celery

from kernel.celery_config import celery_config
from kernel.settings import load_settings

NOOP_TASK = "bench.noop"

settings = load_settings()
app = Celery("bench-raw", set_as_current=False)
app.conf.update(celery_config(settings))
app.conf.update(
    result_backend=settings.store.broker,
    task_ignore_result=False,
    task_default_queue=os.environ.get("BENCH_RAW_QUEUE", "bench.raw"),
)


@app.task(name=NOOP_TASK, ignore_result=False)
def noop(stream_id: str, window: int) -> int:
    return window
