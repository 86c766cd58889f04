"""Where passages are cut and how their scores make a document's, measured: nDCG@10 of BM25's
top 100 on the long collection, reranked by the packaged bi-encoder's passages, for each way of
cutting (rows) and each way of aggregating (columns), side by side in one run.

The cuts are the worker's own (``worker.scoring.passages.split`` with the member's tokenizer and
``max_length``, the stream defaults otherwise); only the scoring is done here, directly with
sentence-transformers (``encode_query`` / ``encode_document``, normalised: the cosine the
``embedding`` member computes), each distinct passage embedded once for every cut and kept on
disk between runs (``VECTOR_STORE``; ``--no-cache``: not). Rows: ``tokens`` (fixed windows,
half a passage apart), ``structure`` at several fills (``PASSAGE_FILL_SHARE``, the shipped one
marked), and BM25 itself. Columns: the worker's aggregates (``max``, ``first``, ``sum_top_k``,
``max_mean``: ``worker.scoring.passages.aggregate``) and two read here only (``AGGREGATES``).
The same again on the collection with every paragraph break removed (``flat``), where
structure falls back to sentences.

    python -m ops.bench.passage_quality --json /tmp/passage_quality.json
"""

from __future__ import annotations

import argparse
import importlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.bench.common import CACHE_DIR, ROOT, print_table, write_json

COLLECTION = ROOT / "worker" / "collection" / "long"
FILLS = (0.0, 0.25, 0.5, 1.0)
DEPTH = 100


@dataclass
class Encoder:
    """The packaged bi-encoder, every text embedded once; with ``store``, the vectors kept on
    disk between runs (keyed by the text's SHA-256, so a cut or a header that changes a passage
    embeds only the passages it changed)."""

    model: Any
    cache: dict[str, Any]
    store: Path | None = None
    fresh: int = 0

    def documents(self, texts: Sequence[str]) -> list[Any]:
        keys = [_key(t) for t in texts]
        todo = {k: t for k, t in zip(keys, texts) if k not in self.cache}
        if todo:
            vectors = self.model.encode_document(
                list(todo.values()), batch_size=32, normalize_embeddings=True, convert_to_tensor=True
            )
            self.cache.update(zip(todo, vectors))
            self.fresh += len(todo)
        return [self.cache[k] for k in keys]

    def query(self, text: str) -> Any:
        return self.model.encode_query([text], normalize_embeddings=True, convert_to_tensor=True)[0]

    def save(self) -> None:
        """Write the vectors to ``store`` as a plain float array and a JSON list of keys (read back with
        ``allow_pickle=False``)."""
        if self.store is None or not self.fresh:
            return
        import json

        import numpy as np
        import torch

        self.store.mkdir(parents=True, exist_ok=True)
        keys = list(self.cache)
        np.save(self.store / "vectors.npy", torch.stack([self.cache[k] for k in keys]).cpu().numpy())
        (self.store / "keys.json").write_text(json.dumps(keys))
        self.fresh = 0


