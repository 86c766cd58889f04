"""Rerank LlamaIndex nodes on the queue with RerankqRerank. Needs a worker on the same Redis
(RERANKQ_REDIS_URL, RERANKQ_NAMESPACE); ``pip install 'rerankq[llamaindex]'``; run
``python examples/llamaindex_postprocessor.py``. In a query engine:
``index.as_query_engine(node_postprocessors=[RerankqRerank(client=client, top_n=5)])``."""

from __future__ import annotations

from llama_index.core.schema import NodeWithScore, TextNode

from producer import RerankClient
from producer.integrations.llamaindex import RerankqRerank

RETRIEVED = [
    NodeWithScore(node=TextNode(text="the cat sat on the mat", metadata={"source": "kb/pets"}), score=0.8),
    NodeWithScore(
        node=TextNode(text="how to recover checkout after 502s", metadata={"source": "kb/runbook-7"}), score=0.7
    ),
    NodeWithScore(
        node=TextNode(
            text="checkout returned 502 after the certificate expired", metadata={"source": "kb/incident-41"}
        ),
        score=0.6,
    ),
]


def main() -> None:
    client = RerankClient.from_env()
    try:
        rerank = RerankqRerank(client=client, top_n=2, instruction="find the runbook")
        for node in rerank.postprocess_nodes(RETRIEVED, query_str="checkout is failing with 502"):
            print(f"{node.score:.3f}  {node.node.metadata['source']}  {node.node.get_content()}")
    finally:
        client.close()


if __name__ == "__main__":
    main()
