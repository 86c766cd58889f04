"""The exported backends (ONNX Runtime, OpenVINO) behind the local provider: they rank as
torch fp32 does through the real load path, their exports are made once and reused, one
that does not keep the ranking is refused and says so, and a real worker serves on one."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from delivery_helpers import pull_until_complete
from engine_helpers import start_engine
from structlog.testing import capture_logs

from devservers.tiny_model import WORDS, build_tiny_cross_encoder
from producer import ConfigError, RerankClient, load_settings
from worker.engine import BackendChoice, BackendRefused, ScoringEngine, load_cross_encoder, shared_engine
from worker.engine.parity import spearman
from worker.providers.base import ProviderStartError, ScoreRequest
from worker.providers.local import LocalProvider

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def exporters_installed() -> None:
    # At the module's first test rather than at collection, which every test process does for
    # every module: the exporters' imports cost each process a second or more there.
    for name in ("onnxruntime", "openvino"):
        pytest.importorskip(name)


FP32 = {"RERANKQ_PRECISION": "fp32"}


def copy_model(source: Path, target: Path) -> Path:
    """The tiny model in a directory of the test's own, so exports land there and nowhere else."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("onnx", "openvino"))
    return target


def windows(n: int, size: int, *, seed: int) -> list[list[tuple[str, str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        query = " ".join(rng.choice(WORDS) for _ in range(5))
        out.append(
            [(query, " ".join(rng.choice(WORDS) for _ in range(rng.choice([3, 8, 20, 60, 150])))) for _ in range(size)]
        )
    return out


def local_provider(model: Path, **env: str) -> LocalProvider:
    settings = load_settings({"RERANKQ_RERANKER_MODEL": str(model), **FP32, **env})
    return LocalProvider(settings.chain.effective_members()[0], settings)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return copy_model(tiny_model_dir, tmp_path_factory.mktemp("backends") / "model")


@pytest.fixture(scope="module")
def torch_fp32(model_dir: Path) -> ScoringEngine:
    return ScoringEngine(
        load_cross_encoder(str(model_dir), device="cpu"),
        settings=load_settings({}, precision="fp32"),
        backend=BackendChoice("torch"),
    )


@pytest.mark.parametrize(
    "env",
    [
        {"RERANKQ_RERANKER_BACKEND": "onnx", "RERANKQ_RERANKER_ONNX_OPTIMIZATION": "O1"},
        {"RERANKQ_RERANKER_BACKEND": "onnx"},  # O2: ONNX Runtime's transformer fusions
        {"RERANKQ_RERANKER_BACKEND": "openvino"},
        {"RERANKQ_RERANKER_BACKEND": "auto"},
    ],
    ids=["onnx-O1", "onnx-O2", "openvino", "auto"],
)
def test_an_exported_backend_ranks_every_window_as_torch_fp32(model_dir, torch_fp32, env):
    provider = local_provider(model_dir, **env)
    expected_backend = "openvino" if env["RERANKQ_RERANKER_BACKEND"] == "auto" else env["RERANKQ_RERANKER_BACKEND"]
    assert provider.engine.backend.name == expected_backend

    for window in windows(4, 25, seed=1):
        request = ScoreRequest(query=window[0][0], documents=[d for _, d in window])
        scores = provider.score(request, deadline=float("inf"))
        reference = torch_fp32.score_pairs(window)
        assert spearman(reference, scores) == pytest.approx(1.0)
        assert max(abs(a - b) for a, b in zip(scores, reference)) < 1e-4
    # Its scores are cached apart from torch's: the identity names the backend and the export.
    identity = json.loads(provider.cache_identity)
    assert identity["backend"] == expected_backend and identity["artifact"]
    assert identity != json.loads(local_provider(model_dir, RERANKQ_RERANKER_BACKEND="torch").cache_identity)


def test_every_batch_an_exported_backend_runs_reaches_the_metrics_hook(model_dir):
    # The worker's padding metrics hang on on_batch: a window served by ONNX Runtime counts as torch's does.
    engine = ScoringEngine(
        load_cross_encoder(str(model_dir), device="cpu"),
        settings=load_settings({}, precision="fp32"),
        backend=BackendChoice("onnx"),
        token_budget=256,
    )
    seen: list[tuple[int, int]] = []
    engine.on_batch = lambda real, padded: seen.append((real, padded))
    window = windows(1, 25, seed=3)[0]
    engine.score_pairs(window)

    batches = engine.batches(engine.tokenize(window))
    assert len(batches) > 1
    assert seen == [(int(b.tensors["attention_mask"].sum()), b.padded_tokens) for b in batches]


def test_members_share_an_engine_only_when_they_ask_for_the_same_backend(model_dir):
    settings = load_settings({}, precision="fp32")

    def engine(name: str) -> ScoringEngine:
        return shared_engine(str(model_dir), device="cpu", settings=settings, backend=BackendChoice(name))

    on_torch, on_onnx = engine("torch"), engine("onnx")
    assert (on_torch.backend.name, on_onnx.backend.name) == ("torch", "onnx")
    assert engine("onnx") is on_onnx and engine("torch") is on_torch


def test_an_export_is_made_once_reused_by_the_next_start_and_redone_when_the_model_changes(tiny_model_dir, tmp_path):
    model = copy_model(tiny_model_dir, tmp_path / "model")
    settings = load_settings({}, precision="fp32")
    choice = BackendChoice("onnx", onnx_optimization="O2")

    def start() -> ScoringEngine:
        return ScoringEngine(load_cross_encoder(str(model), device="cpu"), settings=settings, backend=choice)

    first = start()
    exported = model / "onnx" / "model_O2.onnx"
    made_at = exported.stat().st_mtime_ns
    assert first.backend.exported and exported.exists()

    second = start()
    assert not second.backend.exported
    assert exported.stat().st_mtime_ns == made_at
    assert second.backend.artifact == first.backend.artifact

    # New weights under the same name: the old export must not be served for them.
    weights = model / "model.safetensors"
    os.utime(weights, ns=(made_at + 10**9, made_at + 10**9))
    third = start()
    assert third.backend.exported and exported.stat().st_mtime_ns != made_at
    assert third.backend.artifact != first.backend.artifact


@pytest.mark.parametrize(
    ("env", "damaged", "same_size"),
    [
        # auto at fp32 runs OpenVINO: a damaged export used to fall back to torch at every start.
        ({"RERANKQ_RERANKER_BACKEND": "auto"}, "openvino/openvino_model.bin", True),
        ({"RERANKQ_RERANKER_BACKEND": "onnx", "RERANKQ_RERANKER_ONNX_OPTIMIZATION": "O1"}, "onnx/model.onnx", False),
    ],
    ids=["openvino-weights-same-size-and-mtime", "onnx-graph-cut-short"],
)
def test_a_damaged_export_is_made_again_and_served(tiny_model_dir, tmp_path, torch_fp32, env, damaged, same_size):
    model = copy_model(tiny_model_dir, tmp_path / "model")
    backend = "onnx" if env["RERANKQ_RERANKER_BACKEND"] == "onnx" else "openvino"
    first = start_engine(model, {**FP32, **env})
    assert (first.backend.name, first.backend.exported) == (backend, True)
    file = model / damaged
    stat = file.stat()
    if same_size:  # other bytes over it, and its old mtime put back: only its digest tells
        with open(file, "r+b") as overwritten:
            overwritten.write(random.Random(0).randbytes(stat.st_size))
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    else:
        file.write_bytes(file.read_bytes()[: stat.st_size // 2])

    with capture_logs() as logs:
        second = start_engine(model, {**FP32, **env})

    assert (second.backend.name, second.backend.exported) == (backend, True)
    warned = [e for e in logs if e["event"] == "export_damaged"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning" and file.name in warned[0]["reason"]
    assert not [e for e in logs if e["event"] in ("backend_fallback", "backend_refused")]
    window = windows(1, 25, seed=4)[0]
    assert max(abs(a - b) for a, b in zip(second.score_pairs(window), torch_fp32.score_pairs(window))) < 1e-4
    # Whole again: the next start reuses it and says nothing.
    with capture_logs() as logs:
        third = start_engine(model, {**FP32, **env})
    assert (third.backend.name, third.backend.exported) == (backend, False)
    assert not [e for e in logs if e["event"] == "export_damaged"]


def test_a_backend_that_does_not_keep_the_ranking_is_refused_and_says_so(tiny_model_dir, tmp_path):
    # An export of another model (a different seed) where this model's export belongs: a file
    # we did not make is used as it is, so only the parity probe stands between it and a window.
    other = build_tiny_cross_encoder(tmp_path / "other", seed=1)
    ScoringEngine(
        load_cross_encoder(str(other), device="cpu"),
        settings=load_settings({}, precision="fp32"),
        backend=BackendChoice("onnx", onnx_optimization="O1"),
    )
    model = copy_model(tiny_model_dir, tmp_path / "model")
    (model / "onnx").mkdir()
    shutil.copy(other / "onnx" / "model.onnx", model / "onnx" / "model.onnx")

    with pytest.raises(ProviderStartError) as refused:
        local_provider(model, RERANKQ_RERANKER_BACKEND="onnx", RERANKQ_RERANKER_ONNX_OPTIMIZATION="O1")
    assert refused.value.reason == "backend_refused"
    assert "does not keep torch fp32's ranking" in refused.value.detail and "Spearman" in refused.value.detail
    assert refused.value.remedy is not None and refused.value.remedy.field == "backend"

    # auto is not refused: it keeps torch.
    (model / "openvino").mkdir()
    for name in ("openvino_model.xml", "openvino_model.bin"):
        shutil.copy(_openvino_export(other) / name, model / "openvino" / name)
    assert local_provider(model, RERANKQ_RERANKER_BACKEND="auto").engine.backend.name == "torch"


def _openvino_export(model: Path) -> Path:
    ScoringEngine(
        load_cross_encoder(str(model), device="cpu"),
        settings=load_settings({}, precision="fp32"),
        backend=BackendChoice("openvino"),
    )
    return model / "openvino"


def test_static_int8_is_calibrated_on_the_windows_file_and_never_served_below_parity(model_dir, tmp_path):
    calibration = tmp_path / "windows.jsonl"
    calibration.write_text(
        "".join(json.dumps({"query": w[0][0], "documents": [d for _, d in w]}) + "\n" for w in windows(8, 20, seed=5))
    )
    choice = BackendChoice("openvino", quantization="int8", calibration=str(calibration))
    cross_encoder = load_cross_encoder(str(model_dir), device="cpu")
    try:
        engine = ScoringEngine(cross_encoder, settings=load_settings({}, precision="fp32"), backend=choice)
    except BackendRefused as refused:
        # The probe held it to every window: the fixed probe and the two held-out windows.
        assert "int8 at Spearman" in str(refused) and "3 probe windows" in str(refused)
    else:
        assert engine.precision == "int8" and engine.probe_spearman is not None and engine.probe_spearman >= 0.99
    manifest = json.loads((model_dir / "openvino" / "openvino_model_qint8_quantized.xml.rerankq.json").read_text())
    assert manifest["made_from"]["calibration"]  # the export names the windows it was calibrated on

    calibration.write_text('{"query": "q", "documents": ["only one"]}\n')
    with pytest.raises(ProviderStartError) as bad:
        local_provider(
            model_dir,
            RERANKQ_RERANKER_BACKEND="onnx",
            RERANKQ_RERANKER_QUANTIZATION="int8",
            RERANKQ_RERANKER_CALIBRATION=str(calibration),
        )
    assert bad.value.reason == "calibration" and "line 1" in bad.value.detail


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RERANKQ_RERANKER_BACKEND": "tensorrt"}, "RERANKQ_RERANKER_BACKEND"),
        (
            {
                "RERANKQ_RERANKER_PROVIDER": "rrf",
                "RERANKQ_RERANKER_1_PROVIDER": "local",
                "RERANKQ_RERANKER_1_ONNX_OPTIMIZATION": "O9",
            },
            "RERANKQ_RERANKER_1_ONNX_OPTIMIZATION",
        ),
        ({"RERANKQ_RERANKER_BACKEND": "onnx", "RERANKQ_RERANKER_QUANTIZATION": "int8"}, "RERANKQ_RERANKER_CALIBRATION"),
        (
            {"RERANKQ_RERANKER_QUANTIZATION": "int8", "RERANKQ_RERANKER_CALIBRATION": "/w.jsonl"},
            "RERANKQ_RERANKER_QUANTIZATION",
        ),
        ({"RERANKQ_RERANKER_QUANTIZATION": "int4"}, "RERANKQ_RERANKER_QUANTIZATION"),
    ],
)
def test_a_bad_backend_setting_names_its_variable(environ, variable):
    with pytest.raises(ConfigError) as err:
        load_settings(environ)
    assert err.value.variable == variable


def test_backend_settings_are_per_member():
    settings = load_settings({"RERANKQ_RERANKER_BACKEND": "onnx", "RERANKQ_RERANKER_1_PROVIDER": "local"})
    first, second = settings.chain.effective_members()
    assert (first.backend, second.backend) == ("onnx", "auto")


def test_a_worker_on_the_onnx_backend_serves_a_stream(
    start_worker: Callable[..., Any],
    make_client: Callable[..., RerankClient],
    model_dir: Path,
    torch_fp32: ScoringEngine,
) -> None:
    worker = start_worker(env={"RERANKQ_RERANKER_BACKEND": "onnx", "RERANKQ_RERANKER_MODEL": str(model_dir)})
    client = make_client()
    texts = [d for _, d in windows(1, 12, seed=9)[0]]
    query = "payment gateway error after the certificate expired"
    stream = client.open(query, [{"id": f"c{i}", "text": t} for i, t in enumerate(texts)], window_size=12)
    page = pull_until_complete(client, stream, 12)

    assert all(r.decision.served_by == "0:local" for r in page.rows)
    by_id = {r.id: r.decision.score for r in page.rows}
    reference = torch_fp32.score_pairs([(query, t) for t in texts])
    for i, expected in enumerate(reference):
        assert by_id[f"c{i}"] == pytest.approx(expected, abs=1e-4)
    assert "backend=onnx" in worker.log()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx512f", "avx512_bf16"}, "fp32"),  # native bf16 without AMX ran slower than fp32 (README)
        ({"avx512f", "avx512_bf16", "amx_bf16"}, "bf16"),
        ({"avx2"}, "fp32"),
    ],
)
def test_auto_precision_picks_bf16_on_a_cpu_only_where_it_is_faster(monkeypatch, flags, expected):
    from worker.engine import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    assert precision.resolve_precision("auto", "cpu") == expected
    assert precision.exported_precisions(BackendChoice("openvino"), "auto", "cpu")[0] == expected


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_a_causal_lm_reranker_asked_for_an_export_runs_on_torch_and_says_why(tmp_path: Path, backend: str):
    from structlog.testing import capture_logs

    from devservers.tiny_model import build_tiny_causal_reranker

    model = build_tiny_causal_reranker(tmp_path / "causal")
    with capture_logs() as logs:
        provider = local_provider(model, RERANKQ_RERANKER_BACKEND=backend)

    # An export holds a sequence-classification transformer; a causal LM's score comes from
    # LogitScore over its vocabulary logits, which no export here carries.
    assert provider.engine.backend.name == "torch"
    assert '"backend":"torch"' in provider.cache_identity
    unsupported = [e for e in logs if e["event"] == "backend_unsupported"]
    assert unsupported and unsupported[0]["backend"] == backend and "causal" in unsupported[0]["reason"]
    assert not (model / "onnx").exists() and not (model / "openvino").exists()

    query, documents = "payment gateway outage", ["restart the gateway pods", "coffee machine", "tls certificate"]
    expected = provider.engine.cross_encoder.predict([(query, d) for d in documents], show_progress_bar=False)
    scores = provider.score(ScoreRequest(query=query, documents=documents), deadline=float("inf"))
    assert max(abs(a - float(b)) for a, b in zip(scores, expected)) < 1e-4
