"""The int8 recipes: how an export is quantised, and which layers stay in the higher precision.

A recipe names a way to make an int8 export of the transformer; ``auto`` builds each one its
backend takes, holds it to the parity probe and the held-out windows like any candidate, and
times it (``worker.engine.autotune``). What each does on each backend is in
``worker.engine.quantize``. The unquantised rest of the network (layer norms, softmax, GELU,
the layers a recipe keeps) runs at the candidate's precision: fp32, or bf16 on OpenVINO where
the CPU runs it natively.

Measured on the trained bench cross-encoder (docs/performance.md, "int8 recipes"): BERT's
activations after the feed-forward block carry the outliers that per-tensor int8 cannot hold,
so keeping those layers' inputs out of int8 ranks closest to fp32 of the static recipes;
weight-only int8 ranks closer still but computes in the higher precision, so it is the
baseline for speed rather than a way to it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A member's quantization setting, and a candidate's, when nothing is quantised.
NONE = "none"


@dataclass(frozen=True)
class Recipe:
    name: str
    #: The exported backends that make it.
    backends: tuple[str, ...]
    #: Whether activation ranges are calibrated on windows (static int8). Weight-only and
    #: dynamic recipes read no windows.
    calibrated: bool
    #: Node names (regular expressions, per backend) of the layers kept in the higher precision.
    kept: dict[str, tuple[str, ...]]
    #: What it is, for the log and the docs.
    summary: str


#: The feed-forward block's output layer of every encoder layer (BERT, RoBERTa, XLM-R, ELECTRA
#: name it ``layer.N.output.dense``), and the scoring head after the encoder.
_FFN_OUTPUT = {"openvino": (r".*layer\.\d+\.output\.dense/.*",), "onnx": (r".*/layer\.\d+/output/dense/MatMul",)}
_HEAD = {"openvino": (r".*\.pooler\..*", r".*\.classifier[./].*"), "onnx": ()}

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            "int8",
            ("onnx", "openvino"),
            calibrated=True,
            kept={},
            summary="static: every matrix multiply in int8 (NNCF's transformer preset; ONNX Runtime's QDQ)",
        ),
        Recipe(
            "int8-ffn",
            ("onnx", "openvino"),
            calibrated=True,
            kept={name: _FFN_OUTPUT[name] + _HEAD[name] for name in _FFN_OUTPUT},
            summary="static, the feed-forward output layers and the scoring head kept in the higher precision",
        ),
        Recipe(
            "int8-weights",
            ("openvino",),
            calibrated=False,
            kept={},
            summary="weight-only: int8 weights (per channel), computed in the higher precision (NNCF compress_weights)",
        ),
        Recipe(
            "int8-dynamic",
            ("onnx",),
            calibrated=False,
            kept={},
            summary="dynamic: int8 weights, activations quantised per batch (ONNX Runtime quantize_dynamic)",
        ),
    )
}

#: A member's QUANTIZATION values: none, or a recipe's name.
QUANTIZATIONS = (NONE, *RECIPES)


class RecipeInapplicable(Exception):
    """The recipe keeps layers this model does not have (its layers are named otherwise): it
    would be the plain recipe again, so it is not made."""


def recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown int8 recipe {name!r}; one of {', '.join(RECIPES)}") from None


def recipes_for(backend: str) -> list[Recipe]:
    return [r for r in RECIPES.values() if backend in r.backends]


def served_precision(quantization: str, rest: str) -> str:
    """What an engine reports it runs at (its pair cache identity names it): the rest's
    precision, or for an int8 export ``int8`` (the rest in fp32) or ``int8+bf16``."""
    if quantization == NONE:
        return rest
    return "int8" if rest == "fp32" else f"int8+{rest}"
