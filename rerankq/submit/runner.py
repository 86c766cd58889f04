"""The submit loop: open jobs with at most ``max_in_flight`` streams in flight, and write each
job to the output as its last window commits.

Flow control is the stream count: a job is read and opened only when one in flight has
completed, so a file of a million jobs never floods Redis, and the loop holds at most
``max_in_flight`` jobs (their candidates only until ``open`` has stored them). An ``open`` is
mostly waiting on Redis round trips, so a few threads open jobs side by side (the client is
thread-safe); everything else (reading, the ledger, the output) stays on the main thread.
Completion is polled from the streams' meta (``RerankClient.progress``: one round trip for every
stream in flight), and a completed stream is read once with ``pull``.

Each job's idempotency key is a digest of the run's identity and the job id, so running the
same command again re-opens nothing already opened (``open`` returns the same stream and sends
nothing) and re-scores nothing committed; the output says which jobs are done.

A first SIGINT or SIGTERM stops the loop between two steps (never inside a write); the
streams in flight keep scoring in the workers and are collected by the next run. A second
SIGINT stops at once.
"""

from __future__ import annotations

import hashlib
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import IdempotencyConflict, StoreError, StreamNotFound, TooShallow, ValidationError
from kernel.explain import store_trouble
from kernel.windows import window_count
from producer.budget import required_depth
from rerankq.submit.jobs import BadLine, Job
from rerankq.submit.ledger import Ledger
from rerankq.submit.output import Output
from rerankq.submit.progress import Tally

#: Bad lines and failed jobs listed in the summary; beyond this they are only counted.
LIST_LIMIT = 100
#: The completion poll backs off from the first pause to the longest while nothing completes.
FIRST_PAUSE_S = 0.02
LONGEST_PAUSE_S = 0.2
#: Options whose refusal depends on the job's candidates (the over-fetch rule), not on the option.
DATA_DEPENDENT = {"keep", "allow_shallow"}
#: Threads opening jobs side by side.
OPENERS = 4
#: Each poll reads the oldest streams in flight (a lane is first in, first out, so they finish
#: first); every FULL_POLL_S it reads them all, for jobs that finish out of order. A poll of 64
#: streams costs about 1.5 ms of CPU, a tenth of what a job costs the client.
HEAD_POLL = 16
FULL_POLL_S = 0.25
#: Jobs whose windows' failover reasons are read for the summary (a status read each).
FAILOVER_SAMPLES = 3


