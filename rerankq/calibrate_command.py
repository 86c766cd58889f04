"""``rerankq calibrate``: fit each chain member's map from its score to P(relevant) on judgements."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rerankq.common import json_option

if TYPE_CHECKING:
    from evaluation.calibration import Method, Unjudged


@click.command(
    epilog="""\b
Examples:
  rerankq calibrate --out calibration.json                 # every member, the shipped collection
  rerankq calibrate --qrels q.txt --run run.txt --queries q.tsv --documents d.jsonl --out cal.json
  RERANKQ_CALIBRATION=calibration.json rerankq worker      # serve calibrated scores
  RERANKQ_CALIBRATION=calibration.json rerankq eval        # ECE raw and calibrated, per member
"""
)
@click.option(
    "--qrels",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TREC qrels: qid 0 docid grade (default: the shipped collection)",
)
@click.option(
    "--run",
    "run_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TREC run, the first stage: qid Q0 docid rank score tag",
)
@click.option(
    "--queries", type=click.Path(dir_okay=False, path_type=Path), help="qid<TAB>text, or JSON lines with id and text"
)
@click.option(
    "--documents",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON lines with id, text and an optional title, or docid<TAB>text",
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="the calibration file to write (an existing one is replaced only if it is a calibration file)",
)
@click.option("--members", help="chain member indexes to fit, e.g. 0,1 (default: every member that scores)")
@click.option(
    "--depth",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="rerank the top d of the input run per query: the pairs are those documents",
)
@click.option(
    "--relevant-grade", type=int, default=1, show_default=True, help="the lowest grade that counts as relevant"
)
@click.option(
    "--unjudged",
    type=click.Choice(["irrelevant", "skipped"]),
    default="irrelevant",
    show_default=True,
    help="how to read a reranked document with no judgement (irrelevant: as trec_eval counts it)",
)
@click.option(
    "--method",
    type=click.Choice(["auto", "isotonic", "platt"]),
    default="auto",
    show_default=True,
    help="auto: isotonic from 1000 pairs and 50 relevant ones, Platt scaling below",
)
@click.option("--timeout", type=float, default=120.0, show_default=True, help="seconds to wait for one query")
@click.option(
    "--device", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True, help="the private worker's device"
)
@click.option(
    "--long-documents",
    type=click.Choice(["excerpt", "passages"]),
    help="the streams' long_documents option, as rerankq eval takes it: the maps and weights are fitted on the "
    "rows it produces; with no files named, the shipped long-document collection  [default: the deployment's]",
)
@json_option("print the calibration file's contents as JSON instead of a table")
def calibrate(
    qrels: Path | None,
    run_path: Path | None,
    queries: Path | None,
    documents: Path | None,
    out: Path,
    members: str | None,
    depth: int,
    relevant_grade: int,
    unjudged: Unjudged,
    method: Method,
    timeout: float,
    device: str,
    long_documents: str | None,
    as_json: bool,
) -> int:
    """Rerank judged queries with each chain member in turn, through the real queue, and fit a
    monotone map per member from its normalised score to the probability that the document is
    relevant, and the weight of the first stage in the order (cross-validated over queries: 1.0,
    all first stage, where the member does not beat it held out). The file is keyed by each
    member's identity (provider, model, URL, scale, backend), so a worker given it
    (RERANKQ_CALIBRATION) calibrates and blends only the members it was fitted for."""
    from evaluation.calibrate_run import CalibrateRequest, run

    # The fit, at the end, needs scikit-learn: on an install without rerankq[eval], say so
    # before every member has scored every query (rerankq's one line for a missing extra).
    importlib.import_module("sklearn")
    return run(
        CalibrateRequest(
            qrels=qrels,
            run=run_path,
            queries=queries,
            documents=documents,
            out=out,
            members=members,
            depth=depth,
            relevant_grade=relevant_grade,
            unjudged=unjudged,
            method=method,
            timeout_s=timeout,
            device=device,
            long_documents=long_documents,
        ),
        as_json=as_json,
    )
