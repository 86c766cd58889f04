"""Fuzz the whole envelope of a real message against a real worker: ``python -m ops.probe.envelope_fuzz``.

Takes real messages rerankq sent (one per one-window stream, taken out of the queue before the
worker starts), and for each case mutates one field of one of them by type: every header,
every property (on Redis, every field of kombu's envelope and of its ``delivery_info``; on
RabbitMQ, the AMQP properties), the body, and a field rerankq never sends, each set to an int,
a negative or 64-bit one, a float, a bool, a list, a map, null, an empty or huge string, text
in a bad encoding (a lone surrogate on Redis, raw bytes on RabbitMQ), or removed. Cases are
drawn from all of those with a fixed ``--seed``, ``--cases`` of them, and injected in batches
(there are about 480 on Redis and 490 on RabbitMQ: the default of 500 draws each once).

Each mutated message must be either served as the original (its window committed, ranked) or
refused and counted (``rerankq_task_messages_refused_total``), and the worker must stay the
same process: after each batch the windows served plus the refusals counted must equal the
batch, and nothing may be left waiting. A mutation the broker's client cannot send (an AMQP
property of the wrong type, a short string over 255 bytes) or the broker itself refuses (an
``expiration`` that is not a number, a ``user_id`` that is not the connection's) never reaches
the worker: it is skipped, and counted as "not sendable".

One line, ``probe envelope-fuzz: ok (...)`` or ``probe envelope-fuzz: FAIL ...`` followed by a
line for each failed batch naming its mutations; exit status non-zero on any failure.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.probe.queue_cases import TaskMessage
from ops.probe.queue_messages import NotSendable, QueueProbe, RedisQueue, refused_count

MISSING = object()
HUGE_CHARS = 100_000
#: Each value a field is set to, by type; ``MISSING`` removes the field.
VALUES: dict[str, Any] = {
    "int": 7,
    "negative": -1,
    "int64": 2**63,
    "float": 1.5,
    "bool": True,
    "list": [1, "x"],
    "empty-list": [],
    "map": {"a": 1},
    "empty-map": {},
    "null": None,
    "empty-string": "",
    "huge-string": "x" * HUGE_CHARS,
    "removed": MISSING,
}
#: Text a decoder may choke on: JSON carries a lone surrogate, AMQP raw bytes.
BAD_TEXT = {"redis": "\udcff\ud800", "amqp": b"\xff\xfe\x00"}
#: What rerankq never sends, added to the headers and properties.
FOREIGN = "x-fuzz"
#: The AMQP basic properties besides content type, encoding and headers (AMQP 0-9-1 has no others).
AMQP_PROPERTIES = (
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


@dataclass(frozen=True)
class Mutation:
    where: str  # headers, properties, delivery_info, envelope; amqp (its fields), amqp_properties
    key: str
    value_name: str

    def __str__(self) -> str:
        return f"{self.where}.{self.key}={self.value_name}"


@dataclass
class FuzzResult:
    cases: int = 0
    served: int = 0
    refused: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        summary = (
            f"{self.cases} cases: {self.served} served as the original, {self.refused} refused and counted, "
            f"{self.skipped} not sendable"
        )
        return f"probe envelope-fuzz: ok ({summary})" if not self.failures else f"probe envelope-fuzz: FAIL ({summary})"


def mutations(probe: QueueProbe, real: TaskMessage, seed: int) -> list[Mutation]:
    """Every (field, value) pair of a real message, shuffled by ``seed``."""
    values = [*VALUES, "bad-text"]
    fields: list[tuple[str, str]] = [("headers", key) for key in real.headers] + [("headers", FOREIGN)]
    if isinstance(probe.queue, RedisQueue):
        envelope = probe.queue.envelope
        fields += [("envelope", key) for key in envelope if key != "headers"]
        fields += [("properties", key) for key in envelope["properties"] if key != "delivery_info"]
        fields += [("properties", FOREIGN)]
        fields += [("delivery_info", key) for key in envelope["properties"]["delivery_info"]]
    else:
        fields += [("amqp", key) for key in ("content_type", "content_encoding", "body")]
        fields += [("amqp_properties", key) for key in AMQP_PROPERTIES]
    cases = [Mutation(where, key, value) for where, key in fields for value in values]
    random.Random(seed).shuffle(cases)
    return cases


def _value(name: str, broker: str) -> Any:
    return BAD_TEXT[broker] if name == "bad-text" else VALUES[name]


def _set(mapping: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = dict(mapping)
    if value is MISSING:
        out.pop(key, None)
    else:
        out[key] = value
    return out


def mutated(probe: QueueProbe, real: TaskMessage, mutation: Mutation) -> Any:
    """What to inject: ``real`` with one field mutated (a Redis list entry, or an AMQP message)."""
    import base64
    import dataclasses
    import json
    import uuid

    value = _value(mutation.value_name, probe.broker)
    headers = _set(real.headers, mutation.key, value) if mutation.where == "headers" else real.headers
    if isinstance(probe.queue, RedisQueue):
        envelope = {
            **probe.queue.envelope,
            "headers": headers,
            "content-type": real.content_type,
            "content-encoding": real.content_encoding,
            "body": base64.b64encode(real.body).decode(),
        }
        properties = {**envelope["properties"], "delivery_tag": str(uuid.uuid4())}
        if mutation.where == "delivery_info":
            properties["delivery_info"] = _set(properties["delivery_info"], mutation.key, value)
        elif mutation.where == "properties":
            properties = _set(properties, mutation.key, value)
        envelope["properties"] = properties
        if mutation.where == "envelope":
            envelope = _set(envelope, mutation.key, value)
        return json.dumps(envelope).encode("utf-8", "surrogatepass")
    message = dataclasses.replace(real, headers=headers)
    if mutation.where == "amqp":
        message = dataclasses.replace(message, **{mutation.key: b"" if value is MISSING else value})
    elif mutation.where == "amqp_properties":
        message = dataclasses.replace(message, properties=_set(real.properties, mutation.key, value))
    return message


def _served(probe: QueueProbe, stream: str) -> bool:
    window = probe.client.status(stream).windows[0]
    return window.state == "committed" and not window.failed


def run_batch(probe: QueueProbe, batch: list[tuple[Mutation, str, TaskMessage]], result: FuzzResult) -> None:
    assert probe.worker is not None and probe.worker.proc is not None
    pid = probe.worker.proc.pid
    before = refused_count(probe.metrics_port)
    sent: list[tuple[Mutation, str]] = []
    for mutation, stream, real in batch:
        try:
            probe.queue.inject(mutated(probe, real, mutation))
        except NotSendable:
            result.skipped += 1
            continue
        sent.append((mutation, stream))
    result.cases += len(batch)
    deadline = time.monotonic() + probe.timeout_s
    served: list[Mutation] = []
    refused = 0.0
    while time.monotonic() < deadline:
        served = [m for m, stream in sent if _served(probe, stream)]
        refused = refused_count(probe.metrics_port) - before
        if len(served) + refused >= len(sent) or not probe.worker_alive():
            break
        time.sleep(0.1)
    why = None
    if not probe.worker_alive() or probe.worker.proc is None or probe.worker.proc.pid != pid:
        why = "the worker exited"
    elif len(served) + refused != len(sent):
        why = f"{len(served)} served + {refused:.0f} refused of {len(sent)} sent"
    elif not probe.good_window_scored():
        why = "a good window sent after the batch was not scored"
    result.served += len(served)
    result.refused += int(refused)
    if why is not None:
        result.failures.append(f"  batch FAIL {why}: {', '.join(str(m) for m, _ in sent)}")
        if not probe.worker_alive():
            probe.restart_worker()


def fuzz(probe: QueueProbe, *, cases: int, seed: int, batch_size: int = 20) -> FuzzResult:
    """Open ``cases`` one-window streams, start the worker, inject one mutant of each stream's
    real message per case. The probe's worker must not be running yet."""
    reals = probe.take_real_messages(cases)
    probe.start_worker()
    result = FuzzResult()
    if not probe.good_window_scored():
        result.failures.append("  the worker scores no window")
        return result
    drawn = mutations(probe, reals[0][1], seed)
    planned = [(drawn[i % len(drawn)], stream, real) for i, (stream, real) in enumerate(reals)]
    for start in range(0, len(planned), batch_size):
        run_batch(probe, planned[start : start + batch_size], result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.probe.envelope_fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    parser.add_argument(
        "--cases",
        type=int,
        default=500,
        help="mutated messages to inject, one stream each (500: every mutation once, on either broker)",
    )
    parser.add_argument("--seed", type=int, default=31, help="which mutations are drawn, in which order")
    parser.add_argument("--batch", type=int, default=20, help="mutated messages injected before each check")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="how long a batch may take to be handled")
    args = parser.parse_args(argv)
    if not 1 <= args.cases <= 2000:
        parser.error("--cases must be 1-2000")
    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")
    directory = Path(tempfile.mkdtemp(prefix="rerankq-probe-fuzz-"))
    with QueueProbe(directory, args.timeout_s, args.broker) as probe:
        result = fuzz(probe, cases=args.cases, seed=args.seed, batch_size=args.batch)
    print(result.line(), flush=True)
    for failure in result.failures:
        print(failure, flush=True)
    if result.failures:
        print(f"logs: {directory}")
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
