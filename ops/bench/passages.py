"""Long documents as passages: what splitting costs, and what the embedding cache gives back.

Windows of the long-document collection (``worker/collection/long``: documents of
1,300-2,400 words, the shipped queries; each window one query's BM25 top documents) are
scored by the worker's own path, in this process: a stream opened by the client, its window
run by the ``WindowScorer`` a worker holds (begin, cutting, the chain with the pair cache
and the embedding cache on a private Redis, decide, commit). Two members, each a chain of
its own: ``embedding`` (the packaged all-MiniLM-L6-v2) and ``local`` (the bench
cross-encoder, ``ops/bench/common.py`` ``bench_model``), both on the CPU. For each window,
in this order:

- ``excerpt``: the query-centred excerpt, one pair per document (caches emptied first);
- ``passages cold, token windows``: the same with ``passage_cut="tokens"`` (fixed windows half
  a passage apart, the cut before structure-aware cutting), the caches emptied first;
- ``passages cold``: every passage of every document as the stream default cuts them (at the
  document's breaks), the caches emptied first: each passage is embedded (scored) for the
  first time;
- ``passage texts as a window``: those same passages (the worker's cut, header and all), each
  sent as a document of its own in one plain window, the caches emptied first: the engine's
  pairs/s on pairs of the same token lengths, which passages should cost no more than;
- ``passages warm``: the same documents under another query of the collection, right after:
  the batch-run case, where documents recur across queries. The pair cache cannot answer
  (a pair is a query and a document); the embedding cache holds every passage's vector, so
  the bi-encoder embeds only the query. A cross-encoder reads query and passage together:
  nothing it computed before helps it;
- ``passages repeat``: the cold stream again (same query, same documents): the pair cache
  answers every passage, for either member.

Rounds alternate the members and go through every window; each rate is the round's
documents (or passages) over the summed time of its windows, and each ratio is taken per
round, the median shown. Reported per member and mode: documents/s, passages/s (what the
member was asked to score: one per document in excerpt mode), pairs/s (what the model itself
computed: for ``local`` the pairs the pair cache missed, for ``embedding`` the texts the
embedding cache missed, the query aside), and the hit rates the store's counters observed.

    python -m ops.bench.passages --quick --json /tmp/passages.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel import stream_defaults
from ops.bench.common import ROOT, bench_model, print_table, worker_env, write_json

COLLECTION = ROOT / "worker" / "collection" / "long"
MODES = (
    "excerpt",
    "passages cold",
    "passage texts as a window",
    "passages cold, token windows",
    "passages warm",
    "passages repeat",
)
MEMBERS = {
    "embedding": {"RERANKQ_RERANKER_PROVIDER": "embedding"},
    "local": {"RERANKQ_RERANKER_PROVIDER": "local"},  # the model is the bench model, set in main
}


@dataclass
class Tally:
    """One member's one mode over a round: seconds, and what was scored in them."""

    seconds: float = 0.0
    documents: int = 0
    passages: int = 0
    model_pairs: int = 0
    pair_hits: int = 0
    pair_misses: int = 0
    embedding_hits: int = 0
    embedding_misses: int = 0

    def add(self, other: Tally) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def rate(self, what: str) -> float:
        return getattr(self, what) / self.seconds if self.seconds else float("nan")


@dataclass
class Window:
    query: str
    other_query: str  # another query over the same documents: the warm mode's
    candidates: list[dict[str, object]]


