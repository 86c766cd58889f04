"""``auto`` decides by measuring: every candidate backend and precision held to the parity
probe and timed at first start, the fastest at parity adopted, the decision kept beside the
model and reused while nothing it depends on has changed, measured once by processes
starting together, and bypassed by an explicit backend or precision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import start_engine
from structlog.testing import capture_logs

from devservers.tiny_model import build_tiny_cross_encoder
from producer import load_settings
from worker.engine import BackendChoice, ScoringEngine, load_cross_encoder
from worker.engine.autotune import DECISION_FILE, Candidate
from worker.engine.parity import spearman

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def exporters_installed() -> None:
    # At the module's first test rather than at collection, which every test process does for
    # every module: the exporters' imports cost each process a second or more there.
    for name in ("onnxruntime", "openvino"):
        pytest.importorskip(name)


ROOT = Path(__file__).resolve().parents[1]
#: Timing seconds for a measurement: one round, so the tests time what they must and no more.
QUICK = 0.01


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The module's own model, so its exports (made by the first measurement, reused by the
    # rest: their manifests name this directory) and decisions land nowhere else.
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("autotune") / "model")


@pytest.fixture
def fresh(model_dir: Path) -> Path:
    """The model with no decision kept yet (its exports stay: they are not what is tested)."""
    (model_dir / DECISION_FILE).unlink(missing_ok=True)
    return model_dir


def start(model: Path, **env: str) -> ScoringEngine:
    """An engine as the local member builds one: backend and precision from the settings."""
    return start_engine(model, env, auto_timing_s=QUICK)


def kept(model: Path) -> list[dict]:
    return json.loads((model / DECISION_FILE).read_text())["decisions"]


def test_auto_measures_every_candidate_adopts_the_fastest_at_parity_and_keeps_the_decision(fresh):
    with capture_logs() as logs:
        engine = start(fresh, RERANKQ_AUTO_INT8="true")

    decision = engine.auto_decision
    assert decision is not None and not decision.reused
    labels = [(m.candidate.backend, m.candidate.precision, m.candidate.quantization) for m in decision.table]
    assert labels[0] == ("torch", "fp32", "none")
    # Every exported backend plain, and with each of its int8 recipes (tests/test_int8_recipes.py).
    assert {
        ("onnx", "fp32", "none"),
        ("onnx", "fp32", "int8"),
        ("openvino", "fp32", "none"),
        ("openvino", "fp32", "int8"),
    } <= set(labels)
    # Every candidate at parity was timed; the one adopted is the fastest of them, and it serves.
    timed = [m for m in decision.table if m.at_parity]
    assert timed and all(m.pairs_per_s and m.pairs_per_s > 0 for m in timed)
    assert all(m.pairs_per_s is None and m.reason for m in decision.table if not m.at_parity)
    assert decision.chosen == max(timed, key=lambda m: m.pairs_per_s or 0).candidate
    assert (engine.backend.name, engine.precision) == (decision.chosen.backend, decision.chosen.served_precision)
    # The table is logged, and kept beside the model's exports under the fingerprint.
    chosen = [e for e in logs if e["event"] == "backend_chosen"]
    assert len(chosen) == 1 and chosen[0]["reused"] is False
    assert [row["candidate"] for row in chosen[0]["table"]] == [m.candidate.label for m in decision.table]
    (entry,) = kept(fresh)
    assert Candidate(**entry["chosen"]) == decision.chosen
    assert entry["fingerprint"]["versions"]["torch"] and entry["fingerprint"]["threads"] >= 1


def test_a_second_start_reuses_the_decision_without_measuring(fresh):
    first = start(fresh)
    # By default auto spends no first start on calibrating int8 (RERANKQ_AUTO_INT8 asks for it).
    assert first.auto_decision is not None
    assert {m.candidate.quantization for m in first.auto_decision.table} == {"none"}
    written = (fresh / DECISION_FILE).read_bytes()
    with capture_logs() as logs:
        second = start(fresh)

    assert second.auto_decision is not None and second.auto_decision.reused
    assert second.auto_decision.chosen == first.auto_decision.chosen
    # The same table, to the last digit of every timing: read back, not timed again.
    assert second.auto_decision.table == first.auto_decision.table
    assert (fresh / DECISION_FILE).read_bytes() == written
    assert [e["reused"] for e in logs if e["event"] == "backend_chosen"] == [True]
    assert not [e for e in logs if e["event"] == "model_exported"]
    # And it serves as the first did.
    window = [("payment gateway outage", d) for d in ("restart the gateway pods", "coffee machine", "tls certificate")]
    assert spearman(first.score_pairs(window), second.score_pairs(window)) == pytest.approx(1.0)


def test_a_decision_made_under_another_library_version_is_measured_again(fresh):
    start(fresh)
    stored = json.loads((fresh / DECISION_FILE).read_text())
    stored["decisions"][0]["fingerprint"]["versions"]["openvino"] = "2020.1.0"  # as if made before an upgrade
    (fresh / DECISION_FILE).write_text(json.dumps(stored))

    engine = start(fresh)

    assert engine.auto_decision is not None and not engine.auto_decision.reused
    versions = [d["fingerprint"]["versions"]["openvino"] for d in kept(fresh)]
    assert len(versions) == 2 and "2020.1.0" in versions  # the other host's decision is kept beside


@pytest.mark.parametrize(
    ("env", "backend"),
    [({"RERANKQ_PRECISION": "fp32"}, "openvino"), ({"RERANKQ_RERANKER_BACKEND": "torch"}, "torch")],
    ids=["precision", "backend"],
)
def test_an_explicit_backend_or_precision_bypasses_the_decision(fresh, env, backend):
    engine = start(fresh, **env)

    assert engine.auto_decision is None
    assert engine.backend.name == backend
    assert not (fresh / DECISION_FILE).exists()


_START = """
import json, sys
from producer import load_settings
from worker.engine import BackendChoice, ScoringEngine, load_cross_encoder
path = sys.argv[1]
engine = ScoringEngine(load_cross_encoder(path, device="cpu"), settings=load_settings({}),
                       backend=BackendChoice("auto"), model_name=path, auto_timing_s=float(sys.argv[2]))
