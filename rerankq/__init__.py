"""The ``rerankq`` command line: one script, one small module per command.

Commands are click commands registered by name in ``COMMANDS`` and imported only when
run, so ``rerankq submit/status/pull/inspect/serve/exporter`` start without torch (a
pipeline-only install has none) and only ``worker``, ``demo`` and ``eval`` load the scoring
side. ``serve`` and ``exporter`` live in ``producer`` (they are producers, like any
pipeline); ``python -m producer.gateway`` and ``python -m producer.exporter`` run the same
commands. How their records render is this script's choice, passed to them in
``kernel.command_line.Host``.

Exit status: 0 success, 1 failure (a job or a window failed, Redis unreachable, bad input),
2 usage error, 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys

import click

from kernel.command_line import Host, run_command
from worker.logs import stdlib_host_logging

#: name -> "module:attribute". Adding a command is one line here.
COMMANDS: dict[str, str] = {
    "worker": "worker.command:worker",
    "demo": "rerankq.demo_command:demo",
    "submit": "rerankq.submit.command:submit",
    "status": "rerankq.status:status",
    "cancel": "rerankq.cancel_command:cancel",
    "pull": "rerankq.pull:pull",
    "inspect": "rerankq.inspect:inspect",
    "config": "rerankq.config_command:config",
    "serve": "producer.gateway.main:serve",
    "exporter": "producer.exporter.main:exporter",
    "eval": "evaluation.command:evaluate_command",
    "calibrate": "rerankq.calibrate_command:calibrate",
}

EPILOG = """\b
Examples:
  rerankq submit run.jsonl --out reranked.jsonl          # batch rerank a file of jobs
  rerankq worker --device cpu --processes 2              # serve the CPU queue
  rerankq inspect                                        # queues, workers, breakers, counters
  rerankq config --changed                               # the settings this host runs with, and from where
  rerankq serve --keys-file keys.json                    # the Cohere/TEI-compatible HTTP gateway
  rerankq exporter                                       # queue backlog metrics for Prometheus
  rerankq eval --plots out/                              # nDCG, P@k, R@k of each chain member (shipped collection)
  rerankq COMMAND --help                                 # each command's options and examples
Settings come from RERANKQ_* variables and RERANKQ_CONFIG_FILE (docs/configuration.md).
Shell completion (bash): eval "$(_RERANKQ_COMPLETE=bash_source rerankq)"
"""


def _load(name: str) -> click.Command:
    module_name, _, attribute = COMMANDS[name].partition(":")
    target = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(target, click.Command):
        raise TypeError(f"{COMMANDS[name]} is not a click command")
    return target


class Commands(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return _load(cmd_name) if cmd_name in COMMANDS else None


@click.group(cls=Commands, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rerankq", prog_name="rerankq", message="%(prog)s %(version)s")
def cli() -> None:
    """rerankq: batch reranking, workers, and an operator's view of the queue."""


_invoked: list[str] = []


def invoked_args() -> list[str]:
    """The arguments this run was given, for a command that prints how to run it again."""
    return list(_invoked)


def main(argv: list[str] | None = None, prog_name: str = "rerankq") -> int:
    """Run a command and return its exit status (the console script exits with it)."""
    _invoked[:] = sys.argv[1:] if argv is None else argv
    from kernel.explain import explain

    return run_command(cli, argv, prog_name=prog_name, host=Host(logging=stdlib_host_logging), explain=explain)


if __name__ == "__main__":
    sys.exit(main())
