"""The shipped evaluation collection (``worker/collection``) for in-process reranking.

Documents are read as the worker reads them: ``heading\\n\\ntext``, the title as the one
heading (``worker.scoring.documents.header``), so a model sees here what it sees through the
queue. Reranking scores each query's first-stage run (the BM25 top ``depth``) as one window
and keeps the rest of the run in its order, as ``python -m evaluation`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

Pairs = list[tuple[str, str]]


@dataclass(frozen=True)
class ShippedCollection:
    queries: dict[str, str]
    #: document id -> the text a reranker reads (title as heading, then the text)
    documents: dict[str, str]
    #: document id -> (title, text) as the collection has them
    parts: dict[str, tuple[str | None, str]]
    qrels: dict[str, dict[str, int]]
    #: query id -> document ids in the first stage's order
    run: dict[str, list[str]]

    @property
    def evaluated(self) -> list[str]:
        return [qid for qid in self.run if qid in self.qrels]


def reader_text(title: str | None, text: str) -> str:
    """A document as the worker assembles it for the model (``header`` then text)."""
    return f"{title}\n\n{text}" if title else text


@lru_cache(maxsize=1)
def shipped_collection() -> ShippedCollection:
    from evaluation.command import collection_files
    from evaluation.trec import load_collection

    qrels, run, queries, documents = collection_files(None, None, None, None, long_documents=None)
    loaded = load_collection(qrels=qrels, run=run, queries=queries, documents=documents)
    return ShippedCollection(
        queries=dict(loaded.queries),
        documents={d.id: reader_text(d.title, d.text) for d in loaded.documents.values()},
        parts={d.id: (d.title, d.text) for d in loaded.documents.values()},
        qrels=loaded.qrels,
        run={qid: [r.docid for r in ranked] for qid, ranked in loaded.run.items()},
    )


def rerank(
    collection: ShippedCollection, score_window: Callable[[Pairs], Sequence[float]], *, depth: int = 100
) -> tuple[dict[str, list[str]], dict[str, list[float]]]:
    """Each evaluated query's run reranked by ``score_window`` over its top ``depth``: the
    rankings (best first) and the scores of the window in run order."""
    rankings: dict[str, list[str]] = {}
    scores: dict[str, list[float]] = {}
    for qid in collection.evaluated:
        head, tail = collection.run[qid][:depth], collection.run[qid][depth:]
        window = [(collection.queries[qid], collection.documents[d]) for d in head]
        scored = [float(s) for s in score_window(window)]
        scores[qid] = scored
        # Ties keep run order: sorted is stable.
        order = sorted(range(len(head)), key=lambda i: -scored[i])
        rankings[qid] = [head[i] for i in order] + tail
    return rankings, scores


def ndcg_at_10(collection: ShippedCollection, rankings: dict[str, list[str]]) -> float:
    from evaluation.measures import evaluate

    return evaluate(collection.qrels, rankings).mean["nDCG@10"]
