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

from kernel.settings import Settings
from worker import control_strings
from worker.engine.autotune import (
    AUTO_TIMING_S,
    Candidate,
    available_candidates,
    shipped_calibration,
)
from worker.engine.backend import Backend, BackendChoice, BackendRefused, TorchBackend, auto_backend, require_package
from worker.engine.batching import Batch, pad_batches
from worker.engine.calibration import Calibration, Window, read_calibration
from worker.engine.forward import ForwardEngine, configure_threads, owning, shared
from worker.engine.int8_recipes import NONE, served_precision
from worker.engine.loading import load_cross_encoder
from worker.engine.parity import MIN_SPEARMAN, SCORE_TOLERANCE, EngineDisagrees, disagreement_with, spearman
from worker.engine.precision import exported_precisions, library_probe, probe_pairs
from worker.engine.prefix import MIN_PREFIX_TOKENS, PrefixRunner, common_prefix_length

__all__ = ["ScoringEngine", "configure_threads", "shared_engine"]

log = structlog.get_logger("rerankq.engine")


class ScoringEngine(ForwardEngine):
    """Scores pairs as ``CrossEncoder.predict`` does, with the model's activation applied (so the
    declared scale holds).

    sentence-transformers turns each pair into token ids (``CrossEncoder.preprocess``: the
    model's prompt, chat template, truncation) and its module chain turns a batch into scores
    (the transformer, then ``LogitScore`` for a causal LM, or whatever else the model declares).
    The engine reuses both and owns only what lies between: the order, the batches and their
    padding, the precision, the backend. A causal LM is padded on the left (its last position
    must be a real token), computes only that position's logits, and reads a window's shared
    prefix once (``worker.engine.prefix``).

    At load the engine is held to the library: its scores on the probe windows, at fp32, must
    equal ``CrossEncoder.predict``'s within ``parity.SCORE_TOLERANCE`` and rank as it does, or
    the model is refused (``EngineDisagrees``). The backend (torch, or an export run by ONNX
    Runtime or OpenVINO) and precision are then held to the same scores and ranking.

    One deliberate departure: a control string of the tokenizer's (``<|im_end|>``, ``[SEP]``)
    inside a query, instruction or document is read as text (``worker.control_strings``),
    where predict would read it as the control token and let a document write its own answer.
    The scores are predict's for the text with those strings broken; the probe windows hold none.
    """

    def __init__(
        self,
        model: Any,
        *,
        settings: Settings,
        precision: str | None = None,
        token_budget: int | None = None,
        verify_parity: bool = True,
        backend: BackendChoice | None = None,
        model_name: str | None = None,
        prefix_reuse: bool = True,
        auto_timing_s: float = AUTO_TIMING_S,
    ) -> None:
        import torch

        self.cross_encoder = model
        module = model[0]
        self.network = module.model  # the transformers model under the CrossEncoder
        self.tokenizer = module.tokenizer
        self.max_length = int(module.max_seq_length or self.tokenizer.model_max_length)
        self.activation = getattr(model, "activation_fn", None)
        self.model_name = model_name or str(getattr(self.network, "name_or_path", "") or "")
        #: A causal LM reranker (``Transformer(transformer_task="text-generation")`` + ``LogitScore``).
        self.causal = getattr(module, "transformer_task", None) == "text-generation"
        self.left_padding = getattr(self.tokenizer, "padding_side", "right") == "left"
        #: The strings this tokenizer reads as control tokens, broken in every caller's text.
        self.control = control_strings.of_tokenizer(self.tokenizer)
        self.network.eval()
        model.eval()
        #: What preprocess adds beside the token tensors (its modality, logits_to_keep), the same for every batch.
        self.features = {k: v for k, v in model.preprocess([("q", "d")]).items() if not hasattr(v, "shape")}
        self.prefix = PrefixRunner(self.network) if self.causal and prefix_reuse else None
        if self.prefix is not None and not self.prefix.supported:
            log.info("prefix_reuse_unavailable", model=self.model_name, reason="the model's forward takes no cache")
            self.prefix = None
        self.prefix_reused = 0  # pairs scored from a shared prefix, for the benchmark
        #: The model itself: the torch backend, and at fp32 what every other backend is held to.
        self.torch = TorchBackend(model, torch.device(model.device), features=self.features)
        self.backend: Backend = self.torch
        asked = backend or BackendChoice()
        requested = precision or settings.engine.precision
        if self._measures(asked, requested, verify=verify_parity):
            super().__init__(
                device=model.device,
                settings=settings,
                precision="fp32",
                token_budget=token_budget,
                verify_parity=verify_parity,
            )
            try:
                self._decide_automatically(asked, timing_s=auto_timing_s)
            except Exception as exc:
                log.warning("backend_fallback", backend="auto", kept="torch", reason=f"{type(exc).__name__}: {exc}")
                self.backend = self.torch
                self._choose_precision(requested, verify=verify_parity)
            return
        choice = replace(asked, name=auto_backend(self.torch.device.type)) if asked.name == "auto" else asked
        if choice.name != "torch" and not self.exportable:
            # An export covers a sequence-classification transformer alone: a causal LM's vocabulary
            # logits, or modules after the transformer, are not in it.
            log.warning(
                "backend_unsupported",
                backend=choice.name,
                kept="torch",
                model=self.model_name,
                reason=self.unexportable_reason,
            )
            choice = replace(choice, name="torch")
        exported = choice.name != "torch"
        # An exported backend is adopted against torch fp32, so torch's own precision is not tried first.
        super().__init__(
            device=model.device,
            settings=settings,
            precision="fp32" if exported else precision,
            token_budget=token_budget,
            verify_parity=verify_parity,
        )
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

    @property
    def exportable(self) -> bool:
        return self.unexportable_reason is None

    @property
    def unexportable_reason(self) -> str | None:
        if self.causal:
            return "a causal-LM reranker is not exported (its scores come from LogitScore over vocabulary logits)"
        if len(self.cross_encoder) != 1:
            return "the model's module chain goes on after the transformer, and an export holds the transformer only"
        return None

    # -- auto: measured --

    def _measures(self, asked: BackendChoice, requested: str, *, verify: bool) -> bool:
        """Whether ``auto`` is decided by measurement: backend and precision both auto, on a CPU,
        for a model an export can hold, with the parity probe on (the bar every candidate meets)."""
        return (
            asked.name == "auto"
            and requested == "auto"
            and verify
            and self.torch.device.type == "cpu"
            and self.exportable
        )

    def auto_candidates(self, *, calibrated: bool = False) -> list[Candidate]:
        """What ``auto`` measures for this model; int8 when ``RERANKQ_AUTO_INT8`` is on or the
        member names calibration windows (``calibrated``)."""
        return available_candidates(exportable=self.exportable, int8=self.settings.engine.auto_int8 or calibrated)

    def _decide_automatically(self, asked: BackendChoice, *, timing_s: float) -> None:
        from worker.engine.export import source_fingerprint

        shipped = shipped_calibration(self.settings.streams.window_size)
        # int8 calibrates on the operator's windows when given, else on the shipped ones.
        calibration = read_calibration(asked.calibration) if asked.calibration else shipped

        def build(candidate: Candidate) -> tuple[Backend, str]:
            if candidate.backend == "torch":
                return self.torch, candidate.precision
            choice = BackendChoice(
                candidate.backend, onnx_optimization=asked.onnx_optimization, quantization=candidate.quantization
            )
            backend = self._load_exported(choice, candidate.precision, calibration if candidate.quantized else None)
            return backend, candidate.served_precision

        def score(runner: tuple[Backend, str], window: Window) -> list[float]:
            backend, precision = runner
            kept, self.precision = self.precision, precision  # torch's autocast reads it
            try:
                return self._score(backend, window)
            finally:
                self.precision = kept

        self._decide_and_adopt(
            kind="cross-encoder",
            source=source_fingerprint(self.model_name, self.network),
            shape={"onnx_optimization": asked.onnx_optimization, "calibration": calibration.digest},
            candidates=self.auto_candidates(calibrated=asked.calibration is not None),
            build=build,
            score=score,
            # int8 is held to its held-out windows and to the shipped collection's judged ones (for
            # its nDCG: an operator's calibration windows come without judgements).
            held_out=[*calibration.held_out, *(shipped.held_out if calibration is not shipped else [])],
            timing_windows=shipped.calibrate,
            timing_s=timing_s,
        )

    @property
    def export_serves(self) -> bool:
        return self.backend is not self.torch

    # -- agreement with sentence-transformers --

    def _agree_with_library(self) -> None:
        """Refuse the model unless the engine at fp32 scores the probe windows as predict does;
        a causal reranker's agreement is kept (``agreement``), so a second start skips it."""
        if not self.causal:
            self._check_agreement()
            return
        from worker.engine.agreement import keep_verdict, kept_verdict
        from worker.engine.autotune import fingerprint
        from worker.engine.export import export_root, source_fingerprint

        root = export_root(self.model_name)
        wanted = fingerprint(
            kind="agreement",
            source=source_fingerprint(self.model_name, self.network),
            device=str(self.device),
            shape={"max_length": self.max_length, "prefix_reuse": self.prefix is not None},
            candidates=[],
        )
        verdict = kept_verdict(root, wanted)
        if verdict is not None:
            if not verdict.prefix_reuse:
                self.prefix = None
            log.info(
                "engine_agreement_reused", model=self.model_name, causal=True, prefix_reuse=self.prefix is not None
            )
            return
        self._check_agreement()
        keep_verdict(root, wanted, prefix_reuse=self.prefix is not None)

    def _check_agreement(self) -> None:
        for window, prompt in library_probe():
            expected = library_scores(self.cross_encoder, window, prompt=prompt)
            plain = self._score(self.torch, window, prompt=prompt, reuse=False)
            disagreement = disagreement_with(expected, plain)
            if disagreement:
                raise EngineDisagrees(
                    f"the engine does not score this model as CrossEncoder.predict does "
                    f"({disagreement}, prompt {'given' if prompt else 'default'}): refused"
                )
            if self.prefix is not None:
                reused = self._score(self.torch, window, prompt=prompt, reuse=True)
                disagreement = disagreement_with(expected, reused)
                if disagreement:
                    log.warning("prefix_reuse_disabled", model=self.model_name, reason=disagreement)
                    self.prefix = None
        log.info(
            "engine_agrees_with_library",
            model=self.model_name,
            causal=self.causal,
            prefix_reuse=self.prefix is not None,
            tolerance=SCORE_TOLERANCE,
        )

    # -- backend --

    def _adopt_exported(self, choice: BackendChoice, requested: str, *, verify: bool) -> None:
        """Run an export with ONNX Runtime or OpenVINO: the first candidate precision whose
        every probe window ranks as torch fp32 ranks it, or none (BackendRefused)."""
        require_package(choice.name)
        calibration = read_calibration(choice.calibration) if choice.calibration else None
        if calibration is None and choice.quantization != NONE:
            # An int8 export without the operator's windows calibrates on the shipped ones, as auto's does.
            calibration = shipped_calibration(self.settings.streams.window_size)
        windows = [probe_pairs(), *(calibration.held_out if calibration else [])]
        reference = [self._score(self.torch, w) for w in windows] if verify else None
        rejected = []
        for rest in exported_precisions(choice, requested, self.device.type):
            candidate = self._load_exported(choice, rest, calibration)
            precision = served_precision(choice.quantization, rest)
            if reference is None:
                self.backend, self.precision = candidate, precision
                return
            scored = [self._score(candidate, w) for w in windows]
            rho = min(spearman(r, c) for r, c in zip(reference, scored))
            # At fp32 an export computes what torch computes: its scores, not only their order, hold.
            off = next((d for r, c in zip(reference, scored) if (d := disagreement_with(r, c))), None)
            if precision == "fp32" and off is not None and rho >= MIN_SPEARMAN:
                log.warning("backend_off_scale", backend=choice.name, precision=precision, reason=off)
                rejected.append(f"{precision} with {off}")
                continue
            if rho >= MIN_SPEARMAN:
                self.backend, self.precision, self.probe_spearman = candidate, precision, rho
                log.info(
                    "backend_adopted",
                    backend=choice.name,
                    precision=precision,
                    quantization=choice.quantization,
                    spearman=round(rho, 4),
                    exported=candidate.exported,
                    windows=len(windows),
                )
                return
            log.warning("backend_below_parity", backend=choice.name, precision=precision, spearman=round(rho, 4))
            rejected.append(f"{precision} at Spearman {rho:.4f}")
        raise BackendRefused(
            f"{choice.name} does not keep torch fp32's ranking ({', '.join(rejected)} on the worst of "
            f"{len(windows)} probe windows; parity needs {MIN_SPEARMAN}): refused"
        )

    def _load_exported(self, choice: BackendChoice, precision: str, calibration: Calibration | None) -> Any:
        return self._load_export(
            choice.name,
            precision=precision,
            quantization=choice.quantization,
            calibration=calibration,
            encode=lambda windows: (self.tokenize(window) for window in windows.calibrate),
            onnx_level=choice.onnx_optimization,
        )

    # -- scoring --

    def tokenize(self, pairs: Sequence[tuple[str, str]], *, prompt: str | None = None) -> dict[str, list[list[int]]]:
        """Each pair's token ids as ``CrossEncoder.predict`` makes them (the model's default prompt
        unless ``prompt`` is given, its chat template, its truncation), unpadded: one
        preprocess call for every pair, its padding then taken off so the engine can batch.
        A control string in the caller's text is broken first, so it stays text."""
        if not pairs:
            return {"input_ids": []}
        # The caller's text (query, document, an instruction given in place of the model's own
        # prompt) is read as text: its control strings are broken (``worker.control_strings``).
        # Here alone the engine departs from predict, which would read them as control tokens.
        text = self.control.neutralise
        if prompt is not None:
            prompt = text(prompt)
        resolved = self.cross_encoder._resolve_prompt(prompt, None)  # what predict does with prompt=
        features = self.cross_encoder.preprocess([(text(q), text(d)) for q, d in pairs], prompt=resolved)
        mask = features["attention_mask"].bool()
        out: dict[str, list[list[int]]] = {}
        for name in ("input_ids", "token_type_ids"):
            if name in features:
                out[name] = [row[keep].tolist() for row, keep in zip(features[name], mask)]
        return out

    def batches(self, encoded: dict[str, list[list[int]]]) -> list[Batch]:
        return pad_batches(encoded, self.token_budget, pad_id=self.tokenizer.pad_token_id or 0, left=self.left_padding)

    def score_pairs(self, pairs: Sequence[tuple[str, str]], *, prompt: str | None = None) -> list[float]:
        """Scores as ``CrossEncoder.predict(pairs, prompt=prompt)`` gives them."""
        return self._score(self.backend, pairs, prompt=prompt, reuse=self.prefix is not None)

    def _score(
        self, backend: Backend, pairs: Sequence[tuple[str, str]], *, prompt: str | None = None, reuse: bool = False
    ) -> list[float]:
        import torch

        if not pairs:
            return []
        encoded = self.tokenize(pairs, prompt=prompt)
        scores = [0.0] * len(pairs)
        plain = list(range(len(pairs)))
        # torch runs at the engine's precision; an exported backend at the one it was adopted at.
        autocast = self._autocast() if backend is self.torch else contextlib.nullcontext()
        with torch.inference_mode(), autocast:
            if reuse and backend is self.torch and self.prefix is not None:
                plain = self._score_shared_prefixes(pairs, encoded, scores)
            if plain:
                subset = {name: [rows[i] for i in plain] for name, rows in encoded.items()}
                for batch in self.batches(subset):
                    values = self._read_scores(backend.forward(batch.tensors))
                    for i, value in zip(batch.indices, values):
                        scores[plain[i]] = value
                    self._count(batch)
        return scores

    def _read_scores(self, raw: Any) -> list[float]:
        """One score per pair: the activation applied (as predict applies it); a multi-label
        head's last column is "relevant"."""
        raw = raw.float()
        if self.activation is not None:
            raw = self.activation(raw)
        if raw.ndim == 1:
            raw = raw.unsqueeze(-1)
        return [float(v) for v in raw[:, -1].cpu().tolist()]

    def _score_shared_prefixes(
        self, pairs: Sequence[tuple[str, str]], encoded: dict[str, list[list[int]]], scores: list[float]
    ) -> list[int]:
        """Score each query's pairs from their shared prefix; returns the pairs left for the plain batch."""
        assert self.prefix is not None
        ids = encoded["input_ids"]
        by_query: dict[str, list[int]] = {}
        for i, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(i)
        plain: list[int] = []
        for members in by_query.values():
            rows = [ids[i] for i in members]
            length = common_prefix_length(rows)
            # self.prefix is None once a query before found the model's cache unusable.
            if self.prefix is None or len(members) < 2 or length < MIN_PREFIX_TOKENS:
                plain.extend(members)
                continue
            cached = self.prefix.prefix_cache(rows[0][:length], self.device)
            if cached is None:
                log.info(
                    "prefix_reuse_unavailable",
                    model=self.model_name,
                    reason="the model's cache is not a plain full-attention one",
                )
                self.prefix = None
                plain.extend(members)
                continue
            self._count_prefix(length)
            suffixes = {"input_ids": [row[length:] for row in rows]}
            for batch in pad_batches(
                suffixes, self.token_budget, pad_id=self.tokenizer.pad_token_id or 0, left=True, shared_width=length
            ):
                tensors = {k: v.to(self.device, non_blocking=True) for k, v in batch.tensors.items()}
                logits = self.prefix.suffix_logits(cached, tensors["input_ids"], tensors["attention_mask"])
                features: dict[str, Any] = {self.cross_encoder[0].module_output_name: logits}
                for module in list(self.cross_encoder)[1:]:  # LogitScore, and whatever follows it
                    features = module(features)
                for i, value in zip(batch.indices, self._read_scores(features["scores"])):
                    scores[members[i]] = value
                self._count(batch)
            self.prefix_reused += len(members)
        return plain


def library_scores(cross_encoder: Any, pairs: Sequence[tuple[str, str]], *, prompt: str | None) -> list[float]:
    """What sentence-transformers itself gives for these pairs: ``CrossEncoder.predict``, one
    score per pair (a multi-label head's last column, as the engine reads it)."""
    import numpy as np

    values = np.asarray(cross_encoder.predict(list(pairs), prompt=prompt, show_progress_bar=False), dtype=np.float64)
    return [float(v) for v in (values[:, -1] if values.ndim > 1 else values)]


def shared_engine(
    model_name: str, *, device: str, settings: Settings, backend: BackendChoice | None = None
) -> ScoringEngine:
    """The process's cross-encoder engine for this model and backend; chain members naming both share it."""
    choice = backend or BackendChoice()
    return shared(
        "cross-encoder",
        model_name,
        device=device,
        settings=settings,
        variant=choice,
        build=lambda: owning(
            ScoringEngine(
                load_cross_encoder(model_name, device=device), settings=settings, backend=choice, model_name=model_name
            )
        ),
    )
