"""The quality cost of a precision or backend, measured: nDCG@10 of the shipped collection.

Each candidate reranks the BM25 top ``--depth`` (100) of the shipped collection's 32 queries
in process (one window a query, documents read as the worker reads them) and its nDCG@10 is
set against the fp32 torch reference of the same model: the difference, and whether it stays
under ``MAX_NDCG_LOSS`` (0.005), the bar a precision must clear before ``auto`` may adopt it.
Also each candidate's least and mean Spearman per query against the reference's scores.

Models: the ``embedding`` member (the packaged all-MiniLM-L6-v2, by the embedding engine)
and the bench cross-encoder with real scores (``ops/bench/trained_reranker.py``, by the
scoring engine), the latter also against its teacher (the bi-encoder): how closely it ranks
like it, on queries it was never trained on. Candidates come from ``candidates()``; a
backend the embedding engine does not offer here is left out, not failed. Each int8 recipe
(``worker/engine/int8_recipes.py``) is a row; a calibrated one calibrates on the shipped
collection's windows as ``auto`` does (so it is the same export as ``ops.bench.scoring``'s int8
rows, and is reused): six of the 32 evaluated queries' top 25, so those six are not held out
here (``ops.bench.scoring`` holds each recipe to the other 26).

    python -m ops.bench.quantization_quality [--depth 100] [--json out.json]

Forced candidates skip the engine's parity probe: this measures what each would give, not
whether the probe would let it through.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ops.bench.collection import ndcg_at_10, rerank, shipped_collection
from ops.bench.common import bench_model, print_table, write_json

#: The largest nDCG@10 a precision may lose against fp32 and still be adopted.
MAX_NDCG_LOSS = 0.005

Pairs = list[tuple[str, str]]


@dataclass(frozen=True)
class Candidate:
    """One way to run one model: the member, its backend and precision, and the int8 recipe
    (``none``: not quantised; else the precision is the unquantised rest's)."""

    model: str  # "embedding" or "cross-encoder"
    backend: str  # torch, onnx or openvino
    precision: str  # fp32 or bf16
    quantization: str = "none"

    @property
    def label(self) -> str:
        if self.quantization != "none":
            return f"{self.model} {self.backend} {self.quantization} ({self.precision} rest)"
        return f"{self.model} {self.backend} {self.precision}"

    @property
    def reference(self) -> bool:
        return self.backend == "torch" and self.precision == "fp32" and self.quantization == "none"


def candidates(*, embedding_backends: Sequence[str], exported: Sequence[str], native_bf16: bool) -> list[Candidate]:
    """What each model could run at here, its fp32 torch reference first: torch bf16; and on each
    exported backend installed (``exported``) fp32 and each int8 recipe it makes, with OpenVINO
    bf16 (and its int8 recipes with a bf16 rest) where the CPU has native bf16. The embedding
    member gets the exported ones only where its engine offers them (``embedding_backends``)."""
    from worker.engine.int8_recipes import recipes_for

    out: list[Candidate] = []
    for model, backends in (("embedding", embedding_backends), ("cross-encoder", ("torch", *exported))):
        out += [Candidate(model, "torch", "fp32"), Candidate(model, "torch", "bf16")]
        for backend in exported:
            if backend not in backends:
                continue
            rests = ["fp32", "bf16"] if backend == "openvino" and native_bf16 else ["fp32"]
            out += [Candidate(model, backend, rest) for rest in rests]
            out += [Candidate(model, backend, rest, r.name) for r in recipes_for(backend) for rest in rests]
    return out


def verdict(ndcg: float, reference: float) -> tuple[float, bool]:
    """The difference to the reference's nDCG@10, and whether the loss is within MAX_NDCG_LOSS."""
    difference = ndcg - reference
    return difference, -difference < MAX_NDCG_LOSS


def embedding_backends() -> list[str]:
    """The backends the embedding engine takes here: torch, and the exported ones once its
    constructor has a ``backend`` (it may not yet)."""
    from worker.engine.embedding import EmbeddingEngine

    if "backend" in inspect.signature(EmbeddingEngine.__init__).parameters:
        return ["torch", "onnx", "openvino"]
    return ["torch"]


def scorer(candidate: Candidate, *, settings: Any, model_path: str) -> Callable[[Pairs], list[float]]:
    from worker.engine import BackendChoice, ScoringEngine, load_cross_encoder

    # No calibration file: an int8 recipe that calibrates does so on the shipped windows, as auto's does.
    choice = BackendChoice(candidate.backend, quantization=candidate.quantization)
    precision = candidate.precision
    if candidate.model == "embedding":
        from worker.engine.embedding import EmbeddingEngine
        from worker.engine.loading import load_sentence_transformer
        from worker.providers.embedding import packaged_model

        extra: dict[str, Any] = {} if candidate.backend == "torch" else {"backend": choice}
        engine: Any = EmbeddingEngine(
            load_sentence_transformer(packaged_model()[0], device="cpu"),
            settings=settings,
            precision=precision,
            verify_parity=False,
            **extra,
        )
    else:
        engine = ScoringEngine(
            load_cross_encoder(model_path, device="cpu"),
            settings=settings,
            precision=precision,
            verify_parity=False,
            backend=choice,
            model_name=model_path,
        )
    return engine.score_pairs  # type: ignore[no-any-return]


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=100, help="rerank each query's BM25 top DEPTH")
    parser.add_argument("--model", help="the cross-encoder directory (default: the trained bench model)")
    parser.add_argument("--only", help="comma-separated labels' substrings to run, e.g. 'embedding,int8'")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch/runtime threads (quality does not depend on them)"
    )
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args(argv)


