"""Reading the standard inputs: TREC qrels and runs, queries and documents.

- qrels: ``qid iter docid grade`` per line (``iter`` is ignored, by convention ``0``);
- run: ``qid Q0 docid rank score tag`` per line; a query's order is by score, highest
  first, ties by rank (as trec_eval reads a run);
- queries: ``qid<TAB>text`` per line, or JSON lines with ``id`` / ``_id`` / ``qid`` and
  ``text`` / ``query``;
- documents: JSON lines with ``id`` / ``_id`` / ``docid``, ``text`` and an optional
  ``title`` (BEIR's corpus shape), or ``docid<TAB>text`` per line.

A malformed line is an ``InputError`` naming the file and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class InputError(Exception):
    """A file the evaluation cannot read: names the file and, where it can, the line."""


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str | None = None


@dataclass(frozen=True)
class Ranked:
    """One line of a run: a document and the first stage's score for it."""

    docid: str
    score: float


def _lines(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for n, line in _lines(path):
        parts = line.split()
        if len(parts) != 4:
            raise InputError(f"{path}:{n}: expected 'qid iter docid grade', got {len(parts)} fields")
        qid, _, docid, grade = parts
        try:
            qrels.setdefault(qid, {})[docid] = int(grade)
        except ValueError:
            raise InputError(f"{path}:{n}: the grade must be an integer, got {grade!r}") from None
    if not qrels:
        raise InputError(f"{path}: no judgements")
    return qrels


def read_run(path: Path) -> dict[str, list[Ranked]]:
    lines: dict[str, list[tuple[float, int, str]]] = {}
    for n, line in _lines(path):
        parts = line.split()
        if len(parts) != 6:
            raise InputError(f"{path}:{n}: expected 'qid Q0 docid rank score tag', got {len(parts)} fields")
        qid, _, docid, rank_field, score_field, _ = parts
        try:
            lines.setdefault(qid, []).append((float(score_field), int(rank_field), docid))
        except ValueError:
            raise InputError(f"{path}:{n}: rank must be an integer and score a number") from None
    run: dict[str, list[Ranked]] = {}
    for qid, rows in lines.items():
        seen: set[str] = set()
        ranked = []
        for score, _, docid in sorted(rows, key=lambda r: (-r[0], r[1])):
            if docid in seen:
                raise InputError(f"{path}: query {qid} lists document {docid} twice")
            seen.add(docid)
            ranked.append(Ranked(docid=docid, score=score))
        run[qid] = ranked
    if not run:
        raise InputError(f"{path}: no ranked documents")
    return run


def _json_lines(path: Path, id_fields: tuple[str, ...]) -> list[tuple[int, str, dict[str, object]]]:
    out = []
    for n, line in _lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{n}: not JSON: {exc.msg}") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{n}: expected a JSON object")
        ident = next((record[f] for f in id_fields if f in record), None)
        if not isinstance(ident, (str, int)) or isinstance(ident, bool):
            raise InputError(f"{path}:{n}: no id (one of {', '.join(id_fields)})")
        out.append((n, str(ident), record))
    return out


def _tab_lines(path: Path, what: str) -> list[tuple[int, str, str]]:
    out = []
    for n, line in _lines(path):
        ident, tab, text = line.partition("\t")
        if not tab or not ident.strip():
            raise InputError(f"{path}:{n}: expected '{what}<TAB>text'")
        out.append((n, ident.strip(), text.strip()))
    return out


def read_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    if path.suffix == ".jsonl":
        for n, qid, record in _json_lines(path, ("id", "_id", "qid")):
            text = record.get("text", record.get("query"))
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"{path}:{n}: no query text ('text' or 'query')")
            queries[qid] = text
    else:
        for _, qid, text in _tab_lines(path, "qid"):
            queries[qid] = text
    if not queries:
        raise InputError(f"{path}: no queries")
    return queries


def read_documents(path: Path) -> dict[str, Document]:
    documents: dict[str, Document] = {}
    if path.suffix == ".jsonl":
        for n, docid, record in _json_lines(path, ("id", "_id", "docid")):
            text, title = record.get("text"), record.get("title")
            if not isinstance(text, str):
                raise InputError(f"{path}:{n}: 'text' must be a string")
            if title is not None and not isinstance(title, str):
                raise InputError(f"{path}:{n}: 'title' must be a string")
            documents[docid] = Document(id=docid, text=text, title=title or None)
    else:
        for _, docid, text in _tab_lines(path, "docid"):
            documents[docid] = Document(id=docid, text=text)
    if not documents:
        raise InputError(f"{path}: no documents")
    return documents


@dataclass(frozen=True)
class Collection:
    qrels: dict[str, dict[str, int]]
    run: dict[str, list[Ranked]]
    queries: dict[str, str]
    documents: dict[str, Document]

    @property
    def evaluated(self) -> list[str]:
        """The queries that can be evaluated: judged, and in the run."""
        return [qid for qid in self.run if qid in self.qrels]


def load_collection(*, qrels: Path, run: Path, queries: Path, documents: Path) -> Collection:
    """All four files, checked against each other: every run query has text, every run document exists."""
    collection = Collection(
        qrels=read_qrels(qrels), run=read_run(run), queries=read_queries(queries), documents=read_documents(documents)
    )
    for qid, ranked in collection.run.items():
        if qid not in collection.queries:
            raise InputError(f"{run}: query {qid} has no text in {queries}")
        missing = next((r.docid for r in ranked if r.docid not in collection.documents), None)
        if missing is not None:
            raise InputError(f"{run}: query {qid} ranks document {missing}, which {documents} does not have")
    if not collection.evaluated:
        raise InputError(f"{run}: no query of the run is judged in {qrels}")
    return collection
