"""``rerankq demo``: a private Redis, a CPU worker, a sample job, readable results (``make demo``)."""

from __future__ import annotations

import click

from rerankq.common import json_option


@click.command(
    epilog="""\b
Examples:
  rerankq demo
  RERANKQ_RERANKER_MODEL=/models/ms-marco-MiniLM-L-6-v2 rerankq demo
"""
)
@json_option("print the pages and windows as one JSON document")
def demo(as_json: bool) -> int:
    """Start a private redis-server (unless RERANKQ_REDIS_URL is set) and a CPU worker, rerank a
    bundled sample, and print a first page, a deeper page, and every window."""
    from rerankq.demo import main  # starts a worker: the scoring side

    return main(as_json=as_json)
