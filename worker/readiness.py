"""Whether a worker can score at all, decided before it takes a window from a device queue.

A worker whose chain has no member that scores (anything but ``rrf``) would commit its share
of every tenant's windows in fusion order, or as failed, and look ready doing it. It refuses
to start instead, in one line naming the fix, unless passthrough is what was asked for: a
chain configured with ``rrf`` members only, or ``RERANKQ_SERVE_WITHOUT_SCORING=true``.
"""

from __future__ import annotations

from kernel.settings import Settings
from worker.providers.base import ProviderStartError

INSTALL_WORKER = "pip install 'rerankq[worker]'"


def passthrough_on_purpose(settings: Settings) -> bool:
    """Whether this worker was asked to serve without a scoring member (the default chain never is)."""
    configured = settings.chain.members
    rrf_only = bool(configured) and all(m.provider == "rrf" for m in configured)
    return rrf_only or settings.worker.serve_without_scoring


def cause(member: str, exc: ProviderStartError) -> str:
    """One member's failed start in words, with the fix when it is a missing install."""
    detail = f"{exc.reason}: {exc.detail}" if exc.detail else exc.reason
    if "No module named 'torch'" in exc.detail:
        return f"{member} needs torch, which is not installed ({INSTALL_WORKER})"
    return f"{member} cannot start ({detail})"


def explain(causes: list[str]) -> str:
    if not causes:
        return "the chain has no member that scores (set RERANKQ_SERVE_WITHOUT_SCORING=true if fusion order is meant)"
    return (
        "no chain member that scores can start: "
        + "; ".join(causes)
        + " (or set RERANKQ_SERVE_WITHOUT_SCORING=true to serve fusion order on purpose)"
    )
