"""``python -m worker`` (and the ``rerankq-worker`` script): ``rerankq worker`` without the rest of the script."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from kernel.command_line import Host, run_command
    from kernel.explain import explain
    from worker.command import worker
    from worker.logs import stdlib_host_logging

    return run_command(
        worker, argv, prog_name="rerankq worker", host=Host(logging=stdlib_host_logging), explain=explain
    )


if __name__ == "__main__":
    raise SystemExit(main())
