"""The ``rerankq`` command line: one script, one small module per command.

Commands are registered by name in ``COMMANDS`` and imported only when run, so
``rerankq submit/status/pull/inspect`` start without torch (a pipeline-only install has
none) and only ``worker`` and ``demo`` load the scoring side. A command is either a click
command (``"module:attribute"``) or, for a module that parses its own arguments, its
``main(argv) -> int`` (``"module:main"`` under ``PASSTHROUGH``), which gets every argument
after the command name as it is.

Exit status: 0 success, 1 failure (a job or a window failed, Redis unreachable, bad input),
2 usage error, 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from worker.logs import stdlib_host_logging

#: name -> "module:attribute". Adding a command is one line here.
COMMANDS: dict[str, str] = {
    "worker": "worker.cli.worker_command:worker",
    "demo": "worker.cli.demo_command:demo",
    "submit": "worker.cli.submit.command:submit",
    "status": "worker.cli.status:status",
    "pull": "worker.cli.pull:pull",
    "inspect": "worker.cli.inspect:inspect",
    "serve": "producer.gateway.main:main",
    "exporter": "producer.exporter.main:main",
    "eval": "worker.evaluation.command:main",
    "calibrate": "worker.cli.calibrate_command:calibrate",
}
#: Commands whose target is a ``main(argv) -> int`` that parses its own arguments.
PASSTHROUGH: set[str] = {"serve", "exporter", "eval"}
#: Passthrough commands whose ``main`` takes the host's logging setup (producer modules never configure it).
HOST_LOGGING: set[str] = {"serve", "exporter"}

EPILOG = """\b
Examples:
  rerankq submit run.jsonl --out reranked.jsonl          # batch rerank a file of jobs
  rerankq worker --device cpu --processes 2              # serve the CPU queue
  rerankq inspect                                        # queues, workers, breakers, counters
  rerankq serve --keys-file keys.json                    # the Cohere/TEI-compatible HTTP gateway
  rerankq exporter                                       # queue backlog metrics for Prometheus
  rerankq eval --plots out/                              # nDCG, P@k, R@k of each chain member (shipped collection)
Settings come from RERANKQ_* variables and RERANKQ_CONFIG_FILE (see README).
"""


def _load(name: str) -> click.Command:
    module_name, _, attribute = COMMANDS[name].partition(":")
    target = getattr(importlib.import_module(module_name), attribute)
    if isinstance(target, click.Command):
        return target
    if name not in PASSTHROUGH:
        raise TypeError(f"{COMMANDS[name]} is not a click command; list {name!r} in PASSTHROUGH")
    return _passthrough(name, target)


def _passthrough(name: str, main: Any) -> click.Command:
    @click.command(name=name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                                "help_option_names": []}, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> int:
        if name in HOST_LOGGING:
            return int(main(list(args), host_logging=stdlib_host_logging) or 0)
        return int(main(list(args)) or 0)

    command.help = (getattr(main, "__doc__", None) or f"Run {COMMANDS[name]}.").strip().splitlines()[0]
    return command


class Commands(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return _load(cmd_name) if cmd_name in COMMANDS else None


@click.group(cls=Commands, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """rerankq: batch reranking, workers, and an operator's view of the queue."""


_invoked: list[str] = []


def invoked_args() -> list[str]:
    """The arguments this run was given, for a command that prints how to run it again."""
    return list(_invoked)


def main(argv: list[str] | None = None, prog_name: str = "rerankq") -> int:
    """Run a command and return its exit status (the console script exits with it)."""
    _invoked[:] = sys.argv[1:] if argv is None else argv
    try:
        result = cli.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:  # usage errors are 2, others 1
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except Exception as exc:  # the project's, Redis's and the broker's errors as one line; a bug keeps its traceback
        from worker.cli.errors import explain

        said = explain(exc)
        if said is None:
            raise
        click.echo(f"{prog_name}: {said}", err=True)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
