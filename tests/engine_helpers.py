"""Starting an engine as the local member does, in the test's own process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from producer import load_settings
from worker.engine import BackendChoice, ScoringEngine, load_cross_encoder


def start_engine(model: Path, env: dict[str, str], **engine: Any) -> ScoringEngine:
    """A start of the local member's engine for ``model`` under the settings ``env`` gives (its
    backend and precision), as a new worker process makes one: ``shared_engine`` keeps one
    engine per process, so a second provider in one process would start nothing."""
    settings = load_settings(env)
    member = settings.chain.effective_members()[0]
    return ScoringEngine(
        load_cross_encoder(str(model), device="cpu"),
        settings=settings,
        backend=BackendChoice.from_member(member),
        model_name=str(model),
        **engine,
    )
