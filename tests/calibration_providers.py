"""A member on a skewed scale, for the calibration tests (loaded by import path; imports no torch).

It reads relevance from word overlap with the query, but squeezes every score into
[0.6, 1]: an unrelated document gets 0.6 and a bit, so ``min_score=0.5`` on its raw scores
keeps everything, where the embedding member's cosines put unrelated text near 0.
"""

from __future__ import annotations

import hashlib
import re

from worker.providers.base import ProviderUnavailable, ScoreRequest, cache_identity

WORDS = re.compile(r"[a-z]{4,}")
#: The chain profile whose odd windows this member cannot serve (a failover mid-stream).
FLAKY_PROFILE = "flaky"


def _noise(query: str, document: str) -> float:
    digest = hashlib.blake2b(f"{query}\x00{document}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


class SkewedProvider:
    kind = "skewed"
    scale = "probability"

    def __init__(self, member: object = None, settings: object = None) -> None:
        model = getattr(member, "model", None) or "skewed-1"
        self.cache_identity = cache_identity(self.kind, model=model, scale=self.scale)

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        if request.chain == FLAKY_PROFILE and request.window % 2 == 1:
            raise ProviderUnavailable("connect", "down for the odd windows of the flaky profile")
        asked = set(WORDS.findall(request.query.lower()))
        out: list[float | None] = []
        for document in request.documents:
            shared = len(asked & set(WORDS.findall(document.lower()))) / max(1, len(asked))
            out.append(0.6 + 0.3 * min(1.0, 2 * shared) + 0.05 * _noise(request.query, document))
        return out

    def close(self) -> None:
        pass
