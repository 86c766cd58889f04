"""The in-process cross-encoder (sentence-transformers ``CrossEncoder``)."""

from __future__ import annotations

import structlog

from producer.settings import DEFAULT_MODEL, MemberSettings, Settings
from worker.providers.base import ProviderStartError, ProviderUnavailable, Scale, ScoreRequest

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
    kind = "local"

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        from worker.engine import ScoringEngine, load_cross_encoder

        self.model_name = member.model or DEFAULT_MODEL
        device = resolve_device(member.device or settings.device, allow_mps=member.allow_mps)
        try:
            model = load_cross_encoder(self.model_name, device=device)
        except Exception as exc:  # a missing model is an OSError, a bad one anything
            raise ProviderStartError("model_load", f"{self.model_name}: {type(exc).__name__}: {exc}") from None
        self.engine = ScoringEngine(model, settings=settings)
        self.scale: Scale | None = member.scale or activation_scale(model)
        log.info("model_loaded", model=self.model_name, device=device, scale=self.scale)

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        try:
            scores = self.engine.score(request.query, list(request.documents))
        except Exception as exc:
            raise ProviderUnavailable("model_error", f"{type(exc).__name__}: {exc}") from None
        return [float(s) for s in scores]

    def close(self) -> None:
        pass
