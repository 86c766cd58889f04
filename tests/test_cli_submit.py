"""``rerankq submit`` end to end: the script run as a subprocess against the private Redis and
real workers; a loopback rerank server counts provider calls where that is the point."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import (
    RERANKQ,
    expected_order,
    fast_env,
    make_jobs,
    poisoned_modules,
    read_jsonl,
    rerankq,
    write_jsonl,
)
from delivery_helpers import wait_for

from kernel.store import Store, connect
from rerankq.submit.output import Output, OutputError
from rerankq.submit.runner import idempotency_key


def test_jsonl_batch_end_to_end_in_order_without_torch(start_worker, base_env, tmp_path):
    env = fast_env(base_env)
    start_worker(env)
    jobs = make_jobs(9, candidates=30)
    jobs[4]["window_size"] = 10  # a job's own open() option: three windows, each in its own order
    jobs[7]["candidates"] = jobs[7]["candidates"][:26]
    source = write_jsonl(tmp_path / "jobs.jsonl", jobs)
    out = tmp_path / "out.jsonl"

    done = rerankq(
        ["submit", str(source), "--out", str(out), "--max-in-flight", "3", "--json"],
        env,
        no_torch=poisoned_modules(tmp_path / "poison"),
    )

    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["jobs"] == {
        "total": 9,
        "done": 9,
        "resumed": 0,
        "reopened": 0,
        "failed": 0,
        "skipped": 0,
        "in_flight": 0,
        "per_s": summary["jobs"]["per_s"],
    }
    lines = read_jsonl(out)
    assert sorted(line["id"] for line in lines) == sorted(j["id"] for j in jobs)
    for line in lines:
        job = next(j for j in jobs if j["id"] == line["id"])
        depth = 40  # no --keep, no --depth: the over-fetch rule for keep 10
        texts = {c["id"]: c["text"] for c in job["candidates"][:depth]}
        assert [row["id"] for row in line["rows"]] == expected_order(job["query"], texts, job.get("window_size", 25))
        assert [row["rank"] for row in line["rows"]] == list(range(1, len(texts) + 1))
        row = line["rows"][0]
        assert set(row) == {
            "rank",
            "window",
            "stage",
            "kind",
            "id",
            "index",
            "score",
            "final_score",
            "served_by",
            "reason",
            "document",
            "passage",
        }
        assert row["passage"] is None  # an excerpt stream's rows say no passage
        assert row["stage"] == 1  # a stream of one stage
        assert row["kind"] == "ranked" and row["reason"] is None and row["served_by"].startswith("0:")
        assert line["stream"] == "k_" + idempotency_key(summary["run_id"], line["id"])


def write_trec(tmp_path: Path, n_queries: int, n_docs: int) -> tuple[Path, Path, Path, dict[str, list[str]]]:
    run, ranked = [], {}
    for q in range(1, n_queries + 1):
        docs = [f"D{(q * 7 + i * 3) % 97}" for i in range(n_docs)]
        ranked[str(q)] = docs
        # The run lists lines out of score order; trec_eval (and submit) order them by score.
        for rank, doc in reversed(list(enumerate(docs, 1))):
            run.append(f"{q} Q0 {doc} {rank} {50 - rank * 0.25:.2f} bm25")
    (tmp_path / "run.trec").write_text("\n".join(run) + "\n")
    (tmp_path / "topics.tsv").write_text("".join(f"{q}\tincident number {q} in checkout\n" for q in ranked))
    (tmp_path / "corpus.jsonl").write_text(
        "".join(
            json.dumps({"_id": f"D{d}", "title": f"Title {d}", "text": f"body of document {d}", "extra": [1]}) + "\n"
            for d in range(97)
        )
    )
    return tmp_path / "run.trec", tmp_path / "topics.tsv", tmp_path / "corpus.jsonl", ranked


def test_trec_batch_end_to_end(start_worker, base_env, tmp_path):
    env = fast_env(base_env)
    start_worker(env)
    run, topics, corpus, ranked = write_trec(tmp_path, 5, 40)
    out = tmp_path / "reranked.trec"

    done = rerankq(
        [
            "submit",
            str(run),
            "--queries",
            str(topics),
            "--docs",
            str(corpus),
            "--out",
            str(out),
            "--format",
            "trec",
            "--depth",
            "30",
            "--window-size",
            "15",
            "--tag",
            "rq",
        ],
        env,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in out.read_text().splitlines()]
    by_query: dict[str, list[list[str]]] = {}
    for parts in lines:
        assert len(parts) == 6 and parts[1] == "Q0" and parts[5] == "rq"
        by_query.setdefault(parts[0], []).append(parts)
    assert sorted(by_query) == sorted(ranked)
    for qid, rows in by_query.items():
        top = ranked[qid][:30]  # the run's top 30 by score
        # A document is scored as it reads: "Title: body" (the title is its context).
        texts = {d: f"Title {d[1:]}: body of document {d[1:]}" for d in top}
        assert [r[2] for r in rows] == expected_order(f"incident number {qid} in checkout", texts, 15)
        assert [int(r[3]) for r in rows] == list(range(1, 31))
        scores = [float(r[4]) for r in rows]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == 30  # trec_eval keeps this order


def test_interrupted_run_resumes_without_scoring_twice(start_worker, base_env, server, tmp_path):
    tei = server("tei")
    tei.mode, tei.hang_s = "hang", 0.25  # each window takes a quarter second
    env = {
        **base_env,
        "RERANKQ_RERANKER_PROVIDER": "tei",
        "RERANKQ_RERANKER_URL": tei.url,
        "RERANKQ_RERANKER_MODEL": "",
        "RERANKQ_PAIR_CACHE": "false",
    }
    start_worker(env)
    jobs = make_jobs(14, candidates=25)
    source = write_jsonl(tmp_path / "jobs.jsonl", jobs)
    out = tmp_path / "out.jsonl"
    args = ["submit", str(source), "--out", str(out), "--max-in-flight", "3", "--progress-every", "0.2"]

    first = subprocess.Popen([str(RERANKQ), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: out.exists() and len(out.read_text().splitlines()) >= 5, 60, "five jobs written")
    first.send_signal(signal.SIGINT)
    stdout, stderr = first.communicate(timeout=30)

    assert first.returncode == 130, stdout + stderr
    assert "progress: jobs" in stdout  # plain lines: stdout is not a terminal
    assert f"Resume with:\n  rerankq {' '.join(args)}" in stderr
    written = len(read_jsonl(out))
    assert 5 <= written < 14
    with open(out, "a") as fh:  # and a kill -9 in the middle of a write
        fh.write('{"id": "job13", "stream": "k_rq')
    again = rerankq(args, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{written} were there from an earlier run" in again.stdout
    ids = Counter(line["id"] for line in read_jsonl(out))
    assert ids == Counter({job["id"]: 1 for job in jobs})  # every job once, no torn line
    # One provider call per window over both runs: nothing opened twice, nothing scored twice.
    assert tei.count == 14


def test_bad_lines_stop_or_are_skipped_and_nothing_is_half_written(start_worker, base_env, raw_redis, tmp_path):
    env = fast_env(base_env)
    start_worker(env)
    jobs = make_jobs(6, candidates=25)
    del jobs[2]["candidates"][1]["id"]  # line 3: a candidate without an id
    source = write_jsonl(tmp_path / "jobs.jsonl", jobs, raw_lines={4: '{"id": "broken", "query": '})  # line 5

    stopped = rerankq(["submit", str(source), "--out", str(tmp_path / "stop.jsonl"), "--json"], env)
    assert stopped.returncode == 1
    summary = json.loads(stopped.stdout)
    assert summary["bad_lines"] == [
        {"file": str(source), "line": 3, "field": "candidates[1].id", "message": summary["bad_lines"][0]["message"]}
    ]
    assert "missing required field" in summary["bad_lines"][0]["message"]
    # The jobs before it are written; nothing past the next bad line was opened (job3 may have
    # been opening alongside job2 when job2 was refused).
    assert {"job0", "job1"} <= {line["id"] for line in read_jsonl(tmp_path / "stop.jsonl")} <= {"job0", "job1", "job3"}
    assert "--on-error skip" in rerankq(["submit", str(source), "--out", str(tmp_path / "stop2.jsonl")], env).stderr

    skipped = rerankq(["submit", str(source), "--out", str(tmp_path / "skip.jsonl"), "--on-error", "skip"], env)
    assert skipped.returncode == 1  # some input was not reranked
    assert f"skipped {source}:3: candidates[1].id:" in skipped.stdout
    assert f"skipped {source}:5: line: not a JSON object" in skipped.stdout
    assert sorted(line["id"] for line in read_jsonl(tmp_path / "skip.jsonl")) == [
        "job0",
        "job1",
        "job3",
        "job4",
        "job5",
    ]
    # Nothing of the bad job reached Redis.
    store = Store(connect(env["RERANKQ_REDIS_URL"]), env["RERANKQ_NAMESPACE"])
    bad_stream = "k_" + idempotency_key(summary["run_id"], "job2")
    assert not any(raw_redis.exists(k) for k in store.keys.stream(bad_stream).own())


@pytest.mark.parametrize("depth", [200, 1500, 100_000])
def test_a_deeply_nested_line_is_a_bad_line_naming_its_field_at_any_depth(start_worker, base_env, tmp_path, depth):
    env = fast_env(base_env)
    start_worker(env)
    deep = '{"m": ' * depth + "1" + "}" * depth
    line = '{"id": "deep", "query": "q", "candidates": [{"id": "a", "text": "t", "metadata": ' + deep + "}]}"
    source = write_jsonl(tmp_path / "jobs.jsonl", make_jobs(2), raw_lines={1: line})  # line 2
    skipped = rerankq(["submit", str(source), "--out", str(tmp_path / "skip.jsonl"), "--on-error", "skip"], env)
    assert "Traceback" not in skipped.stderr and "RecursionError" not in skipped.stderr, skipped.stderr[-2000:]
    assert skipped.returncode == 1, skipped.stderr  # some input was not reranked
    assert f"skipped {source}:2: candidates[0].metadata:" in skipped.stdout, skipped.stdout
    assert sorted(line["id"] for line in read_jsonl(tmp_path / "skip.jsonl")) == ["job0", "job1"]
    stopped = rerankq(["submit", str(source), "--out", str(tmp_path / "stop.jsonl"), "--json"], env)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr, stopped.stderr[-2000:]
    [bad] = json.loads(stopped.stdout)["bad_lines"]
    assert bad["line"] == 2 and bad["field"] == "candidates[0].metadata" and "nested" in bad["message"]


def test_usage_errors_exit_2_and_help_shows_an_example(base_env, tmp_path):
    source = write_jsonl(tmp_path / "jobs.jsonl", make_jobs(1))
    bad_boost = rerankq(
        ["submit", str(source), "--out", str(tmp_path / "o"), "--boost", "recency_curve=zigzag"], base_env
    )
    assert bad_boost.returncode == 2 and "--boost" in bad_boost.stderr
    missing = rerankq(["submit", str(source)], base_env)
    assert missing.returncode == 2 and "--out" in missing.stderr
    for command in ("submit", "status", "pull", "inspect", "worker", "demo"):
        shown = rerankq([command, "--help"], base_env)
        assert shown.returncode == 0 and "Example" in shown.stdout, command
    gone = rerankq(["status", "s_" + "0" * 32], base_env)
    assert gone.returncode == 1 and "does not exist" in gone.stderr


def test_a_resumed_output_keeps_whole_jobs_only(tmp_path):
    jsonl = tmp_path / "out.jsonl"
    a, b = (f'{{"id": "{job}", "stream": "s_1", "rows": []}}\n' for job in "ab")
    jsonl.write_text(a + b + '{"id": "c", "ro')
    assert list(Output(jsonl, "jsonl").resume()) == ["a", "b"]
    assert jsonl.read_text() == a + b

    trec = tmp_path / "out.trec"
    whole = "1 Q0 d1 1 2 rq\n1 Q0 d2 2 1 rq\n2 Q0 d5 1 3 rq\n"
    trec.write_text(whole + "2 Q0 d6 2 2 rq\n3 Q0 d")
    # The last query may lack rows (the format has no count): it is cut and written again.
    assert list(Output(trec, "trec", tag="rq").resume()) == ["1"]
    assert trec.read_text() == "1 Q0 d1 1 2 rq\n1 Q0 d2 2 1 rq\n"

    foreign = tmp_path / "notes.txt"
    foreign.write_text("my notes\n")
    with pytest.raises(OutputError):
        list(Output(foreign, "jsonl").resume())
    assert foreign.read_text() == "my notes\n"  # a file this command did not write is left alone


UNRELATED = {
    "notes without a trailing newline": "my notes, never ended with a newline",
    "one word": "hello",
    "a JSON object": '{"a": 1}',
    "jobs (the input format)": '{"id": "job0", "query": "q", "candidates": []}\n{"id": "job1", "query": "q"',
    "another system's TREC run": "1 Q0 d1 1 12.5 bm25\n1 Q0 d2 2 11.0 bm25\n",
    "a TREC run cut short": "1 Q0 d1 1 2 rq\n1 Q0 d2 2 1 bm",
}


@pytest.mark.parametrize("fmt", ["jsonl", "trec"])
@pytest.mark.parametrize("what", sorted(UNRELATED))
def test_an_output_file_this_command_did_not_write_is_refused_untouched(tmp_path, fmt, what):
    """A file without a trailing newline once counted as one torn line: it was emptied."""
    foreign = tmp_path / "precious.txt"
    foreign.write_text(UNRELATED[what])
    with pytest.raises(OutputError, match="did not write"):
        list(Output(foreign, fmt, tag="rq").resume())
    assert foreign.read_text() == UNRELATED[what]
    link = tmp_path / "out.link"
    link.symlink_to(foreign)
    with pytest.raises(OutputError, match="did not write"):
        list(Output(link, fmt, tag="rq").resume())
    assert foreign.read_text() == UNRELATED[what]


def test_submit_refuses_a_foreign_out_and_a_dangling_link_with_a_clear_error(base_env, tmp_path):
    source = write_jsonl(tmp_path / "jobs.jsonl", make_jobs(2))
    before = source.read_bytes()
    onto_input = rerankq(["submit", str(source), "--out", str(source)], base_env)
    assert onto_input.returncode == 1 and "did not write" in onto_input.stderr, onto_input.stderr
    assert source.read_bytes() == before
    dangling = tmp_path / "out.jsonl"
    dangling.symlink_to(tmp_path / "missing" / "target.jsonl")
    answer = rerankq(["submit", str(source), "--out", str(dangling)], base_env)
    assert answer.returncode == 1 and "symbolic link" in answer.stderr and "does not exist" in answer.stderr
    assert "Traceback" not in answer.stderr
    assert not (tmp_path / "missing").exists()


def test_job_lines_and_flags_set_every_stream_option(start_worker, base_env, tmp_path):
    env = fast_env(base_env)
    start_worker(env)
    jobs = make_jobs(3, candidates=25)
    own_key = "own-" + Path(tmp_path).name[-20:].replace("_", "-")
    jobs[1].update(instruction="find the payment runbook", lane="interactive", first_windows=1)
    jobs[2].update(idempotency_key=own_key)
    source = write_jsonl(tmp_path / "jobs.jsonl", jobs)
    out = tmp_path / "out.jsonl"

    done = rerankq(
        [
            "submit",
            str(source),
            "--out",
            str(out),
            "--instruction",
            "rank outage notes first",
            "--window-size",
            "10",
            "--json",
        ],
        env,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    streams = {line["id"]: line["stream"] for line in read_jsonl(out)}
    store = Store(connect(env["RERANKQ_REDIS_URL"]), env["RERANKQ_NAMESPACE"])
    specs = {job_id: store.load_spec(stream) for job_id, stream in streams.items()}
    assert {job_id: spec.instruction for job_id, spec in specs.items()} == {
        "job0": "rank outage notes first",
        "job1": "find the payment runbook",
        "job2": "rank outage notes first",
    }
    assert {spec.window_size for spec in specs.values()} == {10}
    assert streams["job2"] == "k_" + own_key  # a job's own key is used as it is
    assert streams["job0"] == "k_" + idempotency_key(json.loads(done.stdout)["run_id"], "job0")


class Reader:
    """A running command's stdout and stderr, read line by line as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        import threading

        self.process = process
        self.out: list[str] = []
        self.err: list[str] = []
        self.threads = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((process.stdout, self.out), (process.stderr, self.err))
        ]
        for thread in self.threads:
            thread.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in iter(stream.readline, ""):
            into.append(line)

    def finish(self, timeout_s: float = 30) -> tuple[str, str]:
        self.process.wait(timeout=timeout_s)
        for thread in self.threads:
            thread.join(timeout=5)
        return "".join(self.out), "".join(self.err)


