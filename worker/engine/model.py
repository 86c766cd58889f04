"""The scoring engine behind the local provider.

Loads one model copy per process and scores (query, document) pairs close to the
machine's limit: one tokeniser call per request, pairs ordered by token length and
cut into batches by a padded-token budget (so a batch of short documents is wide
and a batch of long ones is narrow, and little of either is padding), inference
mode, and a reduced precision where the hardware runs it natively and a parity
probe at load shows it keeps the ranking fp32 gives.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import structlog

from producer.settings import Settings
from worker.engine.backend import (
    Backend,
    BackendChoice,
    BackendRefused,
    TorchBackend,
    auto_backend,
    require_package,
)
from worker.engine.batching import Batch, default_token_budget, plan_batches
from worker.engine.calibration import Calibration, read_calibration
from worker.engine.loading import load_cross_encoder
from worker.engine.parity import MIN_SPEARMAN, spearman
from worker.engine.precision import exported_precisions, probe_pairs, resolve_precision

log = structlog.get_logger("rerankq.engine")


class ScoringEngine:
    """Scores pairs with the model's configured activation applied (so the declared scale holds).

    The engine tokenises and batches; its backend (``worker/engine/backend.py``) runs each
    batch's forward pass: torch (the model itself, at a precision), or an export of it run
    by ONNX Runtime or OpenVINO, adopted only if it ranks the parity probe as torch fp32 does.
    """

    def __init__(self, model: Any, *, settings: Settings, precision: str | None = None,
                 token_budget: int | None = None, verify_parity: bool = True,
                 backend: BackendChoice | None = None, model_name: str | None = None) -> None:
        import torch

        self.cross_encoder = model
        self.settings = settings
        module = model[0]
        self.network = module.model  # the transformers model under the CrossEncoder
        self.tokenizer = module.processor
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        self.activation = getattr(model, "activation_fn", None)
        self.device = torch.device(model.device)
        self.model_name = model_name or str(getattr(self.network, "name_or_path", "") or "")
        self.token_budget = token_budget or settings.token_budget or default_token_budget(self.device.type)
        self.padded_tokens = 0  # executed tokens, for the benchmark's FLOP count
        self.real_tokens = 0
        self.probe_spearman: float | None = None
        self.network.eval()
        #: torch fp32: what every other backend and precision is held to.
        self.reference = TorchBackend(self.network, self.device, "fp32")
        self.backend: Backend = self.reference
        choice = backend or BackendChoice()
        requested = precision or settings.precision
        if choice.name == "auto":
            choice = self._adopt_auto(choice, requested, verify=verify_parity)
        if choice.name == "torch":
            candidate = resolve_precision(requested, self.device.type)
            if candidate != "fp32":
                # auto engages only at parity; an explicit bf16/fp16 is the operator's call,
                # kept with a warning when the probe disagrees.
                self._adopt_precision(candidate, verify=verify_parity, enforce=requested == "auto")
        elif self.backend is self.reference:
            self._adopt_exported(choice, requested, verify=verify_parity)
        self.precision = self.backend.precision

    # -- precision and backend --

    def _adopt_precision(self, candidate: str, *, verify: bool, enforce: bool) -> None:
        """Run torch at ``candidate``; with ``enforce``, only if the probe keeps fp32's ranking."""
        pairs = probe_pairs()
        reference = self.score_pairs(pairs) if verify else None
        self.backend = TorchBackend(self.network, self.device, candidate)
        if reference is not None:
            rho = spearman(reference, self.score_pairs(pairs))
            self.probe_spearman = rho
            if rho < MIN_SPEARMAN and enforce:
                log.warning("precision_rejected", precision=candidate, spearman=round(rho, 4), kept="fp32")
                self.backend = self.reference
                return
            if rho < MIN_SPEARMAN:
                log.warning("precision_below_parity", precision=candidate, spearman=round(rho, 4))
        log.info("precision_adopted", precision=candidate, verified=reference is not None)

    def _adopt_auto(self, choice: BackendChoice, requested: str, *, verify: bool) -> BackendChoice:
        """``auto``: the exported backend where one is installed, torch when it is not, or
        when its export fails or falls short of parity. Returns what is left to adopt."""
        name = auto_backend(self.device.type)
        if name == "torch":
            return replace(choice, name="torch")
        try:
            self._adopt_exported(replace(choice, name=name), requested, verify=verify)
        except Exception as exc:  # auto means the fastest backend that works here
            log.warning("backend_fallback", backend=name, kept="torch", reason=f"{type(exc).__name__}: {exc}")
            self.backend = self.reference
            return replace(choice, name="torch")
        return replace(choice, name=name)

    def _adopt_exported(self, choice: BackendChoice, requested: str, *, verify: bool) -> None:
        """Run an export with ONNX Runtime or OpenVINO: the first candidate precision whose
        every probe window ranks as torch fp32 ranks it, or none (BackendRefused)."""
        require_package(choice.name)
        calibration = read_calibration(choice.calibration) if choice.calibration else None
        windows = [probe_pairs(), *(calibration.held_out if calibration else [])]
        reference = [self.score_pairs(w) for w in windows] if verify else None
        rejected = []
        for precision in exported_precisions(choice, requested, self.device.type):
            candidate = self._load_exported(choice, precision, calibration)
            if reference is None:
                self.backend = candidate
                return
            rho = min(spearman(r, self._score(candidate, w)) for r, w in zip(reference, windows))
            if rho >= MIN_SPEARMAN:
                self.backend, self.probe_spearman = candidate, rho
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

    def batches(self, encoded: dict[str, list[list[int]]]) -> list[Batch]:
        import torch

        ids = encoded["input_ids"]
        types = encoded.get("token_type_ids")
        pad_id = self.tokenizer.pad_token_id or 0
        out: list[Batch] = []
        for indices in plan_batches([len(x) for x in ids], self.token_budget):
            width = len(ids[indices[0]])
            input_ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(indices), width), dtype=torch.long)
            token_types = torch.zeros((len(indices), width), dtype=torch.long) if types is not None else None
            for row, i in enumerate(indices):
                n = len(ids[i])
                input_ids[row, :n] = torch.tensor(ids[i], dtype=torch.long)
                mask[row, :n] = 1
                if token_types is not None:
                    token_types[row, :n] = torch.tensor(types[i], dtype=torch.long)
            tensors = {"input_ids": input_ids, "attention_mask": mask}
            if token_types is not None:
                tensors["token_type_ids"] = token_types
            out.append(Batch(indices=indices, tensors=tensors))
        return out

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        return self._score(self.backend, pairs)

    def _score(self, backend: Backend, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        if not pairs:
            return []
        encoded = self.tokenize(pairs)
        scores = [0.0] * len(pairs)
        with torch.inference_mode():
            for batch in self.batches(encoded):
                logits = backend.forward(batch.tensors)
                if self.activation is not None:
                    logits = self.activation(logits)
                # One logit per pair; a two-class head's last column is "relevant".
                values = logits[:, -1].cpu().tolist()
                for i, value in zip(batch.indices, values):
                    scores[i] = float(value)
                self.padded_tokens += batch.padded_tokens
                self.real_tokens += int(batch.tensors["attention_mask"].sum())
        return scores

    def score(self, query: str, documents: Sequence[str]) -> list[float]:
        return self.score_pairs([(query, d) for d in documents])


# --- one model copy per process ---------------------------------------------------------------

_engines: dict[tuple[str, str, str, int | None, BackendChoice], ScoringEngine] = {}
_engines_lock = threading.Lock()


def configure_threads(threads: int | None) -> None:
    """Size torch's intra-op pool to the CPU quota this process has, not the host's cores."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)  # one forward at a time per process; no oversubscription
    except RuntimeError:
        pass  # already set (or work already ran): harmless


def shared_engine(model_name: str, *, device: str, settings: Settings,
                  backend: BackendChoice | None = None) -> ScoringEngine:
    """The process's engine for this model and backend; chain members naming both share it."""
    backend = backend or BackendChoice()
    key = (model_name, device, settings.precision, settings.token_budget, backend)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            if device == "cpu":
                configure_threads(settings.torch_threads)
            engine = ScoringEngine(load_cross_encoder(model_name, device=device), settings=settings,
                                   backend=backend, model_name=model_name)
            _engines[key] = engine
        return engine