print(json.dumps({"reused": engine.auto_decision.reused}))
"""


def test_processes_starting_together_measure_once(fresh):
    # Prefork children start at once: one measures, the others wait for its decision and read it.
    started = [
        subprocess.Popen(
            [sys.executable, "-c", _START, str(fresh), str(QUICK)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for process in started:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1])["reused"])

    assert sorted(results) == [False, True]
    assert len(kept(fresh)) == 1


def test_an_engine_serving_an_export_releases_the_torch_weights_and_scores_as_before(model_dir):
    engine = ScoringEngine(
        load_cross_encoder(str(model_dir), device="cpu"),
        settings=load_settings({}, precision="fp32"),
        backend=BackendChoice("onnx"),
        model_name=str(model_dir),
    )
    window = [("payment gateway outage", d) for d in ("restart the gateway pods", "coffee machine", "tls certificate")]
    before = engine.score_pairs(window)

    assert engine.release_unused()

    assert all(p.device.type == "meta" for p in engine.network.parameters())  # the weights are gone
    assert engine.score_pairs(window) == before  # tokenising needs none of them


# --- the embedding member ---


@pytest.fixture(scope="module")
def bi_encoder_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """A tiny bi-encoder: the tiny model's encoder under mean pooling, saved as sentence-transformers saves one."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    encoder = Transformer(str(model_dir))
    model = SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), "mean")], device="cpu")
    directory = tmp_path_factory.mktemp("autotune-embedding") / "model"
    model.save_pretrained(str(directory))
    return directory


def start_embedding(model: Path, **env: str):
    from worker.engine.embedding import EmbeddingEngine
    from worker.engine.loading import load_sentence_transformer

    return EmbeddingEngine(
        load_sentence_transformer(str(model), device="cpu"),
        settings=load_settings(env),
        model_name=str(model),
        auto_timing_s=QUICK,
    )


def test_the_embedding_member_measures_its_exports_keeps_the_decision_and_reuses_it(bi_encoder_dir):
    first = start_embedding(bi_encoder_dir, RERANKQ_AUTO_INT8="true")

    decision = first.auto_decision
    assert decision is not None and not decision.reused
    rows = {m.candidate: m for m in decision.table}
    assert {
        Candidate("torch", "fp32"),
        Candidate("onnx", "fp32"),
        Candidate("onnx", "fp32", "int8"),
        Candidate("openvino", "fp32"),
        Candidate("openvino", "fp32", "int8"),
    } <= set(rows)
    # An fp32 export of the transformer, pooled by the model's own modules, gives torch's cosines.
    assert rows[Candidate("onnx", "fp32")].at_parity and rows[Candidate("openvino", "fp32")].at_parity
    assert (
        decision.chosen == max((m for m in decision.table if m.at_parity), key=lambda m: m.pairs_per_s or 0).candidate
    )

    second = start_embedding(bi_encoder_dir, RERANKQ_AUTO_INT8="true")
    assert second.auto_decision is not None and second.auto_decision.reused
    assert second.auto_decision.table == decision.table
    assert (second.backend and second.backend.name, second.precision) == (
        decision.chosen.backend if decision.chosen.backend != "torch" else None,
        decision.chosen.served_precision,
    )
    assert start_embedding(bi_encoder_dir, RERANKQ_PRECISION="fp32").auto_decision is None


def test_an_embedding_engine_on_an_export_gives_the_library_cosines_after_releasing_torch(bi_encoder_dir):
    from worker.engine.autotune import Candidate, shipped_calibration

    engine = start_embedding(bi_encoder_dir, RERANKQ_PRECISION="fp32")
    st = engine.sentence_transformer
    query, documents = "payment gateway outage", ["restart the gateway pods", "coffee machine", "tls certificate"]
    q = st.encode_query([query], convert_to_tensor=True, normalize_embeddings=True)
    d = st.encode_document(documents, convert_to_tensor=True, normalize_embeddings=True)
    expected = (d @ q[0]).tolist()
    engine.backend = engine._load_exported(Candidate("openvino", "fp32"), shipped_calibration(25))

    assert engine.release_unused()

    assert all(p.device.type == "meta" for p in engine.network.parameters())
    assert engine.score(query, documents) == pytest.approx(expected, abs=1e-5)
