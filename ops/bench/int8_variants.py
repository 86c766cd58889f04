"""int8 variants tried and not shipped as recipes, measured as ``auto`` would hold them.

``worker/engine/int8_recipes.py`` keeps the recipes worth measuring at every first start;
this bench measures the other ways tried to get an int8 export of the trained bench
cross-encoder to parity, so the choice can be checked: NNCF's SmoothQuant at other alphas
and off, its performance preset (symmetric activations: faster int8 kernels), attention kept
in the higher precision, the feed-forward outputs kept with the performance preset, NNCF's
accuracy-aware quantisation (``--accuracy-control``: half an hour here), and ONNX Runtime's
static quantiser with attention's matrix multiplies excluded. The shipped ``int8`` and
``int8-ffn`` recipes are rows too, made the same way, as the yardstick.

Each variant is calibrated on the shipped collection's calibrating windows, as ``auto``
calibrates, and held to the windows ``auto`` holds an int8 export to (the probe and the 26
held-out ones) against torch fp32: the worst window's Spearman, the mean, how many fall
below 0.99, the largest score difference and ``auto``'s verdict (``autotune.judge``). Speed:
alternated rounds over the scoring bench's windows, each variant's pairs/s over OpenVINO
bf16's in the same round (the median), the OpenVINO variants with their unquantised rest in
bf16 (faster than fp32 on a CPU with AMX).

    python -m ops.bench.int8_variants [--rounds 3] [--only sq,perf] [--accuracy-control] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ops.bench.common import (
    bench_model,
    cpu_quota,
    median_of_ratios,
    print_table,
    realistic_pairs,
    windows_of,
    write_json,
)

Pairs = list[tuple[str, str]]
Feeds = list[dict[str, Any]]

#: OpenVINO node names: attention's scaled dot product, the feed-forward outputs.
_SDPA = {"types": ["ScaledDotProductAttention"]}
_FFN = {"patterns": [r".*layer\.\d+\.output\.dense/.*"]}
#: ONNX Runtime node names: attention's two matrix multiplies, the feed-forward outputs.
_ORT_ATTENTION = [r".*/attention/self/MatMul(_1)?"]
_ORT_FFN = [r".*/layer\.\d+/output/dense/MatMul"]


def openvino_variants() -> dict[str, dict[str, Any]]:
    """Each variant's ``nncf.quantize`` arguments beyond the model and the data."""
    import nncf
    from nncf.quantization.advanced_parameters import (  # type: ignore[import-untyped]
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    def alpha(value: float) -> AdvancedQuantizationParameters:
        return AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=value))

    performance = {"preset": nncf.QuantizationPreset.PERFORMANCE}
    return {
        "int8 (shipped: mixed preset, SmoothQuant 0.95)": {},
        "SmoothQuant off": {"advanced_parameters": alpha(-1)},
        "SmoothQuant 0.5": {"advanced_parameters": alpha(0.5)},
        "SmoothQuant 0.75": {"advanced_parameters": alpha(0.75)},
        "performance preset": performance,
        "performance preset, SmoothQuant off": {**performance, "advanced_parameters": alpha(-1)},
        "attention kept": {"ignored_scope": nncf.IgnoredScope(**_SDPA, validate=False)},
        "int8-ffn (shipped: feed-forward outputs and head kept)": {
            "ignored_scope": nncf.IgnoredScope(patterns=[*_FFN["patterns"], r".*\.pooler\..*", r".*\.classifier[./].*"])
        },
        "performance preset, feed-forward outputs kept": {
            **performance,
            "ignored_scope": nncf.IgnoredScope(**_FFN, validate=False),
        },
    }


class Bench:
    """The trained bench cross-encoder, its torch fp32 reference and its plain exports."""

    def __init__(self, model_path: str, directory: Path) -> None:
        from kernel.settings import load_settings
        from worker.engine import BackendChoice, ScoringEngine, load_cross_encoder
        from worker.engine.autotune import shipped_calibration
        from worker.engine.export import onnx_export, openvino_export
        from worker.engine.precision import probe_pairs

        self.engine = ScoringEngine(
            load_cross_encoder(model_path, device="cpu"),
            settings=load_settings({}, precision="fp32"),
            verify_parity=False,
            backend=BackendChoice("torch"),
            model_name=model_path,
        )
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        shipped = shipped_calibration(25)
        self.calibrate = shipped.calibrate
        self.windows = [probe_pairs(), *shipped.held_out]
        self.reference = [self.engine.score_pairs(w) for w in self.windows]
        if not (directory / "openvino_model.xml").exists():
            openvino_export(self.engine.network, self.engine.tokenizer, directory)
        if not (directory / "model.onnx").exists():
            onnx_export(self.engine.network, self.engine.tokenizer, directory)

    def feeds(self) -> Feeds:
        tokenized = (self.engine.tokenize(w) for w in self.calibrate)
        return [{k: v.numpy() for k, v in b.tensors.items()} for t in tokenized for b in self.engine.batches(t)]

    def score(self, forward: Any, window: Pairs) -> list[float]:
        return self.engine._score(forward, window)


