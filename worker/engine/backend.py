"""Inference backends: what runs the forward pass of a batch the engine has built.

The engine tokenises, orders pairs by length and cuts batches by padded tokens for every
backend; a backend only turns one batch of padded tensors into logits. ``torch`` runs the
transformers model itself; ``onnx`` and ``openvino`` (``worker/engine/runtimes.py``) run an
export of it, made once beside the model (``worker/engine/export.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

#: The package each exported backend needs, and the extra that installs it.
_PACKAGES = {"onnx": ("onnxruntime", "onnx"), "openvino": ("openvino", "openvino")}


class BackendUnavailable(Exception):
    """The backend cannot run here: its package is missing, or it does not serve this device."""


class BackendRefused(Exception):
    """The backend ran, but does not keep the ranking torch fp32 gives (the parity probe)."""


@dataclass(frozen=True)
class BackendChoice:
    """What a member asks of the engine's forward pass (``RERANKQ_RERANKER_BACKEND`` and friends)."""

    name: str = "torch"
    onnx_optimization: str = "O2"
    quantization: str = "none"
    calibration: str | None = None

    @classmethod
    def from_member(cls, member: Any) -> BackendChoice:
        return cls(
            name=member.backend,
            onnx_optimization=member.onnx_optimization,
            quantization=member.quantization,
            calibration=member.calibration,
        )


class Backend(Protocol):
    """What runs a batch's forward pass. An exported backend also has the ``precision`` it was
    adopted at (fp32, bf16, or for an int8 export int8 or int8+bf16); torch runs at the
    engine's (``ForwardEngine``'s policy)."""

    # Read-only: each backend class fixes them (torch's artifact is always None).
    @property
    def name(self) -> str:
        """torch, onnx or openvino."""
        ...

    @property
    def artifact(self) -> str | None:
        """A digest of the exported model this backend runs (None for torch): its scores' identity."""
        ...

    def forward(self, tensors: Mapping[str, Any]) -> Any:
        """One batch of padded CPU tensors (input_ids, attention_mask, token_type_ids) to
        float32 logits, a CPU or device torch tensor of shape (batch, labels)."""
        ...


def auto_backend(device_type: str) -> str:
    """What ``auto`` runs: OpenVINO on a CPU where it is installed (the fastest backend at
    parity in ops/bench/scoring.py on the development VM), torch otherwise."""
    if device_type == "cpu" and importlib.util.find_spec("openvino") is not None:
        return "openvino"
    return "torch"


def require_package(backend: str) -> None:
    """Raise BackendUnavailable naming the extra to install, before any work is done."""
    module, extra = _PACKAGES[backend]
    if importlib.util.find_spec(module) is None:
        raise BackendUnavailable(f"the {backend} backend needs {module}: pip install 'rerankq[{extra}]'")


class TorchBackend:
    """The sentence-transformers model in process: its whole module chain (the transformer, then
    ``LogitScore`` or whatever the model declares), so a batch's scores are the ones predict
    computes. The engine opens its precision's autocast around the call
    (``ForwardEngine._autocast``): the precision is the engine's, not this object's."""

    name = "torch"
    artifact = None

    def __init__(self, model: Any, device: Any, *, features: Mapping[str, Any]) -> None:
        self.model = model
        self.device = device
        #: What preprocess adds beside the tensors (modality, logits_to_keep for a causal LM).
        self.features = dict(features)

    def forward(self, tensors: Mapping[str, Any]) -> Any:
        moved = {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}
        return self.model({**moved, **self.features})["scores"].float()
