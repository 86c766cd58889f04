"""Running an evaluation's queries through the real queue, one chain member at a time.

Each query is a stream: the top ``depth`` documents of the input run, in its order, as one
window (so the member ranks all of them together), opened with a chain profile that names
that member alone. The reranked window, followed by the rest of the input run in its
order, is the query's ranking, so a depth changes only what was reranked and every
measure's cutoff sees a full list.

Latency is measured per query from the client: ``total`` is open to a complete pull;
``queue`` is from the message being sent to the worker beginning the window
(``WindowResult.began_at``), ``scoring`` from there to the commit (provider call, scoring,
embeddings). Queries run one at a time, so no query waits behind another.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.trec import Collection
from kernel import stream_defaults
from kernel.errors import ConfigError
from kernel.limits import REMOTE_PASSAGE_TOKENS
from kernel.settings import MemberSettings
from kernel.wire import Failed, Filtered, Ranked
from producer import RerankClient, load_settings

#: The chain profile that forces member ``i``: RERANKQ_CHAIN_EVAL<i>=<i>.
PROFILE_PREFIX = "eval"


def profile_name(index: int) -> str:
    return f"{PROFILE_PREFIX}{index}"


@dataclass(frozen=True)
class ScoredPair:
    """One reranked document: the score its row got, the member's own (``raw``; the same
    number unless the row is calibrated), and its judged grade (None: unjudged)."""

    docid: str
    score: float
    raw: float
    calibrated: bool
    grade: int | None
    #: The document's place in the first stage (0 first): what a blend reads.
    first_stage_rank: int = 0


@dataclass
class QueryRun:
    qid: str
    ranking: list[str]
    total_ms: float
    queue_ms: float | None
    scoring_ms: float | None
    served_by: str | None
    failed: str | None = None
    scored: list[ScoredPair] = field(default_factory=list)


@dataclass
class MemberRun:
    """One member at one depth over the queries."""

    label: str
    depth: int
    queries: list[QueryRun] = field(default_factory=list)
    provider_calls: int = 0

    @property
    def failed(self) -> list[QueryRun]:
        return [q for q in self.queries if q.failed is not None]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95 and the mean, in the values' unit; empty when there are none."""
    if not values:
        return {}
    ordered = sorted(values)
    p95 = statistics.quantiles(ordered, n=20, method="inclusive")[-1] if len(ordered) > 1 else ordered[0]
    return {"p50": statistics.median(ordered), "p95": p95, "mean": statistics.fmean(ordered)}


def latency(run: MemberRun) -> dict[str, dict[str, float]]:
    served = [q for q in run.queries if q.failed is None]
    return {
        "total_ms": percentiles([q.total_ms for q in served]),
        "queue_ms": percentiles([q.queue_ms for q in served if q.queue_ms is not None]),
        "scoring_ms": percentiles([q.scoring_ms for q in served if q.scoring_ms is not None]),
    }


