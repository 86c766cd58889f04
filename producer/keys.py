"""Every Redis key the project writes, and nothing else builds one.

A stream's keys share the hash tag ``{stream_id}`` so one Lua script may touch
them all on a Redis Cluster. Stream ids are validated before they reach here
(``producer.validation.check_stream_id``), so they cannot carry a separator or a
glob character into a key.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamKeys:
    spec: str
    candidates: str
    meta: str
    results: str
    attempts: str
    pending: str
    events: str

    def all(self) -> list[str]:
        return [self.spec, self.candidates, self.meta, self.results, self.attempts, self.pending, self.events]


@dataclass(frozen=True)
class Keys:
    namespace: str

    def stream(self, stream_id: str) -> StreamKeys:
        base = f"{self.namespace}:s:{{{stream_id}}}"
        return StreamKeys(
            spec=f"{base}:spec",
            candidates=f"{base}:cands",
            meta=f"{base}:meta",
            results=f"{base}:results",
            attempts=f"{base}:attempts",
            pending=f"{base}:pending",
            events=f"{base}:events",
        )

    @property
    def active_streams(self) -> str:
        """ZSET of stream ids scored by expiry, walked by the sweep."""
        return f"{self.namespace}:active"

    def breaker(self, member: str) -> str:
        return f"{self.namespace}:breaker:{member}"

    def pair_score(self, digest: str) -> str:
        return f"{self.namespace}:score:{digest}"

    @property
    def counters(self) -> str:
        return f"{self.namespace}:counters"

    @property
    def sweep_lock(self) -> str:
        return f"{self.namespace}:sweep-lock"
