"""Rerankers for the pipeline frameworks, over ``RerankClient``: the queue without the gateway.

Each module is an optional extra (``rerankq[langchain]``, ...) and imports its framework at
import time, so ``import producer.integrations`` alone imports none of them. They are pipeline
side: producer and kernel only, never a worker module (the layers contract in pyproject.toml).
"""
