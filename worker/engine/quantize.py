"""An int8 recipe (``worker.engine.int8_recipes``) applied to an fp32 export, with each backend's own tool.

ONNX Runtime: its QDQ static quantiser (per-channel int8 weights, int8 activations calibrated on
the given batches), the recipe's kept layers passed as ``nodes_to_exclude``; or its dynamic
quantiser. OpenVINO: NNCF's post-training quantisation with the transformer preset optimum-intel
uses (SmoothQuant, bias correction), the kept layers as an ignored scope; or NNCF's weight
compression. Each writes its files into ``directory`` under the name it is given and returns them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worker.engine.int8_recipes import RecipeInapplicable, recipe

Feed = dict[str, Any]  # one calibration batch: input name -> int64 numpy array


def _kept(names: Sequence[str], patterns: Sequence[str], recipe_name: str) -> list[str]:
    """The node names the recipe keeps out of int8; refused when it names patterns no node matches."""
    kept = [n for n in names if any(re.fullmatch(p, n) for p in patterns)]
    if patterns and not kept:
        raise RecipeInapplicable(f"{recipe_name} keeps layers this model has none of ({', '.join(patterns)})")
    return kept


# --- ONNX Runtime ------------------------------------------------------------------------------


def onnx_quantized(source: Path, target: Path, recipe_name: str, feeds: Sequence[Feed]) -> list[Path]:
    """``source`` (a plain fp32 export) quantised by the recipe into ``target``."""
    how = recipe(recipe_name)
    if not how.calibrated:
        return _onnx_dynamic(source, target)
    return onnx_static(source, target, feeds, kept=how.kept.get("onnx", ()), recipe_name=recipe_name)


def onnx_static(
    source: Path, target: Path, feeds: Sequence[Feed], *, kept: Sequence[str], recipe_name: str
) -> list[Path]:
    """Static QDQ int8 of every MatMul but those whose names fully match a pattern in ``kept``
    (ONNX Runtime's per-node exclusion), activations calibrated on ``feeds``."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime's, unannotated
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> Feed | None:
            return next(self._feeds, None)

    prepared = target.with_name("prepared.onnx")
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    graph = onnx.load(str(prepared), load_external_data=False).graph
    excluded = _kept([n.name for n in graph.node if n.op_type == "MatMul"], kept, recipe_name)
    quantize_static(
        str(prepared),
        str(target),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        nodes_to_exclude=excluded,
    )
    prepared.unlink()
    return [target]


def _onnx_dynamic(source: Path, target: Path) -> list[Path]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source), str(target), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
    )
    return [target]


# --- OpenVINO ----------------------------------------------------------------------------------


def openvino_quantized(source: Path, target: Path, recipe_name: str, feeds: Sequence[Feed]) -> list[Path]:
    """``source`` (a plain fp32 IR) quantised by the recipe into ``target`` (and its ``.bin``)."""
    import nncf
    import openvino as ov

    how = recipe(recipe_name)
    model = ov.Core().read_model(str(source))
    if not how.calibrated:
        quantized = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM)
    else:
        patterns = how.kept.get("openvino", ())
        _kept([op.get_friendly_name() for op in model.get_ordered_ops()], patterns, recipe_name)
        quantized = nncf.quantize(
            model,
            nncf.Dataset(list(feeds)),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(feeds),
            ignored_scope=nncf.IgnoredScope(patterns=list(patterns), validate=False) if patterns else None,
        )
    ov.save_model(quantized, str(target), compress_to_fp16=False)
    return [target.with_suffix(".bin"), target]
