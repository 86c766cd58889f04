"""``python -m evaluation``: does reranking improve the input run, at what depth and latency.

With no files named it evaluates the collection the project ships
(``worker/collection``: engineering runbooks, incidents, tickets and notes,
judged 0-3, with a BM25 first stage). Each chain member is forced in turn through the real
queue, at each rerank depth, and compared with the input run itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import click

DEPTHS = (10, 25, 50, 100)

EPILOG = """\b
Examples:
  rerankq eval                                           # the shipped collection, every chain member
  rerankq eval --members 0 --depths 10,50 --limit 20     # member 0 only, two depths, 20 queries
  rerankq eval --plots out/ --json out/eval.json         # PNG plots and the report as JSON
  rerankq eval --qrels q.txt --run bm25.txt --queries queries.tsv --documents docs.jsonl
  rerankq eval --long-documents passages --depths 100    # long documents, split into passages

Exit status: 0 when done, 2 on bad input or settings, 1 when the queue did not answer.
"""


def shipped(name: str) -> Path:
    return Path(str(resources.files("worker").joinpath("collection", *name.split("/"))))


@dataclass
class Arguments:
    """What one evaluation run was asked for, the shipped collection filled in."""

    qrels: Path
    run: Path
    queries: Path
    documents: Path
    depths: list[int]
    members: str | None
    limit: int | None
    relevant_grade: int
    json_path: str | None
    plots: Path | None
    timeout: float
    device: str
    long_documents: str | None = None
    calibration: Path | None = None


def _depths(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        depths = sorted({int(d) for d in value.split(",")})
    except ValueError:
        raise click.BadParameter(f"comma-separated integers, got {value!r}") from None
    if not depths or min(depths) < 1:
        raise click.BadParameter("positive integers")
    return depths


FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command(name="eval", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--qrels", type=FILE, help="TREC qrels: qid 0 docid grade (default: the shipped collection)")
@click.option("--run", type=FILE, help="TREC run, the first stage: qid Q0 docid rank score tag")
@click.option("--queries", type=FILE, help="qid<TAB>text, or JSON lines with id and text")
@click.option("--documents", type=FILE, help="JSON lines with id, text and an optional title, or docid<TAB>text")
@click.option(
    "--depths",
    default=",".join(map(str, DEPTHS)),
    show_default=True,
    callback=_depths,
    help="rerank the top d of the input run, for each d",
)
@click.option("--members", help="chain member indexes to force, e.g. 0,1 (default: every member)")
@click.option("--limit", type=click.IntRange(min=1), help="evaluate only the first N judged queries of the run")
@click.option(
    "--relevant-grade", type=int, default=1, show_default=True, help="the lowest grade P, R and MRR count as relevant"
)
@click.option("--json", "json_path", help="write the report as JSON here ('-': stdout, no table)")
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path), help="write PNG plots into this folder")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="seconds to wait for one query")
@click.option(
    "--device", default="cpu", type=click.Choice(["cpu", "gpu"]), show_default=True, help="the private worker's device"
)
@click.option(
    "--long-documents",
    type=click.Choice(["excerpt", "passages"]),
    help="the streams' long_documents option; with no files named, the shipped long-document collection "
    "(collection/long: 1,300-2,400 words a document, the judged part early, in the middle or late)  "
    "[default: the deployment's, excerpt]",
)
@click.option(
    "--calibration",
    type=FILE,
    help="a file rerankq calibrate wrote: the private worker calibrates and blends the first stage with it "
    "(RERANKQ_CALIBRATION)  [default: the deployment's RERANKQ_CALIBRATION]",
)
def evaluate_command(
    qrels: Path | None, run: Path | None, queries: Path | None, documents: Path | None, **options: Any
) -> int:
    """Measure whether reranking improves a first-stage run, at what depth and latency.

    With no files named it evaluates the collection the project ships (engineering
    runbooks, incidents, tickets and notes, judged 0-3, with a BM25 first stage). Each
    chain member is forced in turn through the real queue, at each rerank depth, and
    compared with the input run itself: nDCG, P@k, R@k and MRR by ir-measures.
    """
    qrels, run, queries, documents = collection_files(
        qrels, run, queries, documents, long_documents=options.get("long_documents")
    )
    args = Arguments(qrels=qrels, run=run, queries=queries, documents=documents, **options)

    from evaluation.trec import InputError, load_collection
    from kernel.errors import ConfigError, ValidationError
    from worker.logs import configure_logging

    configure_logging(level="WARNING")
    try:
        collection = load_collection(qrels=args.qrels, run=args.run, queries=args.queries, documents=args.documents)
        return _evaluate(args, collection)
    except (InputError, ConfigError, ValidationError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except (TimeoutError, RuntimeError) as exc:  # no answer in time; the private worker did not start
        click.echo(f"error: {exc}", err=True)
        return 1


def collection_files(
    qrels: Path | None, run: Path | None, queries: Path | None, documents: Path | None, *, long_documents: str | None
) -> tuple[Path, Path, Path, Path]:
    """The files named, or with none the shipped collection: with ``--long-documents``, its
    long-document collection (``collection/long``)."""
    given = [qrels, run, queries, documents]
    if any(given) and not all(given):
        raise click.UsageError(
            "--qrels, --run, --queries and --documents go together (or none, for the shipped collection)"
        )
    if qrels and run and queries and documents:
        return qrels, run, queries, documents
    folder = "long/" if long_documents else ""
    return (
        shipped(folder + "qrels.txt"),
        shipped(folder + "run.bm25.txt"),
        shipped(folder + "queries.tsv"),
        shipped(folder + "documents.jsonl"),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the evaluation on ``argv``; 0 when done, 2 on bad input or settings, 1 when the queue did not answer."""
    from kernel.command_line import Host, run_command

    return run_command(
        evaluate_command, sys.argv[1:] if argv is None else argv, prog_name="python -m evaluation", host=Host()
    )


