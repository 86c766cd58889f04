"""``rerankq submit``: its options, the run's identity, and the summary at the end."""

from __future__ import annotations

import hashlib
import json
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from rerankq.common import json_option, print_json
from rerankq.submit.flags import flag_of, given_flags, stream_option_flags

EPILOG = """\b
Examples:
  # a JSONL file of jobs: {"id", "query", "candidates": [...], optional open() options}
  rerankq submit jobs.jsonl --out reranked.jsonl
  # a TREC run with its queries and documents; a TREC run out
  rerankq submit bm25.run --queries topics.tsv --docs corpus.jsonl --out reranked.run --format trec --depth 100
  # stopped (Ctrl-C, a crash)? run the same command again: it opens nothing twice and scores nothing twice
"""


@click.command(epilog=EPILOG)
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="where decisions go as jobs complete; what it already holds is not run again",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "trec"]),
    default="jsonl",
    show_default=True,
    help="jsonl: one line per job with every field of every row; trec: qid Q0 docid rank score tag",
)
@click.option(
    "--queries",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="INPUT is a TREC run: its queries (TSV qid<TAB>query, or JSONL)",
)
@click.option(
    "--docs",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="INPUT is a TREC run: its documents (JSONL {id|_id, text, title?, ...} or TSV id<TAB>text)",
)
@click.option(
    "--depth",
    type=click.IntRange(min=1),
    default=None,
    help="rerank the top K candidates of each job  [default: the over-fetch rule for --keep, max(25, 4k); "
    "depth 40 without --keep]",
)
@stream_option_flags()
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="streams open at once; the next job is read when one completes",
)
@click.option(
    "--on-error",
    type=click.Choice(["stop", "skip"]),
    default="stop",
    show_default=True,
    help="a bad line stops the run, or is skipped, counted and listed at the end",
)
@click.option("--tag", default="rerankq", show_default=True, help="the TREC run tag")
@click.option(
    "--progress-every",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="seconds between progress lines when stdout is not a terminal",
)
@click.option("--quiet", is_flag=True, help="no progress display")
@json_option("print the summary as one JSON document (progress lines go to stderr)")
def submit(
    input_path: Path,
    out_path: Path,
    fmt: str,
    queries: Path | None,
    docs: Path | None,
    depth: int | None,
    max_in_flight: int,
    on_error: str,
    tag: str,
    progress_every: float,
    quiet: bool,
    as_json: bool,
    **flags: Any,
) -> int:
    """Batch reranking: open a stream per job of INPUT, at most --max-in-flight at once, and
    write each job's decisions to --out as it completes.

    INPUT is JSONL, one job a line ({"id", "query", "candidates"} as open() takes them, plus
    any of the stream's options such as window_size, boosts or instruction, and depth), or, with
    --queries and --docs, a TREC run (qid Q0 docid rank score tag; each query's lines together).
    Every option flag below is a stream option; a job's own value wins over the flag.

    Safe to run again: each job's idempotency key is a digest of the run's identity and the
    job id, so a run stopped by Ctrl-C or a crash, started again, opens nothing already
    opened, scores nothing already committed, and completes --out (jobs it holds are not run
    again). Batch windows wait in their device queue's batch lane, so pipelines' interactive
    windows are always taken first.
    """
    if (queries is None) != (docs is None):
        raise click.UsageError("a TREC run needs both --queries and --docs")
    if fmt == "trec" and (not tag or any(ch.isspace() for ch in tag)):
        raise click.BadParameter("must be one word", param_hint="--tag")
    from kernel.errors import ValidationError
    from producer.validation import check_options

    open_options = given_flags(flags)
    try:
        check_options(open_options)
    except ValidationError as exc:
        raise click.BadParameter(f"{exc.field}: {exc.message}", param_hint=f"'{flag_of(exc.field)}'") from None
    run_id = open_options.pop("idempotency_key", None)
    keep = open_options.get("keep")
    # The output is part of the identity: the same command resumes; another --out reranks afresh
    # (say, after the workers' model changed) instead of reading the streams of an earlier run.
    paths = [p.resolve() for p in (input_path, queries, docs, out_path) if p is not None]
    # The lane is no part of a job (a retried open keeps its first lane), so none of the run.
    identity = run_id or run_identity(paths, {**{k: v for k, v in open_options.items() if k != "lane"}, "depth": depth})

    from rerankq.common import client
    from rerankq.submit.jobs import count_lines, jsonl_jobs
    from rerankq.submit.ledger import Ledger
    from rerankq.submit.output import Output, OutputError
    from rerankq.submit.progress import Tally, display
    from rerankq.submit.runner import Plan, Runner

    with tempfile.TemporaryDirectory(prefix="rerankq-submit-") as scratch, client() as rerank:
        ledger = Ledger(Path(scratch))
        output = Output(out_path, fmt, tag=tag)
        try:
            ledger.add_done(output.resume())
        except OutputError as exc:
            raise click.ClickException(str(exc)) from None
        lookup = None
        if queries is not None and docs is not None:
            from rerankq.submit.lookup import Lookup
            from rerankq.submit.trec import count_queries, trec_jobs

            lookup = Lookup(queries, docs, Path(scratch))
            total = count_queries(input_path)
            from producer.budget import required_depth

            # Only the candidates that will be reranked are looked up in the corpus.
            jobs: Iterator[Any] = trec_jobs(input_path, lookup, depth=depth or required_depth(keep or 10))
        else:
            total = count_lines(input_path)
            jobs = jsonl_jobs(input_path)
        if fmt == "trec":
            jobs = trec_safe(jobs)
        plan = Plan(
            open_options=open_options,
            depth=depth,
            max_in_flight=max_in_flight,
            on_error=on_error,
            run_id=identity,
            default_window_size=rerank.settings.streams.window_size,
        )
        tally = Tally(total=total)
        try:
            output.open()
        except OutputError as exc:
            raise click.ClickException(str(exc)) from None
        runner = Runner(
            rerank, jobs, output, ledger, plan, tally, display(as_json=as_json, every_s=progress_every, quiet=quiet)
        )
        try:
            outcome = runner.run()
        finally:
            output.close()
            ledger.close()
            if lookup is not None:
                lookup.close()
    return summarise(
        outcome, tally, out_path, identity, as_json=as_json, in_flight=len(runner.in_flight) + len(runner.opening)
    )


