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
from producer.settings import DEFAULT_MODEL
from worker.cli.common import print_json, to_builtins
from worker.cli.render import page_json, page_lines
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerProcess
from worker.logs import configure_logging


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
    chain_configured = any(k.startswith("RERANKQ_RERANKER_1_") for k in env)
    if not chain_configured:
        # The demo fails open: if the model cannot load, fusion order still answers.
        env["RERANKQ_RERANKER_1_PROVIDER"] = "rrf"
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
            deeper = client.pull(stream, 10, 10, timeout=120)
            say("\n".join(page_lines("page 3 (deeper than the first window)", deeper)))
            status = client.status(stream)
            say("\nwindows:")
            for w in status.windows:
                say(f"  window {w.window} [{w.start}, {w.end}): {w.state:<12} served_by={w.served_by or '-':<8} "
                    f"ranked={w.ranked} filtered={w.filtered} failed={w.failed}")
            if as_json:
                print_json({"stream": stream, "query": sample["query"], "pages": [page_json(first), page_json(deeper)],
                            "status": to_builtins(status), "worker_log": str(log_path)})
            served = {w.served_by for w in status.windows if w.served_by}
            if served and all(s.endswith(":rrf") for s in served):
                say(
                    "\nThe cross-encoder could not load (no network to fetch "
                    f"{load_settings(env).chain()[0].model or DEFAULT_MODEL}?), so windows kept fusion order "
                    "(served by rrf).\nTo score with a model, point RERANKQ_RERANKER_MODEL at a local path, e.g.\n"
                    "  RERANKQ_RERANKER_MODEL=/models/ms-marco-MiniLM-L-6-v2 make demo\n"
                    f"Worker log: {log_path}"
                )
    finally:
        worker.stop()
        if redis_server is not None:
            redis_server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
