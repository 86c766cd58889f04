"""How pages and window status read in a terminal: plain text for pages (as the demo prints
them), a rich table for status."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from kernel.wire import Page, StageStatus, StreamStatus
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


#: The id column grows to the longest id on the page up to this; a longer id is cut (with …).
MAX_ID_WIDTH = 48


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def page_lines(title: str, page: Page, *, width: int = 60, headings: dict[str, str] | None = None) -> list[str]:
    # Each column as wide as its widest cell on this page, so every row's document starts
    # where the header's does, whatever the ids, kinds and members.
    kind_w = max([len("decision"), *(len(row.kind) for row in page.rows)])
    served_w = max([len("served by"), 11, *(len(printable(row.served_by or "-")) for row in page.rows)])
    id_w = min(MAX_ID_WIDTH, max([len("id"), 7, *(len(printable(row.id)) for row in page.rows)]))
    win_w = max([3, *(len(str(row.window)) for row in page.rows)])
    rank_w = max([4, *(len(str(row.rank)) for row in page.rows)])
    lines = [
        f"\n{title}  (offset {page.offset}, limit {page.limit}; {page.total} rows visible so far, "
        f"complete={page.complete})",
        f"{'rank':>{rank_w}}  {'score':>7}  {'final':>7}  {'decision':<{kind_w}}  {'served by':<{served_w}}  "
        f"{'win':>{win_w}}  {'id':<{id_w}}  document",
    ]
    for row in page.rows:
        score = "-" if row.score is None else f"{row.score:7.4f}"
        final = "-" if row.final_score is None else f"{row.final_score:7.4f}"
        text = _cut(printable(words(row.decision.document, (headings or {}).get(row.id))), width)
        lines.append(
            f"{row.rank:>{rank_w}}  {score:>7}  {final:>7}  {row.kind:<{kind_w}}  "
            f"{printable(row.served_by or '-'):<{served_w}}  {row.window:>{win_w}}  "
            f"{_cut(printable(row.id), id_w):<{id_w}}  {text}"
        )
        if row.kind == "failed" and row.reason:
            lines.append(f"{'':>{rank_w}}  reason: {printable(row.reason)}")
        if page.stages:
            lines[-1] += f"  (stage {row.stage})"
    if page.pending_windows:
        lines.append(f"({page.pending_windows} window(s) still being scored)")
    lines += [stage_line(stage) for stage in page.stages]
    return lines


def stage_line(stage: StageStatus) -> str:
    """One stage of a cascade: what it read and committed, and where it stopped short."""
    chain = printable(stage.chain or "the whole chain")
    if stage.stage > 1 and stage.read is None:
        return f"stage {stage.stage} ({chain}, keep {stage.keep}): waiting for stage {stage.stage - 1}'s best"
    line = f"stage {stage.stage} ({chain}): read {stage.read}, {stage.committed} of {stage.windows} window(s) committed"
    if stage.stopped:
        line += f"; stopped at {stage.read} of {stage.keep} by its {stage.stopped} budget"
    if stage.fell_back:
        reasons = "; ".join(printable(r) for r in stage.reasons)
        line += f"; {stage.fell_back} row(s) kept the earlier stage's order ({reasons})"
    return line


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
        "stage": row.stage,
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
    if passage is None:
        return None
    out = {"start": passage.start, "end": passage.end, "score": passage.score}
    if passage.unread_from is not None:
        out["unread_from"] = passage.unread_from
    return out


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
        ("cancelled", "right"),
        ("reason", "left"),
    )
    if status.stages:
        columns = (("stage", "right"), *columns)
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for w in status.windows:
        state = {"committed": "[green]committed[/]", "admitted": "[yellow]admitted[/]"}.get(w.state, w.state)
        if w.state == "committed" and w.failed:
            state = "[red]failed[/]"
        elif w.state == "committed" and w.cancelled:
            state = "[yellow]cancelled[/]"
        table.add_row(
            *([str(w.stage)] if status.stages else []),
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
            str(w.cancelled),
            w.reason or "",
        )
    return table
