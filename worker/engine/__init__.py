"""The in-process scoring engine: model loading, precision, token-budget batching, coalescing.

torch is imported inside functions only, so importing this package stays light.
"""

from worker.engine.batching import plan_batches
from worker.engine.loading import load_cross_encoder
from worker.engine.model import ScoringEngine, configure_threads, shared_engine

__all__ = ["ScoringEngine", "configure_threads", "load_cross_encoder", "plan_batches", "shared_engine"]
