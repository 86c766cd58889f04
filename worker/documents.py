"""Assemble the text a provider scores, which is also the text a reader gets back."""

from __future__ import annotations

import datetime as dt

from producer.wire import Candidate


def date_prefix(when: dt.datetime | None) -> str:
    # Both a written-out and an ISO date: cross-encoders read them differently.
    if when is None:
        return ""
    return f"[Date: {when:%B %d, %Y} ({when:%Y-%m-%d})] "


def clip(text: str, budget: int) -> str:
    """At most ``budget`` code points. Python strings index code points, so no character is split."""
    return text if len(text) <= budget else text[:budget]


def assemble(candidate: Candidate, query: str, *, budget: int) -> str:
    body = f"{candidate.context}: {candidate.text}" if candidate.context else candidate.text
    head = " > ".join(candidate.heading_path)
    if head:
        body = f"{head}\n\n{body}"
    return clip(date_prefix(candidate.occurred_start) + body, budget)
