"""The candidate budget, applied by the producer before windows form."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.types import CountOrOff, PositiveInt, doc


class BudgetSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    max_rerank_candidates: Annotated[PositiveInt, doc("global cap on the candidates reranked per stream")] = 300
    max_rerank_candidates_low: Annotated[CountOrOff, doc("cap for open(budget='low'); 0: the global cap")] = 0
    max_rerank_candidates_mid: Annotated[CountOrOff, doc("cap for open(budget='mid'); 0: the global cap")] = 0
    max_rerank_candidates_high: Annotated[CountOrOff, doc("cap for open(budget='high'); 0: the global cap")] = 0
    max_candidates_per_source: Annotated[CountOrOff, doc("per-arm cap, applied first; 0: off")] = 0
    strategy_boosts: Annotated[str, doc("source:level,... (levels low, mid, high), e.g. graph:high,bm25:low")] = ""
