"""One worker's process: its device, its sizing, how it shuts down, how it logs."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.field_errors import NAME_LIST_PATTERN
from kernel.settings.types import PositiveInt, Seconds, doc

#: Comma-separated command names (Celery's are lower-case identifiers), or nothing.
CommandNames = Annotated[str, msgspec.Meta(pattern=NAME_LIST_PATTERN)]


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
    # A worker that cannot score would turn its share of every tenant's windows into fusion
    # order: it refuses to start unless told that is what is wanted (worker.readiness).
    serve_without_scoring: Annotated[
        bool,
        doc(
            "start and take windows even when no chain member that scores can start (they keep fusion "
            "order or fail); a chain configured with rrf members only needs no such setting"
        ),
    ] = False
    # rerankq's own tools use ping and rerankq_worker (rerankq inspect); every other command
    # a client of the broker sends (shutdown, rate_limit, revoke, conf, ...) is refused.
    remote_control_commands: Annotated[
        CommandNames,
        doc(
            "Celery remote-control commands a worker answers besides ping and rerankq_worker, "
            "comma-separated (e.g. stats,active,registered for Flower); every other is refused"
        ),
    ] = ""

    def extra_control_commands(self) -> frozenset[str]:
        """The remote-control commands named in ``remote_control_commands``."""
        return frozenset(name.strip() for name in self.remote_control_commands.split(",") if name.strip())
