"""Jobs from a TREC run: ``qid Q0 docid rank score tag``, one job per query.

A query's lines must be together (as ``trec_eval`` writes them; ``sort -s -k1,1`` makes it
so): one query's lines are held at a time, never the run. Its candidates are in the run's
order as ``trec_eval`` reads it, score descending (rank, then line, break ties), with the run's
score as the fusion score; the query and document texts come from the ``Lookup``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from rerankq.submit.jobs import BadLine, Job, check_job_id
from rerankq.submit.lookup import Lookup


def count_queries(run: Path) -> int:
    """How many jobs the run makes: the number of query groups."""
    count, last = 0, None
    with open(run, "rb") as fh:
        for line in fh:
            head = line.split(None, 1)[:1]
            if head and head[0] != last:
                count, last = count + 1, head[0]
    return count


class _Group:
    def __init__(self, qid: str, line: int) -> None:
        self.qid = qid
        self.line = line
        self.entries: list[tuple[float, int, int, str]] = []  # (-score, rank, line, docid)


def trec_jobs(run: Path, lookup: Lookup, *, depth: int) -> Iterator[Job | BadLine]:
    name = str(run)
    group: _Group | None = None
    with open(run, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            try:
                parts = raw.decode().split()
            except UnicodeDecodeError as exc:
                yield BadLine(file=name, line=number, field="line", message=f"not UTF-8: {exc}")
                continue
            if not parts:
                continue
            if len(parts) != 6:
                yield BadLine(
                    file=name,
                    line=number,
                    field="line",
                    message=f"expected 6 columns (qid Q0 docid rank score tag), got {len(parts)}",
                )
                continue
            qid, _, docid, rank_text, score_text, _ = parts
            try:
                rank = int(rank_text)
            except ValueError:
                yield BadLine(file=name, line=number, field="rank", message=f"not an integer: {rank_text!r}")
                continue
            try:
                score = float(score_text)
            except ValueError:
                score = math.nan
            if not math.isfinite(score):
                yield BadLine(file=name, line=number, field="score", message=f"not a finite number: {score_text!r}")
                continue
            if group is None or qid != group.qid:
                if group is not None:
                    yield _job(group, lookup, depth, name)
                group = _Group(qid, number)
            group.entries.append((-score, rank, number, docid))
    if group is not None:
        yield _job(group, lookup, depth, name)


def _job(group: _Group, lookup: Lookup, depth: int, name: str) -> Job | BadLine:
    try:
        job_id = check_job_id(group.qid)
    except ValueError as exc:
        return BadLine(file=name, line=group.line, field="qid", message=str(exc))
    try:
        query = lookup.query(group.qid)
    except ValueError as exc:
        return BadLine(file=name, line=group.line, field="query", message=str(exc))
    if query is None:
        return BadLine(
            file=name, line=group.line, field="query", message=f"no query {group.qid!r} in {lookup.files['query']}"
        )
    candidates, lines = [], []
    for negative_score, _, line, docid in sorted(group.entries)[:depth]:
        try:
            document = lookup.document(docid)
        except ValueError as exc:
            return BadLine(file=name, line=line, field="docid", message=str(exc))
        if document is None:
            return BadLine(
                file=name, line=line, field="docid", message=f"no document {docid!r} in {lookup.files['document']}"
            )
        candidates.append({**document, "id": docid, "fusion_score": -negative_score})
        lines.append(line)
    return Job(
        id=job_id, query=query, candidates=candidates, options={}, file=name, line=group.line, candidate_lines=lines
    )
