"""The gateway's doors against hostile callers: a real uvicorn gateway on loopback with three
tenants, a real worker and a real Redis, shared by the module.

Headers too large or too slow, idle connections, bodies nested past what a decoder can
walk, whitespace documents (answered last), a quiet event stream, an event id Redis cannot read, a secret in
the URL, and one tenant holding more event streams (or requests) than its share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from delivery_helpers import patient
from gateway_helpers import (
    GatewayProcess,
    queue_env,
    read_until_closed,
    rss_bytes,
    send_until_answered,
    write_keys,
)

from kernel.errors import ConfigError
from producer.gateway.config import load_gateway_settings
from worker.embedded.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
FAST = "tests.delivery_providers:FastProvider"
MAX_STREAMS = 4
HEADER_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 2
HEARTBEAT_S = 1.0
WINDOW_S = 0.03
DOCS = ["checkout returned 502", "the printer on floor 3", "a payment gateway runbook"]


@dataclass
class Doors:
    keys: dict[str, str]
    gateway: GatewayProcess
    http: httpx.Client

    def auth(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def post(self, path: str, body: object, tenant: str = "a") -> httpx.Response:
        return self.http.post(path, content=json.dumps(body), headers=self.auth(tenant))


@pytest.fixture(scope="module")
def doors(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("doors")
    # Each window takes a little while, so concurrent calls wait together, as under real load.
    env = queue_env(
        redis_server.url,
        "d" + uuid.uuid4().hex[:10],
        RERANKQ_RERANKER_PROVIDER=FAST,
        TEST_PROVIDER_SLEEP_S=str(WINDOW_S),
    )
    keys = write_keys(
        tmp / "keys.json",
        [
            {"name": "a", "tenant": "tenant-a", "devices": ["cpu", "gpu"]},
            {"name": "b", "tenant": "tenant-b", "devices": ["cpu", "gpu"]},
            # Only the share test's: no other test's event stream, closing late, counts against it.
            {"name": "c", "tenant": "tenant-c", "devices": ["cpu", "gpu"]},
        ],
    )
    worker = WorkerProcess.rerankq(env, tmp / "worker.log", "--device", "cpu", cwd=ROOT).start()
    gateway = GatewayProcess(
        {
            **env,
            "RERANKQ_GATEWAY_KEYS_FILE": str(tmp / "keys.json"),
            "RERANKQ_GATEWAY_TENANT_MAX_STREAMS": str(MAX_STREAMS),
            "RERANKQ_GATEWAY_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "RERANKQ_GATEWAY_KEEP_ALIVE_S": str(KEEP_ALIVE_S),
            "RERANKQ_GATEWAY_SSE_HEARTBEAT_S": str(HEARTBEAT_S),
        },
        tmp / "gateway.log",
        "--access-log",
    ).start()
    http = httpx.Client(base_url=gateway.url, timeout=60)
    try:
        yield Doors(keys, gateway, http)
    finally:
        http.close()
        gateway.stop()
        worker.stop()


def quiet_stream(doors: Doors, tenant: str = "a") -> str:
    """A stream no worker will score (no GPU worker runs): its event stream has nothing to say."""
    opened = doors.post(
        "/v1/streams", {"query": "q", "candidates": [{"id": "x", "text": "t"}], "device": "gpu"}, tenant
    )
    assert opened.status_code == 201, opened.text
    return opened.json()["stream_id"]


# -- headers and connections --------------------------------------------------------------------


def test_a_huge_header_is_refused_with_431_before_it_is_read_and_memory_stays_flat(doors: Doors) -> None:
    pid = doors.gateway.proc.pid  # type: ignore[union-attr]
    before = rss_bytes(pid)
    head = b"POST /v2/rerank HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * (16 << 20) + b"\r\n\r\n"
    answers: list[tuple[bytes, float]] = []

    def send() -> None:
        started = time.monotonic()
        answer = send_until_answered(doors.gateway.port, head)
        answers.append((answer, time.monotonic() - started))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 4
    for answer, took in answers:
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert took < 5
    assert rss_bytes(pid) - before < 30 << 20
    assert doors.http.get("/health").status_code == 200


def test_idle_and_byte_a_second_connections_are_closed(doors: Doors) -> None:
    port = doors.gateway.port
    with socket.create_connection(("127.0.0.1", port)) as idle:
        answer, closed_after = read_until_closed(idle, HEADER_TIMEOUT_S + 4)
    assert closed_after is not None and closed_after < HEADER_TIMEOUT_S + 2
    assert answer.startswith(b"HTTP/1.1 408 ")

    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\n")
        started, closed = time.monotonic(), False
        while time.monotonic() - started < HEADER_TIMEOUT_S + 4:
            try:
                slow.sendall(b"X")
            except OSError:
                closed = True
                break
            if read_until_closed(slow, 0.3)[1] is not None:
                closed = True
                break
        assert closed and time.monotonic() - started < HEADER_TIMEOUT_S + 2

    with socket.create_connection(("127.0.0.1", port)) as kept:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer, closed_after = read_until_closed(kept, KEEP_ALIVE_S + 4)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert closed_after is not None and closed_after < KEEP_ALIVE_S + 2


def test_secrets_in_the_url_are_masked_in_the_access_log(doors: Doors) -> None:
    secret = "rq_" + uuid.uuid4().hex
    doors.http.get(f"/health?api_key={secret}&key={secret}x&token={secret}y&keep=visible")
    deadline = time.monotonic() + patient(5)
    while "keep=visible" not in doors.gateway.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = doors.gateway.log()
    assert "GET /health?api_key=***&key=***&token=***&keep=visible" in log
    assert secret not in log


def test_every_secret_looking_query_value_is_masked_in_the_access_log(doors: Doors) -> None:
    secret = "rq_" + uuid.uuid4().hex
    names = ["x_api_key", "X-Api-Key", "bearer", "key[]", "key%5B%5D", "api%5Fkey", "access_token", "signature"]
    query = "&".join(f"{name}={secret}{i}" for i, name in enumerate(names))
    doors.http.get(f"/health?{query}&keep=visible2")
    deadline = time.monotonic() + patient(5)
    while "keep=visible2" not in doors.gateway.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = doors.gateway.log()
    assert "keep=visible2" in log
    assert secret not in log
    assert "x_api_key=***&X-Api-Key=***&bearer=***&key[]=***" in log


# -- bodies -------------------------------------------------------------------------------------


DEEP = 10_000


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/rerank", '{"query": "q", "documents": ["a", {"text": "t", "extra": %s}]}', 400, "documents[1].extra"),
        (
            "/v1/streams",
            '{"query": "q", "candidates": [{"id": "a", "metadata": {"m": %s}}]}',
            422,
            "candidates[0].metadata",
        ),
        (
            "/v1/streams",
            '{"query": "q", "candidates": [{"id": "a"}], "boosts": {"recency_curve": %s}}',
            422,
            "boosts.recency_curve",
        ),
        ("/rerank", '{"query": "q", "texts": ["a"], "ignored": %s}', 422, "ignored"),
    ],
)
def test_deeply_nested_json_is_refused_naming_the_field(
    doors: Doors, path: str, body: str, status: int, field: str
) -> None:
    answer = doors.http.post(path, content=body % nested(DEEP), headers=doors.auth("a"))
    assert answer.status_code == status, answer.text
    assert field in answer.text
    if path == "/v1/streams":
        assert answer.json()["error"]["field"] == field
    assert "RecursionError" not in doors.gateway.log()


def test_whitespace_documents_are_answered_last_not_refused(doors: Doors) -> None:
    """As the real services do (test_blank_documents.py holds every door to the rule)."""
    cohere = doors.post("/v2/rerank", {"model": "m", "query": "q", "documents": ["a", " \n\t "]})
    assert cohere.status_code == 200, cohere.text
    assert [r["index"] for r in cohere.json()["results"]] == [0, 1] and cohere.json()["results"][1][
        "relevance_score"
    ] == 0
    tei = doors.post("/rerank", {"query": "q", "texts": ["\u3000", "b"]})
    assert tei.status_code == 200 and [r["index"] for r in tei.json()] == [1, 0], tei.text


# -- event streams ------------------------------------------------------------------------------


def test_a_quiet_event_stream_gets_heartbeats_and_stays_open(doors: Doors) -> None:
    stream_id = quiet_stream(doors)
    received, started = b"", time.monotonic()
    with doors.http.stream(
        "GET", f"/v1/streams/{stream_id}/events", headers=doors.auth("a"), timeout=httpx.Timeout(5.0)
    ) as events:
        assert events.status_code == 200
        for part in events.iter_raw():
            received += part
            if time.monotonic() - started > 3.5 * HEARTBEAT_S:
                break
    assert received.count(b": keep-alive\n\n") >= 2
    assert b"event:" not in received  # no error, no end: only heartbeats


def test_an_out_of_range_last_event_id_is_refused_naming_the_header(doors: Doors) -> None:
    stream_id = quiet_stream(doors)
    for bad in ("99999999999999999999-0", "0-18446744073709551616", "abc"):
        answer = doors.http.get(f"/v1/streams/{stream_id}/events", headers={**doors.auth("a"), "Last-Event-ID": bad})
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"]["field"] == "Last-Event-ID"


# -- one tenant's share -------------------------------------------------------------------------


def test_a_tenant_past_its_share_of_streams_gets_429_and_another_tenant_is_served(doors: Doors) -> None:
    quiet = quiet_stream(doors, "c")
    held = 110  # more than redis-py's default pool of 100 connections

    async def run() -> None:
        limits = httpx.Limits(max_connections=held + 10, max_keepalive_connections=0)
        async with (
            httpx.AsyncClient(base_url=doors.gateway.url, timeout=30, limits=limits) as client,
            contextlib.AsyncExitStack() as streams,
        ):

            async def open_one() -> httpx.Response:
                request = client.build_request("GET", f"/v1/streams/{quiet}/events", headers=doors.auth("c"))
                return await streams.enter_async_context(_streaming(client, request))

            opened = await asyncio.gather(*(open_one() for _ in range(held)))
            await asyncio.sleep(1.5)  # every stream C was let keep is in its blocking read
            # Tenant B: its rerank, its own streams and /ready still answer.
            rerank = await client.post(
                "/v2/rerank",
                json={"model": "m", "query": f"q b {uuid.uuid4().hex}", "documents": DOCS},
                headers=doors.auth("b"),
            )
            assert rerank.status_code == 200, rerank.text
            assert (await client.get("/ready")).status_code == 200
            own = quiet_stream(doors, "b")
            request = client.build_request("GET", f"/v1/streams/{own}/events", headers=doors.auth("b"))
            b_stream = await streams.enter_async_context(_streaming(client, request))
            assert b_stream.status_code == 200
            first = await asyncio.wait_for(b_stream.aiter_raw().__anext__(), 5 * HEARTBEAT_S)
            assert first.startswith(b": keep-alive")  # not an error event
            # Tenant C: its share, and 429 with Retry-After past it, in the stream API's shape.
            codes = sorted(r.status_code for r in opened)
            assert codes == [200] * MAX_STREAMS + [429] * (held - MAX_STREAMS)
            refused = next(r for r in opened if r.status_code == 429)
            assert refused.headers["retry-after"] == "1"
            await refused.aread()
            assert refused.json()["error"]["type"] == "overloaded"

    asyncio.run(run())
    # Tenant C's share comes back once its streams close. The gateway frees a stream's slot when it
    # sees the disconnect, a moment after the client closed, so C does as a 429 tells it: retries
    # after Retry-After.
    deadline = time.monotonic() + patient(10 * HEARTBEAT_S)
    while True:
        with doors.http.stream("GET", f"/v1/streams/{quiet}/events", headers=doors.auth("c")) as again:
            if again.status_code == 200:
                break
            assert again.status_code == 429 and again.headers["retry-after"] == "1"
        assert time.monotonic() < deadline, "tenant C's share did not come back after its streams closed"
        time.sleep(1)


@contextlib.asynccontextmanager
async def _streaming(client: httpx.AsyncClient, request: httpx.Request):
    response = await client.send(request, stream=True)
    try:
        yield response
    finally:
        await response.aclose()


def test_130_concurrent_fresh_reranks_are_all_answered(doors: Doors) -> None:
    async def run() -> list[int]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=doors.gateway.url, timeout=60, limits=limits) as client:
            tag = uuid.uuid4().hex[:8]
            answers = await asyncio.gather(
                *(
                    client.post(
                        "/v2/rerank",
                        json={"model": "m", "query": f"payment {tag} {i}", "documents": DOCS},
                        headers=doors.auth("a"),
                    )
                    for i in range(130)
                )
            )
            return [a.status_code for a in answers]

    codes = asyncio.run(run())
    assert codes == [200] * 130, sorted(set(codes))


def test_the_pool_must_leave_room_past_one_tenants_share() -> None:
    with pytest.raises(ConfigError) as refused:
        load_gateway_settings(
            {
                "RERANKQ_GATEWAY_REDIS_MAX_CONNECTIONS": "100",
                "RERANKQ_GATEWAY_TENANT_MAX_STREAMS": "50",
                "RERANKQ_GATEWAY_TENANT_MAX_REQUESTS": "50",
            }
        )
    assert refused.value.variable == "RERANKQ_GATEWAY_REDIS_MAX_CONNECTIONS"
