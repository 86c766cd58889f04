"""A PyTerrier transformer that reranks whole runs through the queue's batch lane
(``pip install 'rerankq[pyterrier]'``).

``RerankqReranker`` is a ``pt.Transformer``: a results frame in (``qid``, ``query``,
``docno`` and the document text, by default ``text``), the same rows out with the queue's
``score`` and a new ``rank`` per query, best first, so ``pt.Experiment`` compares it with any
other reranker. Every query is opened as its own stream in the batch lane first (the windows of
a run wait behind interactive traffic), then each is read whole. Streams are idempotent
(``producer.integrations.jobs``): running the same run again reads the committed windows and
makes no provider call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import pyterrier as pt

from producer.client import RerankClient
from producer.integrations.jobs import QueueRerank


class RerankqReranker(pt.Transformer):
    """Rerank a PyTerrier results frame on the queue, each query a stream in the batch lane.

    ``options`` are ``RerankClient.open`` keywords (``instruction``, ``long_documents``,
    ``min_score``, ``chain``, ``device``, ...); ``lane`` defaults to ``"batch"``. A row the
    queue filtered (under ``min_score``) is left out of the answer."""

    def __init__(
        self,
        client: RerankClient,
        *,
        text_field: str = "text",
        options: Mapping[str, Any] | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.text_field = text_field
        self.queue = QueueRerank(client, 1, {"lane": "batch", **(options or {})}, timeout_s)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.result_frame(inp, extra_columns=["query", self.text_field])
        groups = [(qid, group.reset_index(drop=True)) for qid, group in inp.groupby("qid", sort=False)]
        # Every stream opened before any is read: the whole run's windows queue at once.
        streams = [
            self.queue.stream(str(group["query"].iloc[0]), [str(t) for t in group[self.text_field].fillna("")])
            for _, group in groups
        ]
        answers = []
        for stream_id, (_, group) in zip(streams, groups, strict=True):
            ranked = self.queue.ranked(stream_id, len(group))
            rows = group.iloc[[r.index for r in ranked]].copy()
            rows["score"] = [r.score for r in ranked]
            rows["rank"] = range(len(ranked))
            answers.append(rows)
        if not answers:
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        return pd.concat(answers, ignore_index=True)