def test_a_stopped_run_says_why_at_once_and_a_resume_counts_what_the_earlier_run_opened(
    start_worker, base_env, tmp_path
):
    # No worker yet: the first run's streams wait in their queue.
    env = fast_env(base_env)
    jobs = make_jobs(3, candidates=8)
    source = write_jsonl(tmp_path / "jobs.jsonl", jobs[:2], raw_lines={2: '{"id": "broken", "query": '})
    out = tmp_path / "out.jsonl"
    args = ["submit", str(source), "--out", str(out), "--progress-every", "0.1"]
    run = Reader(
        subprocess.Popen([str(RERANKQ), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )

    # The bad line is reported while the jobs before it are still in flight, not at the end.
    wait_for(lambda: any(f"{source}:3" in line for line in run.err), 30, "the bad line reported at once")
    # The progress line says why nothing moves, every time.
    wait_for(
        lambda: sum("no live worker consumes queue" in line for line in run.out if line.startswith("progress:")) >= 2,
        30,
        "the reason in the progress lines",
    )
    run.process.send_signal(signal.SIGINT)
    run.process.send_signal(signal.SIGINT)  # impatient: a second Ctrl-C at once
    stdout, stderr = run.finish()
    assert run.process.returncode == 130, stdout + stderr
    assert "interrupted: 0 jobs written" in stdout
    assert f"Resume with:\n  rerankq {' '.join(args)}" in stderr

    # The line fixed and a worker up, the same command collects the two streams the first run
    # opened (scored once, by this worker) and runs the third.
    write_jsonl(source, jobs)
    start_worker(env)
    again = rerankq(args, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 jobs written" in again.stdout
    assert "2 of them opened by an earlier run" in again.stdout
    assert sorted(line["id"] for line in read_jsonl(out)) == ["job0", "job1", "job2"]
