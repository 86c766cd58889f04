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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from evaluation.measures import Scores
    from evaluation.runner import MemberRun, Stack
    from evaluation.trec import Collection

DEPTHS = (10, 25, 50, 100)

EPILOG = """\b
Examples:
  rerankq eval                                           # the shipped collection, every chain member
  rerankq eval --members 0 --depths 10,50 --limit 20     # member 0 only, two depths, 20 queries
  rerankq eval --plots out/ --json out/eval.json         # PNG plots and the report as JSON
  rerankq eval --qrels q.txt --run bm25.txt --queries queries.tsv --documents docs.jsonl
  rerankq eval --long-documents passages --depths 100    # long documents, split into passages
  rerankq eval --stages 1:100,0:20                       # member 1 over the top 100, member 0 over its best 20

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
    #: A cascade to measure: (member index, keep) per stage, first to last.
    stages: list[tuple[int, int]] | None = None


def _depths(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        depths = sorted({int(d) for d in value.split(",")})
    except ValueError:
        raise click.BadParameter(f"comma-separated integers, got {value!r}") from None
    if not depths or min(depths) < 1:
        raise click.BadParameter("positive integers")
    return depths


def _stages(ctx: click.Context, param: click.Parameter, value: str | None) -> list[tuple[int, int]] | None:
    """``member:keep,member:keep``: two stages or more, each a distinct member reading at most
    what the stage before it read."""
    from kernel.limits import MAX_STAGES

    if value is None:
        return None
    stages = []
    for part in value.split(","):
        member, sep, keep = part.strip().partition(":")
        if not (sep and member.strip().isdigit() and keep.strip().isdigit()):
            raise click.BadParameter(f"{part.strip()!r} is not member:keep (a chain member index and a count)")
        stages.append((int(member), int(keep)))
    if not 2 <= len(stages) <= MAX_STAGES:
        raise click.BadParameter(
            f"between 2 and {MAX_STAGES} stages, got {len(stages)} (one member alone: --members and --depths)"
        )
    for i, (_, kept) in enumerate(stages):
        if kept < 1:
            raise click.BadParameter(f"stage {i + 1} keeps {kept}: a keep is a positive count")
        if i and kept > stages[i - 1][1]:
            raise click.BadParameter(
                f"stage {i + 1} keeps {kept}, more than stage {i} ({stages[i - 1][1]}): a later stage re-reads "
                "the previous stage's best, so its keep is at most that stage's"
            )
    members = [m for m, _ in stages]
    if len(set(members)) < len(members):
        raise click.BadParameter(
            "a member named twice: each stage's provider calls are counted by its member, and a member re-reading "
            "its own best ranks it as before"
        )
    return stages


def _check_stages_alone(ctx: click.Context, stages: list[tuple[int, int]] | None) -> None:
    """``--stages`` picks the members and depths itself: refuse ``--members`` or ``--depths`` beside it.
    (Checked once every option is read: a callback runs in the order the options were typed.)"""
    if stages is None:
        return
    for name in ("depths", "members"):
        if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT):
            raise click.BadParameter(
                f"not with --{name}: a cascade measures its own members alone at its stages' keeps",
                param_hint="'--stages'",
            )


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
@click.option(
    "--stages",
    callback=_stages,
    help="a cascade to measure beside its members alone: member:keep per stage, first to last, e.g. 1:100,0:20 "
    "(member 1 reads the top 100, member 0 its best 20)",
)
def evaluate_command(
    qrels: Path | None, run: Path | None, queries: Path | None, documents: Path | None, **options: Any
) -> int:
    """Measure whether reranking improves a first-stage run, at what depth and latency.

    With no files named it evaluates the collection the project ships (engineering
    runbooks, incidents, tickets and notes, judged 0-3, with a BM25 first stage). Each
    chain member is forced in turn through the real queue, at each rerank depth, and
    compared with the input run itself: nDCG, P@k, R@k and MRR by ir-measures. With
    --stages, a cascade of members, each stage's ranking and cost beside its members alone.
    """
    _check_stages_alone(click.get_current_context(), options.get("stages"))
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


def _chosen_members(args: Arguments, chain_length: int) -> list[int]:
    """The member indexes to measure: ``--stages``' members, ``--members``, or every member."""
    from kernel.errors import ConfigError

    if args.stages:
        option, members = "--stages", [m for m, _ in args.stages]
    elif args.members:
        option = "--members"
        try:
            members = [int(i) for i in args.members.split(",")]
        except ValueError:
            raise ConfigError("--members", f"comma-separated member indexes, got {args.members!r}") from None
    else:
        return list(range(chain_length))
    if any(not 0 <= i < chain_length for i in members):
        raise ConfigError(option, f"the chain has members 0..{chain_length - 1}")
    return members


def _evaluate(args: Arguments, collection: Any) -> int:
    from evaluation.measures import evaluate
    from evaluation.plots import write_plots
    from evaluation.report import build_report, render
    from evaluation.runner import environment_notes, run_member, stack
    from evaluation.verdict import judge
    from producer import load_settings

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    env = dict(os.environ)
    if args.calibration is not None:
        env["RERANKQ_CALIBRATION"] = str(args.calibration.resolve())
    chain = load_settings(env).chain.effective_members()
    members = _chosen_members(args, len(chain))
    qids = collection.evaluated[: args.limit] if args.limit else collection.evaluated
    run_depth = max(len(collection.run[q]) for q in qids)
    # A cascade's members are measured alone at its depth (the first stage's keep) and at each keep.
    depths = sorted({min(d, run_depth) for d in ([k for _, k in args.stages] if args.stages else args.depths)})
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
        cascade = None
        if args.stages:
            cascade = _measure_cascade(args, where, collection, qids, runs, scores, input_scores, progress)
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
        cascade=cascade,
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


def _measure_cascade(
    args: Arguments,
    where: Stack,
    collection: Collection,
    qids: Sequence[str],
    runs: Mapping[tuple[str, int], MemberRun],
    scores: Mapping[tuple[str, int], Scores],
    input_scores: Scores,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """The cascade through the queue, and its section of the report beside its members alone
    (``runs`` and ``scores``: those measured at the stages' keeps, by member label and depth)."""
    from evaluation.cascade import StagePlan, describe, run_cascade
    from evaluation.cascade_report import cascade_section
    from evaluation.measures import evaluate

    assert args.stages is not None
    plan = [StagePlan(member=m, keep=k, label=f"{m}:{where.chain[m].provider}") for m, k in args.stages]
    progress(f"cascade {describe(plan)}")
    run = run_cascade(
        where.client,
        collection,
        qids,
        plan,
        timeout_s=args.timeout,
        progress=progress,
        long_documents=args.long_documents,
    )

    def measured(rankings: dict[str, list[str]]) -> Scores:
        return evaluate(collection.qrels, rankings, relevant_grade=args.relevant_grade)

    run_depth = max(len(collection.run[q]) for q in qids)
    alone = []
    for stage in plan:
        for depth in sorted({min(plan[0].keep, run_depth), min(stage.keep, run_depth)}, reverse=True):
            if (stage.label, depth) in runs:  # else the member could not serve alone: reported above
                alone.append((stage.label, depth, runs[(stage.label, depth)], scores[(stage.label, depth)]))
    return cascade_section(
        run=run,
        stage_scores=[measured({q.qid: q.stages[k].ranking for q in run.queries}) for k in range(len(plan))],
        cascade_scores=measured({q.qid: q.ranking for q in run.queries}),
        input_scores=input_scores,
        alone=alone,
    )