def candidates_for(collection: Collection, qid: str, depth: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for ranked in collection.run[qid][:depth]:
        document = collection.documents[ranked.docid]
        out.append(
            {
                "id": ranked.docid,
                "text": document.text,
                "source": "run",
                "fusion_score": ranked.score,
                "heading_path": [document.title] if document.title else [],
            }
        )
    return out


def rerank_query(
    client: RerankClient,
    collection: Collection,
    qid: str,
    *,
    depth: int,
    profile: str,
    timeout_s: float,
    long_documents: str | None = None,
) -> QueryRun:
    candidates = candidates_for(collection, qid, depth)
    started = time.perf_counter()
    # The streams are the evaluation's own: they need not outlive it by much.
    stream = client.open(
        collection.queries[qid],
        candidates,
        window_size=len(candidates),
        chain=profile,
        ttl_s=900,
        long_documents=long_documents,
    )
    sent_at = time.time()
    page = client.pull(stream, 0, len(candidates), timeout=timeout_s)
    total_ms = (time.perf_counter() - started) * 1000
    if not page.complete:
        raise TimeoutError(f"query {qid}: not scored within {timeout_s:.0f} s (is a worker running?)")
    result = client.store.snapshot(stream).results[0]
    # The window's decisions in final order (a subset's omitted ones last): a min-score filter
    # hides rows from a page, not from a ranking.
    reranked = [d.id for d in result.decisions]
    rest = [r.docid for r in collection.run[qid][depth:]]
    failed = (result.reason or "failed") if any(isinstance(d, Failed) for d in result.decisions) else None
    began = result.began_at
    judged = collection.qrels.get(qid, {})
    scored = [
        ScoredPair(
            docid=d.id,
            score=d.score,
            raw=d.raw_score if d.raw_score is not None else d.score,
            calibrated=d.calibrated,
            grade=judged.get(d.id),
            first_stage_rank=d.index,
        )
        for d in result.decisions
        # Seeded scores (fusion's, or a listwise member's places) are no relevance to calibrate.
        if isinstance(d, (Ranked, Filtered))
        and not result.passthrough
        and not result.scored_by_place
        and math.isfinite(d.score)
    ]
    return QueryRun(
        qid=qid,
        ranking=reranked + rest,
        total_ms=total_ms,
        queue_ms=(began - sent_at) * 1000 if began is not None else None,
        scoring_ms=(result.committed_at - began) * 1000 if began is not None else None,
        served_by=result.served_by,
        failed=failed,
        scored=scored,
    )


def run_member(
    client: RerankClient,
    collection: Collection,
    qids: Sequence[str],
    *,
    index: int,
    label: str,
    depth: int,
    timeout_s: float,
    progress: Callable[[str], None],
    long_documents: str | None = None,
) -> MemberRun:
    """Every query through member ``index`` alone. A member that fails the first query is
    not tried on the rest (it cannot start, or cannot serve): its reason is what is reported."""
    run = MemberRun(label=label, depth=depth)
    before = client.store.counters().get(f"provider_calls:{label}", 0)
    for n, qid in enumerate(qids, start=1):
        query = rerank_query(
            client,
            collection,
            qid,
            depth=depth,
            profile=profile_name(index),
            timeout_s=timeout_s,
            long_documents=long_documents,
        )
        run.queries.append(query)
        if n == 1 and query.failed is not None:
            if f"chain profile {profile_name(index)!r} is not configured" in query.failed:
                # Every member would be reported unavailable, and the tables come out empty.
                raise missing_profiles(index)
            break
        if n % 10 == 0 or n == len(qids):
            progress(f"{label} at depth {depth}: {n}/{len(qids)} queries")
    run.provider_calls = client.store.counters().get(f"provider_calls:{label}", 0) - before
    return run


def missing_profiles(index: int) -> ConfigError:
    """A configured Redis (its workers, or this host) lacks the profile that forces member ``index``."""
    variable = f"RERANKQ_CHAIN_{profile_name(index).upper()}"
    return ConfigError(
        "RERANKQ_REDIS_URL",
        f"its workers have no chain profile {profile_name(index)!r} to force member {index} with: unset "
        f"RERANKQ_REDIS_URL to evaluate on a private Redis and worker started here, or start those workers "
        f"with {variable}={index} (one RERANKQ_CHAIN_EVAL<i>=<i> per member evaluated)",
    )


@dataclass
class Stack:
    """Where the queries go: a client, and what was started for the evaluation."""

    client: RerankClient
    private: bool
    chain: list[MemberSettings]
    log_path: Path | None


@contextmanager
def stack(env: dict[str, str], *, max_depth: int, members: Sequence[int], device: str) -> Iterator[Stack]:
    """The configured Redis and its workers; with no RERANKQ_REDIS_URL, a private redis-server
    and worker, started here and stopped after.

    The private worker gets one chain profile per member (``RERANKQ_CHAIN_EVAL<i>``) and the
    pair-score cache off unless ``RERANKQ_PAIR_CACHE`` says otherwise, so each depth pays for
    its scoring and latencies are real. Workers
    of a configured Redis must have those profiles themselves.
    """
    from worker.embedded.redis_server import EmbeddedRedis
    from worker.embedded.worker_process import WorkerProcess

    env = dict(env)
    private = not env.get("RERANKQ_REDIS_URL")
    redis_server = worker = None
    log_path: Path | None = None
    try:
        if private:
            redis_server = EmbeddedRedis().start()
            env["RERANKQ_REDIS_URL"] = redis_server.url
            # Off unless asked for: a batch run's embedding cache (on with it) is worth measuring too.
            env.setdefault("RERANKQ_PAIR_CACHE", "false")
            # Each member is measured on its own and one that cannot start is reported as such, so
            # the private worker serves even when no member of its chain scores.
            env.setdefault("RERANKQ_SERVE_WITHOUT_SCORING", "true")
            env.setdefault("RERANKQ_MAX_WINDOW_SIZE", str(max(256, max_depth)))
            # One window holds a query's whole depth, every passage of it too, each with its header.
            env.setdefault(
                "RERANKQ_MAX_WINDOW_PASSAGE_TOKENS",
                str(max(1_048_576, max_depth * stream_defaults.MAX_PASSAGES * 2 * REMOTE_PASSAGE_TOKENS)),
            )
            for index in members:
                env[f"RERANKQ_CHAIN_{profile_name(index).upper()}"] = str(index)
            log_path = Path(tempfile.mkdtemp(prefix="rerankq-eval-")) / "worker.log"
            worker = WorkerProcess.rerankq(env, log_path, "--device", device).start(timeout_s=300)
        settings = load_settings(env)
        for index in members:
            if profile_name(index) not in settings.chain.profiles:
                raise missing_profiles(index)
        with RerankClient(settings) as client:
            yield Stack(client=client, private=private, chain=settings.chain.effective_members(), log_path=log_path)
    finally:
        if worker is not None:
            worker.stop()
        if redis_server is not None:
            redis_server.stop()


def environment_notes(env: dict[str, str]) -> dict[str, object]:
    """What the latencies depend on, for the report: the machine, and how busy it was."""
    return {
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "precision": env.get("RERANKQ_PRECISION", "auto"),
        "worker_processes": env.get("RERANKQ_WORKER_PROCESSES", "1"),
        "torch_threads": env.get("RERANKQ_TORCH_THREADS", "cores / processes"),
    }
