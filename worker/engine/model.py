"""The cross-encoder engine behind the local provider.

Loads one model copy per process and scores (query, document) pairs close to the
machine's limit: one tokeniser call per request, pairs ordered by token length and
cut into batches by a padded-token budget (so a batch of short documents is wide
and a batch of long ones is narrow, and little of either is padding), inference
mode, and a reduced precision where the hardware runs it natively and a parity
probe at load shows it keeps the ranking fp32 gives (``worker.engine.forward``).
The forward pass itself runs on a backend (``worker.engine.backend``): torch, or an
export of the model run by ONNX Runtime or OpenVINO, held to the same parity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import structlog

from producer.settings import Settings
from worker.engine.backend import Backend, BackendChoice, BackendRefused, TorchBackend, auto_backend, require_package
from worker.engine.calibration import Calibration, read_calibration
from worker.engine.forward import ForwardEngine, configure_threads, shared
from worker.engine.loading import load_cross_encoder
from worker.engine.parity import MIN_SPEARMAN, spearman
from worker.engine.precision import exported_precisions, probe_pairs

__all__ = ["ScoringEngine", "configure_threads", "shared_engine"]

log = structlog.get_logger("rerankq.engine")


class ScoringEngine(ForwardEngine):
    """Scores pairs with the model's configured activation applied (so the declared scale holds).

    The engine tokenises and batches; its backend (``worker/engine/backend.py``) runs each
    batch's forward pass: torch (the model itself, at the engine's precision), or an export
    of it run by ONNX Runtime or OpenVINO, adopted only if it ranks the parity probe as torch
    fp32 does.
    """

    def __init__(self, model: Any, *, settings: Settings, precision: str | None = None,
                 token_budget: int | None = None, verify_parity: bool = True,
                 backend: BackendChoice | None = None, model_name: str | None = None) -> None:
        import torch

        self.cross_encoder = model
        module = model[0]
        self.network = module.model  # the transformers model under the CrossEncoder
        self.tokenizer = module.processor
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        self.activation = getattr(model, "activation_fn", None)
        self.model_name = model_name or str(getattr(self.network, "name_or_path", "") or "")
        self.network.eval()
        #: The model itself: the torch backend, and at fp32 what every other backend is held to.
        self.torch = TorchBackend(self.network, torch.device(model.device))
        self.backend: Backend = self.torch
        asked = backend or BackendChoice()
        choice = replace(asked, name=auto_backend(self.torch.device.type)) if asked.name == "auto" else asked
        requested = precision or settings.engine.precision
        exported = choice.name != "torch"
        # An exported backend is adopted against torch fp32, so torch's own precision is not tried first.
        super().__init__(device=model.device, settings=settings, precision="fp32" if exported else precision,
                         token_budget=token_budget, verify_parity=verify_parity)
        if not exported:
            return
        try:
            self._adopt_exported(choice, requested, verify=verify_parity)
        except Exception as exc:
            if asked.name != "auto":
                raise
            # auto means the fastest backend that works here: torch, at auto's precision for it.
            log.warning("backend_fallback", backend=choice.name, kept="torch", reason=f"{type(exc).__name__}: {exc}")
            self.backend = self.torch
            self._choose_precision(requested, verify=verify_parity)

    # -- backend --

    def _adopt_exported(self, choice: BackendChoice, requested: str, *, verify: bool) -> None:
        """Run an export with ONNX Runtime or OpenVINO: the first candidate precision whose
        every probe window ranks as torch fp32 ranks it, or none (BackendRefused)."""
        require_package(choice.name)
        calibration = read_calibration(choice.calibration) if choice.calibration else None
        windows = [probe_pairs(), *(calibration.held_out if calibration else [])]
        reference = [self._score(self.torch, w) for w in windows] if verify else None
        rejected = []
        for precision in exported_precisions(choice, requested, self.device.type):
            candidate = self._load_exported(choice, precision, calibration)
            if reference is None:
                self.backend, self.precision = candidate, precision
                return
            rho = min(spearman(r, self._score(candidate, w)) for r, w in zip(reference, windows))
            if rho >= MIN_SPEARMAN:
                self.backend, self.precision, self.probe_spearman = candidate, precision, rho
                log.info("backend_adopted", backend=choice.name, precision=precision, spearman=round(rho, 4),
                         exported=candidate.exported, windows=len(windows))
                return
            log.warning("backend_below_parity", backend=choice.name, precision=precision, spearman=round(rho, 4))
            rejected.append(f"{precision} at Spearman {rho:.4f}")
        raise BackendRefused(
            f"{choice.name} does not keep torch fp32's ranking ({', '.join(rejected)} on the worst of "
            f"{len(windows)} probe windows; parity needs {MIN_SPEARMAN}): refused"
        )

    def _load_exported(self, choice: BackendChoice, precision: str, calibration: Calibration | None) -> Any:
        import torch

        from worker.engine.export import onnx_artifact, openvino_artifact
        from worker.engine.runtimes import OnnxBackend, OpenVINOBackend

        def feeds() -> list[dict[str, Any]]:
            windows = calibration.calibrate if calibration else []
            return [{k: v.numpy() for k, v in batch.tensors.items()}
                    for window in windows for batch in self.batches(self.tokenize(window))]

        threads = torch.get_num_threads()
        digest = calibration.digest if calibration else None
        if choice.name == "onnx":
            level = choice.onnx_optimization
            artifact = onnx_artifact(self.model_name, self.network, self.tokenizer, level=level,
                                     quantization=choice.quantization, calibration=feeds, calibration_digest=digest)
            # A QDQ int8 graph becomes int8 kernels in the session's extended passes.
            session_level = "O2" if choice.quantization == "int8" else level
            return OnnxBackend(artifact, precision=precision, level=session_level, device=str(self.device),
                               threads=threads)
        artifact = openvino_artifact(self.model_name, self.network, self.tokenizer, quantization=choice.quantization,
                                     calibration=feeds, calibration_digest=digest)
        return OpenVINOBackend(artifact, precision=precision, device=str(self.device), threads=threads)

    # -- scoring --

    def tokenize(self, pairs: Sequence[tuple[str, str]]) -> dict[str, list[list[int]]]:
        """One tokeniser call for every pair (the fast tokeniser parallelises it), unpadded."""
        encoded = self.tokenizer(
            [q for q, _ in pairs], [d for _, d in pairs], truncation="longest_first",
            max_length=self.max_length, padding=False, return_attention_mask=False,
        )
        return dict(encoded)

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        return self._score(self.backend, pairs)

    def _score(self, backend: Backend, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        if not pairs:
            return []
        encoded = self.tokenize(pairs)
        scores = [0.0] * len(pairs)
        # torch runs at the engine's precision; an exported backend at the one it was adopted at.
        autocast = self._autocast() if backend is self.torch else contextlib.nullcontext()
        with torch.inference_mode(), autocast:
            for batch in self.batches(encoded):
                logits = backend.forward(batch.tensors)
                if self.activation is not None:
                    logits = self.activation(logits)
                # One logit per pair; a two-class head's last column is "relevant".
                values = logits[:, -1].cpu().tolist()
                for i, value in zip(batch.indices, values):
                    scores[i] = float(value)
                self._count(batch)
        return scores


def shared_engine(model_name: str, *, device: str, settings: Settings,
                  backend: BackendChoice | None = None) -> ScoringEngine:
    """The process's cross-encoder engine for this model and backend; chain members naming both share it."""
    choice = backend or BackendChoice()
    return shared("cross-encoder", model_name, device=device, settings=settings, variant=choice,
                  build=lambda: ScoringEngine(load_cross_encoder(model_name, device=device), settings=settings,
                                              backend=choice, model_name=model_name))
