"""What every member's answer must pass before the chain trusts it."""

from __future__ import annotations

import math
import threading

from worker.providers.base import Provider, Scale, ScoreRequest, UnusableResponse

# Defaults of ChainSettings.flat_min_window / flat_range: scores flat across a window this
# large are a broken model, not a judgement.
FLAT_MIN_WINDOW = 8
FLAT_RANGE = 1e-6
# Calibrated scores may come back a rounding error outside [0, 1].
PROBABILITY_SLACK = 1e-6


def check_scores(
    scores: list[float | None],
    n_documents: int,
    *,
    scale: Scale | None = None,
    flat_min_window: int = FLAT_MIN_WINDOW,
    flat_range: float = FLAT_RANGE,
) -> None:
    """Generic checks every member's answer passes before it is trusted."""
    if len(scores) != n_documents:
        raise UnusableResponse("wrong_count", f"{len(scores)} scores for {n_documents} documents")
    present = [s for s in scores if s is not None]
    if any(not math.isfinite(s) for s in present):
        raise UnusableResponse("non_finite", "NaN or infinite score")
    if scale == "probability" and any(not -PROBABILITY_SLACK <= s <= 1 + PROBABILITY_SLACK for s in present):
        # A member declared calibrated that emits logits would rank on the wrong scale.
        raise UnusableResponse("out_of_scale", "a score outside [0, 1] from a member declared 'probability'")
    if scale == "cosine" and any(not -1 - PROBABILITY_SLACK <= s <= 1 + PROBABILITY_SLACK for s in present):
        raise UnusableResponse("out_of_scale", "a score outside [-1, 1] from a member declared 'cosine'")
    if scale == "rank" and (
        len(set(present)) != len(present) or any(s != int(s) or not 0 <= s < n_documents for s in present)
    ):
        # Places in an order: each a whole number below the window's size, none twice.
        raise UnusableResponse("not_a_ranking", "places that are not distinct whole numbers within the window")
    if len(present) >= flat_min_window and max(present) - min(present) < flat_range:
        raise UnusableResponse("flat_scores", f"range under {flat_range} across {len(present)} documents")


class CheckedProvider:
    """A member's raw provider as the chain trusts it: every answer is checked here,
    beneath ``wrap``, so the pair-score cache above never keeps a NaN or flat answer
    (it would serve it back, be rejected again, and hide the member's recovery).

    It also notes, per thread, whether the provider was really called, so the breaker
    learns only from real calls and not from windows the cache answered.
    """

    def __init__(self, inner: Provider, *, flat_min_window: int, flat_range: float) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.remote = bool(getattr(inner, "remote", False))
        self.flat_min_window = flat_min_window
        self.flat_range = flat_range
        self._calls = threading.local()

    @property
    def scale(self) -> Scale | None:
        return self.inner.scale

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # e.g. cache_identity, engine

    def begin(self) -> None:
        self._calls.made = False

    @property
    def called(self) -> bool:
        return getattr(self._calls, "made", True)

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        self._calls.made = True
        scores = self.inner.score(request, deadline=deadline)
        check_scores(
            scores,
            len(request.documents),
            scale=self.inner.scale,
            flat_min_window=self.flat_min_window,
            flat_range=self.flat_range,
        )
        return scores

    def close(self) -> None:
        self.inner.close()
