"""The end of a chaos run: drain every stream, then count what went wrong, each by its own evidence.

- lost: a window of a stream whose open was acknowledged (or whose open gave up but
  exists) that is not committed, counting every window of a stream that vanished;
- twice: a window committed more than once, by either of two independent counts: the
  commit events in its stream's log, and the ``window_committed`` lines in all worker logs;
- failed: a window committed with no member serving it (``failed`` or ``poisoned``);
- changed: a window whose stored result differs from what a reader first read (a second
  commit, or a commit lost and redone);
- gave_up: an open that never got through (with its stream absent, so nothing was opened).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import redis

from kernel.errors import StreamNotFound
from kernel.wire import window_result_decoder
from ops.chaos_faults.readers import Ledger, OpenAttempt, digest, retrying, stored_results
from producer import RerankClient

GIVE_UP_S = 60.0


@dataclass
class Findings:
    streams: int = 0
    windows: int = 0
    lost: int = 0
    twice_events: set[tuple[str, int]] = field(default_factory=set)
    twice_logs: set[tuple[str, int]] = field(default_factory=set)
    failed: int = 0
    changed: int = 0
    gave_up: int = 0
    vanished: int = 0
    vanished_streams: set[str] = field(default_factory=set)
    changed_windows: set[tuple[str, int]] = field(default_factory=set)
    #: Windows with at least one ``window_committed`` line: none at all means that check is blind.
    logged_windows: int = 0

    @property
    def twice(self) -> int:
        return len(self.twice_events | self.twice_logs)


def drain(client: RerankClient, ledger: Ledger, deadline: float) -> int:
    """Pull every stream whole (its remaining windows are admitted) until all are complete or
    ``deadline``; returns how many are not. Reads and admits only: it sends nothing else."""
    pending = {a.stream_id: a for a in ledger.opens.values()}
    while pending and time.monotonic() < deadline:
        for stream_id, attempt in list(pending.items()):
            try:
                page = retrying(
                    lambda stream_id=stream_id, size=attempt.size: client.pull(stream_id, 0, size, timeout=0),
                    give_up_s=GIVE_UP_S,
                )
                ledger.read(
                    stream_id,
                    retrying(lambda stream_id=stream_id: stored_results(client, stream_id), give_up_s=GIVE_UP_S),
                )
            except StreamNotFound:
                del pending[stream_id]  # never opened, or vanished: the audit counts it
                continue
            if page.complete:
                del pending[stream_id]
        if pending:
            time.sleep(0.5)
    return len(pending)


def committed_lines(log_paths: list[Path]) -> Counter[tuple[str, int]]:
    """``window_committed`` lines per (stream, window), over every worker log of the run."""
    counts: Counter[tuple[str, int]] = Counter()
    for path in log_paths:
        with open(path, "rb") as log:
            for line in log:
                if b"window_committed" not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a SIGKILL
                if isinstance(event, dict) and event.get("event") == "window_committed":
                    counts[(str(event["stream"]), int(event["window"]))] += 1
    return counts


def audit(client: RerankClient, ledger: Ledger, log_paths: list[Path]) -> Findings:
    found = Findings(streams=len(ledger.opens))
    raw: redis.Redis = client.store.client
    lines = committed_lines(log_paths)
    found.logged_windows = len(lines)
    for (stream_id, window), n in lines.items():
        if n > 1:
            found.twice_logs.add((stream_id, window))
    first_read: dict[str, dict[int, str]] = defaultdict(dict)
    with ledger.lock:
        for (stream_id, window), first in ledger.first_read.items():
            first_read[stream_id][window] = first
    for attempt in ledger.opens.values():
        _audit_stream(client, raw, ledger, attempt, first_read[attempt.stream_id], found)
    return found


def _audit_stream(
    client: RerankClient,
    raw: redis.Redis,
    ledger: Ledger,
    attempt: OpenAttempt,
    first_read: dict[int, str],
    found: Findings,
) -> None:
    stream_id = attempt.stream_id
    keys = client.store.keys.stream(stream_id)
    try:
        retrying(lambda: client.store.snapshot(stream_id), give_up_s=GIVE_UP_S)
    except StreamNotFound:
        if attempt.acknowledged or stream_id in ledger.vanished:
            found.vanished += 1
            found.vanished_streams.add(stream_id)
            found.windows += attempt.n_windows
            found.lost += attempt.n_windows
        elif attempt.gave_up:
            found.gave_up += 1
        return
    if attempt.gave_up:
        found.gave_up += 1  # it exists, so it is checked like the others, but the open still failed
    found.windows += attempt.n_windows
    results = retrying(lambda: stored_results(client, stream_id), give_up_s=GIVE_UP_S)
    found.lost += sum(1 for w in range(attempt.n_windows) if str(w).encode() not in results)
    for blob in results.values():
        if window_result_decoder.decode(blob).served_by is None:
            found.failed += 1
    for window, first in first_read.items():
        now = results.get(str(window).encode())
        if now is None or digest(now) != first:
            found.changed += 1
            found.changed_windows.add((stream_id, window))
    events: Counter[int] = Counter()
    for _, fields in retrying(lambda: raw.xrange(keys.events), give_up_s=GIVE_UP_S):
        events[int(fields[b"window"])] += 1
    found.twice_events.update((stream_id, w) for w, n in events.items() if n > 1)
