"""A provider whose ranking a test can work out by hand, for the evaluation harness's tests
(loaded by import path; imports no torch)."""

from __future__ import annotations

from worker.providers.base import ScoreRequest


class KeywordProvider:
    """0.9 for a document that mentions "fix", 0.1 otherwise: the fixes first, each group in
    fusion order (the window's tie-break)."""

    kind = "keyword"
    scale = "probability"

    def __init__(self, member: object = None, settings: object = None) -> None:
        pass

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        return [0.9 if "fix" in d.lower() else 0.1 for d in request.documents]

    def close(self) -> None:
        pass


class ShortestFirstProvider:
    """The shorter the document, the higher its score (no two of the tests' documents are the same
    length): another order than KeywordProvider's, for a cascade's second stage."""

    kind = "shortest"
    scale = "probability"

    def __init__(self, member: object = None, settings: object = None) -> None:
        pass

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        return [1 / (1 + len(d)) for d in request.documents]

    def close(self) -> None:
        pass
