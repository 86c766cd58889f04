"""The backlog exporter's command: ``python -m producer.exporter`` (or ``rerankq exporter``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from producer.errors import ConfigError

DESCRIPTION = """\
Serve rerankq's queue backlog for Prometheus: per device queue, the messages waiting, the
messages fetched and not acknowledged, the age of the oldest waiting message; per device, the
admitted windows not yet committed; the live streams. Reads Redis on each scrape with a fixed
number of commands (no stream is scanned) and needs no worker, so an autoscaler can scale a
device's workers from zero. Configured by the same RERANKQ_* variables as everything else.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rerankq-exporter", description=DESCRIPTION)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default RERANKQ_EXPORTER_PORT, 9808)")
    parser.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")
    parser.add_argument("--healthcheck", action="store_true",
                        help="ask a running exporter on this host and port for /healthz; exit 0 when healthy")
    return parser


def healthz(port: int, *, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None, *,
         host_logging: Callable[[str], None] | None = None) -> int:
    """Serve the queues' backlog per device for Prometheus and autoscalers (no workers needed)."""
    args = build_parser().parse_args(argv)
    from producer.settings import load_settings

    try:
        settings = load_settings(environ)
    except ConfigError as exc:
        print(f"rerankq-exporter: {exc}", file=sys.stderr)
        return 2
    port = args.port if args.port is not None else settings.exporter.port
    if args.healthcheck:
        return 0 if healthz(port) else 1
    if not settings.store.redis_url:
        print("rerankq-exporter: RERANKQ_REDIS_URL is not set", file=sys.stderr)
        return 2

    from prometheus_client import CollectorRegistry, generate_latest

    from producer.exporter.backlog import BacklogReader
    from producer.exporter.collector import BacklogCollector
    from producer.exporter.http import MetricsServer, check_route, health_client, metrics_route, reachable
    from producer.redis_clients import broker_client as connect_broker
    from producer.redis_clients import store_client as connect_store

    store_client = connect_store(settings.store.redis_url)
    amqp_probe = None
    if settings.store.broker_kind == "amqp":
        from producer.amqp_broker import AmqpQueueProbe

        amqp_probe, broker_client = AmqpQueueProbe(settings.store.broker), None
    else:
        broker_client = store_client if settings.store.broker == settings.store.redis_url else connect_broker(settings.store.broker)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BacklogCollector(BacklogReader(settings, store_client, broker_client, amqp_probe)))
    if args.once:
        sys.stdout.write(generate_latest(registry).decode())
        return 0

    store_probe = health_client(settings.store.redis_url)
    broker_probe = None if amqp_probe is not None else health_client(settings.store.broker)

    def broker_reachable() -> bool:
        if amqp_probe is None:
            return reachable(broker_probe)
        try:
            amqp_probe.counts([settings.queues.cpu_queue])
            return True
        except Exception:  # noqa: BLE001 - any failure to reach RabbitMQ is "unreachable"
            return False

    def health() -> tuple[bool, dict[str, Any]]:
        checks = {"redis": reachable(store_probe), "broker": broker_reachable()}
        return all(checks.values()), checks

    if host_logging is not None:  # the host renders records (``rerankq exporter``); never this module
        host_logging("INFO")
    server = MetricsServer(args.host, port, {"/metrics": metrics_route(lambda: registry),
                                             "/healthz": check_route(health)})

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever, which runs on this very thread: ask from another.
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("rerankq.exporter").info("exporter_listening host=%s port=%d", args.host, server.port)
    server.serve_forever()
    store_client.close()
    if broker_client is not None and broker_client is not store_client:
        broker_client.close()
    if amqp_probe is not None:
        amqp_probe.close()
    return 0

