"""``python -m worker.evaluation``: does reranking improve the input run, at what depth and latency.

With no files named it evaluates the collection the project ships
(``worker/evaluation/collection``: engineering runbooks, incidents, tickets and notes,
judged 0-3, with a BM25 first stage). Each chain member is forced in turn through the real
queue, at each rerank depth, and compared with the input run itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

DEPTHS = (10, 25, 50, 100)


def shipped(name: str) -> Path:
    return Path(str(resources.files("worker.evaluation").joinpath("collection", *name.split("/"))))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker.evaluation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qrels", type=Path, help="TREC qrels: qid 0 docid grade (default: the shipped collection)")
    parser.add_argument("--run", type=Path, help="TREC run, the first stage: qid Q0 docid rank score tag")
    parser.add_argument("--queries", type=Path, help="qid<TAB>text, or JSON lines with id and text")
    parser.add_argument("--documents", type=Path, help="JSON lines with id, text and an optional title, or docid<TAB>text")
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)),
                        help="rerank the top d of the input run, for each d (default: %(default)s)")
    parser.add_argument("--members", help="chain member indexes to force, e.g. 0,1 (default: every member)")
    parser.add_argument("--limit", type=int, help="evaluate only the first N judged queries of the run")
    parser.add_argument("--relevant-grade", type=int, default=1,
                        help="the lowest grade P, R and MRR count as relevant (default: %(default)s)")
    parser.add_argument("--json", dest="json_path", help="write the report as JSON here ('-': stdout, no table)")
    parser.add_argument("--plots", type=Path, help="write PNG plots into this folder")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for one query (default: %(default)s)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"), help="the private worker's device")
    parser.add_argument("--long-documents", choices=("excerpt", "passages"),
                        help="the streams' long_documents option; with no files named, the shipped long-document "
                             "collection (collection/long: 1,300-2,400 words a document, the judged part early, "
                             "in the middle or late)  (default: the deployment's, excerpt)")
    args = parser.parse_args(argv)
    given = [args.qrels, args.run, args.queries, args.documents]
    if any(given) and not all(given):
        parser.error("--qrels, --run, --queries and --documents go together (or none, for the shipped collection)")
    if not any(given):
        folder = "long/" if args.long_documents else ""
        args.qrels, args.run = shipped(folder + "qrels.txt"), shipped(folder + "run.bm25.txt")
        args.queries, args.documents = shipped(folder + "queries.tsv"), shipped(folder + "documents.jsonl")
    try:
        args.depths = sorted({int(d) for d in args.depths.split(",")})
    except ValueError:
        parser.error(f"--depths: comma-separated integers, got {args.depths!r}")
    if not args.depths or min(args.depths) < 1:
        parser.error("--depths: positive integers")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit: a positive integer")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; 0 when done, 2 on bad input or settings, 1 when the queue did not answer."""
    from producer.errors import ConfigError, ValidationError
    from worker.evaluation.trec import InputError, load_collection
    from worker.logs import configure_logging

    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(level="WARNING")
    try:
        collection = load_collection(qrels=args.qrels, run=args.run, queries=args.queries, documents=args.documents)
        return _evaluate(args, collection)
    except (InputError, ConfigError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError) as exc:  # no answer in time; the private worker did not start
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _evaluate(args: argparse.Namespace, collection: Any) -> int:
    from producer import load_settings
    from producer.errors import ConfigError
    from worker.evaluation.measures import evaluate
    from worker.evaluation.plots import write_plots
    from worker.evaluation.report import build_report, render
    from worker.evaluation.runner import environment_notes, run_member, stack

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    env = dict(os.environ)
    chain = load_settings(env).chain()
    members = list(range(len(chain)))
    if args.members:
        try:
            members = [int(i) for i in args.members.split(",")]
        except ValueError:
            raise ConfigError("--members", f"comma-separated member indexes, got {args.members!r}") from None
        if any(not 0 <= i < len(chain) for i in members):
            raise ConfigError("--members", f"the chain has members 0..{len(chain) - 1}")
    qids = collection.evaluated[:args.limit] if args.limit else collection.evaluated
    run_depth = max(len(collection.run[q]) for q in qids)
    depths = sorted({min(d, run_depth) for d in args.depths})
    input_rankings = {q: [r.docid for r in collection.run[q]] for q in qids}
    input_scores = evaluate(collection.qrels, input_rankings, relevant_grade=args.relevant_grade)

    runs, scores, reported = {}, {}, []
    load_before = os.getloadavg()[0]
    progress(f"evaluating {len(qids)} queries, depths {depths}, members "
             + ", ".join(f"{i}:{chain[i].provider}" for i in members))
    with stack(env, max_depth=max(depths), members=members, device=args.device) as where:
        for index in members:
            label = f"{index}:{where.chain[index].provider}"
            entry: dict[str, Any] = {"label": label, "provider": where.chain[index].provider}
            reported.append(entry)
            for depth in sorted(depths, reverse=True):
                run = run_member(where.client, collection, qids, index=index, label=label, depth=depth,
                                 timeout_s=args.timeout, progress=progress, long_documents=args.long_documents)
                if len(run.queries) < len(qids):  # the member failed its first query
                    entry["reason"] = run.queries[0].failed
                    progress(f"{label}: unavailable ({entry['reason']})")
                    break
                runs[(label, depth)] = run
                scores[(label, depth)] = evaluate(collection.qrels, {q.qid: q.ranking for q in run.queries},
                                                  relevant_grade=args.relevant_grade)
        stack_notes = {"private": where.private,
                       "pair_cache": load_settings(env).pair_cache if where.private and "RERANKQ_PAIR_CACHE" in env
                       else (False if where.private else None),
                       "worker_log": str(where.log_path) if where.log_path else None,
                       "load_average_1m_at_start": round(load_before, 2), **environment_notes(env)}

    report = build_report(
        collection={"files": {k: str(getattr(args, k)) for k in ("qrels", "run", "queries", "documents")},
                    "queries_evaluated": len(qids), "documents": len(collection.documents),
                    "judgements": sum(len(j) for q, j in collection.qrels.items() if q in input_rankings),
                    "run_depth": run_depth, "long_documents": args.long_documents or "excerpt"},
        relevant_grade=args.relevant_grade, depths=depths, input_scores=input_scores, members=reported,
        runs=runs, scores=scores, stack=stack_notes)
    if args.plots:
        for path in write_plots(report, args.plots):
            progress(f"wrote {path}")
    if args.json_path == "-":
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print(render(report))
        if args.json_path:
            path = Path(args.json_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1) + "\n")
            progress(f"wrote {path}")
    return 0