@dataclass
class Subject:
    """One member's chain in a worker's runtime, and a client of the same store."""

    name: str
    runtime: Any
    client: Any
    streams: int = 0
    rounds: list[dict[str, Tally]] = field(default_factory=list)

    def flush_caches(self) -> None:
        client = self.runtime.store.client
        for pattern in self.runtime.store.keys.cache_patterns:
            batch = list(client.scan_iter(match=pattern, count=1000))
            if batch:
                client.delete(*batch)

    def score(
        self,
        query: str,
        candidates: list[dict[str, object]],
        long_documents: str,
        passage_cut: str | None = None,
        document_budget: int | None = None,
    ) -> Tally:
        """One window through the worker's scorer, timed; what it scored, from the store's counters."""
        before = self.client.store.counters()
        stream = self.client.open(
            query,
            candidates,
            window_size=len(candidates),
            long_documents=long_documents,
            passage_cut=passage_cut,
            document_budget=document_budget,
            ttl_s=600,
        )
        self.streams += 1
        started = time.perf_counter()
        outcome = self.runtime.scorer.process(stream, 0, delivery=f"bench-{self.name}-{self.streams}")
        seconds = time.perf_counter() - started
        if outcome != "committed":
            raise RuntimeError(f"{self.name}: window {outcome}")
        after = self.client.store.counters()

        def delta(name: str) -> int:
            return after.get(name, 0) - before.get(name, 0)

        tally = Tally(
            seconds=seconds,
            documents=len(candidates),
            pair_hits=delta("pair_cache_hits"),
            pair_misses=delta("pair_cache_misses"),
            embedding_hits=delta("embedding_cache_hits"),
            embedding_misses=delta("embedding_cache_misses"),
        )
        tally.passages = tally.pair_hits + tally.pair_misses
        tally.model_pairs = tally.embedding_misses if self.name == "embedding" else tally.pair_misses
        return tally

    def window(self, window: Window, modes: Sequence[str], cold_first: bool) -> dict[str, Tally]:
        """The window in each of ``modes`` (``passages cold`` runs too where ``warm`` or
        ``repeat`` need it); the plain window of passage texts before the cold passages, or
        after where ``cold_first``, so neither always meets the process as the other left it."""
        out: dict[str, Tally] = {}
        if "excerpt" in modes:
            self.flush_caches()
            out["excerpt"] = self.score(window.query, window.candidates, "excerpt")
        if "passages cold, token windows" in modes:
            self.flush_caches()
            out["passages cold, token windows"] = self.score(
                window.query, window.candidates, "passages", passage_cut="tokens"
            )
        steps = [self._as_window, self._cold]
        for step in steps[::-1] if cold_first else steps:
            step(window, modes, out)
        return out

    def _as_window(self, window: Window, modes: Sequence[str], out: dict[str, Tally]) -> None:
        if "passage texts as a window" in modes:
            texts = self.passage_texts(window)
            # Each text whole, as its passage is sent: the default budget (2,048 code points) would
            # cut a cross-encoder's passages (about 450 tokens, 2,300 code points) to excerpts.
            budget = max(stream_defaults.DOCUMENT_BUDGET, max(len(str(t["text"])) for t in texts))
            self.flush_caches()
            out["passage texts as a window"] = self.score(window.query, texts, "excerpt", document_budget=budget)

    def _cold(self, window: Window, modes: Sequence[str], out: dict[str, Tally]) -> None:
        if not {"passages cold", "passages warm", "passages repeat"} & set(modes):
            return
        self.flush_caches()
        out["passages cold"] = self.score(window.query, window.candidates, "passages")
        if "passages warm" in modes:
            out["passages warm"] = self.score(window.other_query, window.candidates, "passages")
        if "passages repeat" in modes:
            out["passages repeat"] = self.score(window.query, window.candidates, "passages")

    def passage_texts(self, window: Window) -> list[dict[str, object]]:
        """The window's passages as the worker cuts them, each a document of its own: a window of
        the same pairs, token lengths and all, scored as any window is."""
        import msgspec

        from kernel.wire import Candidate, StreamSpec
        from worker.scoring.passages import chain_cutter, window_passages

        candidates = [msgspec.convert(c, Candidate) for c in window.candidates]
        spec = StreamSpec(query=window.query, window_size=len(candidates), long_documents="passages")
        cutter = chain_cutter(self.runtime.scorer.chain.members_for(None))
        texts = window_passages(candidates, spec, cutter).texts
        return [{"id": f"p{i}", "text": text} for i, text in enumerate(texts)]


