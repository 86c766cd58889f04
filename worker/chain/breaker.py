"""A circuit breaker per chain member, its state shared by every worker process through Redis.

After ``breaker_failures`` consecutive failures a member is open for ``breaker_cooldown_s``:
it is skipped without a call, by every process. After the cooldown one caller (in any
process) gets the half-open probe; its success closes the breaker, its failure opens it
for another cooldown. A dead member is paid for once per cooldown, not once per process
per window. Every state change is one call of ``breaker.lua``.
"""

from __future__ import annotations

import enum
import hashlib
import time
from importlib import resources

import redis

from kernel.keys import Keys
from kernel.settings import MemberSettings, Settings

_SCRIPT = resources.files("worker.chain").joinpath("breaker.lua").read_text()
# A breaker hash outlives its cooldown by this much, then a quiet member leaves nothing behind.
IDLE_TTL_MS = 3_600_000


class Gate(enum.Enum):
    CALL = 1  # closed: call the member
    PROBE = 2  # half-open, and this caller holds the one probe
    SKIP = 0  # open, or another process holds the probe


def breaker_id(label: str, member: MemberSettings) -> str:
    """The member's label plus a digest of what it calls, so two differently configured
    deployments sharing a namespace never share a breaker for different endpoints.
    It names the Redis key only; logs and failovers name the member by its label."""
    target = f"{member.provider}|{member.url or ''}|{member.model or ''}".encode()
    return f"{label}:{hashlib.blake2b(target, digest_size=4).hexdigest()}"


def _now_ms() -> int:
    return int(time.time() * 1000)


class Breaker:
    def __init__(self, client: redis.Redis, keys: Keys, *, failures: int, cooldown_s: float) -> None:
        self.client = client
        self.keys = keys
        self.failures = failures
        self.cooldown_ms = int(cooldown_s * 1000)
        self._script = client.register_script(_SCRIPT)

    @classmethod
    def from_settings(cls, client: redis.Redis, settings: Settings) -> Breaker:
        return cls(
            client,
            Keys(settings.store.namespace),
            failures=settings.breaker.failures,
            cooldown_s=settings.breaker.cooldown_s,
        )

    def _run(self, member: str, command: str, *args: int) -> object:
        return self._script(keys=[self.keys.breaker(member)], args=[command, _now_ms(), *args])

    def _ttl_ms(self, probe_lease_ms: int = 0) -> int:
        return self.cooldown_ms + probe_lease_ms + IDLE_TTL_MS

    def acquire(self, member: str, *, probe_lease_s: float) -> Gate:
        """Whether to call ``member`` now. ``probe_lease_s``: how long a probe may take before
        another process may probe instead (its holder may have died)."""
        lease_ms = int(probe_lease_s * 1000)
        return Gate(_number(self._run(member, "acquire", lease_ms, self._ttl_ms(lease_ms))))

    def record_success(self, member: str) -> str:
        """Closes the breaker; returns the state it was in (the caller logs a change by its label)."""
        return _text(self._run(member, "success"))

    def queue_success(self, pipe: object, member: str) -> None:
        """``record_success`` queued on a pipeline (EVALSHA itself: a registered script would cost
        the pipeline a SCRIPT EXISTS round trip); its reply is the state it was in."""
        pipe.evalsha(self._script.sha, 1, self.keys.breaker(member), "success", _now_ms())  # type: ignore[attr-defined]

    def record_failure(self, member: str) -> str:
        """Counts a failure; returns the state after it, ``opened`` when this one tripped it."""
        return _text(self._run(member, "failure", self.failures, self.cooldown_ms, self._ttl_ms()))

    def state(self, member: str) -> dict[str, str]:
        """The raw hash, for operators and tests; empty when closed with no failures."""
        raw = self.client.hgetall(self.keys.breaker(member))
        return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _number(value: object) -> int:
    return value if isinstance(value, int) else int(_text(value))
