"""Running an evaluation's queries through the real queue as a cascade of chain members.

Each query is one stream whose stages are the members chosen (``--stages 1:100,0:20``), each
forced by its chain profile (``RERANKQ_CHAIN_EVAL<i>``, as ``evaluation.runner`` forces a member
alone): the first stage reads the top ``keep`` of the input run in one window (as a member
alone ranks its whole depth together), each later stage re-reads the previous stage's best
``keep`` rows in windows of its own (``producer/stages.py``). The query's ranking is the page
(the last stage's rows, then each earlier stage's rest) followed by the rest of the input run.

The ranking after each stage is measured too: that stage's rows in its order, then the ranking
after the stage before it, less what this stage read. A later stage's window that failed keeps
its rows in the order it read them, the earlier stage's, as the page does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evaluation.runner import candidates_for, percentiles, profile_name
from evaluation.trec import Collection
from kernel.store import Snapshot
from kernel.wire import Cancelled, Failed, WindowResult
from producer import RerankClient


@dataclass(frozen=True)
class StagePlan:
    """One stage as asked: the chain member that scores it and how many rows it reads."""

    member: int
    keep: int
    label: str


@dataclass
class StageOutcome:
    """What one stage did for one query."""

    ranking: list[str]
    read: int
    windows: int
    scoring_ms: float | None
    served_by: list[str]
    #: Rows the stage read but left in the earlier stage's order (its window failed or was late).
    fell_back: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass
class CascadeQuery:
    qid: str
    #: The page's rows, then the rest of the input run.
    ranking: list[str]
    total_ms: float
    stages: list[StageOutcome]


@dataclass
class CascadeRun:
    plan: list[StagePlan]
    queries: list[CascadeQuery] = field(default_factory=list)
    #: Provider calls each stage's member made over the queries (the members are distinct).
    provider_calls: list[int] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return self.plan[0].keep


def stage_latency(run: CascadeRun) -> tuple[dict[str, float], list[dict[str, float]]]:
    """p50/p95/mean of the total per query, and of each stage's own scoring time."""
    total = percentiles([q.total_ms for q in run.queries])
    stages = [
        percentiles([ms for q in run.queries if (ms := q.stages[k].scoring_ms) is not None])
        for k in range(len(run.plan))
    ]
    return total, stages


def _scoring_ms(results: Sequence[WindowResult]) -> float | None:
    """The stage's own scoring: each of its windows' worker start to commit, summed."""
    spans = [(r.committed_at - r.began_at) * 1000 for r in results if r.began_at is not None]
    return sum(spans) if spans else None


def stage_outcomes(snapshot: Snapshot, first_ranking: Sequence[str], rest: Sequence[str]) -> list[StageOutcome]:
    """Each stage's ranking and cost from a complete cascade's snapshot. ``first_ranking``: the
    candidates the first stage read (the input run's top keep); ``rest``: the run past them."""
    outcomes = []
    ranking: list[str] = list(first_ranking) + list(rest)
    for stage in snapshot.stage_windows():
        if stage.number == 1:
            numbers = list(range(snapshot.n_windows))
            read = snapshot.n_candidates
        else:
            handed = snapshot.handed.get(stage.number)
            if handed is None:
                raise RuntimeError(f"stage {stage.number} was never handed its rows, though the stream is complete")
            numbers = list(range(stage.first, stage.first + handed.windows))
            read = len(handed.members)
        results = [snapshot.results[w] for w in numbers]
        # Every decision of the stage's windows, in order: a failed window's are in the order it
        # read them, the earlier stage's, so the ranking keeps that order as the page does.
        decisions = [d for r in results for d in r.decisions]
        mine = [d.id for d in decisions]
        taken = set(mine)
        ranking = mine + [d for d in ranking if d not in taken]
        fell_back = [d for d in decisions if isinstance(d, (Failed, Cancelled))]
        outcomes.append(
            StageOutcome(
                ranking=ranking,
                read=read,
                windows=len(results),
                scoring_ms=_scoring_ms(results),
                served_by=sorted({r.served_by for r in results if r.served_by}),
                fell_back=len(fell_back),
                reasons=sorted({d.reason or "failed" for d in fell_back}),
            )
        )
    return outcomes


def rerank_cascade(
    client: RerankClient,
    collection: Collection,
    qid: str,
    plan: Sequence[StagePlan],
    *,
    timeout_s: float,
    long_documents: str | None = None,
) -> CascadeQuery:
    candidates = candidates_for(collection, qid, plan[0].keep)
    started = time.perf_counter()
    stream = client.open(
        collection.queries[qid],
        candidates,
        # The first stage ranks its whole keep together, as a member alone ranks its depth.
        window_size=len(candidates),
        stages=[{"chain": profile_name(s.member), "keep": s.keep} for s in plan],
        ttl_s=900,
        long_documents=long_documents,
    )
    page = client.pull(stream, 0, len(candidates), timeout=timeout_s)
    total_ms = (time.perf_counter() - started) * 1000
    if not page.complete:
        raise TimeoutError(f"query {qid}: the cascade was not scored within {timeout_s:.0f} s (is a worker running?)")
    rest = [r.docid for r in collection.run[qid][plan[0].keep :]]
    stages = stage_outcomes(client.store.snapshot(stream), [str(c["id"]) for c in candidates], rest)
    return CascadeQuery(qid=qid, ranking=[row.id for row in page.rows] + rest, total_ms=total_ms, stages=stages)


def run_cascade(
    client: RerankClient,
    collection: Collection,
    qids: Sequence[str],
    plan: Sequence[StagePlan],
    *,
    timeout_s: float,
    progress: Callable[[str], None],
    long_documents: str | None = None,
) -> CascadeRun:
    """Every query through the cascade, one at a time."""
    run = CascadeRun(plan=list(plan))
    before = client.store.counters()
    for n, qid in enumerate(qids, start=1):
        run.queries.append(
            rerank_cascade(client, collection, qid, plan, timeout_s=timeout_s, long_documents=long_documents)
        )
        if n % 10 == 0 or n == len(qids):
            progress(f"cascade {describe(plan)}: {n}/{len(qids)} queries")
    after = client.store.counters()
    run.provider_calls = [
        after.get(f"provider_calls:{s.label}", 0) - before.get(f"provider_calls:{s.label}", 0) for s in plan
    ]
    return run


def describe(plan: Sequence[StagePlan]) -> str:
    """``1:embedding@100 > 0:local@20``: each stage's member and keep, first to last."""
    return " > ".join(f"{s.label}@{s.keep}" for s in plan)
