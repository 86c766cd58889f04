"""The backlog exporter's command: ``rerankq exporter`` (also ``python -m producer.exporter``)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import click

from kernel.command_line import Host, apply_host_logging, run_command
from kernel.errors import ConfigError

EPILOG = """\b
Examples:
  rerankq exporter                                       # /metrics and /healthz on 0.0.0.0:9808
  rerankq exporter --host 127.0.0.1 --port 9900
  rerankq exporter --once                                # one scrape to stdout, then exit
  rerankq exporter --healthcheck                         # a container's health check: exit 0 when healthy
"""


def healthz(port: int, *, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@click.command(name="exporter", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default="0.0.0.0", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=None, help="port to listen on (RERANKQ_EXPORTER_PORT, default 9808)")
@click.option("--once", is_flag=True, help="print one scrape to stdout and exit")
@click.option(
    "--healthcheck", is_flag=True, help="ask a running exporter on this host and port for /healthz; exit 0 when healthy"
)
def exporter(host: str, port: int | None, once: bool, healthcheck: bool) -> int:
    """Serve the queues' backlog per device for Prometheus and autoscalers (no workers needed).

    Per device queue: the messages waiting, the messages fetched and not acknowledged, the
    age of the oldest waiting message; per device, the admitted windows not yet committed;
    the live streams. It reads Redis on each scrape with a fixed number of commands (no
    stream is scanned) and needs no worker, so an autoscaler can scale a device's workers
    from zero. Configured by the same RERANKQ_* variables as everything else.
    """
    from kernel.settings import load_settings

    try:
        settings = load_settings()
    except ConfigError as exc:
        click.echo(f"rerankq-exporter: {exc}", err=True)
        return 2
    port = port if port is not None else settings.exporter.port
    if healthcheck:
        return 0 if healthz(port) else 1
    if not settings.store.redis_url:
        click.echo("rerankq-exporter: RERANKQ_REDIS_URL is not set", err=True)
        return 2

    from prometheus_client import CollectorRegistry, generate_latest

    from kernel.metrics_http import MetricsServer, check_route, health_client, metrics_route, reachable
    from kernel.redis_clients import broker_client as connect_broker
    from kernel.redis_clients import store_client as connect_store
    from producer.exporter.backlog import BacklogReader
    from producer.exporter.collector import BacklogCollector

    store_client = connect_store(settings.store.redis_url)
    amqp_probe = None
    if settings.store.broker_kind == "amqp":
        from kernel.amqp_broker import AmqpQueueProbe

        amqp_probe, broker_client = AmqpQueueProbe(settings.store.broker), None
    else:
        broker_client = (
            store_client if settings.store.broker == settings.store.redis_url else connect_broker(settings.store.broker)
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BacklogCollector(BacklogReader(settings, store_client, broker_client, amqp_probe)))
    if once:
        sys.stdout.write(generate_latest(registry).decode())
        return 0

    store_probe = health_client(settings.store.redis_url)
    broker_probe = None if amqp_probe is not None else health_client(settings.store.broker)

    def broker_reachable() -> bool:
        if amqp_probe is None:
            assert broker_probe is not None  # made whenever there is no RabbitMQ probe
            return reachable(broker_probe)
        try:
            amqp_probe.counts([settings.queues.cpu_queue])
            return True
        except Exception:  # noqa: BLE001 - any failure to reach RabbitMQ is "unreachable"
            return False

    def health() -> tuple[bool, dict[str, Any]]:
        checks = {"redis": reachable(store_probe), "broker": broker_reachable()}
        return all(checks.values()), checks

    apply_host_logging("INFO")  # the host renders records (``rerankq exporter``); never this module
    server = MetricsServer(host, port, {"/metrics": metrics_route(lambda: registry), "/healthz": check_route(health)})

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever, which runs on this very thread: ask from another.
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("rerankq.exporter").info("exporter_listening host=%s port=%d", host, server.port)
    server.serve_forever()
    store_client.close()
    if broker_client is not None and broker_client is not store_client:
        broker_client.close()
    if amqp_probe is not None:
        amqp_probe.close()
    return 0


def main(
    argv: Sequence[str] | None = None,
    *,
    host_logging: Callable[[str], None] | None = None,
    prog_name: str = "python -m producer.exporter",
) -> int:
    """Run the exporter on ``argv`` and return its exit status; ``host_logging(level)`` is the
    host's way to render records."""
    return run_command(
        exporter, sys.argv[1:] if argv is None else argv, prog_name=prog_name, host=Host(logging=host_logging)
    )
