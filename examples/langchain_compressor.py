"""Rerank a LangChain retriever's documents on the queue: ContextualCompressionRetriever over
RerankqCompressor. Needs a worker on the same Redis (RERANKQ_REDIS_URL, RERANKQ_NAMESPACE);
``pip install 'rerankq[langchain]' langchain-classic``; run ``python examples/langchain_compressor.py``."""

from __future__ import annotations

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from producer import RerankClient
from producer.integrations.langchain import RerankqCompressor

KNOWLEDGE_BASE = [
    Document(page_content="the cat sat on the mat", metadata={"source": "kb/pets"}),
    Document(page_content="checkout returned 502 after the certificate expired", metadata={"source": "kb/incident-41"}),
    Document(page_content="how to recover checkout after 502s", metadata={"source": "kb/runbook-7"}),
    Document(page_content="office facilities: the printer on floor 3", metadata={"source": "kb/office"}),
]


class KnowledgeBase(BaseRetriever):
    """A stand-in first stage: every document, as a vector store or BM25 would return its top k."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return KNOWLEDGE_BASE


def main() -> None:
    client = RerankClient.from_env()
    try:
        compressor = RerankqCompressor(client=client, top_n=2, instruction="find the runbook")
        retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=KnowledgeBase())
        for doc in retriever.invoke("checkout is failing with 502"):
            print(f"{doc.metadata['relevance_score']:.3f}  {doc.metadata['source']}  {doc.page_content}")
        # The same job, deeper: the stream's committed window is read, not scored again.
        stream_id = doc.metadata["rerankq_stream_id"]
        print(f"{client.pull(stream_id, 0, 4).total} rows in {stream_id}")
    finally:
        client.close()


if __name__ == "__main__":
    main()
