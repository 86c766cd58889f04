"""Start a worker pinned to one device kind: what ``rerankq worker`` runs.

A CPU worker runs prefork processes sized to the cores it is given; a GPU worker
runs one process (start one per GPU) with a thread pool, so windows of many
streams can share a forward pass.
"""

from __future__ import annotations

import os
import socket

import structlog
from celery import Celery

from kernel.settings import Settings, override, read_settings
from worker.app import create_app
from worker.chain.member_config import check_member_configs
from worker.child_gate import ChildGate
from worker.control_door import check_remote_control
from worker.logs import configure_logging
from worker.metrics.recorder import Recorder
from worker.scoring.calibration import Calibrations

log = structlog.get_logger("rerankq.worker")


def cpu_quota() -> int:
    """Cores this process may actually use (affinity and cgroup quota), not the host's count."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def start_worker(
    *,
    device: str = "cpu",
    processes: int | None = None,
    threads: int | None = None,
    pool: str | None = None,
    gpu_index: int | None = None,
    loglevel: str | None = None,
    json_logs: bool = False,
) -> int:
    """Run a worker until it stops; returns its exit status (non-zero on a fatal error).

    A setting that is wrong, or a chain member that cannot be configured (a ``tei`` member
    with no URL), raises ConfigError naming the variable before anything starts; a member
    that cannot load (a model that is not there) is the chain's to retry.
    """
    # Model loading draws tqdm bars on stderr, which Celery would log as a warning per line.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    loaded = read_settings()
    settings = loaded.settings
    loglevel = (loglevel or settings.worker.log_level).upper()
    configure_logging(level=loglevel, json=json_logs)
    check_member_configs(settings, loaded.names)
    check_remote_control(settings)
    quota = cpu_quota()
    if device == "gpu":
        target = f"cuda:{gpu_index}" if gpu_index is not None else "cuda"
        settings = override(settings, device=target)
        queues = [settings.queues.gpu_queue, settings.queues.any_queue]
        pool_name, concurrency = "threads", threads or 8
        settings = override(settings, coalesce=True if settings.engine.coalesce is None else settings.engine.coalesce)
    elif pool == "threads":
        # One process, all cores to torch, windows of concurrent tasks coalesced: the
        # GPU worker's code path on the CPU (tests run it this way).
        torch_threads = settings.worker.torch_threads or quota
        coalesce = True if settings.engine.coalesce is None else settings.engine.coalesce
        settings = override(settings, device="cpu", torch_threads=torch_threads, coalesce=coalesce)
        queues = [settings.queues.cpu_queue, settings.queues.any_queue]
        pool_name, concurrency = "threads", threads or 4
    else:
        count = processes or settings.worker.worker_processes or 1
        torch_threads = settings.worker.torch_threads or max(1, quota // count)
        settings = override(
            settings, device="cpu", torch_threads=torch_threads, coalesce=bool(settings.engine.coalesce)
        )
        queues = [settings.queues.cpu_queue, settings.queues.any_queue]
        # prefork even for one process: a child killed mid-window (OOM, segfault) is
        # noticed by the parent, which requeues the message.
        pool_name, concurrency = "prefork", count
    # An unreadable calibration file stops the worker here, naming its variable, not in each process.
    Calibrations.from_settings(settings)
    problem = device_problem(settings)
    if problem:
        log.error("worker_cannot_serve_device", device=device, problem=problem)
        return 1
    from worker.metrics import start_monitoring

    try:
        monitoring = start_monitoring(
            settings,
            device=settings.worker.device,
            pool=pool_name,
            processes=concurrency if pool_name == "prefork" else 1,
        )
    except OSError as exc:  # the port is taken, the directory cannot be written
        log.error("metrics_cannot_start", port=settings.metrics.port, error=f"{type(exc).__name__}: {exc}")
        return 1
    if monitoring.server is not None:
        log.info("metrics_listening", host=settings.metrics.host, port=monitoring.server.port)
    gate = scoring_gate(settings, pool_name)
    problem = scoring_problem(settings, pool_name, monitoring.recorder)
    if problem:
        log.error("worker_cannot_score", problem=problem)
        return 1
    from kernel.celery_config import delivery_summary

    log.info("broker_configured", **delivery_summary(settings))
    if settings.store.broker_kind == "amqp":
        from worker.amqp_check import prepare_amqp_broker

        problem = prepare_amqp_broker(settings)
        if problem:
            log.error("broker_cannot_serve", broker="amqp", problem=problem)
            return 1
        from kernel.amqp_broker import consumed_queues

        queues = consumed_queues(queues)
    app = create_app(settings, monitoring=monitoring, gate=gate)
    # Task events (Flower) need the worker's event heartbeats too, or Flower shows it offline.
    heartbeat = [] if settings.worker.task_events else ["--without-heartbeat"]
    return run_celery(
        app,
        [
            "worker",
            f"--pool={pool_name}",
            f"--concurrency={concurrency}",
            f"--queues={','.join(queues)}",
            f"--hostname=rerankq-{device}-{os.getpid()}@{socket.gethostname()}",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
            *heartbeat,
        ],
    )


def scoring_gate(settings: Settings, pool_name: str) -> ChildGate | None:
    """A prefork worker's gate: its pool processes load the chain and say whether it scores, and
    the consumer starts once one does (``worker.child_gate``); none where passthrough is meant."""
    from worker import readiness

    if pool_name != "prefork" or readiness.passthrough_on_purpose(settings):
        return None
    return ChildGate()


def scoring_problem(settings: Settings, pool_name: str, recorder: Recorder) -> str | None:
    """Why this worker must not take windows (no chain member that scores starts), or None.

    Before the consumer starts, so a worker that cannot score takes nothing from the queue.
    A threads pool loads its chain here, in the process that serves it; a prefork worker's
    pool processes answer through its gate instead (``scoring_gate``), so no model loads in
    the parent that forks them.
    """
    from worker import readiness

    if readiness.passthrough_on_purpose(settings) or pool_name == "prefork":
        return None
    from worker.runtime import get_runtime

    runtime = get_runtime(settings, recorder)
    return None if runtime.scoring_started() else readiness.explain(runtime.start_causes())


def run_celery(app: Celery, argv: list[str]) -> int:
    """Run a celery command for ``app`` and return its exit status.

    ``app.worker_main`` and ``app.start`` both drop the status (click hands it back as a return
    value they ignore), so a worker that died of an unrecoverable error would exit 0 and a
    restart-on-failure policy would leave it down.
    """
    from celery.bin.celery import celery as celery_command

    celery_command.params[0].default = app
    try:
        code = celery_command.main(args=argv, standalone_mode=False)
    finally:
        celery_command.params[0].default = None
    return code if isinstance(code, int) else 0


def device_problem(settings: Settings) -> str | None:
    """Why this worker cannot serve the device it was started for, or None.

    A GPU worker whose in-process model would have no CUDA device would report ready and
    serve every window by its fallback: refuse to start instead, so the operator notices.
    """
    if not settings.worker.device.startswith("cuda"):
        return None
    local = [
        i
        for i, m in enumerate(settings.chain.effective_members())
        if m.provider in ("local", "embedding") and not m.device
    ]
    if not local:
        return None  # only remote members (or members pinned to a device of their own)
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'rerankq[worker]')"
    if not torch.cuda.is_available():
        return (
            f"--device gpu asks for {settings.worker.device}, but torch {torch.__version__} sees no CUDA device "
            f"(chain members {local} run the model in process); start a --device cpu worker instead"
        )
    return None