def run_identity(paths: list[Path], options: dict[str, Any]) -> str:
    """The input and output files (resolved paths) and every option that shapes a job, digested."""
    text = json.dumps({"paths": [str(p) for p in paths], "options": options}, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def trec_safe(jobs: Iterator[Any]) -> Iterator[Any]:
    """A TREC output line is split on whitespace: job and candidate ids must have none."""
    from rerankq.submit.jobs import BadLine, Job

    for item in jobs:
        if isinstance(item, Job):
            if any(ch.isspace() for ch in item.id):
                item = BadLine(
                    file=item.file, line=item.line, field="id", message="has whitespace: not with --format trec"
                )
            else:
                for i, candidate in enumerate(item.candidates):
                    cid = candidate.get("id") if isinstance(candidate, dict) else None
                    if isinstance(cid, str) and any(ch.isspace() for ch in cid):
                        field = f"candidates[{i}].id"
                        item = BadLine(
                            file=item.file,
                            line=item.line_of(field),
                            field=field,
                            message="has whitespace: not with --format trec",
                        )
                        break
        yield item


def resume_command() -> str:
    from rerankq import invoked_args

    return "rerankq " + shlex.join(invoked_args())


def summarise(outcome: Any, tally: Any, out_path: Path, run_id: str, *, as_json: bool, in_flight: int) -> int:
    elapsed = tally.elapsed
    status = 0
    if outcome.usage is not None:
        field, message = outcome.usage
        click.echo(f"Error: Invalid value for '{flag_of(field)}': {field}: {message}", err=True)
        return 2
    if outcome.interrupted:
        status = 130
    elif outcome.fatal or outcome.stopped_at or tally.failed or tally.skipped:
        status = 1
    if as_json:
        print_json(
            {
                "status": status,
                "run_id": run_id,
                "output": str(out_path),
                "elapsed_s": round(elapsed, 3),
                "jobs": {
                    "total": tally.total,
                    "done": tally.done,
                    "resumed": tally.resumed,
                    "failed": tally.failed,
                    "skipped": tally.skipped,
                    "in_flight": in_flight,
                    "per_s": round(tally.done / elapsed, 2),
                },
                "windows": {"total": tally.windows_total, "committed": tally.windows_committed},
                "pairs": tally.pairs,
                "failovers": tally.failovers,
                "bad_lines": [
                    {"file": b.file, "line": b.line, "field": b.field, "message": b.message}
                    for b in ([outcome.stopped_at] if outcome.stopped_at else [])
                    + sorted(outcome.bad_lines, key=lambda b: (b.file, b.line))
                ],
                "failed_jobs": outcome.failed_jobs,
                "interrupted": outcome.interrupted,
                "error": outcome.fatal,
                "resume": resume_command() if status else None,
            }
        )
        return status
    say = click.echo
    ended = (
        "interrupted"
        if outcome.interrupted
        else "stopped"
        if outcome.fatal or outcome.stopped_at
        else "finished, with problems listed below"
        if status
        else "done"
    )
    say(
        f"{ended}: {tally.done} jobs written to {out_path} in {elapsed:.1f} s "
        f"({tally.done / elapsed:.1f} jobs/s); {tally.resumed} were there from an earlier run; {tally.failed} failed, "
        f"{tally.skipped} skipped; {tally.windows_committed} windows, {tally.failovers} failovers; run id {run_id}"
    )
    if tally.failovers:
        from rerankq.plain import served_summary

        say("failovers: " + "\n  ".join(served_summary(tally.served, tally.failover_reasons, sampled=True)))
    for bad in sorted(outcome.bad_lines, key=lambda b: (b.file, b.line)):
        say(f"  skipped {bad}")
    if tally.skipped > len(outcome.bad_lines):
        say(f"  ... and {tally.skipped - len(outcome.bad_lines)} more bad lines")
    for job in outcome.failed_jobs:
        say(f"  failed job {job['id']} ({job['at']}): {job['reason']}")
    if outcome.stopped_at is not None:
        say(
            f"bad line, run stopped: {outcome.stopped_at}\nFix it (or pass --on-error skip) and run the same "
            "command again: the jobs written are kept.",
            err=True,
        )
    if outcome.fatal:
        say(
            f"error: {outcome.fatal}\nRun the same command again once it is fixed: nothing is opened or scored twice.",
            err=True,
        )
    if outcome.interrupted:
        say(
            f"interrupted: {in_flight} streams still in flight keep scoring in the workers; the next run collects "
            f"them without scoring them again. Resume with:\n  {resume_command()}",
            err=True,
        )
    return status
