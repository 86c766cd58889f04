"""What every in-process engine shares: the device, the padded-token budget, the precision
policy with its parity probe, and one model copy per process.

An engine scores (query, document) pairs; how its model turns a batch into scores is
its own (a cross-encoder reads a logit per pair, a bi-encoder compares embeddings). The
rest is here once: batches are cut by ``plan_batches`` and padded by ``pad_batches``, the
forward pass runs under ``torch.inference_mode`` and, where the hardware runs it natively,
a reduced precision that a probe at load shows keeps the ranking fp32 gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from kernel.settings import Settings
from worker.engine.batching import Batch, default_token_budget, pad_batches
from worker.engine.parity import MIN_SPEARMAN, spearman
from worker.engine.precision import probe_pairs, resolve_precision

if TYPE_CHECKING:
    from worker.engine.autotune import AutoDecision, Candidate
    from worker.engine.backend import Backend
    from worker.engine.calibration import Calibration, Window

R = TypeVar("R")

log = structlog.get_logger("rerankq.engine")


class ForwardEngine:
    """The base of ``ScoringEngine`` (cross-encoder) and ``EmbeddingEngine`` (bi-encoder).

    A subclass sets ``tokenizer`` and implements ``score_pairs`` before calling
    ``__init__`` here, which may score the probe to choose the precision.
    """

    tokenizer: Any
    #: The transformers model an export stands in for; None where there is none.
    network: Any
    model_name: str
    max_length: int
    #: What runs the forward pass (each subclass says what stands for its torch model).
    backend: Any
    #: Whether the torch weights were freed (``release_unused``).
    released = False
    #: Whether the engine was held to its library's scores at fp32 (``_agree_with_library``).
    _agreed = False

    def __init__(
        self, *, device: Any, settings: Settings, precision: str | None, token_budget: int | None, verify_parity: bool
    ) -> None:
        import torch

        self.settings = settings
        self.device = torch.device(device)
        self.token_budget = token_budget or settings.engine.token_budget or default_token_budget(self.device.type)
        self.padded_tokens = 0  # executed tokens, for the benchmark's FLOP count
        self.real_tokens = 0
        #: Told of each forward batch: (real tokens, padded tokens); the worker's metrics set it.
        self.on_batch: Callable[[int, int], None] | None = None
        self.probe_spearman: float | None = None
        #: What ``auto`` measured and chose (None when a backend or precision is set explicitly).
        self.auto_decision: AutoDecision | None = None
        self.precision = "fp32"
        self._choose_precision(precision or settings.engine.precision, verify=verify_parity)

    def score_pairs(self, pairs: Sequence[tuple[str, str]], *, prompt: str | None = None) -> list[float]:
        """Scores as sentence-transformers gives them; ``prompt`` (a stream's instruction) in
        place of the model's own, None for the model's default."""
        raise NotImplementedError

    def score(self, query: str, documents: Sequence[str], *, prompt: str | None = None) -> list[float]:
        return self.score_pairs([(query, d) for d in documents], prompt=prompt)

    # -- precision --

    def _agree_with_library(self) -> None:
        """Refuse the model (``EngineDisagrees``) unless the engine at fp32 scores the probe as
        the library itself does; run once, before a precision is chosen."""
        raise NotImplementedError

    def _choose_precision(self, requested: str, *, verify: bool) -> None:
        if verify and not self._agreed:
            self._agree_with_library()
            self._agreed = True
        candidate = resolve_precision(requested, self.device.type)
        if candidate != "fp32":
            # auto engages only at parity; an explicit bf16/fp16 is the operator's call,
            # kept with a warning when the probe disagrees.
            self.precision = self._adopt(candidate, verify=verify, enforce=requested == "auto")

    def _adopt(self, candidate: str, *, verify: bool, enforce: bool) -> str:
        """Switch to ``candidate``; with ``enforce``, only if the probe keeps fp32's ranking."""
        pairs = probe_pairs()
        reference = self.score_pairs(pairs) if verify else None
        self.precision = candidate
        if reference is not None:
            rho = spearman(reference, self.score_pairs(pairs))
            self.probe_spearman = rho
            if rho < MIN_SPEARMAN and enforce:
                log.warning(
                    "precision_rejected",
                    precision=candidate,
                    spearman=round(rho, 4),
                    kept="fp32",
                    engine=type(self).__name__,
                )
                self.precision = "fp32"
                return "fp32"
            if rho < MIN_SPEARMAN:
                log.warning(
                    "precision_below_parity", precision=candidate, spearman=round(rho, 4), engine=type(self).__name__
                )
        log.info("precision_adopted", precision=candidate, verified=reference is not None, engine=type(self).__name__)
        return candidate

    # -- auto and exports --

    @property
    def export_serves(self) -> bool:
        """Whether an export, not the torch model, runs the forward pass."""
        raise NotImplementedError

    def release_unused(self) -> bool:
        """Free the transformer's torch weights once an export runs it: the tokenizer and the
        library's preprocess, all the engine reads besides, do not read them. Only for an engine
        that owns its model (``owning``); afterwards torch cannot run it here."""
        if not self.export_serves or self.released or self.network is None:
            return False
        release_weights(self.network)
        self.released = True
        log.info("torch_weights_released", model=self.model_name, backend=getattr(self.backend, "name", None))
        return True

    def _decide_and_adopt(
        self,
        *,
        kind: str,
        source: dict[str, Any],
        shape: dict[str, Any],
        candidates: Sequence[Candidate],
        build: Callable[[Candidate], tuple[R, str]],
        score: Callable[[tuple[R, str], Window], list[float]],
        held_out: Sequence[Window],
        timing_windows: Sequence[Window],
        timing_s: float,
    ) -> None:
        """What ``auto`` decides for this model (measured, or read where an earlier start kept
        it), adopted. Every candidate is held to the probe, an int8 one to ``held_out`` too."""
        from worker.engine.autotune import decide, fingerprint
        from worker.engine.export import export_root

        wanted = fingerprint(
            kind=kind,
            source=source,
            device=str(self.device),
            shape={
                "window_size": self.settings.streams.window_size,
                "token_budget": self.token_budget,
                "max_length": self.max_length,
                **shape,
            },
            candidates=candidates,
        )

        def parity_windows(candidate: Candidate | None) -> list[Window]:
            quantized = candidate is None or candidate.quantized
            return [probe_pairs(), *(held_out if quantized else [])]

        decision, runner = decide(
            root=export_root(self.model_name),
            wanted=wanted,
            candidates=candidates,
            build=build,
            score=score,
            parity_windows=parity_windows,
            timing_windows=timing_windows,
            timing_s=timing_s,
        )
        self._adopt_decision(decision, runner, engine=kind, model=self.model_name)

    def _load_export(
        self,
        name: str,
        *,
        precision: str,
        quantization: str,
        calibration: Calibration | None,
        encode: Callable[[Calibration], Iterable[dict[str, list[list[int]]]]],
        onnx_level: str = "O2",
    ) -> Backend:
        """The transformer exported for ``name`` (onnx, openvino) at ``precision``; an int8 one is
        calibrated on the batches of what ``encode`` makes of the calibration windows."""
        from worker.engine.runtimes import exported_backend

        def feeds() -> list[dict[str, Any]]:
            encoded = encode(calibration) if calibration else []
            return [{k: v.numpy() for k, v in batch.tensors.items()} for e in encoded for batch in self.batches(e)]

        return exported_backend(
            name,
            model_name=self.model_name,
            network=self.network,
            tokenizer=self.tokenizer,
            precision=precision,
            device=str(self.device),
            onnx_level=onnx_level,
            quantization=quantization,
            calibration=feeds,
            calibration_digest=calibration.digest if calibration else None,
        )

    def _adopt_decision(self, decision: AutoDecision, runner: tuple[Any, str], *, engine: str, model: str) -> None:
        """Serve with what ``auto`` chose (``runner``: the backend and its precision), free the
        candidates not chosen, and log the table."""
        (self.backend, self.precision), self.auto_decision = runner, decision
        return_freed_memory()
        self.probe_spearman = decision.chosen_spearman
        log.info(
            "backend_chosen",
            engine=engine,
            model=model,
            backend=decision.chosen.backend,
            precision=decision.chosen.precision,
            reused=decision.reused,
            probe_s=round(decision.probe_s, 1),
            table=decision.rows(),
        )

    def _autocast(self) -> Any:
        import contextlib

        import torch

        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        if self.precision == "fp16":
            return torch.autocast(device_type=self.device.type, dtype=torch.float16)
        return contextlib.nullcontext()

    # -- batching --

    def batches(self, encoded: dict[str, list[list[int]]]) -> list[Batch]:
        return pad_batches(encoded, self.token_budget, pad_id=self.tokenizer.pad_token_id or 0)

    def _count_prefix(self, tokens: int) -> None:
        """A shared prefix run once: real tokens all, no padding."""
        self.padded_tokens += tokens
        self.real_tokens += tokens
        if self.on_batch is not None:
            self.on_batch(tokens, tokens)

    def _count(self, batch: Batch) -> None:
        real = int(batch.tensors["attention_mask"].sum())
        self.padded_tokens += batch.padded_tokens
        self.real_tokens += real
        if self.on_batch is not None:
            self.on_batch(real, batch.padded_tokens)


def release_weights(module: Any) -> None:
    """Free a torch module's weights: its parameters and buffers move to the meta device (shapes
    kept, storage gone), and the allocator hands the freed pages back to the system."""
    module.to("meta")
    return_freed_memory()


def return_freed_memory() -> None:
    """Collect what is no longer referenced (candidates not chosen, weights released) and hand
    the allocator's free pages back to the system, so the process's resident size shows it."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed arenas otherwise
    except (OSError, AttributeError):
        pass  # not glibc: the pages are reused by this process instead


# --- one model copy per process ---------------------------------------------------------------

E = TypeVar("E", bound=ForwardEngine)

_engines: dict[tuple[str, str, str, str, int | None, Hashable], ForwardEngine] = {}
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


def shared(
    kind: str, model_name: str, *, device: str, settings: Settings, build: Callable[[], E], variant: Hashable = None
) -> E:
    """The process's engine of this kind for this model; chain members naming the same model share it.

    ``variant`` is whatever else makes two engines of one model differ (the cross-encoder's
    backend choice): members asking for different ones get an engine each.
    """
    key = (kind, model_name, device, settings.engine.precision, settings.engine.token_budget, variant)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            if device == "cpu":
                configure_threads(settings.worker.torch_threads)
            engine = build()
            _engines[key] = engine
        return engine  # type: ignore[return-value]


def owning(engine: E) -> E:
    """The engine's model is its own (``shared`` built it for this engine alone): what its
    backend does not need is freed."""
    engine.release_unused()
    return engine