def chosen_candidates(only: str | None) -> list[Candidate]:
    """Every candidate this machine can run, or those ``--only`` names (and the references they are judged against)."""
    from worker.engine.precision import cpu_has_native_bf16

    exported = [name for name in ("onnx", "openvino") if importlib.util.find_spec(name + "runtime" * (name == "onnx"))]
    chosen = candidates(embedding_backends=embedding_backends(), exported=exported, native_bf16=cpu_has_native_bf16())
    if only:
        wanted = only.split(",")
        chosen = [c for c in chosen if c.reference or any(w in c.label for w in wanted)]
    return chosen


def evaluate(
    candidate: Candidate,
    score: Callable[[Pairs], list[float]],
    collection: Any,
    *,
    depth: int,
    references: dict[str, tuple[float, dict[str, list[float]]]],
    start: float,
) -> dict[str, Any]:
    """One candidate's nDCG@10 and per-query Spearman against its model's reference (which a
    reference candidate sets in ``references`` for the ones after it)."""
    from worker.engine.parity import spearman

    rankings, scores = rerank(collection, score, depth=depth)
    ndcg = ndcg_at_10(collection, rankings)
    if candidate.reference:
        references[candidate.model] = (ndcg, scores)
    reference_ndcg, reference_scores = references[candidate.model]
    rhos = [spearman(reference_scores[q], scores[q]) for q in scores]
    difference, holds = verdict(ndcg, reference_ndcg)
    result = {
        "model": candidate.model,
        "backend": candidate.backend,
        "precision": candidate.precision,
        "quantization": candidate.quantization,
        "ndcg10": ndcg,
        "ndcg10_vs_fp32": difference,
        "within_bar": holds,
        "spearman_min": min(rhos),
        "spearman_mean": statistics.fmean(rhos),
        "seconds": time.perf_counter() - start,
        "scores": scores,
    }
    print(f"{candidate.label}: nDCG@10 {ndcg:.4f} ({difference:+.4f}), {time.perf_counter() - start:.0f}s")
    return result


def evaluate_all(
    chosen: list[Candidate], collection: Any, *, settings: Any, model_path: str, depth: int
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    references: dict[str, tuple[float, dict[str, list[float]]]] = {}
    for candidate in chosen:
        start = time.perf_counter()
        try:
            score = scorer(candidate, settings=settings, model_path=model_path)
        except Exception as exc:  # a backend that cannot run here is reported, not fatal
            print(f"{candidate.label}: unavailable ({type(exc).__name__}: {exc})", flush=True)
            continue
        results[candidate.label] = evaluate(
            candidate, score, collection, depth=depth, references=references, start=start
        )
    return results


def teacher_agreement(results: dict[str, dict[str, Any]]) -> dict[str, float] | None:
    """Per-query Spearman of the trained cross-encoder against the bi-encoder it was distilled from."""
    from worker.engine.parity import spearman

    teacher = results.get("embedding torch fp32")
    student = results.get("cross-encoder torch fp32")
    if not (teacher and student):
        return None
    rhos = [spearman(teacher["scores"][q], student["scores"][q]) for q in student["scores"]]
    return {"spearman_mean": statistics.fmean(rhos), "spearman_min": min(rhos)}


def print_quality(
    results: dict[str, dict[str, Any]], agreement: dict[str, float] | None, *, depth: int, bm25: float
) -> None:
    print_table(
        f"nDCG@10 of the shipped collection, BM25 top {depth} reranked (BM25 alone: {bm25:.4f}); "
        f"bar: lose under {MAX_NDCG_LOSS} against the model's torch fp32",
        ["candidate", "nDCG@10", "vs fp32", "under bar", "spearman min", "spearman mean"],
        [
            [
                label,
                f"{r['ndcg10']:.4f}",
                f"{r['ndcg10_vs_fp32']:+.4f}",
                "yes" if r["within_bar"] else "no",
                f"{r['spearman_min']:.4f}",
                f"{r['spearman_mean']:.4f}",
            ]
            for label, r in results.items()
        ],
    )
    if agreement:
        print(
            f"\nthe trained cross-encoder against its teacher (the bi-encoder), per query: Spearman mean "
            f"{agreement['spearman_mean']:.3f}, least {agreement['spearman_min']:.3f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)

    from kernel.settings import load_settings
    from worker.engine import configure_threads

    # Quality does not depend on the thread count, and on a shared machine one thread is the quickest.
    configure_threads(args.threads)
    settings = load_settings({})
    model_path = args.model or str(bench_model())
    collection = shipped_collection()
    chosen = chosen_candidates(args.only)
    bm25 = ndcg_at_10(collection, {q: collection.run[q] for q in collection.evaluated})
    results = evaluate_all(chosen, collection, settings=settings, model_path=model_path, depth=args.depth)
    agreement = teacher_agreement(results)
    print_quality(results, agreement, depth=args.depth, bm25=bm25)
    for r in results.values():
        del r["scores"]
    write_json(
        args.json_path,
        {"depth": args.depth, "bm25_ndcg10": bm25, "model": model_path, "candidates": results, "teacher": agreement},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
