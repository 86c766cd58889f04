"""Compare a first stage with the queue's reranking of it in pt.Experiment; the rerank runs in
the batch lane. Needs a worker on the same Redis (RERANKQ_REDIS_URL, RERANKQ_NAMESPACE);
``pip install 'rerankq[pyterrier]' ir-measures``; run ``python examples/pyterrier_experiment.py``."""

from __future__ import annotations

import pandas as pd
import pyterrier as pt

from producer import RerankClient
from producer.integrations.pyterrier import RerankqReranker

TOPICS = pd.DataFrame([{"qid": "q1", "query": "checkout is failing with 502"}])
DOCS = ["the cat sat on the mat", "how to recover checkout after 502s", "checkout returned 502 after the cert expired"]
QRELS = pd.DataFrame([{"qid": "q1", "docno": "d1", "label": 1}])


def main() -> None:
    # A stand-in first stage (BM25 over an index would be pt.terrier.Retriever): its run as it is.
    run = pd.DataFrame(
        [
            {"qid": "q1", "query": TOPICS["query"][0], "docno": f"d{i}", "text": t, "score": -i, "rank": i}
            for i, t in enumerate(DOCS)
        ]
    )
    first_stage = pt.Transformer.from_df(run)
    client = RerankClient.from_env()
    try:
        table = pt.Experiment(
            [first_stage, first_stage >> RerankqReranker(client)],
            TOPICS,
            QRELS,
            eval_metrics=["map", "recip_rank"],
            names=["first stage", "rerankq"],
        )
        print(table.to_string(index=False))
    finally:
        client.close()


if __name__ == "__main__":
    main()
