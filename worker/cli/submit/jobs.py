"""Jobs as the input holds them, read one at a time (memory stays flat in the input size).

A job is one stream to open: an id, a query, candidates in fusion order, and options of
``open()`` that override the command line's. A line that cannot be a job is a ``BadLine``
naming the file, the line and the field, so the run can stop on it or skip it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from producer.wire import Boosts, TimeRange

#: How long a job id may be; it names the job in the output and feeds its idempotency key.
MAX_JOB_ID_CHARS = 256


class Job(msgspec.Struct, kw_only=True):
    id: str
    query: Any
    candidates: list[Any]
    options: dict[str, Any]
    file: str
    line: int
    #: For inputs spread over lines (a TREC run): the line of each candidate, so an error on
    #: ``candidates[3]`` names the line it came from.
    candidate_lines: list[int] | None = None

    def line_of(self, field: str) -> int:
        match = re.match(r"candidates\[(\d+)\]", field)
        if match and self.candidate_lines is not None and int(match.group(1)) < len(self.candidate_lines):
            return self.candidate_lines[int(match.group(1))]
        return self.line


class BadLine(msgspec.Struct, kw_only=True):
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.message}"


class JobLine(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One JSONL line: the job and, optionally, its own ``open()`` options."""

    id: str | int
    query: str
    candidates: list[Any]
    depth: int | None = None
    window_size: int | None = None
    device: str | None = None
    chain: str | None = None
    tenant: str | None = None
    min_score: float | None = None
    min_final_score: float | None = None
    boosts: Boosts | None = None
    reference_time: dt.datetime | None = None
    query_range: TimeRange | None = None
    ttl_s: int | None = None
    budget: str | None = None
    keep: int | None = None
    allow_shallow: bool | None = None
    max_rerank_candidates: int | None = None
    max_candidates_per_source: int | None = None
    strategy_boosts: str | dict[str, str] | None = None
    document_budget: int | None = None


JOB_OPTIONS = tuple(f for f in JobLine.__struct_fields__ if f not in ("id", "query", "candidates"))
_decode_line = msgspec.json.Decoder(JobLine).decode
_AT = re.compile(r"(?s)(.*) - at `\$\.?(.*)`")
_NAMED = re.compile(r"Object (?:missing required|contains unknown) field `(.*)`")


def field_of(exc: msgspec.MsgspecError) -> tuple[str, str]:
    """msgspec's ``Expected `str`, got `int` - at `$.query``` as ``("query", "Expected ...")``."""
    text = str(exc)
    located = _AT.fullmatch(text)
    message, path = (located.group(1), located.group(2)) if located else (text, "")
    named = _NAMED.fullmatch(message)
    if named:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return path or "line", message


def check_job_id(raw: Any) -> str:
    """A job id as text; raises ValueError saying why it cannot be one."""
    job_id = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(job_id, str) or not job_id or not job_id.strip():
        raise ValueError("must be a non-empty string or an integer")
    if len(job_id) > MAX_JOB_ID_CHARS:
        raise ValueError(f"longer than {MAX_JOB_ID_CHARS} characters")
    if any(ch in job_id for ch in "\n\r\t\x00"):
        raise ValueError("must not contain a tab, a line break or a NUL")
    return job_id


def count_lines(path: Path) -> int:
    """Non-blank lines, read in chunks: how many jobs a JSONL file holds."""
    count = 0
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                count += 1
    return count


def jsonl_jobs(path: Path) -> Iterator[Job | BadLine]:
    name = str(path)
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                line = _decode_line(raw)
            except msgspec.DecodeError as exc:
                yield BadLine(file=name, line=number, field="line", message=f"not a JSON object: {exc}")
                continue
            except msgspec.ValidationError as exc:
                field, message = field_of(exc)
                yield BadLine(file=name, line=number, field=field, message=message)
                continue
            try:
                job_id = check_job_id(line.id)
            except ValueError as exc:
                yield BadLine(file=name, line=number, field="id", message=str(exc))
                continue
            options = {f: getattr(line, f) for f in JOB_OPTIONS if getattr(line, f) is not None}
            yield Job(id=job_id, query=line.query, candidates=line.candidates, options=options, file=name,
                      line=number)
