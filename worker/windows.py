"""Score one window exactly once: begin, load, score through the chain, commit."""

from __future__ import annotations

import time

import structlog

from producer.settings import Settings
from producer.store import Store
from producer.wire import Failed, WindowResult
from worker.chain import Chain
from worker.providers.base import ScoreRequest
from worker.scoring.decide import decide
from worker.scoring.documents import assemble, has_text

log = structlog.get_logger("rerankq.window")


class WindowScorer:
    def __init__(self, settings: Settings, store: Store, chain: Chain) -> None:
        self.settings = settings
        self.store = store
        self.chain = chain

    def process(self, stream_id: str, window: int, *, delivery: str) -> str:
        """Returns what happened: committed, already_committed, not_admitted, gone, in_progress, failed.

        ``delivery`` names this message (the Celery task id): the same message coming
        back after its process died takes the window over; another one is a duplicate.
        """
        bound = log.bind(stream=stream_id, window=window)
        attempt = self.store.begin(stream_id, window, work_deadline_s=self.settings.redeliver_after_s,
                                   delivery=delivery)
        if attempt == -4:
            bound.info("window_in_progress_elsewhere")
            return "in_progress"
        if attempt > 1:
            # A redelivery: an earlier attempt died (killed process, lost message, time limit).
            bound.warning("window_attempt_again", attempt=attempt, max_attempts=self.settings.max_attempts)
        if attempt == -1:
            bound.debug("window_already_committed")
            return "already_committed"
        if attempt == -2:
            bound.warning("window_not_admitted")
            return "not_admitted"
        if attempt == -3:
            bound.info("stream_gone")
            return "gone"
        spec = self.store.load_spec(stream_id)
        start = window * spec.window_size
        end = min(start + spec.window_size, spec.n_candidates)
        candidates = self.store.load_candidates(stream_id, start, end)
        documents = [assemble(c, spec.query, budget=spec.document_budget) for c in candidates]

        if attempt > self.settings.max_attempts:
            # A window that keeps killing its process is committed as failed, not looped on.
            reason = f"poison: gave up after {attempt - 1} attempts"
            bound.error("window_poisoned", attempts=attempt - 1, reason=reason)
            decisions = [
                Failed(id=c.id, index=start + i, document=documents[i], reason=reason)
                for i, c in enumerate(candidates)
            ]
            result = WindowResult(window=window, start=start, end=end, served_by=None, passthrough=False,
                                  attempts=attempt - 1, committed_at=time.time(), decisions=decisions, reason=reason)
            if self.store.commit(stream_id, result) == 1:
                self.store.incr_counter("windows_poisoned")
            return "failed"

        scorable = [i for i, c in enumerate(candidates) if has_text(c)]
        request = ScoreRequest(query=spec.query, documents=[documents[i] for i in scorable],
                               stream_id=stream_id, window=window, tenant=spec.tenant, chain=spec.chain)
        outcome = self.chain.run(request)
        if outcome.scores is not None:
            # Re-spread the member's scores over the whole window (text-less rows get none).
            full: list[float | None] = [None] * len(candidates)
            for pos, i in enumerate(scorable):
                full[i] = outcome.scores[pos]
            outcome.scores = full
        decisions = decide(spec, candidates, documents, outcome, first_index=start)
        result = WindowResult(
            window=window, start=start, end=end, served_by=outcome.served_by, passthrough=outcome.passthrough,
            attempts=attempt, committed_at=time.time(), decisions=decisions, failovers=outcome.failovers,
            reason=outcome.reason,
        )
        written = self.store.commit(stream_id, result)
        if written == 1:
            self.store.incr_counter("windows_committed")
            if outcome.failed:
                self.store.incr_counter("windows_failed")
            bound.info("window_committed", served_by=outcome.served_by, candidates=len(candidates),
                       failovers=len(outcome.failovers))
            return "failed" if outcome.failed else "committed"
        bound.info("window_commit_lost_race")
        return "already_committed"
