"""``rerankq calibrate``'s work: each member forced through the queue over the judged queries,
its identity read from the workers' cards, its map fitted, one file written."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

from worker.scoring.calibration import (
    FORMAT,
    CalibrationFile,
    MemberMap,
    calibration_identity,
    declares_ranks,
    decode,
    encode,
    interpolate,
)

if TYPE_CHECKING:
    from evaluation.calibration import Method, Unjudged


@dataclass(frozen=True)
class CalibrateRequest:
    qrels: Path | None
    run: Path | None
    queries: Path | None
    documents: Path | None
    out: Path
    members: str | None
    depth: int
    relevant_grade: int
    unjudged: Unjudged
    method: Method
    timeout_s: float
    device: str
    long_documents: str | None = None


def _progress(message: str) -> None:
    click.echo(message, err=True)


def _refuse_foreign(out: Path) -> None:
    """A command never overwrites a file it did not write: only a calibration file is replaced."""
    if not out.exists():
        return
    try:
        decode(out.read_bytes(), where=str(out))
    except (OSError, ValueError):
        raise click.ClickException(f"{out} exists and is not a calibration file; not overwriting it") from None


def _write(out: Path, calibration: CalibrationFile) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a worker reading it mid-write would refuse a truncated file.
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(encode(calibration) + b"\n")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def member_identities(client: Any) -> dict[str, set[str]]:
    """Each member label's cache identities, as the workers' cards give them."""
    from worker.card import read_cards

    store = client.store
    found: dict[str, set[str]] = {}
    for key in store.client.scan_iter(match=store.keys.worker_cards_pattern):
        for card in read_cards(store.client, key):
            for member in card.get("members", []):
                if member.get("identity"):
                    found.setdefault(member["label"], set()).add(member["identity"])
    return found


#: Why a member whose scores are ranks is not calibrated.
RANKS = "its scores are places in its own order (declared rank), not relevance: nothing to calibrate"


def _ranks_by_class(provider: str) -> bool:
    """Whether a provider's class declares rank scores (``listwise``), known before it is run."""
    from worker.providers import provider_class
    from worker.providers.base import ProviderStartError

    try:
        return getattr(provider_class(provider), "scale", None) == "rank"
    except ProviderStartError:
        return False


def _chosen(members: str | None, chain: list[Any]) -> list[int]:
    if not members:
        return [i for i, m in enumerate(chain) if m.provider != "rrf"]
    try:
        chosen = [int(i) for i in members.split(",")]
    except ValueError:
        raise click.BadParameter(f"comma-separated member indexes, got {members!r}", param_hint="--members") from None
    if any(not 0 <= i < len(chain) for i in chosen):
        raise click.BadParameter(f"the chain has members 0..{len(chain) - 1}", param_hint="--members")
    return chosen


