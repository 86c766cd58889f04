"""Score one window exactly once: begin (and read the window), score through the chain, commit."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
import redis
import structlog

from kernel import store as codes
from kernel.cost import WORK_SHARE_OF_LEASE
from kernel.fair_share import Released
from kernel.limits import MAX_EMBEDDING_DIMS
from kernel.redis_clients import UNAVAILABLE_ERRORS, is_no_replicas
from kernel.settings import Settings
from kernel.store import Begun, Commit, Store
from kernel.wire import (
    Candidate,
    Decision,
    Failed,
    Filtered,
    Omitted,
    StreamSpec,
    WindowEmbeddings,
    WindowResult,
    candidate_decoder,
    pack_embeddings,
    spec_decoder,
)
from worker.chain import Chain, ChainOutcome
from worker.fair_release import ShareReturn
from worker.metrics.recorder import NO_METRICS, Recorder
from worker.providers.base import ScoreRequest
from worker.scoring.calibration import Calibrations
from worker.scoring.decide import decide, ranked_by_member
from worker.scoring.documents import assemble, has_text
from worker.scoring.passages import chain_cutter, scored_passages, window_passages
from worker.side_writes import SideWrite, held_for_commit
from worker.window_place import Undecodable, WindowPlace, place_at_worst, place_of

log = structlog.get_logger("rerankq.window")

T = TypeVar("T")

# While Redis refuses writes (maxmemory), a window waits, backing off up to this long
# between tries, for as long as its lease lasts: a full Redis is waited out like a
# restarting one, not turned into a lost or failed window.
FULL_REDIS_MAX_BACKOFF_S = 2.0
#: What a store call is retried on (``_through_full_redis`` tells a full Redis from other refusals).
_RETRIED: tuple[type[Exception], ...] = (redis.exceptions.ResponseError, *UNAVAILABLE_ERRORS)

#: Who served a window none of whose candidates has text: nobody was asked.
NO_TEXT = "no_text"


def decode_window(begun: Begun) -> tuple[StreamSpec, list[Candidate]]:
    try:
        spec = spec_decoder.decode(begun.spec)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Undecodable(f"undecodable stream spec: {exc}") from None
    candidates = []
    for i, blob in enumerate(begun.candidates):
        try:
            candidates.append(candidate_decoder.decode(blob))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Undecodable(f"undecodable candidate {i} of the window: {exc}") from None
    return spec, candidates


def _stored_id(blob: bytes, fallback: str) -> str:
    """A candidate's id as stored, read leniently, for the failed decisions of an undecodable window."""
    try:
        value = msgspec.msgpack.decode(blob)
    except msgspec.DecodeError:
        return fallback
    candidate_id = value.get("id") if isinstance(value, dict) else None
    return candidate_id if isinstance(candidate_id, str) else fallback


def kept_embeddings(
    outcome: ChainOutcome, window: int, indexes: list[int], documents: Sequence[str], bound: Any
) -> WindowEmbeddings | None:
    """The serving member's embeddings of the scored documents, to keep beside the decisions.

    Only a member that embeds (``embedding``) has them. They are a convenience for readers
    (MMR): a failure to get them is logged and the window commits without them.
    """
    if outcome.embed is None or outcome.served_by is None or not indexes:
        return None
    try:
        vectors = outcome.embed(list(documents))
        if vectors and len(vectors[0]) > MAX_EMBEDDING_DIMS:
            bound.warning("embeddings_not_kept", reason=f"more than {MAX_EMBEDDING_DIMS} dimensions")
            return None
        return pack_embeddings(window, outcome.served_by, indexes, vectors)
    except Exception as exc:
        bound.warning("embeddings_not_kept", reason=f"{type(exc).__name__}: {exc}")
        return None