class OpenVINOForward:
    def __init__(self, path: Path, hint: str, threads: int) -> None:
        import openvino as ov

        config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        compiled = ov.Core().compile_model(str(path), "CPU", config)
        self.request = compiled.create_infer_request()
        self.inputs = [i.get_any_name() for i in compiled.inputs]

    def forward(self, tensors: Any) -> Any:
        import torch

        result = self.request.infer({name: tensors[name].numpy() for name in self.inputs})
        return torch.from_numpy(result[0].copy()).float()


class OnnxForward:
    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def forward(self, tensors: Any) -> Any:
        import torch

        feed = {n: (tensors[n] if n in tensors else tensors["input_ids"] * 0).numpy() for n in self.inputs}
        return torch.from_numpy(self.session.run(None, feed)[0]).float()


def _file_name(variant: str) -> str:
    import re

    return "variant-" + re.sub(r"[^a-z0-9]+", "-", variant.lower()).strip("-")


def nncf_variant(bench: Bench, name: str, arguments: dict[str, Any]) -> Path:
    import nncf
    import openvino as ov

    path = bench.directory / f"{_file_name(name)}.xml"
    if not path.exists():
        model = ov.Core().read_model(str(bench.directory / "openvino_model.xml"))
        feeds = bench.feeds()
        quantized = nncf.quantize(
            model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(feeds), **arguments
        )
        ov.save_model(quantized, str(path), compress_to_fp16=False)
    return path


def accuracy_controlled(bench: Bench) -> Path:
    """NNCF's accuracy-aware quantisation: layers reverted to the higher precision, most harmful
    first, until the worst window's Spearman against torch fp32 (on 12 held-out windows other
    than the judged ones' first) drops at most 0.004, or 12 iterations pass."""
    import nncf
    import numpy as np
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    from worker.engine.parity import spearman

    path = bench.directory / "variant-accuracy-control.xml"
    if path.exists():
        return path

    def batches(window: Pairs) -> list[tuple[list[int], dict[str, Any]]]:
        encoded = bench.engine.tokenize(window)
        return [(b.indices, {k: v.numpy() for k, v in b.tensors.items()}) for b in bench.engine.batches(encoded)]

    validation = [(batches(w), r) for w, r in zip(bench.windows[1:13], bench.reference[1:13])]

    def validate(compiled: Any, items: Sequence[Any]) -> tuple[float, list[float]]:
        names = [i.get_any_name() for i in compiled.inputs]
        rhos = []
        for batches, reference in items:
            scores = [0.0] * len(reference)
            for indices, feed in batches:
                for i, value in zip(indices, np.asarray(compiled({n: feed[n] for n in names})[0])[:, -1]):
                    scores[i] = float(value)
            rhos.append(spearman(reference, scores))
        return min(rhos), rhos

    feeds = bench.feeds()
    quantized = nncf.quantize_with_accuracy_control(
        ov.Core().read_model(str(bench.directory / "openvino_model.xml")),
        nncf.Dataset(feeds),
        nncf.Dataset(validation),
        validate,
        max_drop=0.004,
        drop_type=nncf.DropType.ABSOLUTE,
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(feeds),
        advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(max_num_iterations=12),
    )
    ov.save_model(quantized, str(path), compress_to_fp16=False)
    return path


def ort_variant(bench: Bench, name: str, excluded: Sequence[str]) -> Path:
    from worker.engine.quantize import onnx_static

    path = bench.directory / f"{_file_name(name)}.onnx"
    if not path.exists():
        onnx_static(bench.directory / "model.onnx", path, list(bench.feeds()), kept=excluded, recipe_name=name)
    return path


def _openvino(bench: Bench, name: str, arguments: dict[str, Any], rest: str, threads: int) -> OpenVINOForward:
    return OpenVINOForward(nncf_variant(bench, name, arguments), rest, threads)


def _onnx(bench: Bench, name: str, excluded: Sequence[str], threads: int) -> OnnxForward:
    return OnnxForward(ort_variant(bench, name, excluded), threads)


