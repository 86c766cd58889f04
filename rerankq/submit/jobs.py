"""Jobs as the input holds them, read one at a time (memory stays flat in the input size).

A job is one stream to open: an id, a query, candidates in fusion order, and any of the
stream's options (``producer.options.StreamOptions``), which override the command line's. A
line that cannot be a job is a ``BadLine`` naming the file, the line and the field, so the
run can stop on it or skip it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from kernel.field_errors import from_msgspec
from producer.nesting import too_deep_field
from producer.options import StreamOptions
from producer.validation import MAX_NESTING_DEPTH

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


class JobLine(StreamOptions, frozen=True):
    """One JSONL line: the job, how deep to rerank it, and any of its stream's options."""

    id: str | int
    query: str
    candidates: list[Any]
    depth: int | None = None


#: What a job line may set beside the job itself: the stream's options, and depth.
JOB_OPTIONS = (*StreamOptions.__struct_fields__, "depth")
_decode_line = msgspec.json.Decoder(JobLine).decode


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
            # ValidationError first: it is a DecodeError too.
            except msgspec.ValidationError as exc:
                error = from_msgspec(exc, known=JobLine.__struct_fields__)
                yield BadLine(file=name, line=number, field=error.field or "line", message=error.message)
                continue
            except msgspec.DecodeError as exc:
                yield BadLine(file=name, line=number, field="line", message=f"not a JSON object: {exc}")
                continue
            except RecursionError:
                # Deeper than the decoder can walk: named as a shallower nesting past the bound is
                # (validation's message), so --on-error skip passes it over like any bad line.
                field = too_deep_field(raw) or "line"
                message = f"is nested more than {MAX_NESTING_DEPTH} levels deep"
                yield BadLine(file=name, line=number, field=field, message=message)
                continue
            try:
                job_id = check_job_id(line.id)
            except ValueError as exc:
                yield BadLine(file=name, line=number, field="id", message=str(exc))
                continue
            options = {f: getattr(line, f) for f in JOB_OPTIONS if getattr(line, f) is not None}
            yield Job(id=job_id, query=line.query, candidates=line.candidates, options=options, file=name, line=number)
