"""``rerankq submit``: batch reranking of a file of jobs, resumable, bounded, with progress.

``command`` parses the options; ``jobs`` reads JSONL jobs, ``trec`` the TREC trio (run,
queries, documents, looked up through ``lookup``); ``ledger`` remembers which job ids were
read and which the output already holds; ``runner`` opens streams with at most
``--max-in-flight`` in flight and writes each job as it completes through ``output``;
``progress`` shows how far it is.
"""
