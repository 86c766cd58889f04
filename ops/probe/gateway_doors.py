"""Probe the gateway's doors from outside, the way a hostile caller would.

    python -m ops.probe.gateway_doors [--quiet-s 16] [--keep]

Starts its own private Redis, one worker and ``rerankq serve`` (two tenants in a keys file,
``--access-log`` on), all on loopback, with a slow loopback rerank server (TEI's shape,
250 ms a call, counting its requests) as the chain's first member and ``rrf`` behind it.
Then, each bounded in count and time:

- ``huge_header``: a 64 MB ``Authorization`` header is refused with 431 within seconds, and
  the gateway's memory stays flat;
- ``slow_header`` / ``idle_connection`` / ``idle_keep_alive``: a connection sending a byte at
  a time, one sending nothing, and one idle after a response are all closed;
- ``nested_json``: 10,000-level nesting in a v1 document object, metadata, boosts and a field
  TEI ignores is a 4xx naming the field, and no ``RecursionError`` reaches the log;
- ``blank_documents``: a blank document (empty, white space, U+2028, U+3000, U+200B, U+FEFF,
  U+0000, ``null`` text) is answered last by every route (``/v2/rerank``, ``/v1/rerank``, TEI's
  ``/rerank``, ``/v1/streams``) and never reaches the member; a blank query is refused, naming it;
- ``id_escapes``: a candidate id carrying terminal escapes is refused naming it, and
  ``rerankq pull`` prints a document's escapes escaped, never raw;
- ``submit_nested``: a 1,500-level JSONL line in ``rerankq submit --on-error skip`` is a bad line
  naming its field, skipped, never a ``RecursionError``;
- ``unknown_chain``: a chain profile nobody configured is refused at open (422 naming ``chain``)
  while a configured one is served;
- ``quiet_stream``: an event stream with nothing to say gets heartbeats and no error past 15 s;
- ``bad_last_event_id``: an out-of-range ``Last-Event-ID`` is a 400 naming the header;
- ``secret_in_url``: a key in the query string (``api_key``, ``token``, ``x_api_key``,
  ``bearer``, ``key[]``) does not reach the access log;
- ``one_tenant_streams``: tenant A opening 120 event streams is held to its share (429)
  while tenant B's rerank, B's own stream and ``/ready`` still answer;
- ``concurrent_reranks``: 130 concurrent fresh ``/v2/rerank`` calls get 200 (or 429), never 503;
- ``cross_tenant_cache``: tenant B sending tenant A's query and documents reaches the member
  again (counted by the member's requests, not timed).

One line per probe, ``probe <name>: ok`` or ``probe <name>: FAIL <why>``; exit status 1 when
any probe failed (a crash, a 5xx that is not an outage, a cross-tenant signal, lost data), 2
when the deployment would not start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from ops.probe.runner import ProbeFailed, check, run_each
from producer.gateway.auth import digest, new_key
from worker.embedded.redis_server import EmbeddedRedis, free_port
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
MEMBER_DELAY_S = 0.25
DOCS = [
    "checkout returned 502 after the certificate expired",
    "the printer on floor 3",
    "a payment gateway runbook",
    "how to recover checkout after 502s",
]


# -- the deployment -------------------------------------------------------------------------------


class SlowMember:
    """A TEI-shaped rerank server on loopback: a fixed score per text, MEMBER_DELAY_S a call and
    ``per_text_s`` a text more; it counts its requests and keeps the largest it was sent."""

    def __init__(self, per_text_s: float = 0.0) -> None:
        self.requests = 0
        #: The largest request body (bytes, as received) and the longest text in any request.
        self.largest_body = 0
        self.longest_text = 0
        self.texts: list[str] = []
        self._lock = threading.Lock()
        member = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw or b"{}")
                texts = body.get("texts") or []
                with member._lock:
                    member.requests += 1
                    member.texts.extend(texts)
                    member.largest_body = max(member.largest_body, len(raw))
                    member.longest_text = max([member.longest_text, *(len(t) for t in texts)])
                time.sleep(MEMBER_DELAY_S + per_text_s * len(texts))
                answer = sorted(
                    ({"index": i, "score": 0.05 + 0.9 * (sum(t.encode()) % 1000) / 1000} for i, t in enumerate(texts)),
                    key=lambda r: -r["score"],
                )
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self) -> int:
        with self._lock:
            return self.requests

    def texts_sent(self) -> list[str]:
        with self._lock:
            return list(self.texts)

    def start(self) -> SlowMember:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Deployment:
    def __init__(self, tmp: Path, env: dict[str, str] | None = None, member_per_text_s: float = 0.0) -> None:
        """``env``: settings of this deployment's own, over the probe's."""
        self.tmp = tmp
        (tmp / "redis").mkdir()
        self.redis = EmbeddedRedis(directory=str(tmp / "redis")).start()
        self.member = SlowMember(member_per_text_s).start()
        namespace = "probe" + uuid.uuid4().hex[:6]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
        self.env.update(
            {
                "RERANKQ_REDIS_URL": self.redis.url,
                "RERANKQ_NAMESPACE": namespace,
                "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
                "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
                "RERANKQ_ANY_QUEUE": f"{namespace}.any",
                "PYTHONPATH": str(ROOT),
                "RERANKQ_RERANKER_PROVIDER": "tei",
                "RERANKQ_RERANKER_URL": self.member.url,
                "RERANKQ_RERANKER_TIMEOUT_S": "5",
                "RERANKQ_RERANKER_1_PROVIDER": "rrf",
                "RERANKQ_CHAIN_FAST": "0",
                **(env or {}),
            }
        )
        self.keys = {"a": new_key(), "b": new_key()}
        entries = [
            {"key_sha256": digest(key), "tenant": f"tenant-{name}", "devices": ["cpu", "gpu"]}
            for name, key in self.keys.items()
        ]
        (tmp / "keys.json").write_text(json.dumps(entries))
        self.worker = WorkerProcess.rerankq(self.env, tmp / "worker.log", "--device", "cpu", cwd=ROOT)
        self.port = free_port()
        self.gateway_log = tmp / "gateway.log"
        self.gateway: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Deployment:
        self.worker.start()
        with open(self.gateway_log, "wb") as log:
            self.gateway = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rerankq",
                    "serve",
                    "--port",
                    str(self.port),
                    "--access-log",
                    "--keys-file",
                    str(self.tmp / "keys.json"),
                ],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                raise RuntimeError(f"rerankq serve exited {self.gateway.returncode}: {self.log()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("rerankq serve not ready after 60 s")

    def log(self) -> str:
        return self.gateway_log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.gateway is not None and self.gateway.poll() is None

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def stop(self) -> None:
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.terminate()
            try:
                self.gateway.wait(20)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
                self.gateway.wait()
        self.worker.stop()
        self.member.stop()
        self.redis.stop()


# -- raw connections --------------------------------------------------------------------------------


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float | None]:
    started, data = time.monotonic(), b""
    while (remaining := timeout_s - (time.monotonic() - started)) > 0:
        if not select.select([sock], [], [], remaining)[0]:
            continue
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            part = b""
        if not part:
            return data, time.monotonic() - started
        data += part
    return data, None


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def gateway_pid(d: Deployment) -> int:
    assert d.gateway is not None
    return d.gateway.pid


# -- the probes -------------------------------------------------------------------------------------


def probe_huge_header(d: Deployment) -> None:
    before = rss_mb(gateway_pid(d))
    head = b"POST /v2/rerank HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * (64 << 20) + b"\r\n\r\n"
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as sock:
        view = memoryview(head)
        for at in range(0, len(head), 256 * 1024):
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(view[at : at + 256 * 1024])
            except OSError:
                break
        answer, _ = read_until_closed(sock, 30)
    took = time.monotonic() - started
    grown = rss_mb(gateway_pid(d)) - before
    check(answer.startswith(b"HTTP/1.1 431 "), f"answered {answer[:40]!r}, not 431")
    check(took < 5, f"took {took:.1f} s")
    check(grown < 50, f"gateway memory grew {grown:.0f} MB")
    check(httpx.get(d.url + "/health", timeout=5).status_code == 200, "/health did not answer after")


def probe_slow_header(d: Deployment) -> None:
    with socket.create_connection(("127.0.0.1", d.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        started = time.monotonic()
        while time.monotonic() - started < 30:
            try:
                sock.sendall(b"X")
            except OSError:
                return
            if read_until_closed(sock, 1.0)[1] is not None:
                return
    raise ProbeFailed("a byte-a-second request head was still open after 30 s")


def probe_idle_connection(d: Deployment) -> None:
    with socket.create_connection(("127.0.0.1", d.port)) as sock:
        _, closed_after = read_until_closed(sock, 30)
    check(closed_after is not None, "a connection sending nothing was still open after 30 s")


def probe_idle_keep_alive(d: Deployment) -> None:
    with socket.create_connection(("127.0.0.1", d.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer, closed_after = read_until_closed(sock, 30)
    check(answer.startswith(b"HTTP/1.1 200 "), f"answered {answer[:40]!r}")
    check(closed_after is not None, "an idle keep-alive connection was still open after 30 s")


def probe_nested_json(d: Deployment) -> None:
    deep = "[" * 10_000 + "]" * 10_000
    cases = [
        ("/v1/rerank", '{"query": "q", "documents": ["a", {"text": "t", "extra": %s}]}', "documents[1].extra"),
        ("/v1/streams", '{"query": "q", "candidates": [{"id": "a", "metadata": {"m": %s}}]}', "candidates[0].metadata"),
        (
            "/v1/streams",
            '{"query": "q", "candidates": [{"id": "a"}], "boosts": {"recency_curve": %s}}',
            "boosts.recency_curve",
        ),
        ("/rerank", '{"query": "q", "texts": ["a"], "ignored": %s}', "ignored"),
    ]
    for path, body, field in cases:
        answer = httpx.post(d.url + path, content=body % deep, headers=d.auth("a"), timeout=30)
        check(400 <= answer.status_code < 500, f"{path}: answered {answer.status_code}")
        check(field in answer.text, f"{path}: the answer does not name {field}")
    check("RecursionError" not in d.log(), "a RecursionError reached the log")


def served_page(d: Deployment, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
    """Open a stream through ``POST /v1/streams`` and read its first page, waiting for it."""
    opened = httpx.post(d.url + "/v1/streams", json={**body, "allow_shallow": True}, headers=d.auth(tenant), timeout=30)
    check(opened.status_code == 201, f"/v1/streams: answered {opened.status_code}: {opened.text[:120]}")
    page = httpx.get(
        f"{d.url}/v1/streams/{opened.json()['stream_id']}/page",
        params={"offset": 0, "limit": 20, "wait": 30},
        headers=d.auth(tenant),
        timeout=60,
    )
    check(page.status_code == 200, f"the page: answered {page.status_code}")
    answer: dict[str, Any] = page.json()
    return answer


BLANKS = ["", " \n\t", "\u2028", "\u3000", "\u200b", "\ufeff", "\u0000"]


def probe_blank_documents(d: Deployment) -> None:
    real = ["checkout failed after the certificate expired", "how to recover checkout"]
    documents = [real[0], *BLANKS, real[1]]
    blank = set(range(1, 1 + len(BLANKS)))
    tag = uuid.uuid4().hex[:8]  # fresh queries: no answer retained from an earlier run

    def ranked(path: str, body: dict[str, object], key: str) -> list[int]:
        answer = httpx.post(d.url + path, json=body, headers=d.auth("a"), timeout=60)
        check(answer.status_code == 200, f"{path}: answered {answer.status_code}: {answer.text[:120]}")
        rows = answer.json()["results"] if isinstance(answer.json(), dict) else answer.json()
        scores = [r[key] for r in rows]
        check(all(isinstance(x, float) for x in scores), f"{path}: a score that is not a number: {scores}")
        return [r["index"] for r in rows]

    before = len(d.member.texts_sent())
    orders = {
        "/v2/rerank": ranked(
            "/v2/rerank", {"model": "m", "query": f"q v2 {tag}", "documents": documents}, "relevance_score"
        ),
        "/v1/rerank": ranked(
            "/v1/rerank",
            {"query": f"q v1 {tag}", "documents": [{"text": t} for t in documents[:-1]] + [{"text": None}]},
            "relevance_score",
        ),
        "/rerank": ranked("/rerank", {"query": f"q tei {tag}", "texts": documents}, "score"),
    }
    for path, order in orders.items():
        check(len(order) == len(documents), f"{path}: {len(order)} of {len(documents)} documents answered")
        last = blank if path != "/v1/rerank" else {*blank, len(documents) - 1}
        check(set(order[-len(last) :]) == last, f"{path}: the blank documents are not last: {order}")
    candidates = [{"id": f"d{i}", "text": t} for i, t in enumerate(documents)]
    page = served_page(d, "a", {"query": f"q streams {tag}", "candidates": candidates})
    ids = [r["decision"]["id"] for r in page["rows"]]
    check(page["complete"] and len(ids) == len(documents), f"/v1/streams: {len(ids)} rows, complete={page['complete']}")
    check({int(i[1:]) for i in ids[-len(blank) :]} == blank, f"/v1/streams: the blank documents are not last: {ids}")
    sent = d.member.texts_sent()[before:]
    check(not [t for t in sent if t in BLANKS], "a blank document reached the member")
    for path, body, status in [
        ("/v2/rerank", {"model": "m", "query": "\u200b ", "documents": real}, 400),
        ("/rerank", {"query": "\ufeff", "texts": real}, 422),
        ("/v1/streams", {"query": "\u3000", "candidates": [{"id": "a", "text": real[0]}]}, 422),
    ]:
        answer = httpx.post(d.url + path, json=body, headers=d.auth("a"), timeout=30)
        check(answer.status_code == status and "query" in answer.text, f"a blank query to {path}: {answer.status_code}")


ESCAPES = "\x1b]0;PWNED\x07\x1b[2J"


def probe_id_escapes(d: Deployment) -> None:
    refused = httpx.post(
        d.url + "/v1/streams",
        json={"query": "q", "candidates": [{"id": f"id{ESCAPES}", "text": "t"}]},
        headers=d.auth("a"),
        timeout=30,
    )
    check(refused.status_code == 422, f"an id with escapes: answered {refused.status_code}")
    check(refused.json()["error"]["field"] == "candidates[0].id", f"the refusal names {refused.json()['error']}")
    opened = httpx.post(
        d.url + "/v1/streams",
        json={"query": "q", "candidates": [{"id": "c0", "text": f"payment error {ESCAPES} \u202eevil"}]},
        headers=d.auth("a"),
        timeout=30,
    )
    check(opened.status_code == 201, f"a document with escapes: answered {opened.status_code}")
    pulled = subprocess.run(
        [sys.executable, "-m", "rerankq", "pull", opened.json()["stream_id"], "--timeout", "30"],
        env=d.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    check(pulled.returncode == 0, f"rerankq pull exited {pulled.returncode}: {pulled.stderr[-200:]!r}")
    check("PWNED" in pulled.stdout, "rerankq pull did not print the document")
    raw = [ch for ch in "\x1b\x07\u202e" if ch in pulled.stdout]
    check(not raw, f"rerankq pull printed {raw!r} raw to the terminal")


def probe_submit_nested(d: Deployment) -> None:
    jobs = d.tmp / f"nested-{uuid.uuid4().hex[:6]}.jsonl"
    deep = '{"m": ' * 1500 + "1" + "}" * 1500
    good = {"id": "good", "query": "checkout", "candidates": [{"id": "a", "text": DOCS[0]}]}
    bad = '{"id": "deep", "query": "q", "candidates": [{"id": "a", "text": "t", "metadata": ' + deep + "}]}"
    jobs.write_text(json.dumps(good) + "\n" + bad + "\n")
    out = jobs.with_suffix(".out.jsonl")
    done = subprocess.run(
        [sys.executable, "-m", "rerankq", "submit", str(jobs), "--out", str(out), "--on-error", "skip"]
        + ["--allow-shallow"],
        env=d.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout + done.stderr
    check("RecursionError" not in said and "Traceback" not in said, f"a traceback: {said[-200:]!r}")
    check(done.returncode == 1, f"exited {done.returncode}, not 1 (a line skipped): {said[-200:]!r}")
    check(
        f"skipped {jobs}:2: candidates[0].metadata" in done.stdout, f"the skip does not name the field: {said[-200:]!r}"
    )
    check([json.loads(line)["id"] for line in out.read_text().splitlines()] == ["good"], "the good job was not served")


def probe_unknown_chain(d: Deployment) -> None:
    candidates = [{"id": "a", "text": DOCS[0]}]
    refused = httpx.post(
        d.url + "/v1/streams",
        json={"query": "q", "candidates": candidates, "chain": "nope"},
        headers=d.auth("a"),
        timeout=30,
    )
    check(refused.status_code == 422, f"an unknown profile: answered {refused.status_code}")
    check(refused.json()["error"]["field"] == "chain", f"the refusal names {refused.json()['error']}")
    page = served_page(d, "b", {"query": f"q {uuid.uuid4().hex[:6]}", "candidates": candidates, "chain": "FAST"})
    check(
        page["complete"] and page["rows"][0]["decision"]["served_by"] == "0:tei", f"not served by the profile: {page}"
    )


def quiet_stream(d: Deployment, tenant: str) -> str:
    """A stream on the GPU queue, which no worker serves: its events have nothing to say."""
    opened = httpx.post(
        d.url + "/v1/streams",
        json={"query": "q", "candidates": [{"id": "x", "text": "t"}], "device": "gpu"},
        headers=d.auth(tenant),
        timeout=30,
    )
    check(opened.status_code == 201, f"opening a stream answered {opened.status_code}")
    return opened.json()["stream_id"]


def probe_quiet_stream(d: Deployment, quiet_s: float) -> None:
    stream_id = quiet_stream(d, "a")
    received, started = b"", time.monotonic()
    with httpx.stream(
        "GET", f"{d.url}/v1/streams/{stream_id}/events", headers=d.auth("a"), timeout=httpx.Timeout(30.0)
    ) as events:
        check(events.status_code == 200, f"answered {events.status_code}")
        for part in events.iter_raw():
            received += part
            if b"event:" in received or time.monotonic() - started > quiet_s:
                break
    check(b"event: error" not in received, f"an error event: {received[-200:]!r}")
    check(b"event:" not in received, f"the stream ended: {received[-200:]!r}")
    check(b": keep-alive" in received, "no heartbeat")


def probe_bad_last_event_id(d: Deployment) -> None:
    stream_id = quiet_stream(d, "a")
    answer = httpx.get(
        f"{d.url}/v1/streams/{stream_id}/events",
        timeout=30,
        headers={**d.auth("a"), "Last-Event-ID": "99999999999999999999-0"},
    )
    check(answer.status_code == 400, f"answered {answer.status_code}")
    check("Last-Event-ID" in answer.text, "the answer does not name Last-Event-ID")


def probe_secret_in_url(d: Deployment) -> None:
    secret = "rq_" + uuid.uuid4().hex
    names = ["api_key", "token", "x_api_key", "X-Api-Key", "bearer", "key[]", "key%5B%5D", "signature"]
    marker = uuid.uuid4().hex
    query = "&".join(f"{name}={secret}" for name in names)
    httpx.get(f"{d.url}/health?{query}&keep={marker}", timeout=10)
    deadline = time.monotonic() + 5
    while marker not in d.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    check(marker in d.log(), "the request did not reach the access log")
    check(secret not in d.log(), "a key in the URL reached the access log")


def probe_one_tenant_streams(d: Deployment) -> None:
    quiet = quiet_stream(d, "a")

    async def run() -> None:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with (
            httpx.AsyncClient(base_url=d.url, timeout=30, limits=limits) as client,
            contextlib.AsyncExitStack() as held,
        ):

            async def open_one(tenant: str, stream_id: str) -> httpx.Response:
                response = await client.send(
                    client.build_request("GET", f"/v1/streams/{stream_id}/events", headers=d.auth(tenant)), stream=True
                )
                held.push_async_callback(response.aclose)
                return response

            opened = await asyncio.gather(*(open_one("a", quiet) for _ in range(120)))
            await asyncio.sleep(1.5)
            codes = [r.status_code for r in opened]
            check(set(codes) <= {200, 429}, f"tenant A's streams answered {sorted(set(codes))}")
            check(429 in codes, "tenant A was let hold 120 streams")
            rerank = await client.post(
                "/v2/rerank",
                json={"model": "m", "query": f"b {uuid.uuid4().hex}", "documents": DOCS},
                headers=d.auth("b"),
            )
            check(rerank.status_code == 200, f"tenant B's rerank answered {rerank.status_code}: {rerank.text[:120]}")
            ready = await client.get("/ready")
            check(ready.status_code == 200, f"/ready answered {ready.status_code}")
            own = await open_one("b", quiet_stream(d, "b"))
            check(own.status_code == 200, f"tenant B's stream answered {own.status_code}")

    asyncio.run(run())


def probe_concurrent_reranks(d: Deployment) -> None:
    async def run() -> list[int]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=d.url, timeout=120, limits=limits) as client:
            tag = uuid.uuid4().hex[:8]
            answers = await asyncio.gather(
                *(
                    client.post(
                        "/v2/rerank",
                        json={"model": "m", "query": f"q {tag} {i}", "documents": DOCS},
                        headers={**d.auth("a"), "X-Rerankq-Timeout": "110"},
                    )
                    for i in range(130)
                )
            )
            return [a.status_code for a in answers]

    codes = asyncio.run(run())
    check(set(codes) <= {200, 429}, f"answered {sorted(set(codes))}: {[codes.count(c) for c in sorted(set(codes))]}")


def probe_cross_tenant_cache(d: Deployment) -> None:
    body = {"model": "m", "query": f"is this sent {uuid.uuid4().hex}", "documents": DOCS}
    first = httpx.post(d.url + "/v2/rerank", json=body, headers=d.auth("a"), timeout=60)
    check(first.status_code == 200, f"tenant A answered {first.status_code}")
    before = d.member.count()
    second = httpx.post(d.url + "/v2/rerank", json=body, headers=d.auth("b"), timeout=60)
    check(second.status_code == 200, f"tenant B answered {second.status_code}")
    check(
        d.member.count() > before,
        "tenant B's repeat of tenant A's query and documents did not reach the member: a cache hit tells B what A sent",
    )
    check(second.json()["results"] == first.json()["results"], "the two tenants' scores differ (lost data)")


def gateway_down(d: Deployment) -> str | None:
    if d.alive():
        return None
    return f"the gateway exited ({d.gateway.returncode if d.gateway else '?'})"


def probes(quiet_s: float) -> list[tuple[str, Callable[[Deployment], None]]]:
    return [
        ("huge_header", probe_huge_header),
        ("slow_header", probe_slow_header),
        ("idle_connection", probe_idle_connection),
        ("idle_keep_alive", probe_idle_keep_alive),
        ("nested_json", probe_nested_json),
        ("blank_documents", probe_blank_documents),
        ("id_escapes", probe_id_escapes),
        ("submit_nested", probe_submit_nested),
        ("unknown_chain", probe_unknown_chain),
        ("quiet_stream", lambda d: probe_quiet_stream(d, quiet_s)),
        ("bad_last_event_id", probe_bad_last_event_id),
        ("secret_in_url", probe_secret_in_url),
        ("one_tenant_streams", probe_one_tenant_streams),
        ("concurrent_reranks", probe_concurrent_reranks),
        ("cross_tenant_cache", probe_cross_tenant_cache),
    ]


@contextlib.contextmanager
def deployment(keep: bool, **options: Any) -> Iterator[Deployment]:
    """A started deployment (``options``: ``Deployment``'s), stopped and removed on the way out."""
    tmp = Path(tempfile.mkdtemp(prefix="rerankq-probe-"))
    d = Deployment(tmp, **options)
    try:
        yield d.start()
    finally:
        d.stop()
        if keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_probes(
    chosen: list[tuple[str, Callable[[Deployment], None]]], only: list[str] | None, *, keep: bool, **options: Any
) -> int:
    """Each probe in turn against one deployment, a line each, then the gateway's log read for
    errors; returns the exit status (0, 1 on any failure, 2 when the deployment did not start)."""
    failed = 0
    try:
        context = deployment(keep, **options)
        d = context.__enter__()
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported, not raised
        print(f"probe deployment: FAIL {type(exc).__name__}: {str(exc)[:300]}")
        return 2
    try:
        failed = run_each(chosen, d, only, gateway_down)
        for line in d.log().splitlines():
            if " ERROR " in line or "Traceback" in line:
                failed += 1
                print(f"probe gateway_log: FAIL {line[:200]}")
                break
    finally:
        context.__exit__(None, None, None)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.probe.gateway_doors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quiet-s",
        type=float,
        default=16.0,
        help="how long the quiet event stream is watched (past the 15 s Redis socket timeout)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the deployment's logs")
    parser.add_argument("--only", action="append", help="run only this probe (repeatable)")
    args = parser.parse_args(argv)
    return run_probes(probes(args.quiet_s), args.only, keep=args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
