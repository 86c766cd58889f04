"""``rerankq cancel STREAM``: commit every window not yet committed as cancelled."""

from __future__ import annotations

import click

from rerankq.common import client, json_option, print_json


@click.command(
    epilog="""\b
Examples:
  rerankq cancel k_nightly-0042
  rerankq cancel s_0123456789abcdef0123456789abcdef --json
"""
)
@click.argument("stream")
@json_option()
def cancel(stream: str, as_json: bool) -> int:
    """Cancel STREAM: every window not yet committed is committed as cancelled at once (its
    rows read kind "cancelled"), no worker scores it after, and the stream reads complete.
    Safe to repeat: cancelling a cancelled or complete stream changes nothing."""
    with client() as rerank:
        outcome = rerank.cancel(stream)
    if as_json:
        print_json(outcome)
        return 0
    done = len(outcome.cancelled_windows)
    if done:
        click.echo(f"cancelled {done} of {outcome.n_windows} windows of {stream}; it now reads complete")
    else:
        click.echo(f"{stream}: nothing to cancel (every window was already committed)")
    return 0
