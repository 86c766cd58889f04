"""How far a submit run is: a live rich display on a terminal, plain periodic lines elsewhere."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class Tally:
    total: int
    resumed: int = 0  # jobs the output held before this run
    opened: int = 0  # streams opened (or found opened) by this run
    reopened: int = 0  # of those, streams an earlier run had opened (collected, not scored again)
    done: int = 0  # jobs written by this run
    failed: int = 0  # jobs with a failed window, or that could not finish
    lost: int = 0  # of those, jobs that could not finish (not in the output)
    skipped: int = 0  # bad lines skipped
    in_flight: int = 0
    windows_total: int = 0  # windows of every stream this run opened
    windows_committed: int = 0
    pairs: int = 0  # candidates in committed windows
    failovers: int = 0
    #: Windows per member that served them (from the pages written).
    served: Counter[str] = field(default_factory=Counter)
    #: Why members were passed over, from the windows of the first few jobs that failed over.
    failover_reasons: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    #: Why the jobs in flight do not move (no live worker for their device), repeated each line.
    warning: str | None = None

    @property
    def elapsed(self) -> float:
        return max(1e-9, time.monotonic() - self.started)

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.resumed - self.done - self.skipped - self.lost)

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        return self.remaining / (self.done / self.elapsed)

    def line(self) -> str:
        eta = self.eta_s()
        return (
            f"jobs {self.resumed + self.done}/{self.total} done ({self.failed} failed, {self.skipped} skipped"
            + (f", {self.resumed} from an earlier run" if self.resumed else "")
            + f"), {self.in_flight} in flight; windows {self.windows_committed}/{self.windows_total} committed; "
            f"{self.pairs / self.elapsed:.0f} pairs/s; {self.failovers} failovers; eta {clock(eta)}"
            + (f"; waiting: {self.warning}" if self.warning else "")
        )


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class PlainDisplay:
    """A line every ``every_s`` seconds (for logs and pipes), and one at the end."""

    def __init__(self, stream: TextIO, every_s: float) -> None:
        self.stream = stream
        self.every_s = every_s
        self._last = time.monotonic()

    def __enter__(self) -> PlainDisplay:
        return self

    def update(self, tally: Tally) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.stream.write(f"progress: {tally.line()}\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        pass


#: The bar's width in columns.
BAR_WIDTH = 20


class RichDisplay:
    """A live bar with the run's figures, redrawn by rich ten times a second.

    The bar, ``N/M jobs`` and the ETA come first and keep their width; the detail after them is
    what a narrow terminal cuts (from the right, with an ellipsis), never the line's start."""

    def __init__(self, stream: TextIO, *, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.progress = Progress(
            BarColumn(bar_width=BAR_WIDTH),
            MofNCompleteColumn(),
            TextColumn("jobs"),
            TextColumn("eta {task.fields[eta]}"),
            TextColumn("{task.fields[detail]}"),
            console=console or Console(file=stream),
            transient=False,
        )
        self.task: Any = None

    def __enter__(self) -> RichDisplay:
        self.progress.__enter__()
        self.task = self.progress.add_task("submit", total=None, detail="", eta="-")
        return self

    def update(self, tally: Tally) -> None:
        detail = (
            f"{tally.in_flight} in flight · {tally.windows_committed}/{tally.windows_total} windows · "
            f"{tally.pairs / tally.elapsed:.0f} pairs/s · {tally.failed} failed · {tally.skipped} skipped · "
            f"{tally.failovers} failovers" + (f" · waiting: {tally.warning}" if tally.warning else "")
        )
        eta = clock(tally.eta_s())
        # What the columns before the detail take (rich puts one space between columns); the
        # detail gets the rest, so rich never has to squeeze the bar, N/M or the ETA.
        lead = BAR_WIDTH + 1 + 2 * len(str(tally.total)) + 1 + 1 + len("jobs") + 1 + len(f"eta {eta}") + 1
        room = self.progress.console.width - lead
        if len(detail) > room:
            detail = detail[: max(0, room - 1)].rstrip(" ·") + "…" if room > 1 else ""
        self.progress.update(self.task, total=tally.total, completed=tally.resumed + tally.done, detail=detail, eta=eta)

    def note(self, text: str) -> None:
        sys.stderr.write(text + "\n")  # rich's live display prints it above the bar
        sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)


class NoDisplay:
    def __enter__(self) -> NoDisplay:
        return self

    def update(self, tally: Tally) -> None:
        pass

    def note(self, text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        pass


def display(*, as_json: bool, every_s: float, quiet: bool) -> Any:
    """Rich on a terminal; plain lines otherwise (on stderr under --json, so stdout stays one document)."""
    if quiet:
        return NoDisplay()
    if sys.stdout.isatty() and not as_json:
        return RichDisplay(sys.stdout)
    return PlainDisplay(sys.stderr if as_json else sys.stdout, every_s)
