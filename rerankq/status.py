"""``rerankq status STREAM``: every window of a stream as a table."""

from __future__ import annotations

import click

from rerankq.common import client, console, json_option, print_json, to_builtins


@click.command(
    epilog="""\b
Examples:
  rerankq status k_nightly-0042
  rerankq status s_0123456789abcdef0123456789abcdef --json | jq '.windows[] | select(.state != "committed")'
"""
)
@click.argument("stream")
@json_option()
def status(stream: str, as_json: bool) -> int:
    """Where every window of STREAM stands: state, attempts, who served it, the failovers on
    the way, its decision counts, and the reason of a failed window."""
    with client() as rerank:
        found = rerank.status(stream)
        waiting = any(w.state == "admitted" for w in found.windows)
        warning = rerank.unserved_warning(found.device) if waiting and found.device else None
    if as_json:
        print_json({**to_builtins(found), "warning": warning})
    else:
        from rerankq.render import stage_line, status_table

        console().print(status_table(found))
        for stage in found.stages:
            click.echo(stage_line(stage))
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)
    return 0