def _evaluate(args: Arguments, collection: Any) -> int:
    from evaluation.measures import evaluate
    from evaluation.plots import write_plots
    from evaluation.report import build_report, render
    from evaluation.runner import environment_notes, run_member, stack
    from evaluation.verdict import judge
    from kernel.errors import ConfigError
    from producer import load_settings

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    env = dict(os.environ)
    if args.calibration is not None:
        env["RERANKQ_CALIBRATION"] = str(args.calibration.resolve())
    chain = load_settings(env).chain.effective_members()
    members = list(range(len(chain)))
    if args.members:
        try:
            members = [int(i) for i in args.members.split(",")]
        except ValueError:
            raise ConfigError("--members", f"comma-separated member indexes, got {args.members!r}") from None
        if any(not 0 <= i < len(chain) for i in members):
            raise ConfigError("--members", f"the chain has members 0..{len(chain) - 1}")
    qids = collection.evaluated[: args.limit] if args.limit else collection.evaluated
    run_depth = max(len(collection.run[q]) for q in qids)
    depths = sorted({min(d, run_depth) for d in args.depths})
    input_rankings = {q: [r.docid for r in collection.run[q]] for q in qids}
    input_scores = evaluate(collection.qrels, input_rankings, relevant_grade=args.relevant_grade)

    runs, scores, reported = {}, {}, []
    load_before = os.getloadavg()[0]
    progress(
        f"evaluating {len(qids)} queries, depths {depths}, members "
        + ", ".join(f"{i}:{chain[i].provider}" for i in members)
    )
    with stack(env, max_depth=max(depths), members=members, device=args.device) as where:
        for index in members:
            label = f"{index}:{where.chain[index].provider}"
            entry: dict[str, Any] = {"label": label, "provider": where.chain[index].provider}
            reported.append(entry)
            for depth in sorted(depths, reverse=True):
                run = run_member(
                    where.client,
                    collection,
                    qids,
                    index=index,
                    label=label,
                    depth=depth,
                    timeout_s=args.timeout,
                    progress=progress,
                    long_documents=args.long_documents,
                )
                if len(run.queries) < len(qids):  # the member failed its first query
                    entry["reason"] = run.queries[0].failed
                    progress(f"{label}: unavailable ({entry['reason']})")
                    break
                runs[(label, depth)] = run
                scores[(label, depth)] = evaluate(
                    collection.qrels, {q.qid: q.ranking for q in run.queries}, relevant_grade=args.relevant_grade
                )
        stack_notes = {
            "private": where.private,
            "pair_cache": load_settings(env).chain.pair_cache
            if where.private and "RERANKQ_PAIR_CACHE" in env
            else (False if where.private else None),
            "worker_log": str(where.log_path) if where.log_path else None,
            "load_average_1m_at_start": round(load_before, 2),
            **environment_notes(env),
        }

    verdict = judge(
        runs=runs,
        scores=scores,
        input_scores=input_scores,
        qrels=collection.qrels,
        texts={docid: document.text for docid, document in collection.documents.items()},
        labels=[m["label"] for m in reported if not m.get("reason")],
        depths=depths,
        relevant_grade=args.relevant_grade,
        policy={
            "long_documents": args.long_documents or "excerpt",
            "blend": f"blended as {args.calibration.name} says"
            if args.calibration is not None
            else "the deployment's first-stage blend"
            if env.get("RERANKQ_CALIBRATION")
            else "no first-stage blend",
        },
    )
    report = build_report(
        collection={
            "files": {k: str(getattr(args, k)) for k in ("qrels", "run", "queries", "documents")},
            "queries_evaluated": len(qids),
            "documents": len(collection.documents),
            "judgements": sum(len(j) for q, j in collection.qrels.items() if q in input_rankings),
            "run_depth": run_depth,
            "long_documents": args.long_documents or "excerpt",
        },
        relevant_grade=args.relevant_grade,
        depths=depths,
        input_scores=input_scores,
        members=reported,
        runs=runs,
        scores=scores,
        stack=stack_notes,
        verdict=verdict,
    )
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
