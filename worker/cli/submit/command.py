"""``rerankq submit``: its options, the run's identity, and the summary at the end."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from worker.cli.common import json_option, print_json

EPILOG = """\b
Examples:
  # a JSONL file of jobs: {"id", "query", "candidates": [...], optional open() options}
  rerankq submit jobs.jsonl --out reranked.jsonl
  # a TREC run with its queries and documents; a TREC run out
  rerankq submit bm25.run --queries topics.tsv --docs corpus.jsonl --out reranked.run --format trec --depth 100
  # stopped (Ctrl-C, a crash)? run the same command again: it opens nothing twice and scores nothing twice
"""

_TOKEN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _boost(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any] | None:
    boosts: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE, e.g. recency_alpha=0.3", param=param)
        try:
            boosts[name.strip()] = float(raw)
        except ValueError:
            boosts[name.strip()] = raw.strip()
    return boosts or None


def _reference_time(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO date-time", param=param) from None


def _run_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _TOKEN.fullmatch(value):
        raise click.BadParameter("must be 1-64 of A-Z a-z 0-9 _ . -", param=param)
    return value


@click.command(epilog=EPILOG)
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="where decisions go as jobs complete; what it already holds is not run again")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "trec"]), default="jsonl", show_default=True,
              help="jsonl: one line per job with every field of every row; trec: qid Q0 docid rank score tag")
@click.option("--queries", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="INPUT is a TREC run: its queries (TSV qid<TAB>query, or JSONL)")
@click.option("--docs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="INPUT is a TREC run: its documents (JSONL {id|_id, text, title?, ...} or TSV id<TAB>text)")
@click.option("--depth", type=click.IntRange(min=1), default=None,
              help="rerank the top K candidates of each job  [default: the over-fetch rule for --keep, max(25, 4k)]")
@click.option("--keep", type=click.IntRange(min=1), default=None,
              help="rows a reader keeps: a job with fewer than max(25, 4k) candidates is refused unless "
                   "--allow-shallow; the default --depth is max(25, 4k)  [default: none, depth 40]")
@click.option("--allow-shallow", is_flag=True, default=None, help="accept jobs with fewer candidates than --keep needs")
@click.option("--window-size", type=click.IntRange(min=1), default=None, help="[default: RERANKQ_WINDOW_SIZE]")
@click.option("--device", type=click.Choice(["cpu", "gpu", "any"]), default="cpu", show_default=True)
@click.option("--chain", default=None, help="a chain profile (RERANKQ_CHAIN_<NAME>)")
@click.option("--tenant", default=None)
@click.option("--min-score", type=float, default=None)
@click.option("--min-final-score", type=float, default=None)
@click.option("--boost", "boosts", multiple=True, callback=_boost, metavar="NAME=VALUE",
              help="a boost setting, repeatable: recency_alpha=0.3, recency_curve=exponential, ...")
@click.option("--reference-time", callback=_reference_time, default=None, help="ISO date-time ages are measured from")
@click.option("--budget", type=click.Choice(["low", "mid", "high"]), default=None)
@click.option("--max-rerank-candidates", type=click.IntRange(min=1), default=None)
@click.option("--max-candidates-per-source", type=click.IntRange(min=0), default=None)
@click.option("--strategy-boosts", default=None, help="source:level,... e.g. graph:high,bm25:low")
@click.option("--document-budget", type=click.IntRange(min=1), default=None)
@click.option("--ttl-s", type=click.IntRange(min=1), default=None, help="[default: RERANKQ_STREAM_TTL_S]")
@click.option("--lane", type=click.Choice(["batch", "interactive"]), default="batch", show_default=True,
              help="batch windows wait behind every interactive window of their device queue")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=64, show_default=True,
              help="streams open at once; the next job is read when one completes")
@click.option("--on-error", type=click.Choice(["stop", "skip"]), default="stop", show_default=True,
              help="a bad line stops the run, or is skipped, counted and listed at the end")
@click.option("--run-id", callback=_run_id, default=None,
              help="the run's identity in idempotency keys  [default: a digest of the input and output paths "
                   "and the job options]")
@click.option("--tag", default="rerankq", show_default=True, help="the TREC run tag")
@click.option("--progress-every", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="seconds between progress lines when stdout is not a terminal")
@click.option("--quiet", is_flag=True, help="no progress display")
@json_option("print the summary as one JSON document (progress lines go to stderr)")
def submit(input_path: Path, out_path: Path, fmt: str, queries: Path | None, docs: Path | None, depth: int | None,
           keep: int | None, allow_shallow: bool | None, window_size: int | None, device: str, chain: str | None,
           tenant: str | None, min_score: float | None, min_final_score: float | None, boosts: dict[str, Any] | None,
           reference_time: Any, budget: str | None, max_rerank_candidates: int | None,
           max_candidates_per_source: int | None, strategy_boosts: str | None, document_budget: int | None,
           ttl_s: int | None, lane: str, max_in_flight: int, on_error: str, run_id: str | None, tag: str,
           progress_every: float, quiet: bool, as_json: bool) -> int:
    """Batch reranking: open a stream per job of INPUT, at most --max-in-flight at once, and
    write each job's decisions to --out as it completes.

    INPUT is JSONL, one job a line ({"id", "query", "candidates"} as open() takes them, plus
    any open() option such as window_size or boosts, and depth), or, with --queries and --docs,
    a TREC run (qid Q0 docid rank score tag; each query's lines together).

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
    from producer.errors import ValidationError
    from producer.validation import check_open_arguments

    open_options = {k: v for k, v in {
        "window_size": window_size, "device": device, "chain": chain, "tenant": tenant, "min_score": min_score,
        "min_final_score": min_final_score, "boosts": boosts, "reference_time": reference_time, "budget": budget,
        "keep": keep, "allow_shallow": allow_shallow, "max_rerank_candidates": max_rerank_candidates,
        "max_candidates_per_source": max_candidates_per_source, "strategy_boosts": strategy_boosts,
        "document_budget": document_budget, "ttl_s": ttl_s,
    }.items() if v is not None}
    try:
        check_open_arguments(**{**_OPEN_DEFAULTS, **open_options, "query": "", "first_windows": 1,
                                "idempotency_key": None, "lane": lane, "query_range": None})
        if boosts is not None:
            import msgspec

            from producer.wire import Boosts

            try:
                msgspec.convert(boosts, Boosts)
            except msgspec.ValidationError as exc:
                raise ValidationError("boosts", str(exc).replace("`$.", "`")) from None
    except ValidationError as exc:
        raise click.BadParameter(exc.message, param_hint=option_of(exc.field)) from None
    # The output is part of the identity: the same command resumes; another --out reranks afresh
    # (say, after the workers' model changed) instead of reading the streams of an earlier run.
    paths = [p.resolve() for p in (input_path, queries, docs, out_path) if p is not None]
    identity = run_id or run_identity(paths, {**open_options, "depth": depth})

    from worker.cli.common import client
    from worker.cli.submit.jobs import count_lines, jsonl_jobs
    from worker.cli.submit.ledger import Ledger
    from worker.cli.submit.output import Output, OutputError
    from worker.cli.submit.progress import Tally, display
    from worker.cli.submit.runner import Plan, Runner

    with tempfile.TemporaryDirectory(prefix="rerankq-submit-") as scratch, client() as rerank:
        ledger = Ledger(Path(scratch))
        output = Output(out_path, fmt, tag=tag)
        try:
            ledger.add_done(output.resume())
        except OutputError as exc:
            raise click.ClickException(str(exc)) from None
        lookup = None
        if queries is not None and docs is not None:
            from worker.cli.submit.lookup import Lookup
            from worker.cli.submit.trec import count_queries, trec_jobs

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
        plan = Plan(open_options=open_options, depth=depth, lane=lane, max_in_flight=max_in_flight,
                    on_error=on_error, run_id=identity, default_window_size=rerank.settings.window_size)
        tally = Tally(total=total)
        runner = Runner(rerank, jobs, output.open(), ledger, plan, tally,
                        display(as_json=as_json, every_s=progress_every, quiet=quiet))
        try:
            outcome = runner.run()
        finally:
            output.close()
            ledger.close()
            if lookup is not None:
                lookup.close()
    return summarise(outcome, tally, out_path, identity, as_json=as_json,
                     in_flight=len(runner.in_flight) + len(runner.opening))


_OPEN_DEFAULTS = {k: None for k in (
    "window_size", "min_score", "min_final_score", "chain", "tenant", "boosts", "reference_time", "ttl_s", "budget",
    "keep", "max_rerank_candidates", "max_candidates_per_source", "strategy_boosts", "document_budget")}
_OPEN_DEFAULTS.update({"device": "cpu", "allow_shallow": False})


def option_of(field: str) -> str:
    root = re.split(r"[.\[]", field, maxsplit=1)[0]
    return "--boost" if root == "boosts" else "--" + root.replace("_", "-")


def run_identity(paths: list[Path], options: dict[str, Any]) -> str:
    """The input and output files (resolved paths) and every option that shapes a job, digested."""
    text = json.dumps({"paths": [str(p) for p in paths], "options": options}, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def trec_safe(jobs: Iterator[Any]) -> Iterator[Any]:
    """A TREC output line is split on whitespace: job and candidate ids must have none."""
    from worker.cli.submit.jobs import BadLine, Job

    for item in jobs:
        if isinstance(item, Job):
            if any(ch.isspace() for ch in item.id):
                item = BadLine(file=item.file, line=item.line, field="id",
                               message="has whitespace: not with --format trec")
            else:
                for i, candidate in enumerate(item.candidates):
                    cid = candidate.get("id") if isinstance(candidate, dict) else None
                    if isinstance(cid, str) and any(ch.isspace() for ch in cid):
                        field = f"candidates[{i}].id"
                        item = BadLine(file=item.file, line=item.line_of(field), field=field,
                                       message="has whitespace: not with --format trec")
                        break
        yield item


def resume_command() -> str:
    from worker import cli

    return "rerankq " + shlex.join(cli.invoked_args())


def summarise(outcome: Any, tally: Any, out_path: Path, run_id: str, *, as_json: bool, in_flight: int) -> int:
    elapsed = tally.elapsed
    status = 0
    if outcome.usage is not None:
        field, message = outcome.usage
        click.echo(f"Error: Invalid value for '{option_of(field)}': {field}: {message}", err=True)
        return 2
    if outcome.interrupted:
        status = 130
    elif outcome.fatal or outcome.stopped_at or tally.failed or tally.skipped:
        status = 1
    if as_json:
        print_json({
            "status": status, "run_id": run_id, "output": str(out_path), "elapsed_s": round(elapsed, 3),
            "jobs": {"total": tally.total, "done": tally.done, "resumed": tally.resumed, "failed": tally.failed,
                     "skipped": tally.skipped, "in_flight": in_flight, "per_s": round(tally.done / elapsed, 2)},
            "windows": {"total": tally.windows_total, "committed": tally.windows_committed},
            "pairs": tally.pairs, "failovers": tally.failovers,
            "bad_lines": [{"file": b.file, "line": b.line, "field": b.field, "message": b.message}
                          for b in ([outcome.stopped_at] if outcome.stopped_at else [])
                          + sorted(outcome.bad_lines, key=lambda b: (b.file, b.line))],
            "failed_jobs": outcome.failed_jobs, "interrupted": outcome.interrupted, "error": outcome.fatal,
            "resume": resume_command() if status else None,
        })
        return status
    say = click.echo
    ended = "interrupted" if outcome.interrupted else "stopped" if outcome.fatal or outcome.stopped_at else \
        "finished, with problems listed below" if status else "done"
    say(f"{ended}: {tally.done} jobs written to {out_path} in {elapsed:.1f} s "
        f"({tally.done / elapsed:.1f} jobs/s); {tally.resumed} were there from an earlier run; {tally.failed} failed, "
        f"{tally.skipped} skipped; {tally.windows_committed} windows, {tally.failovers} failovers; run id {run_id}")
    if tally.failovers:
        from worker.cli.plain import served_summary

        say("failovers: " + "\n  ".join(served_summary(tally.served, tally.failover_reasons, sampled=True)))
    for bad in sorted(outcome.bad_lines, key=lambda b: (b.file, b.line)):
        say(f"  skipped {bad}")
    if tally.skipped > len(outcome.bad_lines):
        say(f"  ... and {tally.skipped - len(outcome.bad_lines)} more bad lines")
    for job in outcome.failed_jobs:
        say(f"  failed job {job['id']} ({job['at']}): {job['reason']}")
    if outcome.stopped_at is not None:
        say(f"bad line, run stopped: {outcome.stopped_at}\nFix it (or pass --on-error skip) and run the same "
            "command again: the jobs written are kept.", err=True)
    if outcome.fatal:
        say(f"error: {outcome.fatal}\nRun the same command again once it is fixed: nothing is opened or scored "
            "twice.", err=True)
    if outcome.interrupted:
        say(f"interrupted: {in_flight} streams still in flight keep scoring in the workers; the next run collects "
            f"them without scoring them again. Resume with:\n  {resume_command()}", err=True)
    return status