def idempotency_key(run_id: str, job_id: str) -> str:
    """``rqs-`` and 32 hex characters: a valid key (1-64 of ``A-Z a-z 0-9 _ . -``) for any job id."""
    return "rqs-" + hashlib.blake2b(f"{run_id}\x00{job_id}".encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Plan:
    #: The stream's options from the command line; a job's own options override them.
    open_options: dict[str, Any]
    depth: int | None
    max_in_flight: int
    on_error: str
    run_id: str
    default_window_size: int


@dataclass
class Flight:
    job_id: str
    query: str
    place: str
    windows: int
    committed: int = 0
    failovers: int = 0
    pairs: int = 0
    nudged: bool = False
    device: str = "cpu"


@dataclass
class Outcome:
    bad_lines: list[BadLine] = field(default_factory=list)
    failed_jobs: list[dict[str, Any]] = field(default_factory=list)
    stopped_at: BadLine | None = None
    fatal: str | None = None
    #: A command-line option every job would be refused for: (option field, message).
    usage: tuple[str, str] | None = None
    interrupted: bool = False


class Runner:
    def __init__(
        self,
        rerank: Any,
        jobs: Iterator[Job | BadLine],
        output: Output,
        ledger: Ledger,
        plan: Plan,
        tally: Tally,
        display: Any,
    ) -> None:
        self.rerank = rerank
        self.jobs = jobs
        self.output = output
        self.ledger = ledger
        self.plan = plan
        self.tally = tally
        self.display = display
        self.outcome = Outcome()
        self.in_flight: dict[str, Flight] = {}
        self.opening: dict[Future[Any], tuple[Job, int]] = {}
        self.exhausted = False
        self._pause = FIRST_PAUSE_S
        self._failover_samples = 0
        self._openers = ThreadPoolExecutor(max_workers=OPENERS, thread_name_prefix="rerankq-open")

    # -- the loop --------------------------------------------------------------

    def run(self) -> Outcome:
        previous = self._install_signals()
        next_poll = next_full_poll = 0.0
        try:
            with self.display as display:
                while not self._stopping():
                    self._fill()
                    self._opened()
                    if not self.in_flight and not self.opening and (self.exhausted or self.outcome.stopped_at):
                        break
                    if self.in_flight and time.monotonic() >= next_poll:
                        # Polled at most every FIRST_PAUSE_S, backing off while nothing completes.
                        full = time.monotonic() >= next_full_poll
                        if full:
                            next_full_poll = time.monotonic() + FULL_POLL_S
                        finished = self._collect(full=full)
                        if full:
                            self._check_served()
                        self._pause = FIRST_PAUSE_S if finished else min(LONGEST_PAUSE_S, self._pause * 2)
                        next_poll = time.monotonic() + self._pause
                        display.update(self.tally)
                        if finished:
                            continue  # room to open more now
                    # Until the next poll, wake for each open that completes: room to open another.
                    timeout = max(0.0, next_poll - time.monotonic()) if self.in_flight else self._pause
                    if self.opening:
                        wait(list(self.opening), timeout=timeout, return_when=FIRST_COMPLETED)
                    else:
                        time.sleep(timeout)
                display.update(self.tally)
        finally:
            # Opens already started finish (their streams are in Redis; a next run collects them).
            self._openers.shutdown(wait=True)
            self._restore_signals(previous)
        return self.outcome

    def _stopping(self) -> bool:
        return self.outcome.interrupted or self.outcome.fatal is not None or self.outcome.usage is not None

    def _install_signals(self) -> dict[int, Any]:
        def stop(signum: int, frame: Any) -> None:
            if self.outcome.interrupted and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now
            self.outcome.interrupted = True

        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[signum] = signal.signal(signum, stop)
            except ValueError:  # not the main thread: leave signals to the host
                pass
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    # -- opening -----------------------------------------------------------------

    def _fill(self) -> None:
        while (
            len(self.in_flight) + len(self.opening) < self.plan.max_in_flight
            and not self.exhausted
            and self.outcome.stopped_at is None
            and not self._stopping()
        ):
            item = next(self.jobs, None)
            if item is None:
                self.exhausted = True
                return
            if isinstance(item, BadLine):
                self._bad(item)
                continue
            if self.ledger.is_done(item.id):
                self.tally.resumed += 1  # the output holds it from an earlier run
                continue
            earlier = self.ledger.first_seen(item.id, f"{item.file}:{item.line}")
            if earlier is not None:
                self._bad(
                    BadLine(
                        file=item.file,
                        line=item.line,
                        field="id",
                        message=f"job {item.id!r} was already read at {earlier}; job ids must be unique"
                        " (a TREC run must keep each query's lines together: sort -s -k1,1)",
                    )
                )
                continue
            self._open(item)

    def _open(self, job: Job) -> None:
        options = {**self.plan.open_options, **{k: v for k, v in job.options.items() if k != "depth"}}
        depth = job.options.get("depth", self.plan.depth)
        if depth is None:
            keep = options.get("keep")
            depth = required_depth(keep if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0 else 10)
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            self._bad(BadLine(file=job.file, line=job.line, field="depth", message="must be a positive integer"))
            return
        candidates = job.candidates[:depth]
        window_size = options.get("window_size") or self.plan.default_window_size
        windows = (
            max(1, window_count(len(candidates), window_size))
            if isinstance(window_size, int) and window_size > 0
            else 1
        )
        # Every window is sent at once unless told otherwise; a job's own key is used as it is.
        options = {"first_windows": windows, "idempotency_key": idempotency_key(self.plan.run_id, job.id), **options}
        opening = self._openers.submit(self.rerank.open_stream, job.query, candidates, options)
        self.opening[opening] = (job, windows)

    def _opened(self) -> None:
        """Takes in the opens that completed: a stream in flight, or the job's line as bad."""
        for opening in [f for f in self.opening if f.done()]:
            job, windows = self.opening.pop(opening)
            self._take(job, windows, opening)

    def _take(self, job: Job, windows: int, opening: Future[Any]) -> None:
        try:
            opened = opening.result()
        except TooShallow as exc:
            # The command line's words for the opt-out, not the Python argument's.
            self._bad(
                BadLine(
                    file=job.file,
                    line=job.line,
                    field=exc.field,
                    message=exc.message_for('--allow-shallow (or "allow_shallow": true in the job)'),
                )
            )
            return
        except ValidationError as exc:
            root = re.split(r"[.\[]", exc.field, maxsplit=1)[0]
            if root in self.plan.open_options and root not in job.options and root not in DATA_DEPENDENT:
                self.outcome.usage = (exc.field, exc.message)  # every job would be refused the same way
            else:
                self._bad(BadLine(file=job.file, line=job.line_of(exc.field), field=exc.field, message=exc.message))
            return
        except IdempotencyConflict:
            self._bad(
                BadLine(
                    file=job.file,
                    line=job.line,
                    field="id",
                    message=f"job {job.id!r} was opened by an earlier run of this command with another "
                    "query or candidates; its output is in the stream already opened. Give this "
                    "input another --run-id to rerank the changed job",
                )
            )
            return
        except StoreError as exc:
            self.outcome.fatal = store_trouble(exc)
            return
        device = {**self.plan.open_options, **job.options}.get("device") or "cpu"
        self.in_flight[opened.stream_id] = Flight(
            job_id=job.id, query=job.query, place=f"{job.file}:{job.line}", windows=windows, device=device
        )
        self.tally.opened += 1
        if not opened.created:
            self.tally.reopened += 1  # an earlier run opened it: collected, not scored again
        self.tally.in_flight = len(self.in_flight)
        self.tally.windows_total += windows

    def _bad(self, bad: BadLine) -> None:
        if self.plan.on_error == "stop":
            # Opens run side by side, so a later line can be found bad first: report the earliest.
            if self.outcome.stopped_at is None:
                # Said now, not after the jobs in flight complete (which can take long).
                waiting = len(self.in_flight) + len(self.opening)
                self.display.note(
                    f"bad line, run stopped: {bad}"
                    + (f"; waiting for the {waiting} job(s) in flight to be written" if waiting else "")
                )
            if self.outcome.stopped_at is None or bad.line < self.outcome.stopped_at.line:
                self.outcome.stopped_at = bad
            return
        self.tally.skipped += 1
        if len(self.outcome.bad_lines) < LIST_LIMIT:
            self.outcome.bad_lines.append(bad)

    # -- collecting -------------------------------------------------------------

    def _collect(self, *, full: bool) -> int:
        ids = list(self.in_flight) if full else list(self.in_flight)[:HEAD_POLL]
        try:
            found = self.rerank.progress(ids)
        except StoreError as exc:
            self.outcome.fatal = store_trouble(exc)
            return 0
        finished = 0
        for stream_id in ids:
            flight = self.in_flight[stream_id]
            progress = found.get(stream_id)
            try:
                if progress is None:
                    raise StreamNotFound(stream_id)
                self._account(flight, progress)
                if progress.admitted < progress.first_stage_windows and not flight.nudged:
                    # Opened earlier with fewer windows admitted: a pull admits and sends the rest.
                    self.rerank.pull(stream_id, 0, progress.n_candidates, timeout=0)
                    flight.nudged = True
                if not progress.complete:
                    continue
                page = self.rerank.pull(stream_id, 0, progress.n_candidates, timeout=0)
            except StreamNotFound:
                self._fail(
                    stream_id,
                    flight,
                    "the stream expired before it completed (raise --ttl-s, or "
                    "RERANKQ_STREAM_TTL_S); the next run opens it again",
                )
                finished += 1
                continue
            except StoreError as exc:
                self.outcome.fatal = store_trouble(exc)
                return finished
            self.output.write_job(
                flight.job_id, flight.query, page, {"failed_windows": progress.failed, "failovers": progress.failovers}
            )
            self._note_servers(stream_id, page, progress.failovers)
            self.tally.done += 1
            if progress.failed:
                self.tally.failed += 1
                self._list_failed(
                    flight, stream_id, f"{progress.failed} window(s) failed; see rerankq status {stream_id}"
                )
            del self.in_flight[stream_id]
            finished += 1
        self.tally.in_flight = len(self.in_flight)
        return finished

    def _check_served(self) -> None:
        """Why the streams in flight do not move, when no live worker consumes a device queue
        they wait in: kept in the tally, so every progress line repeats it (cached by the client)."""
        devices = sorted({flight.device for flight in self.in_flight.values()})
        try:
            warnings = [w for w in (self.rerank.unserved_warning(d) for d in devices) if w]
        except StoreError:
            return  # the next poll says what is wrong with Redis
        self.tally.warning = "; ".join(warnings) or None

    def _note_servers(self, stream_id: str, page: Any, failovers: int) -> None:
        """Who served the job's windows, and (for the first few jobs that failed over) why the
        members before it did not: the summary says it in words."""
        served = {row.window: row.served_by for row in page.rows if getattr(row, "served_by", None)}
        self.tally.served.update(served.values())
        if failovers and self._failover_samples < FAILOVER_SAMPLES:
            self._failover_samples += 1
            try:
                status = self.rerank.status(stream_id)
            except (StoreError, StreamNotFound):
                return  # only an explanation is lost
            self.tally.failover_reasons.update(f for w in status.windows for f in w.failovers)

    def _account(self, flight: Flight, progress: Any) -> None:
        self.tally.windows_total += progress.n_windows - flight.windows
        self.tally.windows_committed += progress.committed - flight.committed
        self.tally.failovers += progress.failovers - flight.failovers
        pairs = (
            progress.n_candidates
            if progress.complete
            else min(progress.n_candidates, progress.committed * progress.window_size)
        )
        self.tally.pairs += pairs - flight.pairs
        flight.windows, flight.committed, flight.failovers, flight.pairs = (
            progress.n_windows,
            progress.committed,
            progress.failovers,
            pairs,
        )

    def _fail(self, stream_id: str, flight: Flight, reason: str) -> None:
        del self.in_flight[stream_id]
        self.tally.failed += 1
        self.tally.lost += 1
        self.tally.windows_total -= flight.windows - flight.committed
        self._list_failed(flight, stream_id, reason)

    def _list_failed(self, flight: Flight, stream_id: str, reason: str) -> None:
        if len(self.outcome.failed_jobs) < LIST_LIMIT:
            self.outcome.failed_jobs.append(
                {"id": flight.job_id, "stream": stream_id, "at": flight.place, "reason": reason}
            )
