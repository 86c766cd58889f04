"""How pages and window status read in a terminal: plain text for pages (as the demo prints
them), a rich table for status."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kernel.wire import Page, StreamStatus
from rerankq.common import printable

if TYPE_CHECKING:
    from rich.console import JustifyMethod

#: The header ``worker.scoring.documents`` puts before a document's words: an optional date, then a
#: heading path ending in a blank line.
_DATE = re.compile(r"^\[Date: [^\]]*\] ")


def words(document: str, heading: str | None = None) -> str:
    """The document's own words for a one-line view: the injected date and heading are elided
    (``…`` marks it), never the text.

    ``heading`` is the candidate's heading path as joined into the document, when known; else a
    first line that reads like one (``a > b``, short, followed by a blank line) is taken for it.
    """
    body = _DATE.sub("", document)
    elided = body != document
    head, blank, rest = body.partition("\n\n")
    looks_like_heading = (
        heading == head if heading is not None else (" > " in head and "\n" not in head and len(head) <= 200)
    )
    if blank and looks_like_heading:
        body, elided = rest, True
    return ("… " if elided else "") + " ".join(body.split())


def page_lines(title: str, page: Page, *, width: int = 60, headings: dict[str, str] | None = None) -> list[str]:
    lines = [
        f"\n{title}  (offset {page.offset}, limit {page.limit}; {page.total} rows visible so far, "
        f"complete={page.complete})",
        f"{'rank':>4}  {'score':>7}  {'final':>7}  {'decision':<8}  {'served by':<11}  {'win':>3}  {'id':<7}  document",
    ]
    for row in page.rows:
        score = "-" if row.score is None else f"{row.score:7.4f}"
        final = "-" if row.final_score is None else f"{row.final_score:7.4f}"
        text = printable(words(row.decision.document, (headings or {}).get(row.id)))
        text = text if len(text) <= width else text[: width - 1] + "…"
        lines.append(
            f"{row.rank:>4}  {score:>7}  {final:>7}  {row.kind:<8}  {printable(row.served_by or '-'):<11}  "
            f"{row.window:>3}  {printable(row.id):<7}  {text}"
        )
        if row.kind == "failed" and row.reason:
            lines.append(f"{'':>4}  reason: {printable(row.reason)}")
    if page.pending_windows:
        lines.append(f"({page.pending_windows} window(s) still being scored)")
    return lines


def page_json(page: Page) -> dict[str, Any]:
    """A page with every field of each row (the decision's kind and reason included)."""
    from rerankq.common import to_builtins

    out: dict[str, Any] = to_builtins(page)
    out["rows"] = [row_json(row) for row in page.rows]
    return out


def row_json(row: Any) -> dict[str, Any]:
    """Every field of a row, the same keys for every kind (null where a kind has none)."""
    d = row.decision
    return {
        "rank": row.rank,
        "window": row.window,
        "kind": type(d).__struct_config__.tag,
        "id": d.id,
        "index": d.index,
        "score": getattr(d, "score", None),
        "final_score": getattr(d, "final_score", None),
        "served_by": getattr(d, "served_by", None),
        "reason": getattr(d, "reason", None),
        "document": d.document,
        "passage": _passage_json(getattr(d, "passage", None)),
    }


def _passage_json(passage: Any) -> dict[str, Any] | None:
    return None if passage is None else {"start": passage.start, "end": passage.end, "score": passage.score}


def status_table(status: StreamStatus) -> Any:
    from rich.table import Table

    table = Table(
        title=f"{status.stream_id}: {status.n_candidates} candidates in windows of {status.window_size}",
        title_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("window", "right"),
        ("range", "left"),
        ("state", "left"),
        ("attempts", "right"),
        ("served by", "left"),
        ("failovers", "left"),
        ("ranked", "right"),
        ("filtered", "right"),
        ("omitted", "right"),
        ("failed", "right"),
        ("reason", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for w in status.windows:
        state = {"committed": "[green]committed[/]", "admitted": "[yellow]admitted[/]"}.get(w.state, w.state)
        if w.state == "committed" and w.failed:
            state = "[red]failed[/]"
        table.add_row(
            str(w.window),
            f"[{w.start}, {w.end})",
            state,
            str(w.attempts),
            w.served_by or "-",
            "; ".join(w.failovers) or "-",
            str(w.ranked),
            str(w.filtered),
            str(w.omitted),
            str(w.failed),
            w.reason or "",
        )
    return table
