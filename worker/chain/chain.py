"""The provider chain: members tried in order until one serves the window.

A member is skipped on any ProviderError (timeout, connection, HTTP, unusable
response), when it cannot start, or when its circuit breaker is open. A member that
cannot start is retried on a later window (at most once per ``member_restart_s``)
rather than taking the worker down. A skip of a member that was up is a failover: logged
at WARNING with the member, the reason, the stream and the window, and counted through
``on_failover``. A skip of a member that never started is not: its start failure was said
once, and each window it is skipped for is counted apart, through ``on_not_started``.

A member is named by its label (``0:cohere``) in every log line and failover; the
breaker's Redis key adds a digest of the endpoint, and that key is all it is used for.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import structlog

from kernel.keys import Keys
from kernel.settings import MemberSettings, Settings, chain_profile_variable, member_variable
from kernel.store import connect
from worker.chain.breaker import Breaker, Gate, breaker_id
from worker.chain.cache import provider_identity
from worker.chain.checks import FLAT_MIN_WINDOW, FLAT_RANGE, CheckedProvider, check_scores
from worker.providers import build_provider
from worker.providers.base import (
    Provider,
    ProviderError,
    ProviderStartError,
    Scale,
    ScoreRequest,
    accepts_instruction,
)
from worker.side_writes import SideWrite, write

log = structlog.get_logger("rerankq.chain")

# A half-open probe's holder gets this long past its member's timeout before another
# process may probe instead (the holder may have died mid-call).
PROBE_GRACE_S = 1.0


@dataclass
class ChainOutcome:
    served_by: str | None
    scale: Scale | None
    scores: list[float | None] | None
    failovers: list[str] = field(default_factory=list)
    reason: str | None = None
    #: The serving member's ``embed(documents)`` when it embeds documents (``embedding``).
    embed: Callable[[list[str]], list[list[float]]] | None = None
    #: The serving member, when the stream had an instruction and that member cannot use one.
    instruction_ignored_by: str | None = None
    #: The serving member's cache identity (what its scores depend on besides the pair).
    identity: str | None = None

    @property
    def passthrough(self) -> bool:
        return self.served_by is not None and self.scale is None

    @property
    def failed(self) -> bool:
        return self.served_by is None


def explained(index: int, exc: ProviderError) -> tuple[str, dict[str, str]]:
    """The error's detail with its remedy spelt out for member ``index``, and the variable to name."""
    if exc.remedy is None:
        return exc.detail, {}
    variable = member_variable(index, exc.remedy.field)
    return f"{exc.detail}; {exc.remedy.render(variable)}", {"variable": variable}


def described(exc: ProviderStartError) -> str:
    return f"{exc.reason}: {exc.detail}" if exc.detail else exc.reason


def _not_bound() -> Provider:
    raise ProviderStartError("not_bound", "member has no builder")


