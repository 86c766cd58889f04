"""Calibrated scores: maps fitted by ``rerankq calibrate`` through a real worker, applied by
another at decision time, so one ``min_score`` means the same thing on members whose raw
scores do not (a skewed test member and the packaged bi-encoder)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cli_helpers import RERANKQ
from conftest import ROOT

from evaluation.calibration import Pairs, fit_map
from kernel.errors import ConfigError
from kernel.keys import Keys
from kernel.wire import Filtered, Ranked
from producer import RerankClient, load_settings
from worker.chain.cache import pair_digest
from worker.embedded.worker_process import WorkerProcess
from worker.scoring.calibration import (
    MAX_CALIBRATION_BYTES,
    Calibrations,
    calibration_identity,
    interpolate,
    read_file,
)

SKEWED = "tests.calibration_providers:SkewedProvider"
SKEWED_LABEL = f"0:{SKEWED}"
BLEND_WEIGHT = 0.6
EMBEDDING_LABEL = "1:embedding"

# Eight topics: a query and three documents that answer it; every other topic's documents
# are irrelevant to it.
TOPICS = {
    "t1": (
        "how do we restart the payment gateway after a timeout",
        [
            "Restart the payment gateway pods one region at a time after a timeout.",
            "When the payment gateway times out, drain it and restart it.",
            "Payment gateway timeout runbook: restart the service and watch the error rate.",
        ],
    ),
    "t2": (
        "renew the internal TLS certificate before it expires",
        [
            "To renew the internal TLS certificate, request a new one from the internal CA before it expires.",
            "The internal certificate expires yearly; renew it with the certificate tool.",
            "TLS certificate renewal steps for internal services before expiry.",
        ],
    ),
    "t3": (
        "database replica lag is growing on the orders cluster",
        [
            "Replica lag on the orders database cluster: check long transactions on the primary.",
            "Growing replication lag on orders replicas comes from vacuum on the primary.",
            "Orders cluster replica lag alert: what to check and how to reduce it.",
        ],
    ),
    "t4": (
        "kafka consumer group is falling behind on the events topic",
        [
            "A Kafka consumer group falling behind on events: add partitions and consumers.",
            "Consumer lag on the events topic: check the consumer group's rebalances.",
            "When Kafka consumers fall behind, scale the consumer group for the topic.",
        ],
    ),
    "t5": (
        "pods are being killed for running out of memory",
        [
            "Pods killed out of memory: raise the memory limit or fix the leak.",
            "OOMKilled pods mean the container ran out of its memory limit.",
            "Memory limits for pods, and what happens when a pod runs out of memory.",
        ],
    ),
    "t6": (
        "customer emails are landing in the spam folder",
        [
            "Customer emails landing in spam: check SPF, DKIM and the sending reputation.",
            "Our emails go to the spam folder when DKIM signing breaks.",
            "Spam folder complaints from customers: how email deliverability is checked.",
        ],
    ),
    "t7": (
        "the search index needs a full reindex after the schema change",
        [
            "Run a full reindex of the search index after any schema change.",
            "Schema changes to the search index need a full reindex into a new index.",
            "Reindexing search after a schema change: build the new index, then swap the alias.",
        ],
    ),
    "t8": (
        "our cloud bill jumped because of network egress",
        [
            "A cloud bill jump from network egress: find the buckets serving traffic out.",
            "Network egress costs on the cloud bill rose when the CDN cache was bypassed.",
            "Why egress drives the cloud bill, and how to cut network transfer out.",
        ],
    ),
}


def _collection(directory: Path) -> dict[str, Path]:
    documents = {f"{topic}d{i}": text for topic, (_, texts) in TOPICS.items() for i, text in enumerate(texts)}
    files = {
        "qrels": directory / "qrels.txt",
        "run": directory / "run.txt",
        "queries": directory / "queries.tsv",
        "documents": directory / "documents.jsonl",
    }
    files["qrels"].write_text("".join(f"{t} 0 {t}d{i} 2\n" for t in TOPICS for i in range(3)))
    # Each query's run: every document, its own answers spread among the others.
    run_lines = []
    for topic in TOPICS:
        order = sorted(documents, key=lambda d: (d[:2] == topic, d))
        run_lines += [f"{topic} Q0 {d} {r} {100 - r} test\n" for r, d in enumerate(order, start=1)]
    files["run"].write_text("".join(run_lines))
    files["queries"].write_text("".join(f"{t}\t{q}\n" for t, (q, _) in TOPICS.items()))
    files["documents"].write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in documents.items()))
    return files


# -- the map itself -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["isotonic", "platt"])
def test_a_map_fitted_on_a_known_curve_recovers_it(method):
    rng = np.random.default_rng(7)
    scores = rng.uniform(0, 1, 6000)
    truth = 1 / (1 + np.exp(-(10 * scores - 6)))  # a sigmoid (Platt's own family) centred at 0.6
    relevant = rng.uniform(0, 1, scores.size) < truth
    fitted = fit_map(Pairs(scores=scores.tolist(), relevant=relevant.tolist()), label="0:x", method=method)
    grid = np.linspace(0.05, 0.95, 19)
    recovered = np.array([interpolate(fitted.scores, fitted.probabilities, x) for x in grid])
    expected = 1 / (1 + np.exp(-(10 * grid - 6)))
    assert np.max(np.abs(recovered - expected)) < 0.06
    # Monotone, and strictly rising between its ends: a calibrated window keeps the member's order.
    assert all(b > a for a, b in zip(fitted.probabilities, fitted.probabilities[1:]))
    assert fitted.fit.pairs == 6000 and fitted.fit.positives == int(relevant.sum())
    assert fitted.fit.ece < 0.03 and fitted.fit.ece_raw > 0.1


def test_a_bad_calibration_file_names_its_variable(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text(
        json.dumps(
            {
                "format": "rerankq-calibration/1",
                "relevant_grade": 1,
                "unjudged": "irrelevant",
                "members": {
                    "{}": {
                        "label": "0:x",
                        "method": "isotonic",
                        "scores": [0.5, 0.2],
                        "probabilities": [0.1, 0.2],
                        "fit": {"pairs": 1, "positives": 1, "brier": 0, "ece": 0, "ece_raw": 0},
                    }
                },
            }
        )
    )
    with pytest.raises(ConfigError, match=r"RERANKQ_CALIBRATION .*scores must increase"):
        Calibrations.from_settings(load_settings({}, calibration=str(bad)))
    with pytest.raises(ConfigError, match=r"RERANKQ_CALIBRATION_NOPE: names no chain profile"):
        load_settings({"RERANKQ_CALIBRATION_NOPE": str(bad)})


# -- the file itself ----------------------------------------------------------------------


def _not_a_calibration_file(tmp_path: Path, kind: str) -> tuple[str, str]:
    """A path that is no calibration file a worker could read, and what the refusal says."""
    if kind == "fifo":
        path = tmp_path / "calibration.fifo"
        os.mkfifo(path)  # opened for reading, it blocks until a writer comes: none will
        return str(path), "not a regular file"
    if kind == "device":
        return "/dev/zero", "not a regular file"  # read, it never ends
    if kind == "directory":
        return str(tmp_path), "not a regular file"
    if kind == "oversize":
        path = tmp_path / "calibration.json"
        with open(path, "wb") as fh:
            fh.truncate(MAX_CALIBRATION_BYTES + 1)  # sparse: costs no disk
        return str(path), f"larger than {MAX_CALIBRATION_BYTES} bytes"
    path = tmp_path / "calibration.json"
    path.write_text('{"format": "rerankq-calibration/1", "relevant_grade": 1}')
    return str(path), "not a calibration file"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "oversize", "not_json_of_maps"])
def test_rerankq_config_refuses_a_calibration_file_the_worker_would_refuse(tmp_path, kind):
    path, said = _not_a_calibration_file(tmp_path, kind)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "RERANKQ_CALIBRATION": path}
    done = subprocess.run(
        [sys.executable, "-m", "rerankq", "config"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0, done.stdout[-300:]
    assert "RERANKQ_CALIBRATION" in done.stderr and said in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "oversize"])
def test_a_worker_refuses_a_calibration_file_that_is_no_regular_file_of_bounded_size_at_once(base_env, tmp_path, kind):
    path, said = _not_a_calibration_file(tmp_path, kind)
    env = {
        **base_env,
        "RERANKQ_RERANKER_PROVIDER": "tests.delivery_providers:FastProvider",
        "RERANKQ_CALIBRATION": path,
    }
    try:
        done = subprocess.run(
            [str(RERANKQ), "worker", "--device", "cpu"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the worker was still starting 60 s later: it waits on the calibration file")
    assert done.returncode != 0
    assert "RERANKQ_CALIBRATION" in done.stderr + done.stdout and said in done.stderr + done.stdout


# -- through the queue --------------------------------------------------------------------


def _env(base_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {
        **base_env,
        "RERANKQ_RERANKER_PROVIDER": SKEWED,
        "RERANKQ_RERANKER_1_PROVIDER": "embedding",
        "RERANKQ_PRECISION": "fp32",
        "RERANKQ_CHAIN_EVAL0": "0",
        "RERANKQ_CHAIN_EVAL1": "1",
        "RERANKQ_CHAIN_FLAKY": "0,1",
        "RERANKQ_CHAIN_RENAMED": "0",
        "RERANKQ_CHAIN_BLENDED": "1",
        **extra,
    }
    env.pop("RERANKQ_RERANKER_MODEL", None)
    env.pop("RERANKQ_RERANKER_BACKEND", None)
    return env


@pytest.fixture(scope="module")
def calibrated(redis_server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """Maps fitted by ``rerankq calibrate`` through one worker, then a second worker serving
    with them (and, for the ``renamed`` profile, with a file fitted for another model)."""
    import uuid

    directory = tmp_path_factory.mktemp("calibration")
    namespace = "t" + uuid.uuid4().hex[:10]
    base = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    base.update(
        {
            "RERANKQ_REDIS_URL": redis_server.url,
            "RERANKQ_NAMESPACE": namespace,
            "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
            "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
            "RERANKQ_ANY_QUEUE": f"{namespace}.any",
            "RERANKQ_TORCH_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT),
        }
    )
    files = _collection(directory)
    out = directory / "calibration.json"
    fitting = WorkerProcess.rerankq(_env(base), directory / "fitting.log", "--device", "cpu", cwd=ROOT).start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rerankq",
                "calibrate",
                *(f"--{k}={v}" for k, v in files.items()),
                "--out",
                str(out),
            ],
            env=_env(base),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        fitting.stop()
    assert done.returncode == 0, done.stdout + done.stderr + fitting.log()[-4000:]
    # The same file, as if fitted for another model behind member 0's label.
    renamed = directory / "renamed.json"
    renamed.write_text(out.read_text().replace("skewed-1", "skewed-0"))
    # The same maps with a first-stage weight of 0.6 for every member (the ``blended`` profile).
    blended = directory / "blended.json"
    content = json.loads(out.read_text())
    for member in content["members"].values():
        member["first_stage_weight"] = BLEND_WEIGHT
    blended.write_text(json.dumps(content))
    serving_env = _env(
        base,
        RERANKQ_CALIBRATION=str(out),
        RERANKQ_CALIBRATION_RENAMED=str(renamed),
        RERANKQ_CALIBRATION_BLENDED=str(blended),
    )
    serving = WorkerProcess.rerankq(serving_env, directory / "serving.log", "--device", "cpu", cwd=ROOT).start()
    client = RerankClient(load_settings(serving_env))
    try:
        candidates = [
            {"id": d["id"], "text": d["text"]} for d in map(json.loads, files["documents"].read_text().splitlines())
        ]
        yield {
            "file": out,
            "stdout": done.stdout,
            "stderr": done.stderr,
            "client": client,
            "worker": serving,
            "namespace": namespace,
            "candidates": candidates,
            "files": files,
            "env": serving_env,
        }
    finally:
        client.close()
        serving.stop()


def test_calibrate_writes_one_map_per_member_keyed_by_its_identity(calibrated):
    calibration = read_file(str(calibrated["file"]), variable="test")
    by_label = {m.label: (identity, m) for identity, m in calibration.members.items()}
    assert set(by_label) == {SKEWED_LABEL, EMBEDDING_LABEL}
    skewed_identity = by_label[SKEWED_LABEL][0]
    assert json.loads(skewed_identity) == {"provider": "skewed", "model": "skewed-1", "scale": "probability"}
    embedding_identity = json.loads(by_label[EMBEDDING_LABEL][0])
    assert embedding_identity["provider"] == "embedding" and embedding_identity["scale"] == "cosine"
    assert "precision" not in embedding_identity and "device" not in embedding_identity
    for _, member in by_label.values():
        # 8 queries x 24 documents, 3 relevant each; too few pairs for isotonic steps.
        assert member.fit.pairs == 192 and member.fit.positives == 24 and member.method == "platt"
        assert member.fit.ece < member.fit.ece_raw
    assert SKEWED_LABEL in calibrated["stdout"] and "ECE raw" in calibrated["stdout"]
    # It says how to use the file it wrote.
    assert f"RERANKQ_CALIBRATION={calibrated['file']} rerankq worker" in calibrated["stdout"]
    # This run puts every query's answers last: the bi-encoder beats it held out, and the
    # weight fitted beside its map gives the first stage no part in the order.
    _, embedding = by_label[EMBEDDING_LABEL]
    assert embedding.blend_fit is not None and embedding.blend_fit.queries == 8
    assert embedding.blend_fit.member > embedding.blend_fit.first_stage
    assert embedding.first_stage_weight == 0.0
    assert f"{EMBEDDING_LABEL}: first_stage_weight 0 (held out over 8 queries" in calibrated["stderr"]


def _open(
    calibrated: dict[str, Any],
    topic: str,
    *,
    chain: str,
    min_score: float | None = 0.5,
    window_size: int = 24,
    query: str | None = None,
) -> str:
    return calibrated["client"].open(
        query or TOPICS[topic][0], calibrated["candidates"], window_size=window_size, chain=chain, min_score=min_score
    )


def _decisions(calibrated: dict[str, Any], stream: str) -> list[Ranked | Filtered]:
    client = calibrated["client"]
    assert client.pull(stream, 0, 200, timeout=60).complete
    results = client.store.snapshot(stream).results
    return [d for r in results.values() for d in r.decisions if isinstance(d, (Ranked, Filtered))]


def test_a_fitted_first_stage_weight_blends_the_fused_order_in_and_a_stream_option_overrides_it(calibrated):
    from worker.scoring.blend import first_stage_score

    client = calibrated["client"]
    n = len(calibrated["candidates"])

    def rows(**options: Any) -> list[Ranked | Filtered]:
        stream = client.open(TOPICS["t3"][0], calibrated["candidates"], window_size=n, chain="blended", **options)
        return _decisions(calibrated, stream)

    blended = rows()
    assert len(blended) == n
    for row in blended:
        assert row.calibrated and row.first_stage_weight == BLEND_WEIGHT
        assert row.first_stage == pytest.approx(first_stage_score(row.index, n))
        # The blend orders; score keeps the member's calibrated relevance.
        assert row.final_score == pytest.approx((1 - BLEND_WEIGHT) * row.score + BLEND_WEIGHT * row.first_stage)
    assert [r.final_score for r in blended] == sorted((r.final_score for r in blended), reverse=True)
    alone = rows(first_stage_weight=0.0)
    assert all(r.first_stage is None and r.final_score == r.score for r in alone)
    assert [r.id for r in alone] != [r.id for r in blended]
    # All first stage: the fused order, whatever the member scored.
    assert [r.index for r in rows(first_stage_weight=1.0)] == list(range(n))


def test_a_blend_reads_the_candidates_fusion_scores_and_rows_keep_score_raw_score_and_first_stage_apart(calibrated):
    from worker.scoring.blend import first_stage_score, first_stage_scores

    client = calibrated["client"]
    n = len(calibrated["candidates"])
    # BM25-like: a few strong scores, then a long tail; in fusion order.
    fusion = [40.0 * 0.75**i + 1.0 for i in range(n)]
    candidates = [{**c, "fusion_score": f} for c, f in zip(calibrated["candidates"], fusion)]

    def rows(window_size: int, **options: Any) -> list[Ranked | Filtered]:
        stream = client.open(
            TOPICS["t3"][0], candidates, window_size=window_size, chain="blended", allow_shallow=True, **options
        )
        return _decisions(calibrated, stream)

    # Two windows: each reads its candidates' fusion scores on its own places' range.
    half = n // 2
    expected = first_stage_scores(fusion[:half], indexes=range(half), n_candidates=n) + first_stage_scores(
        fusion[half:], indexes=range(half, n), n_candidates=n
    )
    blended = rows(half, min_score=0.2)
    assert len(blended) == n
    for row in blended:
        assert row.calibrated and row.first_stage_weight == BLEND_WEIGHT
        assert row.first_stage == pytest.approx(expected[row.index])
        # The member's calibrated relevance, its own score and the blend, each kept apart.
        assert row.raw_score is not None and row.score != row.raw_score
        assert row.final_score == pytest.approx((1 - BLEND_WEIGHT) * row.score + BLEND_WEIGHT * row.first_stage)
        # min_score reads the calibrated relevance, never the blend.
        assert isinstance(row, Filtered) == (row.score < 0.2)
    # The fusion scores were read: not the evenly spaced places.
    assert max(abs(r.first_stage - first_stage_score(r.index, n)) for r in blended) > 0.1
    assert {round(r.first_stage, 9) for r in blended if r.index in (0, half)} == {
        round(first_stage_score(0, n), 9),
        round(first_stage_score(half, n), 9),
    }
    assert any(isinstance(r, Filtered) for r in blended) and any(isinstance(r, Ranked) for r in blended)


def test_min_score_on_calibrated_scores_filters_the_same_share_on_members_with_different_curves(calibrated):
    filtered, raw_under, kept = {}, {}, {}
    for profile in ("eval0", "eval1"):
        irrelevant, relevant = [], []
        for topic in ("t1", "t5"):
            for d in _decisions(calibrated, _open(calibrated, topic, chain=profile)):
                assert d.calibrated and d.raw_score is not None
                (relevant if d.id.startswith(topic) else irrelevant).append(d)
        filtered[profile] = sum(isinstance(d, Filtered) for d in irrelevant) / len(irrelevant)
        raw_under[profile] = sum(d.raw_score < 0.5 for d in irrelevant) / len(irrelevant)
        kept[profile] = sum(isinstance(d, Ranked) for d in relevant)
    # Raw, 0.5 means nothing alike: the skewed member keeps every unrelated document, the
    # bi-encoder almost none.
    assert raw_under["eval0"] == 0.0 and raw_under["eval1"] > 0.9
    # Calibrated, it filters the same share on both, and keeps answers on both.
    assert filtered["eval0"] == pytest.approx(filtered["eval1"], abs=0.05) and filtered["eval0"] > 0.9, filtered
    assert kept["eval0"] > 0 and kept["eval1"] > 0, kept


def test_a_failover_mid_stream_keeps_the_threshold_consistent(calibrated):
    client = calibrated["client"]
    # Windows of 8: member 0 serves the even ones, the embedding member the odd ones (a query
    # of its own, so no pair is in the cache and member 0 is asked, and fails, for window 1).
    stream = _open(
        calibrated, "t3", chain="flaky", window_size=8, query="replica lag keeps growing on the orders database cluster"
    )
    page = client.pull(stream, 0, 200, timeout=60)
    assert page.complete
    results = client.store.snapshot(stream).results
    served = {w: r.served_by for w, r in results.items()}
    assert set(served.values()) == {SKEWED_LABEL, EMBEDDING_LABEL}
    for by in (SKEWED_LABEL, EMBEDDING_LABEL):
        decisions = [
            d for r in results.values() if r.served_by == by for d in r.decisions if isinstance(d, (Ranked, Filtered))
        ]
        irrelevant = [d for d in decisions if not d.id.startswith("t3")]
        assert all(d.calibrated for d in decisions)
        # Each member's windows drop the unrelated documents under the one threshold.
        assert sum(isinstance(d, Filtered) for d in irrelevant) / len(irrelevant) > 0.9, by


def test_a_member_whose_identity_changed_is_served_uncalibrated_and_said_once(calibrated):
    for topic in ("t2", "t4"):
        decisions = _decisions(calibrated, _open(calibrated, topic, chain="renamed", min_score=None))
        assert not any(d.calibrated for d in decisions) and all(d.raw_score is None for d in decisions)
        assert min(d.score for d in decisions) >= 0.6  # the member's own skewed scale
    lines = [line for line in calibrated["worker"].log().splitlines() if "member_uncalibrated" in line]
    assert len(lines) == 1, lines
    assert "identity_changed" in lines[0] and "skewed-0" in lines[0] and "renamed" in lines[0]


def test_the_pair_cache_keeps_the_members_raw_scores(calibrated):
    client = calibrated["client"]
    decisions = _decisions(calibrated, _open(calibrated, "t6", chain="eval0", min_score=None))
    identity = json.dumps(
        {"model": "skewed-1", "provider": "skewed", "scale": "probability"}, sort_keys=True, separators=(",", ":")
    )
    keys = Keys(calibrated["namespace"])
    query = TOPICS["t6"][0]
    for d in decisions[:5]:
        raw = client.store.client.get(keys.pair_score(pair_digest(identity, query, d.document)))
        assert raw is not None and struct.unpack("<d", raw)[0] == d.raw_score != d.score
    assert calibration_identity(identity) == identity


def test_eval_reports_each_members_ece_raw_and_calibrated_with_a_reliability_plot(calibrated, tmp_path):
    env = {**calibrated["env"], "RERANKQ_CALIBRATION": str(calibrated["file"])}
    plots = tmp_path / "plots"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rerankq",
            "eval",
            *(f"--{k}={v}" for k, v in calibrated["files"].items()),
            "--depths=24",
            "--json",
            str(tmp_path / "eval.json"),
            "--plots",
            str(plots),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    for member in report["members"]:
        calibration = member["calibration"]
        assert calibration["calibrated"] and calibration["pairs"] == 192 and calibration["positives"] == 24
        assert calibration["served"]["ece"] < calibration["raw"]["ece"], member["label"]
        assert sum(b["pairs"] for b in calibration["raw"]["bins"]) == 192
    skewed = next(m for m in report["members"] if m["label"] == SKEWED_LABEL)
    assert skewed["calibration"]["raw"]["ece"] > 0.4  # unrelated documents at 0.6, relevant none of the time
    assert "ECE calibrated" in done.stdout
    assert (plots / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_gateway_answers_calibrated_scores(calibrated, tmp_path):
    from gateway_helpers import GatewayProcess

    gateway = GatewayProcess(calibrated["env"], tmp_path / "gateway.log", "--insecure-no-auth").start()
    query, answers = TOPICS["t7"]
    texts = [c["text"] for c in calibrated["candidates"]]
    try:
        answered = httpx.post(
            gateway.url + "/v2/rerank", json={"model": "m", "query": query, "documents": texts}, timeout=60
        )
    finally:
        gateway.stop()
    assert answered.status_code == 200, answered.text
    results = answered.json()["results"]
    by_text = {texts[r["index"]]: r["relevance_score"] for r in results}
    # Member 0 (the default chain's first) scores every unrelated text 0.6 or more; calibrated,
    # they read as nearly never relevant, and the answers as likely.
    assert max(score for text, score in by_text.items() if text not in answers) < 0.2
    assert min(by_text[text] for text in answers) > 0.5
    assert {texts[r["index"]] for r in results[:3]} == set(answers)