class WindowScorer:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        chain: Chain,
        recorder: Recorder = NO_METRICS,
        calibrations: Calibrations | None = None,
        share_return: ShareReturn | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.chain = chain
        self.recorder = recorder
        self.calibrations = calibrations
        self.share_return = share_return

    def _through_full_redis(self, call: Callable[[], T], *, until: float, bound: Any) -> T:
        """``call()``, retried while Redis is at maxmemory, or failing over (a cluster slot without a
        master, a Sentinel master being replaced or refusing writes with NOREPLICAS), until the
        monotonic instant ``until``. Each
        store call is safe to repeat (``commit`` writes once; ``begin`` takes over its own lease,
        at worst counting one attempt more, as the client's own reconnect retries always could)."""
        pause = 0.1
        warned = False
        while True:
            try:
                return call()
            except _RETRIED as exc:
                # A full Redis; or a master refusing writes for want of replicas in sync
                # (NOREPLICAS, raw where no rerankq connection class converted it: a cluster node).
                if isinstance(exc, redis.exceptions.ResponseError) and not (
                    isinstance(exc, redis.exceptions.OutOfMemoryError) or is_no_replicas(exc)
                ):
                    raise
                if time.monotonic() + pause > until:
                    raise
                if not warned:
                    event = (
                        "redis_full_waiting"
                        if isinstance(exc, redis.exceptions.OutOfMemoryError)
                        else "store_unavailable_waiting"
                    )
                    bound.warning(event, max_wait_s=round(until - time.monotonic(), 1), error=type(exc).__name__)
                    warned = True
                time.sleep(pause)
                pause = min(FULL_REDIS_MAX_BACKOFF_S, pause * 2)

    def process(self, stream_id: str, window: int, *, delivery: str, takeover: bool = False) -> str:
        """Returns what happened: committed, failed, already_committed, not_admitted, gone,
        in_progress or no_such_window.

        ``delivery`` names this message (the Celery task id). While an attempt's lease is live,
        every other delivery of the window is turned away uncounted, a copy of this very message
        too, unless ``takeover``: the broker itself hands this message back (``Store.begin``).
        """
        began_at = time.time()  # the queue's part of a window's latency ends here
        bound = log.bind(stream=stream_id, window=window)
        # The lease is this attempt's whole budget, waits for a full Redis included.
        until = time.monotonic() + self.settings.queues.redeliver_after_s * WORK_SHARE_OF_LEASE
        begun = self._through_full_redis(
            lambda: self.store.begin(
                stream_id,
                window,
                work_deadline_s=self.settings.queues.redeliver_after_s,
                delivery=delivery,
                takeover=takeover,
            ),
            until=until,
            bound=bound,
        )
        if isinstance(begun, int):
            return self._not_begun(begun, bound)
        scoring_started = time.perf_counter()
        self.recorder.window_begun(attempt=begun.attempt, admitted_at_ms=begun.admitted_at_ms)
        if begun.attempt > 1:
            # A redelivery: an earlier attempt died (killed process, lost message, time limit).
            bound.warning("window_attempt_again", attempt=begun.attempt, max_attempts=self.settings.queues.max_attempts)
        if begun.attempt > self.settings.queues.max_attempts:
            # A window that keeps killing its process is committed as failed, not looped on.
            reason = f"poison: gave up after {begun.attempt - 1} attempts"
            bound.error("window_poisoned", attempts=begun.attempt - 1, reason=reason)
            return self._commit_failed(
                stream_id,
                window,
                begun,
                reason,
                outcome="poisoned",
                attempts=begun.attempt - 1,
                until=until,
                bound=bound,
            )
        try:
            spec, candidates = decode_window(begun)
            place = place_of(spec, window, begun)
        except Undecodable as exc:
            bound.error("window_undecodable", reason=str(exc))
            return self._commit_failed(
                stream_id, window, begun, str(exc), outcome="failed", attempts=begun.attempt, until=until, bound=bound
            )
        if place.past_time_budget(begun.admitted_at_ms):
            # Its stage's time ran out before a worker reached it: its rows keep the previous
            # stage's order, and the stream says why.
            assert place.later is not None
            reason = f"budget: max_seconds={place.later.max_seconds:g} ran out before the window began"
            bound.info("window_past_stage_budget", stage=place.stage, reason=reason)
            return self._commit_failed(
                stream_id,
                window,
                begun,
                reason,
                outcome="skipped",
                attempts=begun.attempt,
                until=until,
                bound=bound,
                place=place,
            )

        # The cache's writes and the counters go with the commit, in its round trip.
        with held_for_commit() as side_writes:
            return self._score_and_commit(
                stream_id,
                window,
                spec,
                place,
                candidates,
                begun,
                began_at,
                scoring_started,
                until=until,
                bound=bound,
                side_writes=side_writes,
            )

    def _score_and_commit(
        self,
        stream_id: str,
        window: int,
        spec: StreamSpec,
        place: WindowPlace,
        candidates: list[Candidate],
        begun: Begun,
        began_at: float,
        scoring_started: float,
        *,
        until: float,
        bound: Any,
        side_writes: list[SideWrite],
    ) -> str:
        documents = [assemble(c, spec.query, budget=spec.document_budget) for c in candidates]
        scorable = [i for i, c in enumerate(candidates) if has_text(c)]
        passages = (
            window_passages(candidates, spec, chain_cutter(self.chain.members_for(place.chain)))
            if spec.long_documents == "passages"
            else None
        )
        ceiling = self.settings.streams.max_window_passage_tokens
        if passages is not None and passages.tokens > ceiling:
            # open holds a stream under the ceiling; a stream opened under another one (an older
            # producer, other settings) is refused here, before any member is sent a token.
            reason = (
                f"the window's passages would send {passages.tokens} tokens, over "
                f"RERANKQ_MAX_WINDOW_PASSAGE_TOKENS ({ceiling})"
            )
            bound.error("window_over_passage_ceiling", tokens=passages.tokens, ceiling=ceiling)
            return self._commit_failed(
                stream_id,
                window,
                begun,
                reason,
                outcome="failed",
                attempts=begun.attempt,
                until=until,
                bound=bound,
                place=place,
            )
        request = ScoreRequest(
            query=spec.query,
            documents=passages.texts if passages else [documents[i] for i in scorable],
            stream_id=stream_id,
            window=window,
            tenant=spec.tenant,
            chain=place.chain,
            instruction=spec.instruction,
        )
        # Nothing to read (every candidate blank): no member is asked, as a member would refuse
        # a request of no documents (TEI: 400 "`texts` cannot be empty") or be paid for one.
        outcome = (
            self.chain.run(request)
            if request.documents
            else ChainOutcome(served_by=NO_TEXT, scale="probability", scores=[])
        )
        spans = None
        if passages is not None:
            spans = scored_passages(passages, outcome, spec, documents)
        elif outcome.scores is not None:
            # Re-spread the member's scores over the whole window (text-less rows get none).
            full: list[float | None] = [None] * len(candidates)
            for pos, i in enumerate(scorable):
                full[i] = outcome.scores[pos]
            outcome.scores = full
        calibration, weight = None, None
        if self.calibrations is not None and outcome.served_by is not None and not outcome.passthrough:
            calibration = self.calibrations.map_for(
                profile=place.chain, label=outcome.served_by, cache_identity=outcome.identity
            )
            weight = self.calibrations.first_stage_weight_for(profile=place.chain, cache_identity=outcome.identity)
        decisions = decide(
            spec,
            candidates,
            documents,
            outcome,
            indexes=place.indexes,
            calibration=calibration,
            passages=spans,
            first_stage_weight=weight,
        )
        embeddings = kept_embeddings(
            outcome,
            window,
            [place.indexes[i] for i in scorable],
            [documents[i] for i in scorable] if passages else request.documents,
            bound,
        )
        result = WindowResult(
            window=window,
            start=place.start,
            end=place.end,
            stage=place.stage,
            scored_by_place=ranked_by_member(outcome),
            served_by=outcome.served_by,
            passthrough=outcome.passthrough,
            attempts=begun.attempt,
            committed_at=time.time(),
            decisions=decisions,
            failovers=outcome.failovers,
            reason=outcome.reason,
            began_at=began_at,
            instruction_ignored_by=outcome.instruction_ignored_by,
        )
        self.recorder.window_scored(time.perf_counter() - scoring_started)
        written = self._commit(
            stream_id,
            result,
            outcome="failed" if outcome.failed else "ranked",
            begun=begun,
            until=until,
            bound=bound,
            embeddings=embeddings,
            side_writes=side_writes,
            device=spec.device,
        )
        if written == 1:
            bound.info(
                "window_committed",
                served_by=outcome.served_by,
                candidates=len(candidates),
                failovers=len(outcome.failovers),
            )
            return "failed" if outcome.failed else "committed"
        bound.info("window_commit_lost_race", code=written)
        return "already_committed"

    def _not_begun(self, code: int, bound: Any) -> str:
        if code == codes.HELD_ELSEWHERE:
            bound.info("window_in_progress_elsewhere")
            return "in_progress"
        if code == codes.ALREADY_COMMITTED:
            bound.debug("window_already_committed")
            return "already_committed"
        if code == codes.NOT_ADMITTED:
            bound.warning("window_not_admitted")
            return "not_admitted"
        if code == codes.NO_SUCH_WINDOW:
            # A number some stream could have (the door checked that much), not one this
            # stream has: a message rerankq never sent, refused like the door's own.
            bound.warning("task_message_refused", reason="arguments", detail="a window the stream does not have")
            self.recorder.message_refused("arguments")
            return "no_such_window"
        bound.info("stream_gone")
        return "gone"

    def _commit_failed(
        self,
        stream_id: str,
        window: int,
        begun: Begun,
        reason: str,
        *,
        outcome: str,
        attempts: int,
        until: float,
        bound: Any,
        place: WindowPlace | None = None,
    ) -> str:
        """Commit every candidate of the window as ``failed`` with ``reason``, once.

        Without a ``place`` (the spec may be the very thing that cannot be decoded), the window's
        candidate indexes come from the store's reply.
        """
        try:
            spec: StreamSpec | None = spec_decoder.decode(begun.spec)
        except (msgspec.DecodeError, msgspec.ValidationError):
            spec = None
        if place is None:
            place = place_at_worst(spec, window, begun)
        decisions: list[Decision] = []
        for i, blob in enumerate(begun.candidates):
            index = place.indexes[i] if i < len(place.indexes) else place.start + i
            try:
                candidate = candidate_decoder.decode(blob)
                document = assemble(candidate, spec.query, budget=spec.document_budget) if spec else ""
                candidate_id = candidate.id
            except (msgspec.DecodeError, msgspec.ValidationError):
                candidate_id, document = _stored_id(blob, f"#{index}"), ""
            decisions.append(Failed(id=candidate_id, index=index, document=document, reason=reason))
        result = WindowResult(
            window=window,
            start=place.start,
            end=place.start + len(decisions),
            stage=place.stage,
            served_by=None,
            passthrough=False,
            attempts=attempts,
            committed_at=time.time(),
            decisions=decisions,
            reason=reason,
        )
        self._commit(
            stream_id,
            result,
            outcome=outcome,
            begun=begun,
            until=until,
            bound=bound,
            device=spec.device if spec is not None else None,
        )
        return "failed"

    def _commit(
        self,
        stream_id: str,
        result: WindowResult,
        *,
        outcome: str,
        begun: Begun,
        until: float,
        bound: Any,
        embeddings: WindowEmbeddings | None = None,
        side_writes: list[SideWrite] | None = None,
        device: str | None = None,
    ) -> int:
        """Commit once (waiting out a full Redis) and tell the metrics, counted as the script counts.

        The held ``side_writes`` ride on the first try only: a retry (Redis full) is the commit alone.
        Behind the commit, in its round trip, the window's share of ``device``'s queue is given
        back, and the windows that released are sent (``worker.fair_release``); a share a retry
        leaves counted is the sweep's to give back.
        """
        start = time.perf_counter()
        riding = list(side_writes or ())
        if side_writes:
            side_writes.clear()
        released: list[Released] = []
        behind = (
            [self.share_return.after_commit(device, stream_id, result.window, released)]
            if self.share_return is not None and device is not None
            else []
        )

        # The rows' order as its page shows them: what a cascade's next stage reads.
        order = [d.index for d in result.decisions if not isinstance(d, (Filtered, Omitted))]

        def attempt() -> Commit:
            nonlocal riding, behind
            ride, riding = riding, []
            then, behind = behind, []
            return self.store.commit(
                stream_id,
                result,
                outcome=outcome,
                embeddings=embeddings,
                side_writes=ride,
                after=then,
                order=order,
                enqueue_grace_s=self.settings.queues.redeliver_after_s,
            )

        committed = self._through_full_redis(attempt, until=until, bound=bound)
        written = committed.code
        if self.share_return is not None and device is not None:
            self.share_return.send(device, released, bound)
            if committed.admitted is not None:
                self.share_return.send_admitted(device, stream_id, committed.admitted, bound)
        self.recorder.window_committed(
            member=result.served_by,
            outcome=outcome,
            commit_s=time.perf_counter() - start,
            admitted_at_ms=begun.admitted_at_ms,
            written=written == 1,
        )
        return written