def load_windows(n_windows: int, depth: int) -> list[Window]:
    from evaluation.runner import candidates_for
    from evaluation.trec import load_collection

    collection = load_collection(
        qrels=COLLECTION / "qrels.txt",
        run=COLLECTION / "run.bm25.txt",
        queries=COLLECTION / "queries.tsv",
        documents=COLLECTION / "documents.jsonl",
    )
    qids = [q for q in collection.evaluated if q in collection.run][:n_windows]
    if len(qids) < 2:
        raise RuntimeError(f"{COLLECTION}: fewer than two queries with a run (python -m ops.build_long_collection)")
    return [
        Window(
            query=collection.queries[qid],
            other_query=collection.queries[qids[(i + 1) % len(qids)]],
            candidates=candidates_for(collection, qid, depth),
        )
        for i, qid in enumerate(qids)
    ]


def start_subjects(redis_url: str, torch_threads: int | None, members: Sequence[str]) -> list[Subject]:
    from kernel.settings import load_settings
    from producer import RerankClient
    from worker.runtime import Runtime

    subjects = []
    for name, extra in MEMBERS.items():
        if name not in members:
            continue
        env = worker_env(
            redis_url,
            f"bp-{name}",
            RERANKQ_DEVICE="cpu",
            RERANKQ_PAIR_CACHE="true",
            RERANKQ_MAX_WINDOW_SIZE="256",
            **({"RERANKQ_TORCH_THREADS": str(torch_threads)} if torch_threads else {}),
            **extra,
        )
        settings = load_settings(env)
        runtime = Runtime(settings)
        runtime.warm_up()
        subjects.append(Subject(name=name, runtime=runtime, client=RerankClient(settings)))
    return subjects


def round_ratios(subject: Subject, over: str, under: str, what: str) -> list[float]:
    return [
        r[over].rate(what) / r[under].rate(what)
        for r in subject.rounds
        if over in r and under in r and r[under].rate(what)
    ]


def median_ratio(subject: Subject, over: str, under: str, what: str) -> float:
    ratios = round_ratios(subject, over, under, what)
    return statistics.median(ratios) if ratios else float("nan")


