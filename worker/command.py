"""``rerankq worker``: serve one device's queues (what ``python -m worker`` runs)."""

from __future__ import annotations

import click


@click.command(
    epilog="""\b
Examples:
  rerankq worker --device cpu --processes 2              # prefork, torch threads = cores / processes
  rerankq worker --device cpu --pool threads --threads 4 # one process, concurrent windows coalesced
  rerankq worker --device gpu --gpu-index 0              # one process per GPU
"""
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "gpu"]),
    default="cpu",
    show_default=True,
    help="the device kind: its queue, and the any queue",
)
@click.option("--processes", type=click.IntRange(min=1), default=None, help="worker processes (cpu)")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="concurrent windows per process (gpu, or cpu with --pool threads)",
)
@click.option(
    "--pool",
    type=click.Choice(["prefork", "threads"]),
    default=None,
    help="cpu only: prefork (default) or threads, one process whose windows coalesce",
)
@click.option("--gpu-index", type=click.IntRange(min=0), default=None, help="pin to cuda:N")
@click.option("--loglevel", default=None, help="log level  [default: RERANKQ_LOG_LEVEL, else INFO]")
@click.option("--json-logs", "--json", "json_logs", is_flag=True, help="log JSON lines")
def worker(
    device: str,
    processes: int | None,
    threads: int | None,
    pool: str | None,
    gpu_index: int | None,
    loglevel: str | None,
    json_logs: bool,
) -> int:
    """Start a worker pinned to one device kind; it runs until stopped.

    It exits non-zero on a fatal error (a GPU worker on a host without CUDA, a lost
    broker it cannot get back), so a restart-on-failure policy restarts it.
    """
    from worker.launch import start_worker  # the scoring side: torch loads in the worker's processes

    return start_worker(
        device=device,
        processes=processes,
        threads=threads,
        pool=pool,
        gpu_index=gpu_index,
        loglevel=loglevel,
        json_logs=json_logs,
    )