def variants(bench: Bench, args: argparse.Namespace, threads: int) -> dict[str, Callable[[], Any]]:
    """Each variant by name, built when called; OpenVINO bf16 (the yardstick) first."""
    rest = "bf16" if args.rest == "bf16" else "f32"
    made: dict[str, Callable[[], Any]] = {
        "openvino bf16 (not quantised)": lambda: OpenVINOForward(
            bench.directory / "openvino_model.xml", "bf16", threads
        )
    }
    for name, arguments in openvino_variants().items():
        made[f"openvino {name}"] = functools.partial(_openvino, bench, name, arguments, rest, threads)
    if args.accuracy_control:
        made["openvino accuracy-aware (NNCF, min Spearman)"] = lambda: OpenVINOForward(
            accuracy_controlled(bench), rest, threads
        )
    for name, excluded in {
        "int8 (shipped)": [],
        "int8-ffn (shipped)": _ORT_FFN,
        "attention kept": _ORT_ATTENTION,
        "attention and feed-forward outputs kept": _ORT_ATTENTION + _ORT_FFN,
    }.items():
        made[f"onnx {name}"] = functools.partial(_onnx, bench, name, excluded, threads)
    if args.only:
        wanted = args.only.split(",")
        made = {n: m for i, (n, m) in enumerate(made.items()) if i == 0 or any(w in n for w in wanted)}
    return made


def held(bench: Bench, forward: Any) -> dict[str, Any]:
    from worker.engine.autotune import Candidate, judge
    from worker.engine.parity import MIN_SPEARMAN, max_abs_diff, spearman

    scored = [bench.score(forward, w) for w in bench.windows]
    rhos = [spearman(r, s) for r, s in zip(bench.reference, scored)]
    return {
        "spearman_min": min(rhos),
        "spearman_mean": statistics.fmean(rhos),
        "windows_below": sum(r < MIN_SPEARMAN for r in rhos),
        "windows": len(rhos),
        "max_abs_diff": max(max_abs_diff(r, s) for r, s in zip(bench.reference, scored)),
        "refused_by_auto": judge(Candidate("openvino", "fp32", "int8"), bench.reference, scored, bench.windows)[1],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest", choices=["bf16", "fp32"], default="bf16", help="OpenVINO's unquantised rest")
    parser.add_argument("--only", help="comma-separated substrings of the variants to run (the yardstick always runs)")
    parser.add_argument("--accuracy-control", action="store_true", help="also NNCF's accuracy-aware quantisation")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)

    import torch

    threads = cpu_quota()
    torch.set_num_threads(threads)
    from worker.engine.autotune import shipped_calibration

    model_path = str(bench_model())
    # Made once per model and calibration windows, beside the model; reused by the next run.
    bench = Bench(model_path, Path(model_path) / f"int8-variants-{shipped_calibration(25).digest}")
    timed = windows_of(
        realistic_pairs(n_windows=4, window_size=25, tokenizer=bench.engine.tokenizer, max_tokens=512), 25
    )
    built: dict[str, Any] = {}
    figures: dict[str, dict[str, Any]] = {}
    for name, make in variants(bench, args, threads).items():
        start = time.perf_counter()
        try:
            built[name] = make()
        except Exception as exc:  # a variant this model or tool cannot make is a row, not a failed run
            print(f"{name}: not made ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
            continue
        figures[name] = held(bench, built[name])
        print(f"{name}: {figures[name]}, {time.perf_counter() - start:.0f}s", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in built}
    names = list(built)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            for window in timed:
                bench.score(built[name], window)
            rates[name].append(sum(map(len, timed)) / (time.perf_counter() - start))
    yardstick = names[0]
    for name in names:
        figures[name]["pairs_per_s"] = statistics.median(rates[name])
        figures[name]["ratio_bf16"] = median_of_ratios(rates[name], rates[yardstick])
    print_table(
        f"int8 variants on {model_path}: ranking on the probe and the shipped held-out windows against torch fp32, "
        f"speed against {yardstick} ({args.rounds} alternated rounds, {threads} threads, OpenVINO rest {args.rest})",
        ["variant", "spearman min", "mean", "< 0.99", "max |diff|", "x bf16", "auto"],
        [
            [
                name,
                f"{f['spearman_min']:.4f}",
                f"{f['spearman_mean']:.4f}",
                f"{f['windows_below']}/{f['windows']}",
                f"{f['max_abs_diff']:.3f}",
                f"{f['ratio_bf16']:.2f}",
                f["refused_by_auto"] or "at parity",
            ]
            for name, f in figures.items()
        ],
    )
    write_json(args.json_path, {"model": model_path, "rounds": args.rounds, "rest": args.rest, "variants": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
