"""rerankq's backlog exporter: queue depth, unacked messages, the oldest wait and the
uncommitted windows per device, for Prometheus and autoscalers, with no worker running.

Light like the rest of ``producer``: no torch, no ``worker`` import. Run it as
``python -m producer.exporter``; ``main(argv)`` is the entry point.
"""

from producer.exporter.main import main

__all__ = ["main"]
