"""Redis restarts mid-run (AOF on): every stream still completes, every window committed once."""

from __future__ import annotations

import pytest
import redis
from conftest import make_candidates
from delivery_helpers import commits_per_window, provider_env, pull_until_complete, wait_for

from worker.embedded.redis_server import EmbeddedRedis

pytestmark = pytest.mark.chaos


@pytest.fixture
def private_redis():
    server = EmbeddedRedis(appendonly=True).start()
    yield server
    server.stop()


def test_streams_complete_across_a_redis_restart(private_redis, start_worker, make_client):
    env = provider_env("SlowProvider", sleep_s=0.3, redeliver_after_s=3, sweep_interval_s=1)
    env["RERANKQ_REDIS_URL"] = private_redis.url
    start_worker(env=env)
    client = make_client(redis_url=private_redis.url, redeliver_after_s=3)
    streams = [
        client.open(f"payment gateway error {i}", make_candidates(30), window_size=10, first_windows=3)
        for i in range(5)
    ]
    raw = redis.Redis.from_url(private_redis.url)

    def committed() -> int:
        return sum(len(client.store.snapshot(s).results) for s in streams)

    wait_for(lambda: committed() >= 2, 30, "the first windows to commit", 0.05)
    assert committed() < 15, "the restart must land mid-run"
    private_redis.restart()  # SIGTERM: Redis fsyncs its AOF and exits; then it replays it

    for stream in streams:
        page = pull_until_complete(client, stream, 30, timeout_s=90)
        assert page.total == 30
        assert commits_per_window(raw, client, stream) == {0: 1, 1: 1, 2: 1}
    raw.close()
