"""What the framework integration tests share: the knowledge-base job they all rerank, the
count of provider calls that tells a deeper pull cost nothing, and running a shipped example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERY = "payment gateway 502 recovery"
KB_TEXTS = [
    "the cat sat on the mat",
    "checkout returned 502 after the certificate expired",
    "how to recover checkout after 502s",
    "office facilities: the printer on floor 3",
    "a payment gateway runbook for 502 errors",
]


def provider_calls(client) -> int:
    """The local member's calls so far: unchanged by a pull that reads committed windows."""
    return client.store.counters().get("provider_calls:0:local", 0)


def direct_rows(client, query: str, texts: list[str], top_n: int, **options) -> list:
    """The ranked rows of the same job sent through RerankClient itself."""
    stream_id = client.open(query, [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)], **options)
    page = client.pull(stream_id, 0, top_n, timeout=60)
    return [row.decision for row in page.rows if row.kind == "ranked"]


def run_example(name: str, env: dict[str, str], timeout: float = 120) -> str:
    """Run ``examples/<name>`` as a user would and return what it printed; a failure shows its stderr."""
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout
