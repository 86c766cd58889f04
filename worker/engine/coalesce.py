"""Coalescing: windows of many streams, arriving together, scored in one forward pass.

On a GPU, one window (25 pairs) leaves most of the chip idle; a threads-pool worker
runs one task per thread, so windows of different streams are in flight at once.
Each task hands its pairs to the coalescer and blocks; one flusher thread gathers
what arrived within a short delay (or until a size cap), scores it all through the
engine in one call (which still orders by length and batches by token budget), and
hands each window its own slice back. The task then commits its window as usual.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from kernel.settings import Settings

log = structlog.get_logger("rerankq.coalesce")

#: What an engine gives back per pair: a score (cross-encoder), or a score and an embedding (bi-encoder).
R = TypeVar("R")
#: An engine's pairs-to-results call; ``prompt`` is the windows' instruction (None: the model's default).
ScorePairs = Callable[..., list[R]]


class CoalesceTimeout(Exception):
    """The window's deadline passed before its flush finished."""


@dataclass
class _Pending(Generic[R]):
    pairs: list[tuple[str, str]]
    prompt: str | None = None
    future: Future[list[R]] = field(default_factory=Future)


class Coalescer(Generic[R]):
    def __init__(self, score_pairs: ScorePairs[R], *, max_pairs: int, max_delay_s: float) -> None:
        self._score_pairs = score_pairs
        self.max_pairs = max_pairs
        self.max_delay_s = max_delay_s
        self._pending: list[_Pending[R]] = []
        self._cond = threading.Condition()
        self._closed = False
        self.flushes = 0  # forward calls made; with windows_scored, the coalescing gain
        self.windows_scored = 0
        self._thread = threading.Thread(target=self._run, name="rerankq-coalescer", daemon=True)
        self._thread.start()

    def score(
        self, query: str, documents: Sequence[str], *, deadline: float | None = None, prompt: str | None = None
    ) -> list[R]:
        """Blocks until this window's scores are back; raises what the engine raised.

        Windows with different prompts (instructions) may be flushed together; each prompt's
        windows go to the engine in a call of their own.
        """
        if not documents:
            return []
        pending: _Pending[R] = _Pending(pairs=[(query, d) for d in documents], prompt=prompt)
        with self._cond:
            if self._closed:
                raise RuntimeError("coalescer is closed")
            self._pending.append(pending)
            self._cond.notify_all()
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return pending.future.result(timeout=timeout)
        except FutureTimeout:
            # The flush may still run; its result for this window is simply dropped.
            raise CoalesceTimeout(f"no scores within {timeout:.1f}s") from None

    def _take(self) -> list[_Pending[R]]:
        """Wait for a first window, then up to max_delay_s for more, or until max_pairs."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed and not self._pending:
                return []
            flush_at = time.monotonic() + self.max_delay_s
            while not self._closed and sum(len(p.pairs) for p in self._pending) < self.max_pairs:
                left = flush_at - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            # Take whole windows up to the cap (always at least one): a window is never split.
            taken: list[_Pending[R]] = []
            size = 0
            while self._pending and (not taken or size + len(self._pending[0].pairs) <= self.max_pairs):
                item = self._pending.pop(0)
                taken.append(item)
                size += len(item.pairs)
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if not taken:
                return
            live = [p for p in taken if p.future.set_running_or_notify_cancel()]
            by_prompt: dict[str | None, list[_Pending[R]]] = {}
            for p in live:
                by_prompt.setdefault(p.prompt, []).append(p)
            for prompt, group in by_prompt.items():
                self._flush(group, prompt)
            self.flushes += 1
            if len(live) > 1:
                log.debug("coalesced", windows=len(live), pairs=sum(len(p.pairs) for p in live))

    def _flush(self, group: list[_Pending[R]], prompt: str | None) -> None:
        pairs = [pair for p in group for pair in p.pairs]
        try:
            scores = self._score_pairs(pairs, prompt=prompt)
        except BaseException as exc:  # every waiting window learns why
            for p in group:
                p.future.set_exception(exc)
            return
        self.windows_scored += len(group)
        offset = 0
        for p in group:
            p.future.set_result(scores[offset : offset + len(p.pairs)])
            offset += len(p.pairs)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


_coalescers: dict[int, Coalescer[Any]] = {}
_coalescers_lock = threading.Lock()


def shared_coalescer(engine: object, score_pairs: ScorePairs[R], settings: Settings) -> Coalescer[R]:
    """One coalescer per engine, so every member and thread using the model meets in it.

    An engine is coalesced through one function only (``score_pairs`` for a cross-encoder,
    ``score_and_embed`` for a bi-encoder), so the engine alone keys it.
    """
    with _coalescers_lock:
        coalescer = _coalescers.get(id(engine))
        if coalescer is None:
            coalescer = Coalescer(
                score_pairs,
                max_pairs=settings.engine.coalesce_max_pairs,
                max_delay_s=settings.engine.coalesce_delay_ms / 1000.0,
            )
            _coalescers[id(engine)] = coalescer
        return coalescer
