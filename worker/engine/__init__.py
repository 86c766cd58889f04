"""The in-process scoring engine: model loading, precision, backends, token-budget batching, coalescing.

torch, ONNX Runtime and OpenVINO are imported inside functions only, so importing this
package stays light.
"""

from worker.engine.backend import BackendChoice, BackendRefused, BackendUnavailable
from worker.engine.batching import plan_batches
from worker.engine.calibration import CalibrationError
from worker.engine.loading import load_cross_encoder
from worker.engine.model import ScoringEngine, configure_threads, shared_engine

__all__ = [
    "BackendChoice",
    "BackendRefused",
    "BackendUnavailable",
    "CalibrationError",
    "ScoringEngine",
    "configure_threads",
    "load_cross_encoder",
    "plan_batches",
    "shared_engine",
]
