"""The evaluation harness: TREC qrels and a first-stage run in; nDCG, P@k, R@k and MRR for
the run and for each chain member reranking it through the real queue, latency per query,
a rerank-depth sweep, a cascade of members stage by stage (``--stages``), tables, JSON and PNG
plots out. ``python -m evaluation``.

``main(argv) -> int`` is the entry point; its modules import nothing heavy until it runs.
"""

from evaluation.command import main

__all__ = ["main"]
