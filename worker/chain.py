"""The provider chain: members tried in order until one serves the window.

A member is skipped on any ProviderError (timeout, connection, HTTP, unusable
response) or when it cannot start; a member that cannot start is retried on a
later window rather than taking the worker down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from producer.settings import MemberSettings, Settings
from worker.providers import build_provider
from worker.providers.base import Provider, ProviderError, ProviderStartError, Scale, ScoreRequest, UnusableResponse

log = structlog.get_logger("rerankq.chain")

# Scores flat across a window this large are a broken model, not a judgement.
FLAT_MIN_WINDOW = 8
FLAT_RANGE = 1e-6


@dataclass
class ChainOutcome:
    served_by: str | None
    scale: Scale | None
    scores: list[float | None] | None
    failovers: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def passthrough(self) -> bool:
        return self.served_by is not None and self.scale is None

    @property
    def failed(self) -> bool:
        return self.served_by is None


def check_scores(scores: list[float | None], n_documents: int) -> None:
    """Generic checks every member's answer passes before it is trusted."""
    if len(scores) != n_documents:
        raise UnusableResponse("wrong_count", f"{len(scores)} scores for {n_documents} documents")
    present = [s for s in scores if s is not None]
    if any(not math.isfinite(s) for s in present):
        raise UnusableResponse("non_finite", "NaN or infinite score")
    if len(present) >= FLAT_MIN_WINDOW and max(present) - min(present) < FLAT_RANGE:
        raise UnusableResponse("flat_scores", f"range under {FLAT_RANGE} across {len(present)} documents")


class Member:
    """One configured provider; built on first use, rebuilt after a failed start."""

    def __init__(self, index: int, settings: MemberSettings, build: Callable[[], Provider]) -> None:
        self.index = index
        self.settings = settings
        self.label = f"{index}:{settings.provider}"
        self._build = build
        self._provider: Provider | None = None

    def provider(self) -> Provider:
        if self._provider is None:
            self._provider = self._build()
        return self._provider

    def close(self) -> None:
        if self._provider is not None:
            self._provider.close()


class Chain:
    def __init__(
        self,
        members: list[Member],
        *,
        on_call: Callable[[str], None] | None = None,
        on_failover: Callable[[str, str], None] | None = None,
    ) -> None:
        self.members = members
        self._on_call = on_call or (lambda label: None)
        self._on_failover = on_failover or (lambda label, reason: None)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        wrap: Callable[[int, MemberSettings, Provider], Provider] | None = None,
        **kwargs: object,
    ) -> Chain:
        """Members from settings; ``wrap`` decorates each built provider (the pair-score cache)."""

        def builder(index: int, member: MemberSettings) -> Callable[[], Provider]:
            def build() -> Provider:
                provider = build_provider(member, settings)
                return wrap(index, member, provider) if wrap else provider
            return build

        members = [Member(i, m, builder(i, m)) for i, m in enumerate(settings.chain())]
        return cls(members, **kwargs)  # type: ignore[arg-type]

    def warm_up(self) -> None:
        """Start every member now (model load at process start); failures are logged, not fatal."""
        for member in self.members:
            try:
                member.provider()
            except ProviderStartError as exc:
                log.warning("member_start_failed", member=member.label, reason=exc.reason, detail=exc.detail)

    def run(self, request: ScoreRequest) -> ChainOutcome:
        failovers: list[str] = []
        for member in self.members:
            try:
                provider = member.provider()
                self._on_call(member.label)
                deadline = time.monotonic() + member.settings.timeout_s
                scores = provider.score(request, deadline=deadline)
                check_scores(scores, len(request.documents))
            except ProviderError as exc:
                failovers.append(f"{member.label}: {exc.reason}")
                log.warning(
                    "reranker_failover", member=member.label, reason=exc.reason, detail=exc.detail,
                    stream=request.stream_id, window=request.window,
                )
                self._on_failover(member.label, exc.reason)
                continue
            return ChainOutcome(served_by=member.label, scale=provider.scale, scores=scores, failovers=failovers)
        return ChainOutcome(
            served_by=None, scale=None, scores=None, failovers=failovers,
            reason="all members failed: " + "; ".join(failovers),
        )

    def close(self) -> None:
        for member in self.members:
            member.close()