class Member:
    """One configured provider; built on first use, rebuilt after a failed start.

    A failed start is retried no sooner than ``restart_s`` later, so a member whose
    model is missing is not reloaded on every window.
    """

    def __init__(
        self, index: int, settings: MemberSettings, build: Callable[[], Provider], *, restart_s: float = 30.0
    ) -> None:
        self.index = index
        self.settings = settings
        self.label = f"{index}:{settings.provider}"
        self.breaker_id = breaker_id(self.label, settings)
        #: Whether calls leave this process (and so go through the shared breaker); known once built.
        self.remote = False
        #: The checked raw provider beneath any wrap; set by Chain.from_settings.
        self.checked: CheckedProvider | None = None
        self.restart_s = restart_s
        self._build = build
        self._provider: Provider | None = None
        self._lock = threading.Lock()
        self._failed_at: float | None = None
        self._last_error: ProviderStartError | None = None
        self.start_attempts = 0
        self._identity: str | None = None

    @property
    def started(self) -> bool:
        return self._provider is not None

    @property
    def identity(self) -> str | None:
        """The started provider's cache identity (``worker.chain.cache.provider_identity``)."""
        if self._identity is None and self._provider is not None:
            self._identity = provider_identity(self.settings, self._provider)
        return self._identity

    @property
    def uses_instructions(self) -> bool:
        """Whether the raw provider (beneath the cache and the meter) takes the stream's instruction."""
        return accepts_instruction(self.checked if self.checked is not None else self._provider)

    def provider(self) -> Provider:
        if self._provider is not None:
            return self._provider
        # A threads-pool worker runs windows concurrently; one of them builds, the rest wait.
        with self._lock:
            return self._provider or self._start()

    def _start(self) -> Provider:
        if self._failed_at is not None:
            wait = self._failed_at + self.restart_s - time.monotonic()
            if wait > 0:
                reason = self._last_error.reason if self._last_error else "start_failed"
                raise ProviderStartError("not_started", f"last start failed ({reason}); next try in {wait:.1f}s")
        self.start_attempts += 1
        self._identity = None
        try:
            self._provider = self._build()
        except ProviderStartError as exc:
            self._start_failed(exc)
            raise
        except Exception as exc:  # a custom provider may raise anything while starting
            error = ProviderStartError("start_error", f"{type(exc).__name__}: {exc}")
            self._start_failed(error)
            raise error from None
        self._failed_at = None
        if not self.uses_instructions and self._provider is not None and self._provider.scale is not None:
            # Once per start; each window it serves with an instruction records it too.
            log.info("member_ignores_instructions", member=self.label, provider=self.settings.provider)
        return self._provider

    def _start_failed(self, exc: ProviderStartError) -> None:
        previous = self._last_error
        self._failed_at = time.monotonic()
        self._last_error = exc
        field_name = getattr(exc, "field", None)
        named = {"variable": member_variable(self.index, field_name)} if isinstance(field_name, str) else {}
        # Said once: a model that is not there (offline, the default chain's first member) is
        # retried every restart_s, and each retry that fails as the last one did is no news.
        same = previous is not None and (previous.reason, previous.detail) == (exc.reason, exc.detail)
        (log.debug if same else log.warning)(
            "member_start_failed",
            member=self.label,
            reason=exc.reason,
            detail=exc.detail,
            retry_in_s=self.restart_s,
            **named,
        )

    def close(self) -> None:
        if self._provider is not None:
            self._provider.close()


