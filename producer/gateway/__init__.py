"""The HTTP gateway: Cohere (v1, v2) and TEI rerank APIs and a stream API, served from the queue.

``python -m producer.gateway`` runs it (``main``); ``create_app`` builds the ASGI app. It
imports no torch and nothing from ``worker``: it is a producer like any pipeline.
"""

from producer.gateway.app import create_app
from producer.gateway.main import main

__all__ = ["create_app", "main"]
