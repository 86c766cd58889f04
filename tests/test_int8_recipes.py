"""The int8 recipes: each export is made as its recipe says (and where it says), ``auto``
measures every one at each precision its rest can run, adopts one only at parity on the probe
and the held-out windows, and keeps that decision for the next start."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from engine_helpers import start_engine
from structlog.testing import capture_logs

from devservers.tiny_model import build_tiny_cross_encoder
from kernel.errors import ConfigError
from kernel.settings.checks import INT8_RECIPES
from producer import load_settings
from worker.engine import BackendChoice, BackendUnavailable, ScoringEngine, load_cross_encoder
from worker.engine.autotune import DECISION_FILE, Candidate, shipped_calibration
from worker.engine.export import ONNX_FILES, OPENVINO_FILES
from worker.engine.int8_recipes import RECIPES, recipes_for
from worker.engine.parity import MIN_SPEARMAN, spearman
from worker.engine.precision import cpu_has_native_bf16, probe_pairs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def exporters_installed() -> None:
    # At the module's first test rather than at collection, which every test process does for
    # every module: the exporters' imports cost each process a second or more there.
    for name in ("onnxruntime", "openvino", "nncf"):
        pytest.importorskip(name)


#: Timing seconds for a measurement: one round, so the tests time what they must and no more.
QUICK = 0.01
#: The feed-forward output layer of every encoder layer, as each backend names its matrix multiply.
FFN_OUTPUT = {
    "openvino": r".*layer\.\d+\.output\.dense/aten::linear/MatMul",
    "onnx": r".*/layer\.\d+/output/dense/MatMul",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The module's own model: its exports and decisions land nowhere else.
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("int8") / "model")


def exported(model: Path, backend: str, recipe: str) -> ScoringEngine:
    """The recipe's export made and served, forced (no probe): what the file holds is under test."""
    return ScoringEngine(
        load_cross_encoder(str(model), device="cpu"),
        settings=load_settings({}, precision="fp32"),
        backend=BackendChoice(backend, quantization=recipe),
        verify_parity=False,
        model_name=str(model),
    )


def openvino_int8_inputs(path: Path) -> dict[str, bool]:
    """Each matrix multiply with weights, by name: whether its activation input is quantised (a
    FakeQuantize feeds it); and "int8 weights" whether any weight constant is stored as int8."""
    import openvino as ov

    model = ov.Core().read_model(str(path))
    found: dict[str, bool] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() == "MatMul" and "aten::linear" in op.get_friendly_name():
            source = op.input_value(0).get_node()
            found[op.get_friendly_name()] = source.get_type_name() == "FakeQuantize"
    found["int8 weights"] = any(
        op.get_type_name() == "Constant" and op.get_element_type().get_type_name() == "i8"
        for op in model.get_ordered_ops()
    )
    return found


def onnx_int8_inputs(path: Path) -> tuple[dict[str, bool], set[str]]:
    """Each MatMul with weights (not attention's two), by name: whether its activation input is
    dequantised from int8 (a QDQ pair before it); and the graph's op types."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    found = {}
    for node in graph.node:
        if node.op_type == "MatMul" and not node.name.endswith(("/self/MatMul", "/self/MatMul_1")):
            source = producer.get(node.input[0])
            found[node.name] = source is not None and source.op_type == "DequantizeLinear"
    return found, {node.op_type for node in graph.node}


@pytest.mark.parametrize(
    ("backend", "recipe"), [(backend, r.name) for backend in ("openvino", "onnx") for r in recipes_for(backend)]
)
def test_each_recipe_makes_its_own_export_quantising_what_it_says(model_dir, backend, recipe):
    engine = exported(model_dir, backend, recipe)

    assert engine.precision == "int8" and engine.backend.name == backend
    files = OPENVINO_FILES if backend == "openvino" else ONNX_FILES
    path = model_dir / backend / files[recipe]
    made_from = json.loads(path.with_name(path.name + ".rerankq.json").read_text())["made_from"]
    assert made_from["variant"] == recipe
    # A recipe that calibrates names the windows it was calibrated on (the shipped ones here);
    # one that reads none names none, so new windows do not make it again.
    expected = shipped_calibration(25).digest if RECIPES[recipe].calibrated else None
    assert made_from["calibration"] == expected

    if backend == "openvino":
        quantised = openvino_int8_inputs(path)
        weights = quantised.pop("int8 weights")
        ffn = {name: q for name, q in quantised.items() if re.fullmatch(FFN_OUTPUT["openvino"], name)}
        others = {name: q for name, q in quantised.items() if name not in ffn and ".layer." in name}
    else:
        quantised, ops = onnx_int8_inputs(path)
        if recipe == "int8-dynamic":
            # Activations quantised per batch by the graph itself; no range was fixed ahead of time.
            assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "QuantizeLinear" not in ops
            return
        weights = "DequantizeLinear" in ops
        ffn = {name: q for name, q in quantised.items() if re.fullmatch(FFN_OUTPUT["onnx"], name)}
        others = {name: q for name, q in quantised.items() if name not in ffn and "/layer." in name}
    assert ffn and others and weights  # every recipe stores int8 weights
    if recipe == "int8":
        assert all(ffn.values()) and all(others.values())
    elif recipe == "int8-ffn":
        # The feed-forward outputs stay in the higher precision; the other layers are int8.
        assert not any(ffn.values()) and all(others.values())
    else:  # int8-weights
        assert not any(ffn.values()) and not any(others.values())  # weights only: no activation in int8


def test_a_recipe_a_backend_does_not_make_is_refused_naming_it(model_dir):
    with pytest.raises(BackendUnavailable, match="int8-weights is made for openvino, not onnx"):
        exported(model_dir, "onnx", "int8-weights")


def test_the_settings_know_each_recipe_as_the_engine_makes_it():
    assert INT8_RECIPES == {name: (r.backends, r.calibrated) for name, r in RECIPES.items()}
    with pytest.raises(ConfigError, match="RERANKQ_RERANKER_QUANTIZATION.*int8-dynamic needs .*BACKEND=onnx"):
        load_settings({"RERANKQ_RERANKER_BACKEND": "openvino", "RERANKQ_RERANKER_QUANTIZATION": "int8-dynamic"})
    with pytest.raises(ConfigError, match="RERANKQ_RERANKER_CALIBRATION.*int8-ffn"):
        load_settings({"RERANKQ_RERANKER_BACKEND": "onnx", "RERANKQ_RERANKER_QUANTIZATION": "int8-ffn"})
    # A recipe that reads no windows needs none.
    member = load_settings(
        {"RERANKQ_RERANKER_BACKEND": "openvino", "RERANKQ_RERANKER_QUANTIZATION": "int8-weights"}
    ).chain.effective_members()[0]
    assert member.quantization == "int8-weights" and member.calibration is None


# --- auto ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(model_dir: Path) -> ScoringEngine:
    """A first start with int8 asked for: every candidate measured."""
    (model_dir / DECISION_FILE).unlink(missing_ok=True)
    return start_engine(model_dir, {"RERANKQ_AUTO_INT8": "true"}, auto_timing_s=QUICK)


def held_to(engine: ScoringEngine, reference: ScoringEngine, candidate: Candidate) -> list[float]:
    """Each window auto holds an int8 candidate to (the probe, the shipped held-out windows):
    its Spearman against torch fp32 (``reference``), from the candidate's export loaded anew."""
    windows = [probe_pairs(), *shipped_calibration(25).held_out]
    choice = BackendChoice(candidate.backend, quantization=candidate.quantization)
    backend = engine._load_exported(choice, candidate.precision, shipped_calibration(25))
    return [spearman(reference.score_pairs(w), engine._score(backend, w)) for w in windows]


