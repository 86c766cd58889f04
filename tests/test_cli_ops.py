"""``rerankq inspect``, ``status`` and ``pull`` against states the tests set up, in ``--json``."""

from __future__ import annotations

import json
import time

import pytest
from cli_helpers import fast_env, poisoned_modules, rerankq
from delivery_helpers import pull_until_complete, wait_for
from rerank_servers import closed_port_url

from kernel.errors import ValidationError


@pytest.mark.slow
def test_inspect_reports_queues_workers_breakers_and_counters(
    start_worker, base_env, make_client, tiny_model_dir, tmp_path
):
    env = {
        **base_env,
        # member 0: the model in process; members 1 (a dead remote) and 2 (fusion order) for profile "remote"
        "RERANKQ_RERANKER_1_PROVIDER": "tei",
        "RERANKQ_RERANKER_1_URL": closed_port_url(),
        "RERANKQ_RERANKER_2_PROVIDER": "rrf",
        "RERANKQ_CHAIN_REMOTE": "1,2",
        "RERANKQ_BREAKER_FAILURES": "1",
        "RERANKQ_BREAKER_COOLDOWN_S": "600",
    }
    start_worker(env)
    client = make_client(env)
    served = client.open("q", [{"id": f"c{i}", "text": f"doc {i}"} for i in range(4)], chain="remote")
    assert pull_until_complete(client, served, 4).rows[0].served_by == "2:rrf"
    local = client.open("q", [{"id": f"c{i}", "text": f"doc {i}"} for i in range(4)])
    assert pull_until_complete(client, local, 4).rows[0].served_by == "0:local"
    # A backlog on the GPU queue, which no worker serves: two interactive windows, three batch ones.
    for i in range(5):
        client.open(f"gpu {i}", [{"id": "a", "text": "x"}], device="gpu", lane="batch" if i < 3 else "interactive")
    time.sleep(0.3)

    done = rerankq(["inspect", "--json"], env, no_torch=poisoned_modules(tmp_path / "poison"))

    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    queues = {(q["device"], q["lane"]): q for q in view["queues"]}
    assert queues["gpu", "interactive"]["waiting"] == 2 and queues["gpu", "batch"]["waiting"] == 3
    assert queues["gpu", "batch"]["oldest_age_s"] >= 0.3
    assert queues["cpu", "interactive"]["waiting"] == 0 and queues["cpu", "batch"]["oldest_age_s"] is None
    assert queues["gpu", "batch"]["queue"] == env["RERANKQ_GPU_QUEUE"]
    [worker] = view["workers"]
    assert worker["kind"] == "cpu" and worker["pool"] == "prefork" and worker["concurrency"] == 1
    assert sorted(worker["queues"]) == sorted([env["RERANKQ_CPU_QUEUE"], env["RERANKQ_ANY_QUEUE"]])
    assert worker["processed"] >= 2
    [process] = worker["processes"]
    members = {m["label"]: m for m in process["members"]}
    assert members["0:local"]["model"] == str(tiny_model_dir) and members["0:local"]["precision"] == "fp32"
    assert members["1:tei"]["breaker"] and members["2:rrf"]["breaker"] is None
    [breaker] = view["breakers"]
    assert breaker["member"] == "1:tei" and breaker["state"] == "open" and breaker["failures"] == 1
    assert breaker["open_for_s"] > 500
    counters = view["counters"]
    assert counters["windows_committed"] == 2 and counters["failovers"] == 1
    assert counters["all"]["failovers:1:tei"] == 1 and counters["pair_cache_hit_rate"] == 0.0

    table = rerankq(["inspect"], env)
    assert table.returncode == 0 and "workers alive: 1 cpu, 0 gpu" in table.stdout
    assert "1:tei" in table.stdout and "open" in table.stdout


def test_inspect_lists_only_the_workers_of_its_own_namespace(start_worker, base_env):
    # Celery's remote control reaches every worker on the broker: a second deployment (its own
    # namespace and queues) on the same Redis must not be counted as this one's.
    mine = fast_env(base_env)
    start_worker(mine)
    other_namespace = base_env["RERANKQ_NAMESPACE"] + "x"
    start_worker(
        fast_env(
            base_env,
            RERANKQ_NAMESPACE=other_namespace,
            **{f"RERANKQ_{kind}_QUEUE": f"{other_namespace}.{kind.lower()}" for kind in ("CPU", "GPU", "ANY")},
        )
    )

    # The broadcast waits its whole timeout for answers: 5 s lets a worker on a loaded host answer.
    done = rerankq(["inspect", "--json", "--timeout", "5"], mine)

    assert done.returncode == 0, done.stderr
    [worker] = json.loads(done.stdout)["workers"]
    assert sorted(worker["queues"]) == sorted([mine["RERANKQ_CPU_QUEUE"], mine["RERANKQ_ANY_QUEUE"]])


