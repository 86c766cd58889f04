"""One worker's process: its device, its sizing, how it shuts down, how it logs."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from producer.settings.types import PositiveInt, Seconds, doc


class WorkerSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    device: Annotated[str, doc("cpu, cuda, cuda:N, mps (a --device gpu worker sets cuda)")] = "cpu"
    worker_processes: Annotated[PositiveInt | None, doc("CPU worker processes (default 1)")] = None
    torch_threads: Annotated[PositiveInt | None, doc("torch threads per process (default: cores / processes)")] = None
    # A soft shutdown is SIGQUIT, or SIGTERM with REMAP_SIGTERM=SIGQUIT.
    soft_shutdown_s: Annotated[
        Seconds,
        doc("on a soft shutdown, running windows get this long to commit before they are cancelled and requeued"),
    ] = 20.0
    task_events: Annotated[bool, doc("Celery task events (and worker heartbeats), for Flower")] = False
    log_level: Annotated[str, doc("worker log level (rerankq worker --loglevel overrides it)")] = "INFO"
