"""The exported backends: ONNX Runtime and OpenVINO running an export of the model.

Each takes the engine's padded batches as they are (CPU int64 tensors, handed over as
numpy views without a copy) and returns the logits as a torch tensor, so the engine's
activation and ordering code is the same for every backend.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from worker.engine.backend import BackendUnavailable
from worker.engine.export import Artifact
from worker.engine.int8_recipes import NONE, served_precision

#: ONNX Runtime session optimisation per level: O1 basic; O2 and O3 run a fused graph,
#: which the session still gives its extended and layout passes.
_SESSION_LEVEL = {"O1": "ORT_ENABLE_BASIC", "O2": "ORT_ENABLE_ALL", "O3": "ORT_ENABLE_ALL"}


class OnnxBackend:
    name = "onnx"

    def __init__(self, artifact: Artifact, *, precision: str, level: str, device: str, threads: int) -> None:
        import onnxruntime as ort

        if device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable("onnx on CUDA needs onnxruntime-gpu (its CUDAExecutionProvider)")
            index = device.split(":")[1] if ":" in device else "0"
            providers: list[Any] = [("CUDAExecutionProvider", {"device_id": int(index)})]
        elif device == "cpu":
            providers = ["CPUExecutionProvider"]
        else:
            raise BackendUnavailable(f"onnx does not run on {device}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _SESSION_LEVEL[level])
        self.session = ort.InferenceSession(str(artifact.path), options, providers=providers)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.output = self.session.get_outputs()[0].name
        self.precision = precision
        self.artifact = artifact.digest
        self.exported = artifact.exported

    def forward(self, tensors: Mapping[str, Any]) -> Any:
        import torch

        feed = {name: _numpy(tensors, name) for name in self.inputs}
        (logits,) = self.session.run([self.output], feed)  # run() is safe from many threads
        return torch.from_numpy(logits).float()


class OpenVINOBackend:
    name = "openvino"

    def __init__(self, artifact: Artifact, *, precision: str, device: str, threads: int) -> None:
        import openvino as ov

        if device != "cpu":
            raise BackendUnavailable(f"openvino runs on the CPU here, not {device}")
        config = {
            # int8 layers run int8 whatever the hint; the rest run at the hint.
            "INFERENCE_PRECISION_HINT": "bf16" if precision.endswith("bf16") else "f32",
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads,
        }
        self.compiled = ov.Core().compile_model(str(artifact.path), "CPU", config)
        self.inputs = [i.get_any_name() for i in self.compiled.inputs]
        self.precision = precision
        self.artifact = artifact.digest
        self.exported = artifact.exported
        # An infer request is not safe from two threads at once: each thread keeps its own.
        self._local = threading.local()

    def forward(self, tensors: Mapping[str, Any]) -> Any:
        import torch

        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        result = request.infer({name: _numpy(tensors, name) for name in self.inputs})
        return torch.from_numpy(result[0].copy()).float()  # the request reuses its output buffer


def _numpy(tensors: Mapping[str, Any], name: str) -> Any:
    if name in tensors:
        return tensors[name].numpy()
    if name == "token_type_ids":  # an export that takes them, a tokenizer that gives none
        return tensors["input_ids"].new_zeros(tensors["input_ids"].shape).numpy()
    raise BackendUnavailable(f"the exported model wants an input {name!r} the tokenizer does not give")


def exported_backend(
    name: str,
    *,
    model_name: str,
    network: Any,
    tokenizer: Any,
    precision: str,
    device: str,
    onnx_level: str = "O2",
    quantization: str = "none",
    calibration: Callable[[], list[dict[str, Any]]] | None = None,
    calibration_digest: str | None = None,
) -> OnnxBackend | OpenVINOBackend:
    """The model's transformer exported (or its kept export read) and running on ``name``
    (``onnx`` or ``openvino``), its unquantised part at ``precision``; an int8 recipe that
    calibrates does so on the feeds ``calibration`` gives."""
    import torch

    from worker.engine.export import onnx_artifact, openvino_artifact

    threads = torch.get_num_threads()
    feeds = calibration or list
    served = served_precision(quantization, precision)
    if name == "onnx":
        artifact = onnx_artifact(
            model_name,
            network,
            tokenizer,
            level=onnx_level,
            quantization=quantization,
            calibration=feeds,
            calibration_digest=calibration_digest,
        )
        # A QDQ int8 graph becomes int8 kernels in the session's extended passes.
        session_level = "O2" if quantization != NONE else onnx_level
        return OnnxBackend(artifact, precision=served, level=session_level, device=device, threads=threads)
    artifact = openvino_artifact(
        model_name,
        network,
        tokenizer,
        quantization=quantization,
        calibration=feeds,
        calibration_digest=calibration_digest,
    )
    return OpenVINOBackend(artifact, precision=served, device=device, threads=threads)
