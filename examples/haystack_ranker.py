"""Rerank Haystack documents on the queue with RerankqRanker in a Pipeline. Needs a worker on
the same Redis (RERANKQ_REDIS_URL, RERANKQ_NAMESPACE); ``pip install 'rerankq[haystack]'``;
run ``python examples/haystack_ranker.py``."""

from __future__ import annotations

from haystack import Document, Pipeline

from producer import RerankClient
from producer.integrations.haystack import RerankqRanker

RETRIEVED = [
    Document(content="the cat sat on the mat", meta={"source": "kb/pets"}),
    Document(content="how to recover checkout after 502s", meta={"source": "kb/runbook-7"}),
    Document(content="checkout returned 502 after the certificate expired", meta={"source": "kb/incident-41"}),
]


def main() -> None:
    client = RerankClient.from_env()
    try:
        pipeline = Pipeline()
        pipeline.add_component("ranker", RerankqRanker(client, top_k=2, instruction="find the runbook"))
        answer = pipeline.run({"ranker": {"query": "checkout is failing with 502", "documents": RETRIEVED}})
        for doc in answer["ranker"]["documents"]:
            print(f"{doc.score:.3f}  {doc.meta['source']}  {doc.content}")
    finally:
        client.close()


if __name__ == "__main__":
    main()
