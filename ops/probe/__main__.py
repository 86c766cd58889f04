"""Every hostile probe in turn: the queue's messages and the envelope fuzzer (Redis, then RabbitMQ
where it is installed), what a process is handed at start, the gateway's doors, what one tenant can
make the queue do to another (``tenant_shares``) and the model doors. Exits with the worst exit status
of the parts, so one failing door fails the whole run."""

from __future__ import annotations

import os
import shutil
import sys
from types import ModuleType

from ops.probe import engine_doors, envelope_fuzz, gateway_doors, process_doors, queue_messages, tenant_shares


def main() -> int:
    parts: list[tuple[str, list[str], ModuleType]] = [
        ("queue messages on redis", ["--broker", "redis"], queue_messages)
    ]
    parts.append(("envelope fuzz on redis", ["--broker", "redis"], envelope_fuzz))
    if shutil.which("rabbitmq-server") or os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server"):
        parts.append(("queue messages on rabbitmq", ["--broker", "amqp"], queue_messages))
        parts.append(("envelope fuzz on rabbitmq", ["--broker", "amqp"], envelope_fuzz))
    parts.append(("process doors", [], process_doors))
    parts.append(("gateway doors", [], gateway_doors))
    parts.append(("tenant shares and passage bounds", [], tenant_shares))
    parts.append(("engine doors", [], engine_doors))
    worst = 0
    for title, argv, module in parts:
        print(f"== {title}", flush=True)
        status = int(module.main(argv))
        worst = max(worst, status)
    print(f"== probes {'passed' if worst == 0 else 'FAILED'}", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())
