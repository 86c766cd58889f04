"""Turn a chain outcome into a window's decisions: normalise, seed, filter, order."""

from __future__ import annotations

import math

from producer.wire import Candidate, Decision, Failed, Filtered, Omitted, Ranked, StreamSpec
from worker.chain import ChainOutcome


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def normalise(score: float, scale: str) -> float:
    """Declared per provider: probabilities as they are, logits through a sigmoid. Never by rank."""
    return sigmoid(score) if scale == "logit" else score


def seeded_scores(n: int) -> list[float]:
    """Fusion rank mapped onto [0.1, 1.0], so boosts modulate fusion order instead of replacing it."""
    if n == 1:
        return [1.0]
    return [1.0 - 0.9 * rank / (n - 1) for rank in range(n)]


def decide(
    spec: StreamSpec,
    candidates: list[Candidate],
    documents: list[str],
    outcome: ChainOutcome,
    *,
    first_index: int,
) -> list[Decision]:
    """Decisions for one window, in final order (final score desc, fusion order on ties)."""
    if outcome.failed:
        reason = outcome.reason or "failed"
        return [
            Failed(id=c.id, index=first_index + i, document=documents[i], reason=reason)
            for i, c in enumerate(candidates)
        ]
    served_by = outcome.served_by or ""
    if outcome.passthrough:
        base: list[float | None] = list(seeded_scores(len(candidates)))
    else:
        assert outcome.scores is not None and outcome.scale is not None
        base = [None if s is None else normalise(s, outcome.scale) for s in outcome.scores]

    scored: list[tuple[float, int, Decision]] = []
    omitted: list[Decision] = []
    for i, c in enumerate(candidates):
        index = first_index + i
        if not c.text:
            # No text: sinks to the bottom of its window, never dropped.
            score = final = -math.inf
        elif base[i] is None:
            omitted.append(Omitted(id=c.id, index=index, document=documents[i], served_by=served_by))
            continue
        else:
            score = final = base[i]  # type: ignore[assignment]
        reason = None
        if not outcome.passthrough and math.isfinite(score):
            if spec.min_score is not None and score < spec.min_score:
                reason = "min_score"
            elif spec.min_final_score is not None and final < spec.min_final_score:
                reason = "min_final_score"
        decision: Decision
        if reason:
            decision = Filtered(id=c.id, index=index, document=documents[i], score=score, final_score=final,
                                served_by=served_by, reason=reason)
        else:
            decision = Ranked(id=c.id, index=index, document=documents[i], score=score, final_score=final,
                              served_by=served_by)
        scored.append((final, i, decision))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [d for _, _, d in scored] + omitted
