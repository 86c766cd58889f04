"""The in-process cross-encoder (sentence-transformers ``CrossEncoder``)."""

from __future__ import annotations

import structlog

from producer.settings import DEFAULT_MODEL, MemberSettings, Settings
from worker.engine.coalesce import CoalesceTimeout, shared_coalescer
from worker.providers.base import ProviderStartError, ProviderUnavailable, Scale, ScoreRequest, cache_identity

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

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        from worker.engine import shared_engine

        self.model_name = member.model or DEFAULT_MODEL
        device = resolve_device(member.device or settings.device, allow_mps=member.allow_mps)
        try:
            self.engine = shared_engine(self.model_name, device=device, settings=settings)
        except Exception as exc:  # a missing model is an OSError, a bad one anything
            raise ProviderStartError("model_load", f"{self.model_name}: {type(exc).__name__}: {exc}") from None
        self.scale: Scale | None = member.scale or activation_scale(self.engine.cross_encoder)
        # Scores differ in their last digits between precisions and devices: a cached score
        # is only reused by the same model at the same precision on the same kind of device.
        # The scale changes how the number is read, so it is named too.
        self.cache_identity = cache_identity(self.kind, model=self.model_name, precision=self.engine.precision,
                                             device=device.split(":")[0], scale=self.scale)
        self.coalescer = shared_coalescer(self.engine, self.engine.score_pairs, settings) if settings.coalesce else None
        log.info("model_loaded", model=self.model_name, device=device, scale=self.scale,
                 precision=self.engine.precision, coalesce=self.coalescer is not None)

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        try:
            if self.coalescer is not None:
                scores = self.coalescer.score(request.query, list(request.documents), deadline=deadline)
            else:
                scores = self.engine.score(request.query, list(request.documents))
        except CoalesceTimeout as exc:
            raise ProviderUnavailable("timeout", str(exc)) from None
        except Exception as exc:
            raise ProviderUnavailable("model_error", f"{type(exc).__name__}: {exc}") from None
        return [float(s) for s in scores]

    def close(self) -> None:
        pass  # the engine and coalescer live as long as the process; other members may share them