def _key(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: Where the packaged bi-encoder's passage vectors are kept between runs (``--no-cache``: not).
VECTOR_STORE = CACHE_DIR / "passage-vectors-minilm-v1"


def load_encoder(store: Path | None = VECTOR_STORE) -> Encoder:
    from sentence_transformers import SentenceTransformer

    from kernel.settings import PACKAGED_EMBEDDING_MODULE

    package = importlib.import_module(PACKAGED_EMBEDDING_MODULE)
    model = SentenceTransformer(str(Path(package.get_model_path())), device="cpu")
    cache: dict[str, Any] = {}
    if store is not None and (store / "keys.json").exists():
        import json

        import numpy as np
        import torch

        keys = json.loads((store / "keys.json").read_text())
        vectors = torch.from_numpy(np.load(store / "vectors.npy", allow_pickle=False))
        cache = dict(zip(keys, vectors))
    return Encoder(model=model, cache=cache, store=store)


def load(folder: Path = COLLECTION) -> Any:
    from evaluation.trec import load_collection

    return load_collection(
        qrels=folder / "qrels.txt",
        run=folder / "run.bm25.txt",
        queries=folder / "queries.tsv",
        documents=folder / "documents.jsonl",
    )


Rankings = dict[str, list[str]]
#: Per query, each of BM25's top documents' score (the cosine, as the member normalises it:
#: clipped at 0), aggregated over its passages.
BestScores = dict[str, dict[str, float]]
#: Per query, each of BM25's top documents' passages: their texts and scores, in document order.
PassageScores = dict[str, dict[str, list[tuple[str, float]]]]


def passage_scores(
    collection: Any, encoder: Encoder, cut: Callable[[str, str], list[str]]
) -> tuple[PassageScores, int]:
    """Each query's BM25 top documents' passages, scored; and how many passages.
    ``cut(query, docid)``: a bi-encoder's passages do not depend on the query, so a document
    is cut (and each passage embedded) once."""
    scores: PassageScores = {}
    passages = 0
    for qid in collection.evaluated:
        query = collection.queries[qid]
        q = encoder.query(query)
        scores[qid] = {}
        for ranked in collection.run[qid][:DEPTH]:
            texts = cut(query, ranked.docid)
            passages += len(texts)
            vectors = encoder.documents(texts)
            scores[qid][ranked.docid] = [(t, max(0.0, float(q @ v))) for t, v in zip(texts, vectors)]
    return scores, passages


#: How a document's score is read from its passages': the worker's aggregates
#: (``worker.scoring.passages.aggregate``, k = the stream default), then two read here only, for
#: comparison: the mean of the best and the first passage (a hybrid of MaxP and FirstP), and the
#: best passage with a nudge for the share of the query's words it holds (query-term aware).
WORKER_AGGREGATES = ("max", "first", "sum_top_k", "max_mean")
BENCH_AGGREGATES = ("max+first", "max, query terms")
#: The nudge per share of the query's words a passage holds (``max, query terms``).
QUERY_TERM_NUDGE = 0.1
_WORD = re.compile(r"\w+")


def aggregated(passages: list[tuple[str, float]], how: str, query: str) -> float:
    from kernel.stream_defaults import PASSAGE_TOP_K
    from worker.scoring.passages import aggregate

    scores = [score for _, score in passages]
    if how == "max+first":
        return (max(scores) + scores[0]) / 2
    if how == "max, query terms":
        words = {w for w in _WORD.findall(query.lower()) if len(w) > 2}
        return max(score + QUERY_TERM_NUDGE * _share(words, text) for text, score in passages)
    result = aggregate(scores, how, top_k=PASSAGE_TOP_K, normalise=lambda s: s)  # type: ignore[arg-type]
    return result.score if result is not None else 0.0


def _share(words: set[str], text: str) -> float:
    return len(words & set(_WORD.findall(text.lower()))) / len(words) if words else 0.0


def document_scores(
    collection: Any, encoder: Encoder, cut: Callable[[str, str], list[str]], how: str = "max"
) -> tuple[BestScores, int]:
    """Each query's BM25 top documents scored by their passages, aggregated ``how``; and how
    many passages."""
    scores, passages = passage_scores(collection, encoder, cut)
    return {
        qid: {docid: aggregated(ps, how, collection.queries[qid]) for docid, ps in docs.items()}
        for qid, docs in scores.items()
    }, passages


def ranked_by(scores: BestScores) -> Rankings:
    # Ties in BM25's order, as a window's decisions keep fusion order on equal scores.
    return {qid: sorted(docs, key=lambda d: -docs[d]) for qid, docs in scores.items()}


def splitter(
    collection: Any, encoder: Encoder, passage_cut: str, fill: float, flat: bool
) -> Callable[[str, str], list[str]]:
    import kernel.passage_budget as budget
    from kernel.wire import Candidate, StreamSpec
    from worker.scoring.passages import Cutter, split, tokenizer_offsets

    cutter = Cutter(
        offsets=tokenizer_offsets(encoder.model.tokenizer),
        max_length=int(encoder.model.max_seq_length),
        reads_query=False,
    )

    done: dict[str, list[str]] = {}

    def cut(query: str, docid: str) -> list[str]:
        if docid not in done:
            budget.PASSAGE_FILL_SHARE = fill  # the one constant a row varies
            spec = StreamSpec(query=query, window_size=DEPTH, long_documents="passages", passage_cut=passage_cut)
            document = collection.documents[docid]
            text = flatten(document.text) if flat else document.text
            # The header the evaluation's candidates carry: the title as the heading path.
            candidate = Candidate(id=docid, text=text, heading_path=[document.title] if document.title else [])
            done[docid] = [p.text for p in split(candidate, query, cutter, spec)]
        return done[docid]

    return cut


def flatten(text: str) -> str:
    return " ".join(text.split())


def measure(
    collection: Any, encoder: Encoder, flat: bool, fills: Sequence[float]
) -> tuple[list[dict[str, Any]], PassageScores | None]:
    """One row per cut: each aggregate's nDCG@10 side by side, and per query against BM25 for
    the worker's ``max`` and ``max_mean``; and the shipped cut's passage scores."""
    from evaluation.measures import evaluate
    from kernel.limits import PASSAGE_FILL_SHARE

    bm25 = {qid: [r.docid for r in collection.run[qid][:DEPTH]] for qid in collection.evaluated}
    base = evaluate(collection.qrels, bm25)
    rows: list[dict[str, Any]] = [{"cut": "BM25 (the input)", **dict.fromkeys(AGGREGATES, base.mean["nDCG@10"])}]
    variants = [("tokens", PASSAGE_FILL_SHARE)] + [("structure", fill) for fill in fills]
    shipped_scores = None
    for passage_cut, fill in variants:
        started = time.perf_counter()
        scored, passages = passage_scores(collection, encoder, splitter(collection, encoder, passage_cut, fill, flat))
        name = passage_cut if passage_cut == "tokens" else f"structure, fill {fill:g}"
        shipped = passage_cut == "structure" and fill == PASSAGE_FILL_SHARE
        shipped_scores = scored if shipped else shipped_scores
        row: dict[str, Any] = {"cut": name + (" (shipped)" if shipped else ""), "passages": passages}
        for how in AGGREGATES:
            documents = {
                qid: {d: aggregated(ps, how, collection.queries[qid]) for d, ps in docs.items()}
                for qid, docs in scored.items()
            }
            measured = evaluate(collection.qrels, ranked_by(documents))
            row[how] = measured.mean["nDCG@10"]
            if how in ("max", "max_mean"):
                row[f"{how} vs BM25 +/=/-"] = versus(measured.per_query["nDCG@10"], base.per_query["nDCG@10"])
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
    return rows, shipped_scores


def share_held_out(collection: Any, scored: PassageScores) -> list[dict[str, Any]]:
    """``max_mean``'s share of the best passage, chosen where it is not measured: on each half of
    the queries (sorted ids, alternating) the share of a grid (0, 0.05, ..., 1) that ranks best,
    and nDCG@10 at that share on the other half, beside BM25 and ``max`` there."""
    from evaluation.measures import evaluate

    def ndcg(share: float, qids: Sequence[str]) -> float:
        documents = {
            qid: {d: share * max(s for _, s in ps) + (1 - share) * sum(s for _, s in ps) / len(ps) for d, ps in docs}
            for qid, docs in ((q, scored[q].items()) for q in qids)
        }
        return float(evaluate(collection.qrels, ranked_by(documents)).mean["nDCG@10"])

    qids = sorted(scored)
    halves = (qids[0::2], qids[1::2])
    grid = [round(i / 20, 2) for i in range(21)]
    rows = []
    for k, (train, test) in enumerate((halves, halves[::-1])):
        share = max(grid, key=lambda g: (round(ndcg(g, train), 9), -g))
        bm25 = evaluate(collection.qrels, {q: [r.docid for r in collection.run[q][:DEPTH]] for q in test})
        rows.append(
            {
                "held out": f"half {k + 1} ({len(test)} queries)",
                "share fitted on the other half": share,
                "max_mean at it": ndcg(share, test),
                "max": ndcg(1.0, test),
                "bm25": bm25.mean["nDCG@10"],
            }
        )
    return rows


AGGREGATES = WORKER_AGGREGATES + BENCH_AGGREGATES
COLUMNS = ["cut", "passages", *AGGREGATES, "max vs BM25 +/=/-", "max_mean vs BM25 +/=/-", "seconds"]


def versus(mine: dict[str, float], theirs: dict[str, float]) -> str:
    better = sum(mine[q] > theirs[q] + 1e-9 for q in theirs)
    worse = sum(mine[q] < theirs[q] - 1e-9 for q in theirs)
    return f"{better} / {len(theirs) - better - worse} / {worse}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.passage_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--fills", type=float, nargs="+", default=list(FILLS), help=f"the structure rows' fills  [default: {FILLS}]"
    )
    parser.add_argument(
        "--flat-fills",
        type=float,
        nargs="*",
        default=None,
        help="the fills of the flat rows  [default: the shipped one]",
    )
    parser.add_argument(
        "--collections",
        nargs="+",
        choices=["paragraphs", "flat"],
        default=["paragraphs", "flat"],
        help="the long collection as shipped, and with its paragraph breaks removed",
    )
    parser.add_argument("--no-cache", action="store_true", help="embed every passage afresh; keep nothing on disk")
    args = parser.parse_args(argv)
    import torch

    torch.set_grad_enabled(False)
    collection, encoder = load(), load_encoder(None if args.no_cache else VECTOR_STORE)
    figures: dict[str, Any] = {}
    from kernel.limits import PASSAGE_FILL_SHARE
    from worker.scoring.passages import MAX_MEAN_BEST_SHARE

    flat_fills = [PASSAGE_FILL_SHARE] if args.flat_fills is None else args.flat_fills
    for flat in [name == "flat" for name in args.collections]:
        rows, shipped = measure(collection, encoder, flat, flat_fills if flat else args.fills)
        title = "the long collection" + (", paragraph breaks removed" if flat else "")
        print_table(
            f"{title}: nDCG@10 of BM25's top {DEPTH} reranked by the passages' scores, each aggregate",
            COLUMNS,
            [[row.get(h, "") for h in COLUMNS] for row in rows],
        )
        figures["flat" if flat else "paragraphs"] = rows
        if shipped is not None:
            shares = share_held_out(collection, shipped)
            print_table(
                f"{title}: max_mean's share of the best passage, fitted on one half, measured on the other "
                f"(shipped: {MAX_MEAN_BEST_SHARE})",
                list(shares[0]),
                [list(r.values()) for r in shares],
            )
            figures[("flat" if flat else "paragraphs") + " max_mean share held out"] = shares
    encoder.save()
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
