"""Running a click command as a program: the producer side's own programs (``python -m
producer.gateway``, ``python -m producer.exporter``), ``python -m worker`` and the ``rerankq`` script.

A command returns its exit status; ``run_command`` maps click's outcomes onto the same
statuses everywhere: 2 for a usage error, 130 when interrupted. What the host of a command
decides, how log records render, travels in ``Host`` on the click context, so a command's
module never configures logging itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Host:
    """What the program running a command decides for it."""

    #: Configures how records render, given the level the command settled on; None leaves logging alone.
    logging: Callable[[str], None] | None = None


def apply_host_logging(level: str) -> None:
    """Apply the running program's logging setup at ``level``, if it gave one."""
    host = click.get_current_context().find_object(Host)
    if host is not None and host.logging is not None:
        host.logging(level)


def run_command(
    command: click.Command,
    argv: Sequence[str] | None,
    *,
    prog_name: str,
    host: Host,
    explain: Callable[[Exception], str | None] | None = None,
) -> int:
    """Run ``command`` on ``argv`` (``sys.argv[1:]`` when None) and return its exit status.

    With ``explain``, an error it can say in one line (``kernel.explain.explain``) is printed as
    that line with status 1; any other keeps its traceback, since it is a bug.
    """
    try:
        result = command.main(
            args=None if argv is None else list(argv), prog_name=prog_name, standalone_mode=False, obj=host
        )
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:  # usage errors are 2, others 1
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except Exception as exc:
        said = explain(exc) if explain is not None else None
        if said is None:
            raise
        click.echo(f"{prog_name}: {said}", err=True)
        return 1
    return result if isinstance(result, int) else 0