def test_status_and_pull_show_each_window_state(start_worker, base_env, make_client, tmp_path):
    env = fast_env(base_env)
    start_worker(env)
    # A profile where streams are opened that the worker lacks: its window fails there.
    client = make_client({"RERANKQ_CHAIN_NOPE": "0"})
    stream = client.open(
        "payment errors", [{"id": f"c{i}", "text": f"payment error {i}"} for i in range(12)], window_size=5
    )
    assert len(client.pull(stream, 0, 5, timeout=30).rows) == 5
    client.store.admit(stream, 2, enqueue_grace_s=600)  # window 1 admitted, never sent: it stays admitted
    failed = client.open("q", [{"id": f"c{i}", "text": f"doc {i}"} for i in range(3)], chain="nope")
    wait_for(lambda: client.status(failed).windows[0].state == "committed", 20, "the failed window")
    poison = poisoned_modules(tmp_path / "poison")

    shown = rerankq(["status", stream, "--json"], env, no_torch=poison)
    assert shown.returncode == 0, shown.stderr
    windows = json.loads(shown.stdout)["windows"]
    assert [w["state"] for w in windows] == ["committed", "admitted", "not_admitted"]
    assert windows[0]["served_by"] == "0:tests.delivery_providers:FastProvider" and windows[0]["ranked"] == 5
    assert windows[0]["attempts"] == 1 and windows[1]["attempts"] == 0

    [window] = json.loads(rerankq(["status", failed, "--json"], env).stdout)["windows"]
    assert window["state"] == "committed" and window["failed"] == 3 and "RERANKQ_CHAIN_NOPE" in window["reason"]

    page = json.loads(rerankq(["pull", stream, "--limit", "3", "--json"], env, no_torch=poison).stdout)
    assert [r["rank"] for r in page["rows"]] == [1, 2, 3] and page["total"] == 5 and not page["complete"]
    assert {r["kind"] for r in page["rows"]} == {"ranked"}
    rows = json.loads(rerankq(["pull", failed, "--json"], env).stdout)["rows"]
    assert [r["id"] for r in rows] == ["c0", "c1", "c2"]  # fusion order
    assert all(r["kind"] == "failed" and "RERANKQ_CHAIN_NOPE" in r["reason"] for r in rows)

    table = rerankq(["status", failed], env).stdout
    assert "failed" in table and "RERANKQ_CHAIN_NOPE" in table
    text = rerankq(["pull", stream, "--limit", "2"], env).stdout
    assert (
        "rank    score    final  decision" in text
        and len([ln for ln in text.splitlines() if ln.strip()[:1].isdigit()]) == 2
    )
    # Cancelled: the uncommitted windows commit as cancelled, and the table says so, with how many.
    client.cancel(stream)
    windows = json.loads(rerankq(["status", stream, "--json"], env).stdout)["windows"]
    assert [w["cancelled"] for w in windows] == [0, 5, 2]
    table = rerankq(["status", stream], {**env, "COLUMNS": "200"}).stdout
    rows = {span: next(ln for ln in table.splitlines() if span in ln) for span in ("[5, 10)", "[10, 12)")}
    assert all("cancelled" in row for row in rows.values()), table
    assert " 5 " in rows["[5, 10)"] and " 2 " in rows["[10, 12)"]


ESCAPES = "\x1b]0;PWNED\x07\x1b[2J"


def test_a_candidate_id_with_terminal_escapes_is_refused_at_open(make_client):
    client = make_client()
    with pytest.raises(ValidationError) as refused:
        client.open("q", [{"id": "ok", "text": "a"}, {"id": f"id{ESCAPES}", "text": "b"}], allow_shallow=True)
    assert refused.value.field == "candidates[1].id" and "U+001B" in refused.value.message


def test_pull_prints_a_documents_control_characters_escaped(start_worker, base_env, make_client):
    """A document may hold control characters (a coloured log line is a document); the
    terminal that ``rerankq pull`` prints to never receives them raw."""
    env = fast_env(base_env)
    start_worker(env)
    client = make_client()
    stream = client.open("payment errors", [{"id": "c0", "text": f"payment error {ESCAPES} \u202eevil"}])
    assert client.pull(stream, 0, 1, timeout=30).rows[0].decision.document.endswith("\u202eevil")  # kept as sent
    text = rerankq(["pull", stream], env).stdout
    assert "PWNED" in text
    assert not any(ch in text for ch in "\x1b\x07\u202e"), repr(text)
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in text and "\\u202e" in text