def hit_rate(hits: int, misses: int) -> float | str:
    return round(hits / (hits + misses), 3) if hits + misses else "-"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller windows (a few minutes on a CPU)")
    parser.add_argument("--windows", type=int, default=None, help="queries (one window each)")
    parser.add_argument("--depth", type=int, default=None, help="documents per window (a query's BM25 top)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="as RERANKQ_TORCH_THREADS (default: the worker's, cores / processes); on a host busy with "
        "other work, 1 keeps a small forward from waiting on threads the host cannot run",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="the modes to run (the cold passages run too where warm or repeat need them); "
        "'passages cold' and 'passage texts as a window' alone make the engine's ratio",
    )
    parser.add_argument("--members", nargs="+", choices=list(MEMBERS), default=list(MEMBERS))
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args(argv)


def run_rounds(subjects: list[Subject], windows: list[Window], rounds: int, modes: Sequence[str]) -> None:
    """Every window through every member, the members' order (and that of the cold passages
    and their plain window) alternated per round."""
    warm_up = Window(windows[0].query, windows[0].other_query, windows[0].candidates[:1])
    for subject in subjects:  # unmeasured: first calls, allocator, the libraries' own caches
        subject.window(warm_up, MODES, cold_first=False)
    for r in range(rounds):
        order = subjects if r % 2 == 0 else subjects[::-1]
        totals = {s.name: defaultdict(Tally) for s in subjects}
        for window in windows:
            for subject in order:
                for mode, tally in subject.window(window, modes, cold_first=r % 2 == 1).items():
                    totals[subject.name][mode].add(tally)
        for subject in subjects:
            subject.rounds.append(dict(totals[subject.name]))
        print(
            f"round {r + 1}/{rounds}: "
            + ", ".join(
                f"{s.name} {m} {totals[s.name][m].rate('documents'):.2f} docs/s"
                for s in subjects
                for m in MODES
                if m in totals[s.name]
            ),
            flush=True,
        )


def measured(
    windows: list[Window], rounds: int, torch_threads: int | None, modes: Sequence[str], members: Sequence[str]
) -> list[Subject]:
    """The members' rounds, on a private Redis started and stopped here."""
    from worker.embedded.redis_server import EmbeddedRedis

    server = EmbeddedRedis().start()
    subjects: list[Subject] = []
    try:
        subjects = start_subjects(server.url, torch_threads, members)
        run_rounds(subjects, windows, rounds, modes)
    finally:
        for subject in subjects:
            subject.client.close()
            subject.runtime.close()
        server.stop()
    return subjects


def mode_figures(subject: Subject, mode: str) -> tuple[list[Any], dict[str, Any]]:
    """One member's one mode: its table row and its JSON figures."""
    total = Tally()
    for round_ in subject.rounds:
        total.add(round_[mode])
    per_round = [round_[mode] for round_ in subject.rounds]
    docs = statistics.median(t.rate("documents") for t in per_round)
    passages = statistics.median(t.rate("passages") for t in per_round)
    pairs = statistics.median(t.rate("model_pairs") for t in per_round)
    pair_hit = hit_rate(total.pair_hits, total.pair_misses)
    embedding_hit = hit_rate(total.embedding_hits, total.embedding_misses)
    per_document = total.passages / total.documents
    row = [subject.name, mode, docs, passages, pairs, round(per_document, 1), pair_hit, embedding_hit]
    figures = {
        "documents_per_s": docs,
        "passages_per_s": passages,
        "model_pairs_per_s": pairs,
        "passages_per_document": per_document,
        "model_pairs_per_document": total.model_pairs / total.documents,
        "pair_cache_hit_rate": pair_hit,
        "embedding_cache_hit_rate": embedding_hit,
    }
    return row, figures


#: (label, mode over, mode under, the rate compared).
RATIOS = (
    ("passages cold vs excerpt, docs/s", "passages cold", "excerpt", "documents"),
    ("structure cut vs token windows, cold, docs/s", "passages cold", "passages cold, token windows", "documents"),
    ("passages cold vs their texts as a window, pairs/s", "passages cold", "passage texts as a window", "model_pairs"),
    ("passages warm vs cold, docs/s", "passages warm", "passages cold", "documents"),
    ("passages repeat vs cold, docs/s", "passages repeat", "passages cold", "documents"),
)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n_windows = args.windows or (2 if args.quick else 6)
    depth = args.depth or (4 if args.quick else 10)
    rounds = args.rounds or (2 if args.quick else 3)
    MEMBERS["local"]["RERANKQ_RERANKER_MODEL"] = str(bench_model())
    from worker.logs import configure_logging

    # A worker's logging, warnings and up: its INFO line per window would be most of the output.
    configure_logging(level="WARNING")
    # No worker consumes the queue the streams are published to: their windows are run here.
    logging.getLogger("rerankq.producer").setLevel(logging.ERROR)
    windows = load_windows(n_windows, depth)
    subjects = measured(windows, rounds, args.torch_threads, args.modes, args.members)

    rows, figures = [], {}
    for subject in subjects:
        figures[subject.name] = {}
        for mode in MODES:
            if all(mode in round_ for round_ in subject.rounds):
                row, figures[subject.name][mode] = mode_figures(subject, mode)
                rows.append(row)
    print_table(
        f"{len(windows)} windows of {depth} long documents, {rounds} alternated rounds, CPU, torch threads "
        f"{args.torch_threads or 'the worker default'} "
        "(rates: median over rounds; hit rates: over all rounds)",
        [
            "member",
            "mode",
            "docs/s",
            "passages/s",
            "model pairs/s",
            "passages/doc",
            "pair cache hits",
            "embedding cache hits",
        ],
        rows,
    )
    ratio_rows = []
    for subject in subjects:
        for label, over, under, what in RATIOS:
            ratios = round_ratios(subject, over, under, what)
            if not ratios:
                continue
            ratio = statistics.median(ratios)
            ratio_rows.append([subject.name, label, round(ratio, 2), f"{min(ratios):.2f}-{max(ratios):.2f}"])
            figures[subject.name][f"ratio: {label}"] = ratio
            figures[subject.name][f"ratios per round: {label}"] = ratios
    print_table(
        "ratios (median of per-round ratios, and their range)", ["member", "ratio", "x", "per round"], ratio_rows
    )
    figures.update(windows=len(windows), depth=depth, rounds=rounds, torch_threads=args.torch_threads)
    write_json(args.json_path, figures)


if __name__ == "__main__":
    main()
