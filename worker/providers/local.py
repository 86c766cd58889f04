"""The in-process cross-encoder (sentence-transformers ``CrossEncoder``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from kernel.settings import DEFAULT_MODEL, MemberSettings, Settings
from worker import control_strings
from worker.engine.coalesce import CoalesceTimeout, shared_coalescer
from worker.providers.base import (
    ProviderStartError,
    ProviderUnavailable,
    Remedy,
    Scale,
    ScoreRequest,
    cache_identity,
    check_device,
)

if TYPE_CHECKING:
    from worker.engine import BackendChoice

log = structlog.get_logger("rerankq.provider.local")


def resolve_device(requested: str, *, allow_mps: bool) -> str:
    """``cpu``, ``cuda``/``cuda:N`` or, only when allowed, ``mps``.

    MPS keeps a kernel and allocator pool per input shape and never frees them;
    reranking is variable-length by nature, so it is opt-in.
    """
    import torch

    if requested == "mps":
        if not allow_mps:
            raise ProviderStartError("device", "mps is opt-in: set RERANKQ_RERANKER_ALLOW_MPS=true")
        return "mps"
    if requested.startswith("cuda") or requested == "gpu":
        if not torch.cuda.is_available():
            raise ProviderStartError("device", f"{requested} requested but CUDA is not available")
        return "cuda" if requested == "gpu" else requested
    if requested != "cpu":
        raise ProviderStartError("device", f"unknown device {requested!r}")
    return "cpu"


def activation_scale(model: object) -> Scale:
    """Read the scale from the model's configured activation, never from its outputs."""
    import torch

    activation = getattr(model, "activation_fn", None) or getattr(model, "default_activation_function", None)
    if isinstance(activation, (torch.nn.Sigmoid, torch.nn.Softmax)):
        return "probability"
    return "logit"


class LocalProvider:
    """The in-process model: one engine (one model copy) per process, shared by members
    naming the same model; with coalescing on, windows in flight together share a forward pass."""

    kind = "local"
    #: The stream's instruction is the model's prompt (CrossEncoder.predict(prompt=...)).
    accepts_instruction = True

    @staticmethod
    def check_config(member: MemberSettings) -> None:
        """What can be wrong before the model loads (MemberConfigError naming the field)."""
        check_device(member)

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        from worker.engine import BackendChoice, shared_engine

        self.model_name = member.model or DEFAULT_MODEL
        device = resolve_device(member.device or settings.worker.device, allow_mps=member.allow_mps)
        choice = BackendChoice.from_member(member)
        try:
            self.engine = shared_engine(self.model_name, device=device, settings=settings, backend=choice)
        except ProviderStartError:
            raise
        except Exception as exc:  # a missing model is an OSError, a bad one anything
            raise backend_start_error(exc, self.model_name, choice) from None
        self.scale: Scale | None = member.scale or activation_scale(self.engine.cross_encoder)
        # Scores differ in their last digits between backends, precisions and devices: a
        # cached score is only reused by the same model run the same way on the same kind of
        # device (an export by its digest, which names its options and calibration). The
        # scale changes how the number is read, so it is named too.
        backend = self.engine.backend
        self.cache_identity = cache_identity(
            self.kind,
            model=self.model_name,
            backend=backend.name,
            precision=self.engine.precision,
            artifact=backend.artifact,
            device=device.split(":")[0],
            scale=self.scale,
            control_strings=control_strings.RULE,
        )
        self.coalescer = (
            shared_coalescer(self.engine, self.engine.score_pairs, settings) if settings.engine.coalesce else None
        )
        log.info(
            "model_loaded",
            model=self.model_name,
            device=device,
            scale=self.scale,
            backend=backend.name,
            precision=self.engine.precision,
            coalesce=self.coalescer is not None,
        )

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        try:
            # The stream's instruction is the model's prompt, as CrossEncoder.predict(prompt=...) takes it.
            if self.coalescer is not None:
                scores = self.coalescer.score(
                    request.query, list(request.documents), deadline=deadline, prompt=request.instruction
                )
            else:
                scores = self.engine.score(request.query, list(request.documents), prompt=request.instruction)
        except CoalesceTimeout as exc:
            raise ProviderUnavailable("timeout", str(exc)) from None
        except Exception as exc:
            raise ProviderUnavailable("model_error", f"{type(exc).__name__}: {exc}") from None
        return [float(s) for s in scores]

    def close(self) -> None:
        pass  # the engine and coalescer live as long as the process; other members may share them


def backend_start_error(exc: Exception, model_name: str, choice: BackendChoice) -> ProviderStartError:
    """Why the engine did not start, with the member setting that would change it."""
    from worker.engine import BackendRefused, BackendUnavailable, CalibrationError
    from worker.engine.parity import EngineDisagrees

    if isinstance(exc, EngineDisagrees):
        return ProviderStartError(
            "engine_disagrees",
            f"{model_name}: {exc}",
            remedy=Remedy(
                "model",
                "point {variable} at a model the engine runs as the library "
                "does, or serve this one from a remote member",
            ),
        )
    if isinstance(exc, BackendRefused):
        return ProviderStartError(
            "backend_refused",
            f"{model_name}: {exc}",
            remedy=Remedy("backend", "set {variable}=torch, or drop the quantization"),
        )
    if isinstance(exc, BackendUnavailable):
        return ProviderStartError(
            "backend_unavailable",
            f"{model_name}: {exc}",
            remedy=Remedy("backend", "install it or set {variable}=torch"),
        )
    if isinstance(exc, CalibrationError):
        return ProviderStartError(
            "calibration", str(exc), remedy=Remedy("calibration", "fix the file {variable} names")
        )
    return ProviderStartError("model_load", f"{model_name} ({choice.name}): {type(exc).__name__}: {exc}")
