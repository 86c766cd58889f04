"""The long-document evaluation collection: generated from the shipped one with a fixed seed,
each judged part set early, in the middle or late among notes relevant to no query, and what
``rerankq eval --long-documents`` evaluates when no files are named."""

from __future__ import annotations

import json
import random

from evaluation.command import collection_files, shipped
from ops import build_long_collection as build


def lines(name: str) -> list[str]:
    return shipped(name).read_text().splitlines()


def test_the_shipped_long_collection_is_what_the_generator_makes_from_the_short_one():
    documents = [json.loads(line) for line in lines("documents.jsonl")]
    qrels = build.read_qrels(shipped("qrels.txt"))
    made, where = build.long_documents(documents, qrels, random.Random(build.SEED))
    assert [json.dumps(d, ensure_ascii=False) for d in made] == lines("long/documents.jsonl")
    # Every judgement carried over to the long document holding the judged text.
    assert lines("long/qrels.txt") == [f"{q} 0 long-{d} {g}" for q, d, g in qrels]
    assert lines("long/queries.tsv") == lines("queries.tsv")
    text = {d["id"]: d["text"] for d in documents}
    grades = {d: g for _, d, g in qrels}
    for long in made:
        core = text[long["id"].removeprefix("long-")]
        parts = long["text"].split("\n\n")
        assert parts.count(core) == 1 and build.MIN_WORDS <= len(long["text"].split()) <= build.MAX_WORDS + 80
        # The padding is relevant to no query: only the core can earn the document a grade.
        assert all(grades.get(docid, 0) == 0 for docid, t in text.items() if t in parts and t != core)
        share = parts.index(core) / (len(parts) - 1)
        low, high = build.DEPTHS[where[long["id"]]]
        assert low - 0.02 <= share <= high + 0.02
    relevant = [d for d in where if grades[d.removeprefix("long-")] > 0]
    assert {where[d] for d in relevant} == {"early", "middle", "late"}
    run_ids = {line.split()[2] for line in lines("long/run.bm25.txt")}
    assert run_ids <= {d["id"] for d in made}


def test_eval_long_documents_picks_the_long_collection_when_no_files_are_named():
    qrels, run, queries, documents = collection_files(None, None, None, None, long_documents="passages")
    assert (qrels, run, documents) == (
        shipped("long/qrels.txt"),
        shipped("long/run.bm25.txt"),
        shipped("long/documents.jsonl"),
    )
    assert all(path.exists() for path in (qrels, run, queries, documents))
    assert collection_files(None, None, None, None, long_documents=None)[3] == shipped("documents.jsonl")