class Chain:
    def __init__(
        self,
        members: list[Member],
        *,
        on_call: Callable[[str], None] | None = None,
        on_failover: Callable[[str, str], None] | None = None,
        on_not_started: Callable[[str], None] | None = None,
        breaker: Breaker | None = None,
        flat_min_window: int = FLAT_MIN_WINDOW,
        flat_range: float = FLAT_RANGE,
        profiles: dict[str, list[int]] | None = None,
    ) -> None:
        self.members = members
        self.profiles = profiles or {}
        self.breaker = breaker
        self.flat_min_window = flat_min_window
        self.flat_range = flat_range
        self._on_call = on_call or (lambda label: None)
        self._on_failover = on_failover or (lambda label, reason: None)
        self._on_not_started = on_not_started or (lambda label: None)
        self._owned_redis: redis.Redis | None = None  # a connection made for the breaker alone
        #: Why each member that failed its start at warm-up did (by label).
        self.start_errors: dict[str, ProviderStartError] = {}

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        wrap: Callable[[int, MemberSettings, Provider], Provider] | None = None,
        redis_client: redis.Redis | None = None,
        **kwargs: object,
    ) -> Chain:
        """Members from settings; ``wrap`` decorates each built provider (the pair-score cache).

        The breaker lives in the Redis of ``redis_client``, else of the settings' URL;
        with neither, the chain runs without one.
        """

        def builder(member: Member) -> Callable[[], Provider]:
            def build() -> Provider:
                checked = CheckedProvider(
                    build_provider(member.settings, settings),
                    flat_min_window=settings.chain.flat_min_window,
                    flat_range=settings.chain.flat_range,
                )
                member.remote, member.checked = checked.remote, checked
                return wrap(member.index, member.settings, checked) if wrap else checked

            return build

        members = []
        for index, member_settings in enumerate(settings.chain.effective_members()):
            # The builder needs its member (to note whether the raw provider is remote
            # before ``wrap`` hides it), so it is attached once the member exists.
            member = Member(index, member_settings, _not_bound, restart_s=settings.chain.member_restart_s)
            member._build = builder(member)
            members.append(member)
        owned: redis.Redis | None = None
        if "breaker" not in kwargs:
            url = settings.store.redis_url or settings.store.broker_url
            if redis_client is None and url:
                redis_client = owned = connect(url)
            if redis_client is not None:
                kwargs["breaker"] = Breaker(
                    redis_client,
                    Keys(settings.store.namespace),
                    failures=settings.breaker.failures,
                    cooldown_s=settings.breaker.cooldown_s,
                )
        kwargs.setdefault("flat_min_window", settings.chain.flat_min_window)
        kwargs.setdefault("flat_range", settings.chain.flat_range)
        kwargs.setdefault("profiles", settings.chain.profiles)
        chain = cls(members, **kwargs)  # type: ignore[arg-type]
        chain._owned_redis = owned
        return chain

    def warm_up(self) -> None:
        """Start every member now (model load at process start); failures are logged, not fatal.

        When no member that scores (anything but ``rrf``) starts, the worker can only keep
        fusion order or fail windows: that is said once, at ERROR, naming each member and why
        (a worker refuses to start so unless told to: ``worker.readiness``).
        """
        self.start_errors = {}
        for member in self.members:
            try:
                member.provider()
            except ProviderStartError as exc:
                # Logged by the member at WARNING; retried on a later window.
                self.start_errors[member.label] = exc
        scoring = [m for m in self.members if m.settings.provider != "rrf"]
        if scoring and not self.scoring_started():
            fallback = next((m.label for m in self.members if m.settings.provider == "rrf"), None)
            log.error(
                "no_scoring_member_started",
                members={m.label: described(self.start_errors[m.label]) for m in scoring},
                windows_served_by=fallback or "nobody: windows are committed as failed",
                retry_in_s=max(m.restart_s for m in scoring),
            )

    def scoring_started(self) -> bool:
        """Whether a member that scores (anything but ``rrf``) is up."""
        return any(m.started for m in self.members if m.settings.provider != "rrf")

    def members_for(self, profile: str | None) -> list[Member] | None:
        """The members a stream's chain profile selects, in its order; None if it is not configured."""
        if profile is None:
            return self.members
        indexes = self.profiles.get(profile.lower())
        if indexes is None:
            return None
        by_index = {m.index: m for m in self.members}
        return [by_index[i] for i in indexes if i in by_index]

    def run(self, request: ScoreRequest) -> ChainOutcome:
        failovers: list[str] = []
        members = self.members_for(request.chain)
        if not members:
            # Never fall back to the whole chain: a profile may exist to keep data away
            # from a hosted member.
            variable = chain_profile_variable(request.chain or "")
            reason = f"chain profile {request.chain!r} is not configured ({variable})"
            log.error("chain_profile_missing", profile=request.chain, stream=request.stream_id, window=request.window)
            return ChainOutcome(served_by=None, scale=None, scores=None, reason=reason)

        def fail_over(member: Member, reason: str, detail: str, **named: str) -> None:
            # Only the reason, a label of our own, is committed with the window; the detail
            # (our words, never a server's body) goes to the log line alone.
            failovers.append(f"{member.label}: {reason}")
            log.warning(
                "reranker_failover",
                member=member.label,
                reason=reason,
                detail=detail,
                stream=request.stream_id,
                window=request.window,
                **named,
            )
            self._on_failover(member.label, reason)

        for member in members:
            try:
                provider = member.provider()
            except ProviderStartError as exc:
                # A member that never started (said once, at its start) was not tried for this
                # window: no failover, or every window of an offline default chain would be one.
                # One reason whether this window retried the start or waited for the next try,
                # so a reader sees one cause, not two wordings of it.
                failovers.append(f"{member.label}: not_started")
                log.debug("member_not_started", member=member.label, reason=exc.reason, window=request.window)
                self._on_not_started(member.label)
                continue
            gate = self._acquire(member)
            if gate is Gate.SKIP:
                fail_over(
                    member,
                    "breaker_open",
                    "skipped without a call; another process holds the probe or the cooldown has not passed",
                )
                continue
            if member.checked is not None:
                member.checked.begin()
            try:
                self._on_call(member.label)
                deadline = time.monotonic() + member.settings.timeout_s
                scores = provider.score(request, deadline=deadline)
                # Again over the whole answer: cached and fresh scores together.
                check_scores(
                    scores,
                    len(request.documents),
                    scale=provider.scale,
                    flat_min_window=self.flat_min_window,
                    flat_range=self.flat_range,
                )
            except ProviderError as exc:
                self._record(member, ok=False, reason=exc.reason, request=request)
                detail, named = explained(member.index, exc)
                fail_over(member, exc.reason, detail, **named)
                continue
            self._record(member, ok=True, reason=None, request=request)
            # The raw provider's, beneath the cache and the meter (the checks forward it).
            embed = getattr(member.checked if member.checked is not None else provider, "embed", None)
            ignored = request.instruction is not None and provider.scale is not None and not member.uses_instructions
            return ChainOutcome(
                served_by=member.label,
                scale=provider.scale,
                scores=scores,
                failovers=failovers,
                # The window's tenant: the embedding cache keeps each tenant's vectors apart.
                embed=functools.partial(embed, tenant=request.tenant) if callable(embed) else None,
                instruction_ignored_by=member.label if ignored else None,
                identity=member.identity if provider.scale is not None else None,
            )
        return ChainOutcome(
            served_by=None,
            scale=None,
            scores=None,
            failovers=failovers,
            reason="all members failed: " + "; ".join(failovers),
        )

    # -- the breaker ---------------------------------------------------------
    # Only remote members go through it: an in-process model failing in one worker says
    # nothing about the others. If Redis itself fails, calls go ahead (fail open).

    def _acquire(self, member: Member) -> Gate:
        if self.breaker is None or not member.remote:
            return Gate.CALL
        try:
            gate = self.breaker.acquire(member.breaker_id, probe_lease_s=member.settings.timeout_s + PROBE_GRACE_S)
        except redis.RedisError as exc:
            log.warning("breaker_unavailable", member=member.label, error=type(exc).__name__)
            return Gate.CALL
        if gate is Gate.PROBE:
            log.info("breaker_probe", member=member.label)
        return gate

    def _record(self, member: Member, *, ok: bool, reason: str | None, request: ScoreRequest) -> None:
        if self.breaker is None or not member.remote:
            return
        if member.checked is not None and not member.checked.called:
            # The cache answered every pair: nothing was learnt about the member. A probe
            # taken for this window lapses after its lease and the next window probes.
            return
        try:
            if ok:
                # With the window's commit (worker.side_writes): a success only closes the
                # breaker, so it need not hold the window up; a failure (below) gates the next call.
                breaker, breaker_id, label = self.breaker, member.breaker_id, member.label

                def closed(previous: object) -> None:
                    was = previous.decode() if isinstance(previous, bytes) else str(previous)
                    if was != "closed":
                        log.info("breaker_closed", member=label, was=was)

                write(
                    SideWrite(
                        queue=lambda pipe: breaker.queue_success(pipe, breaker_id),
                        run=lambda: breaker.record_success(breaker_id),
                        done=closed,
                    )
                )
            elif self.breaker.record_failure(member.breaker_id) == "opened":
                log.warning(
                    "breaker_opened",
                    member=member.label,
                    reason=reason,
                    cooldown_s=self.breaker.cooldown_ms / 1000,
                    stream=request.stream_id,
                    window=request.window,
                )
        except redis.RedisError as exc:
            log.warning("breaker_unavailable", member=member.label, error=type(exc).__name__)

    def close(self) -> None:
        for member in self.members:
            member.close()
        if self._owned_redis is not None:
            self._owned_redis.close()
