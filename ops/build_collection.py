"""Build the shipped evaluation collection from its source, ``ops/collection/topics.toml``.

Writes into ``worker/collection/``:

- ``documents.jsonl``: every document (``id``, ``title``, ``text``), topics' and filler;
- ``queries.tsv``: ``qid<TAB>query``;
- ``qrels.txt``: ``qid 0 docid grade`` for every document written for the query's topic
  (grades 0-3, the zeros included: the lexical traps are judged too), and the judgements
  across topics the source lists;
- ``run.bm25.txt``: the first stage, ``qid Q0 docid rank score bm25s``: the top
  ``--depth`` (100) documents by BM25 over title and text, only those sharing a term with
  the query (a score above 0), ties by document id.

BM25 is bm25s's Lucene variant (k1 1.5, b 0.75) over lower-cased words of two or more
characters, no stemming and no stopword list, like Lucene's StandardAnalyzer: the function
words of a question weigh almost nothing (their IDF is tiny) but let every query reach a
full candidate list. Run from the repository root:

    python -m ops.build_collection
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "ops" / "collection" / "topics.toml"
TARGET = ROOT / "worker" / "collection"


def load_source(path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    source = tomllib.loads(path.read_text())
    topics, filler, across = source["topic"], source.get("filler", []), source.get("judgement", [])
    ids = [d["id"] for t in topics for d in t["doc"]] + [d["id"] for d in filler]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise SystemExit(f"duplicate document ids: {sorted(duplicates)}")
    for topic in topics:
        grades = sorted(d["grade"] for d in topic["doc"])
        if not set(grades) <= {0, 1, 2, 3} or 3 not in grades:
            raise SystemExit(f"{topic['id']}: grades must be 0-3 with at least one 3, got {grades}")
    queries = {t["id"]: {d["id"] for d in t["doc"]} for t in topics}
    for j in across:
        if j["query"] not in queries or j["doc"] not in ids or j["doc"] in queries[j["query"]]:
            raise SystemExit(f"judgement {j}: needs a known query and a document of another topic")
        if j["grade"] not in (0, 1, 2, 3) or not j.get("why"):
            raise SystemExit(f"judgement {j}: a grade 0-3 and why")
    return topics, filler, across


def bm25_run(topics: list[dict], documents: list[dict], depth: int) -> list[str]:
    import bm25s

    texts = [f"{d['title']} {d['text']}" for d in documents]
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(bm25s.tokenize(texts, stopwords=None, show_progress=False), show_progress=False)
    lines = []
    for topic in topics:
        query = bm25s.tokenize([topic["query"]], stopwords=None, show_progress=False)
        found, scores = retriever.retrieve(query, k=len(documents), show_progress=False)
        ranked = sorted(
            ((float(s), documents[int(i)]["id"]) for i, s in zip(found[0], scores[0]) if s > 0),
            key=lambda pair: (-pair[0], pair[1]),
        )[:depth]
        lines += [
            f"{topic['id']} Q0 {docid} {rank} {score:.4f} bm25s" for rank, (score, docid) in enumerate(ranked, start=1)
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=100, help="documents per query in the run")
    args = parser.parse_args()
    topics, filler, across = load_source(SOURCE)
    documents = [{"id": d["id"], "title": d["title"], "text": d["text"]} for t in topics for d in t["doc"]]
    documents += [{"id": d["id"], "title": d["title"], "text": d["text"]} for d in filler]
    TARGET.mkdir(parents=True, exist_ok=True)
    (TARGET / "documents.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents))
    (TARGET / "queries.tsv").write_text("".join(f"{t['id']}\t{t['query']}\n" for t in topics))
    qrels = [(t["id"], d["id"], d["grade"]) for t in topics for d in t["doc"]]
    qrels += [(j["query"], j["doc"], j["grade"]) for j in across]
    (TARGET / "qrels.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, d, g in sorted(qrels)))
    run = bm25_run(topics, documents, args.depth)
    (TARGET / "run.bm25.txt").write_text("\n".join(run) + "\n")
    per_query = {t["id"]: sum(1 for line in run if line.startswith(t["id"] + " ")) for t in topics}
    print(
        f"{len(topics)} queries, {len(documents)} documents, "
        f"{len(qrels)} judgements; run depth {min(per_query.values())}-"
        f"{max(per_query.values())} per query; written to {TARGET}"
    )


if __name__ == "__main__":
    main()