def test_auto_measures_every_recipe_at_each_rest_and_adopts_an_int8_only_at_parity(model_dir, measured):
    reference = start_engine(model_dir, {"RERANKQ_RERANKER_BACKEND": "torch", "RERANKQ_PRECISION": "fp32"})
    decision = measured.auto_decision
    assert decision is not None and not decision.reused
    rests = ["fp32", "bf16"] if cpu_has_native_bf16() else ["fp32"]
    wanted = {Candidate("onnx", "fp32", r.name) for r in recipes_for("onnx")} | {
        Candidate("openvino", rest, r.name) for r in recipes_for("openvino") for rest in rests
    }
    rows = {m.candidate: m for m in decision.table}
    assert wanted <= set(rows)
    for candidate in wanted:
        row = rows[candidate]
        # Timed exactly when at parity; a refusal says why.
        assert (row.pairs_per_s is not None) == row.at_parity and (row.reason is None) == row.at_parity
        rhos = held_to(measured, reference, candidate)
        if row.at_parity:
            # At parity on every window it is held to: the probe and each held-out window.
            assert min(rhos) >= MIN_SPEARMAN, (candidate.label, rhos)
        elif row.reason.startswith("Spearman"):
            assert min(rhos) < MIN_SPEARMAN, (candidate.label, rhos)
    chosen = max((m for m in decision.table if m.at_parity), key=lambda m: m.pairs_per_s or 0).candidate
    assert decision.chosen == chosen
    assert (measured.backend.name, measured.precision) == (chosen.backend, chosen.served_precision)


def choose(model: Path, candidate: Candidate) -> None:
    """The kept decision, as a start that had timed ``candidate`` fastest would have written it."""
    kept = json.loads((model / DECISION_FILE).read_text())
    (entry,) = kept["decisions"]
    entry["chosen"] = msgspec.to_builtins(candidate)
    (model / DECISION_FILE).write_text(json.dumps(kept))


def test_a_kept_int8_decision_is_reused_and_one_no_longer_at_parity_is_measured_again(model_dir, measured):
    table = measured.auto_decision.table
    at_parity = [m.candidate for m in table if m.candidate.quantized and m.at_parity]
    refused = [m.candidate for m in table if m.candidate.quantized and (m.reason or "").startswith("Spearman")]
    if not at_parity or not refused:
        pytest.skip("the tiny model's int8 recipes all hold parity here, or none does")

    choose(model_dir, at_parity[0])
    with capture_logs() as logs:
        second = start_engine(model_dir, {"RERANKQ_AUTO_INT8": "true"}, auto_timing_s=QUICK)
    assert second.auto_decision is not None and second.auto_decision.reused
    assert second.auto_decision.chosen == at_parity[0]
    assert (second.backend.name, second.precision) == (at_parity[0].backend, at_parity[0].served_precision)
    # Only the chosen export was read (none made), and held to the probe and held-out windows again.
    assert not [e for e in logs if e["event"] in ("model_exported", "auto_decision_stale")]

    choose(model_dir, refused[0])
    with capture_logs() as logs:
        third = start_engine(model_dir, {"RERANKQ_AUTO_INT8": "true"}, auto_timing_s=QUICK)
    # A kept int8 that does not hold parity again is not served: auto measures anew.
    assert [e["chosen"] for e in logs if e["event"] == "auto_decision_stale"] == [refused[0].label]
    assert third.auto_decision is not None and not third.auto_decision.reused
    assert third.auto_decision.chosen != refused[0]
