"""``rerankq pull STREAM``: one page of a stream, as the demo prints it."""

from __future__ import annotations

import click

from rerankq.common import client, json_option, print_json


@click.command(
    epilog="""\b
Examples:
  rerankq pull k_nightly-0042                        # the first 10 rows
  rerankq pull k_nightly-0042 --offset 10 --limit 10 # deeper: admits and scores the next window only
"""
)
@click.argument("stream")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="seconds to wait for windows the page needs",
)
@json_option()
def pull(stream: str, offset: int, limit: int, timeout: float, as_json: bool) -> int:
    """A page of STREAM's ranked rows. Like RerankClient.pull: a page deeper than the committed
    windows admits the next windows and waits for them (up to --timeout); what is committed is
    read, never scored again."""
    from rerankq.render import page_json, page_lines

    with client() as rerank:
        page = rerank.pull(stream, offset, limit, timeout=timeout)
    if as_json:
        print_json(page_json(page))
    else:
        click.echo("\n".join(page_lines(f"stream {stream}", page)).lstrip("\n"))
    return 0
