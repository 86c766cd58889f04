"""Build the long-document evaluation collection from the shipped one.

Writes into ``worker/collection/long/``:

- ``documents.jsonl``: one long document per document written for a topic (161):
  ``long-<id>``, its text set among unrelated notes so that it sits early (the first tenth),
  in the middle or late (the last tenth), chosen by a fixed seed, until the document holds
  1,300 to 2,400 words. The padding is drawn from notes relevant to no query (the filler
  notes and the lexical traps, graded 0 wherever judged), so a long document is relevant
  exactly as its own part is. No title: the heading would say what the document is about
  wherever the part sits, and what is measured is whether the part is found;
- ``queries.tsv``: the shipped queries;
- ``qrels.txt``: the shipped judgements, each of ``<id>`` carried over to ``long-<id>``;
- ``run.bm25.txt``: BM25 over the long documents (bm25s, Lucene variant, k1 1.5, b 0.75, as
  ``ops/build_collection.py``), the top 100 per query.

Run from the repository root (the seed makes it the same every time):

    python -m ops.build_long_collection
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "worker" / "collection"
TARGET = SOURCE / "long"
SEED = 23
MIN_WORDS, MAX_WORDS = 1300, 2400
DEPTHS = {"early": (0.0, 0.1), "middle": (0.45, 0.55), "late": (0.9, 1.0)}


def read_qrels(path: Path) -> list[tuple[str, str, int]]:
    rows = []
    for line in path.read_text().splitlines():
        qid, _, docid, grade = line.split()
        rows.append((qid, docid, int(grade)))
    return rows


def long_documents(
    documents: list[dict], qrels: list[tuple[str, str, int]], rng: random.Random
) -> tuple[list[dict], dict[str, str]]:
    best: dict[str, int] = {}
    for _, docid, grade in qrels:
        best[docid] = max(best.get(docid, 0), grade)
    cores = [d for d in documents if d["id"] in best]  # written for a topic, judged
    padding = [d for d in documents if best.get(d["id"], 0) == 0]
    out, where = [], {}
    for core in cores:
        target = rng.randint(MIN_WORDS, MAX_WORDS)
        pool = [d for d in padding if d["id"] != core["id"]]
        rng.shuffle(pool)
        chosen, words, k = [], len(core["text"].split()), 0
        while words < target:
            note = pool[k % len(pool)]  # a short pool is gone through again, in the same order
            chosen.append(note["text"])
            words += len(note["text"].split())
            k += 1
        depth = rng.choice(sorted(DEPTHS))
        low, high = DEPTHS[depth]
        at = rng.randint(round(low * len(chosen)), round(high * len(chosen)))
        chosen.insert(at, core["text"])
        out.append({"id": f"long-{core['id']}", "text": "\n\n".join(chosen)})
        where[f"long-{core['id']}"] = depth
    return out, where


def bm25_run(queries: list[tuple[str, str]], documents: list[dict], depth: int) -> list[str]:
    import bm25s

    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(
        bm25s.tokenize([d["text"] for d in documents], stopwords=None, show_progress=False), show_progress=False
    )
    lines = []
    for qid, text in queries:
        found, scores = retriever.retrieve(
            bm25s.tokenize([text], stopwords=None, show_progress=False), k=len(documents), show_progress=False
        )
        ranked = sorted(
            ((float(s), documents[int(i)]["id"]) for i, s in zip(found[0], scores[0]) if s > 0),
            key=lambda pair: (-pair[0], pair[1]),
        )[:depth]
        lines += [f"{qid} Q0 {docid} {rank} {score:.4f} bm25s" for rank, (score, docid) in enumerate(ranked, 1)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=100, help="documents per query in the run")
    args = parser.parse_args()
    documents = [json.loads(line) for line in (SOURCE / "documents.jsonl").read_text().splitlines()]
    qrels = read_qrels(SOURCE / "qrels.txt")
    queries = [tuple(line.split("\t", 1)) for line in (SOURCE / "queries.tsv").read_text().splitlines()]
    long, where = long_documents(documents, qrels, random.Random(SEED))
    TARGET.mkdir(parents=True, exist_ok=True)
    (TARGET / "documents.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in long))
    (TARGET / "queries.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in queries))
    (TARGET / "qrels.txt").write_text("".join(f"{q} 0 long-{d} {g}\n" for q, d, g in qrels))
    (TARGET / "run.bm25.txt").write_text("\n".join(bm25_run(queries, long, args.depth)) + "\n")  # type: ignore[arg-type]
    words = [len(d["text"].split()) for d in long]
    relevant = {f"long-{d}": g for _, d, g in qrels if g > 0}
    spread = {depth: sum(1 for d, w in where.items() if w == depth and d in relevant) for depth in DEPTHS}
    print(
        f"{len(long)} documents of {min(words)}-{max(words)} words, {len(queries)} queries, {len(qrels)} "
        f"judgements; relevant parts sit {spread}; written to {TARGET}"
    )


if __name__ == "__main__":
    main()