def run(request: CalibrateRequest, *, as_json: bool) -> int:
    from evaluation.calibration import FitError, fit_map, judged_pairs
    from evaluation.command import collection_files
    from evaluation.runner import run_member, stack
    from evaluation.trec import InputError, load_collection
    from producer import load_settings
    from worker.logs import configure_logging

    configure_logging(level="WARNING")
    named = collection_files(
        request.qrels, request.run, request.queries, request.documents, long_documents=request.long_documents
    )
    files = dict(zip(("qrels", "run", "queries", "documents"), named))
    _refuse_foreign(request.out)
    try:
        collection = load_collection(**files)
    except InputError as exc:
        raise click.ClickException(str(exc)) from None
    # The private worker serves raw scores: an older calibration file plays no part in a new fit.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_CALIBRATION")}
    chain = load_settings(env).chain.effective_members()
    indexes = _chosen(request.members, chain)
    qids = collection.evaluated
    depth = min(request.depth, max(len(collection.run[q]) for q in qids))
    maps: dict[str, MemberMap] = {}
    skipped: dict[str, str] = {}
    verdicts: list[str] = []
    _progress(
        f"calibrating on {len(qids)} queries, the top {depth} of each, members "
        + ", ".join(f"{i}:{chain[i].provider}" for i in indexes)
    )
    with stack(env, max_depth=depth, members=indexes, device=request.device) as where:
        for index in indexes:
            label = f"{index}:{where.chain[index].provider}"
            if _ranks_by_class(where.chain[index].provider):
                skipped[label] = RANKS
                continue
            member_run = run_member(
                where.client,
                collection,
                qids,
                index=index,
                label=label,
                depth=depth,
                timeout_s=request.timeout_s,
                progress=_progress,
                long_documents=request.long_documents,
            )
            if member_run.failed:
                skipped[label] = f"could not serve: {member_run.failed[0].failed}"
                continue
            served = {q.served_by for q in member_run.queries}
            if served != {label}:
                skipped[label] = f"windows served by {sorted(s or '-' for s in served)}"
                continue
            identities = member_identities(where.client).get(label, set())
            if len(identities) != 1:
                skipped[label] = (
                    "no worker card names its identity"
                    if not identities
                    else f"workers disagree on its identity: {sorted(identities)}"
                )
                continue
            identity = identities.pop()
            if declares_ranks(identity):
                skipped[label] = RANKS
                continue
            pairs = judged_pairs(member_run.queries, relevant_grade=request.relevant_grade, unjudged=request.unjudged)
            try:
                fitted = fit_map(pairs, label=label, method=request.method)
            except FitError as exc:
                skipped[label] = str(exc)
                continue
            fitted, said = with_first_stage_weight(fitted, member_run.queries, collection, depth, request)
            verdicts.append(said)
            maps[calibration_identity(identity)] = fitted
    for label, reason in skipped.items():
        _progress(f"{label}: not calibrated ({reason})")
    for said in verdicts:
        _progress(said)
    if not maps:
        raise click.ClickException("no member could be calibrated; nothing written")
    calibration = CalibrationFile(
        format=FORMAT,
        relevant_grade=request.relevant_grade,
        unjudged=request.unjudged,
        fitted_on={
            "files": {k: str(v) for k, v in files.items()},
            "queries": len(qids),
            "depth": depth,
            "long_documents": request.long_documents or "excerpt",
        },
        members=maps,
    )
    _write(request.out, calibration)
    _progress(f"wrote {request.out}")
    if as_json:
        sys.stdout.write(encode(calibration).decode() + "\n")
    else:
        click.echo(render(calibration))
        click.echo(next_steps(request.out))
    return 0


def with_first_stage_weight(
    fitted: MemberMap, queries: list[Any], collection: Any, depth: int, request: CalibrateRequest
) -> tuple[MemberMap, str]:
    """The map with the member's first-stage weight, fitted on the same rows (``blend_fit``), and
    the line that says what it means."""
    from evaluation.blend_fit import fit_weight, per_query_ndcg, verdict

    xs, ys = fitted.scores, fitted.probabilities
    table = per_query_ndcg(
        queries,
        collection.qrels,
        streams={q.qid: [r.score for r in collection.run[q.qid][:depth]] for q in queries},
        calibrate=lambda score: interpolate(xs, ys, score),
        relevant_grade=request.relevant_grade,
    )
    weight, fit = fit_weight(table)
    return msgspec.structs.replace(fitted, first_stage_weight=weight, blend_fit=fit), verdict(fitted.label, weight, fit)


def next_steps(out: Path) -> str:
    """How to use the file just written: what a user runs next."""
    where = shlex.quote(str(out.resolve()))
    return (
        "\nUse it:\n"
        f"  RERANKQ_CALIBRATION={where} rerankq worker     # serve calibrated scores (rows say calibrated: true)\n"
        f"  RERANKQ_CALIBRATION={where} rerankq eval       # ECE raw and calibrated, per member\n"
        "Each worker that reads it calibrates only the members it was fitted for (docs/scoring.md)."
    )


def render(calibration: CalibrationFile) -> str:
    header = [
        "member",
        "method",
        "pairs",
        "relevant",
        "breakpoints",
        "ECE raw",
        "ECE calibrated",
        "Brier",
        "first-stage weight",
    ]
    rows = [
        [
            m.label,
            m.method,
            str(m.fit.pairs),
            str(m.fit.positives),
            str(len(m.scores)),
            f"{m.fit.ece_raw:.3f}",
            f"{m.fit.ece:.3f}",
            f"{m.fit.brier:.3f}",
            "-" if m.first_stage_weight is None else f"{m.first_stage_weight:g}",
        ]
        for m in calibration.members.values()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    ]
    title = (
        f"Calibration maps (errors on the pairs they were fitted on; relevant: grade >= "
        f"{calibration.relevant_grade}, unjudged {calibration.unjudged})"
    )
    return "\n".join([title, *lines])
