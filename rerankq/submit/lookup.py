"""The queries and documents of a TREC run, found by id without holding them in memory.

A corpus can be far larger than memory, so neither file is loaded: one pass writes each
id with its line's offset and length into a scratch SQLite file, and a lookup reads that
line back from the file. Each file is JSONL (``{"id" or "_id", ...}``, BEIR's layout included)
or TSV (``id<TAB>text``; documents also ``id<TAB>title<TAB>text``), told apart by its first
non-blank character.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from kernel.wire import Candidate

#: Fields of a JSONL document passed on to the candidate as they are (a title becomes its context).
_CANDIDATE_FIELDS = set(Candidate.__struct_fields__) - {"id", "fusion_score"}


class _Ids(msgspec.Struct):
    """Just the id of a JSONL line (any other field is skipped without being built)."""

    id: str | int | None = None
    underscore_id: str | int | None = msgspec.field(default=None, name="_id")
    docid: str | int | None = None
    qid: str | int | None = None

    def first(self) -> str | None:
        for value in (self.id, self.underscore_id, self.docid, self.qid):
            if value is not None and not isinstance(value, bool):
                return str(value)
        return None


_decode_ids = msgspec.json.Decoder(_Ids).decode


def is_jsonl(path: Path) -> bool:
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                return line.lstrip().startswith(b"{")
    return False


class Lookup:
    """Queries and documents by id, through an index in ``scratch`` (a directory)."""

    def __init__(self, queries: Path, documents: Path, scratch: Path) -> None:
        self.files = {"query": queries, "document": documents}
        self.jsonl = {kind: is_jsonl(path) for kind, path in self.files.items()}
        self.db = sqlite3.connect(scratch / "lookup.sqlite")
        self.db.executescript(
            "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
            "CREATE TABLE entries (kind TEXT, id TEXT, offset INTEGER, length INTEGER, "
            "PRIMARY KEY (kind, id)) WITHOUT ROWID;"
        )
        self._handles = {kind: open(path, "rb") for kind, path in self.files.items()}
        for kind in self.files:
            self._index(kind)

    def _index(self, kind: str) -> None:
        rows: list[tuple[str, str, int, int]] = []
        offset = 0
        with open(self.files[kind], "rb") as fh:
            for raw in fh:
                length = len(raw)
                entry_id = self._id_of(kind, raw)
                if entry_id is not None:
                    rows.append((kind, entry_id, offset, length))
                if len(rows) >= 10_000:
                    self._insert(rows)
                offset += length
        self._insert(rows)

    def _insert(self, rows: list[tuple[str, str, int, int]]) -> None:
        # The first line with an id wins, as a reader scanning the file top-down would find it.
        self.db.executemany("INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?)", rows)
        rows.clear()

    def _id_of(self, kind: str, raw: bytes) -> str | None:
        if not raw.strip():
            return None
        if self.jsonl[kind]:
            try:
                return _decode_ids(raw).first()
            except (msgspec.DecodeError, msgspec.ValidationError):
                return None
        head = raw.split(b"\t", 1)[0].strip()
        try:
            return head.decode() if head else None
        except UnicodeDecodeError:
            return None

    def _read(self, kind: str, entry_id: str) -> bytes | None:
        found = self.db.execute(
            "SELECT offset, length FROM entries WHERE kind = ? AND id = ?", (kind, entry_id)
        ).fetchone()
        if found is None:
            return None
        handle = self._handles[kind]
        handle.seek(found[0])
        return handle.read(found[1])

    def _json(self, raw: bytes, kind: str, entry_id: str) -> dict[str, Any]:
        try:
            entry = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{kind} {entry_id!r} in {self.files[kind]} is not a JSON object: {exc}") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{kind} {entry_id!r} in {self.files[kind]} is not a JSON object")
        return entry

    def query(self, qid: str) -> str | None:
        """The query text, or None when the queries file has no such id. Raises ValueError on a bad line."""
        raw = self._read("query", qid)
        if raw is None:
            return None
        if self.jsonl["query"]:
            entry = self._json(raw, "query", qid)
            text = entry.get("query", entry.get("text"))
            if not isinstance(text, str):
                raise ValueError(f'query {qid!r} in {self.files["query"]} has no "query" or "text" string')
            return text
        parts = raw.decode().rstrip("\r\n").split("\t")
        return parts[-1] if len(parts) >= 2 else ""

    def document(self, docid: str) -> dict[str, Any] | None:
        """The candidate fields of a document (text, its title as context, any candidate field
        a JSONL document carries), or None when the documents file has no such id."""
        raw = self._read("document", docid)
        if raw is None:
            return None
        if self.jsonl["document"]:
            entry = self._json(raw, "document", docid)
            fields = {k: v for k, v in entry.items() if k in _CANDIDATE_FIELDS}
            title = entry.get("title")
            if isinstance(title, str) and title.strip() and "context" not in fields:
                fields["context"] = title
            return fields
        parts = raw.decode().rstrip("\r\n").split("\t")
        if len(parts) >= 3:
            return {"text": parts[2], **({"context": parts[1]} if parts[1].strip() else {})}
        return {"text": parts[1] if len(parts) > 1 else ""}

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self.db.close()
