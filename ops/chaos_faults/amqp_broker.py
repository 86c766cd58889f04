"""``ops/chaos.py --broker amqp``: the chaos run with RabbitMQ as the broker, Redis the store.

A private RabbitMQ node (``devservers.rabbitmq_server``) beside the private Redis, and
the broker's faults:

- the node restarted, cleanly (SIGTERM) or crashed (SIGKILL) and started again on its data:
  workers lose their connections (their unacked messages go back to the queues), readers'
  sends fail until it is back (their windows are marked due and the sweep sends them);
- a lost message: one waiting message taken off a lane queue and acknowledged, so RabbitMQ
  forgets it. Windows this module ever copied are put back instead (a copy would stand in
  for the loss). Its queued mark stays, so only the sweep's age rule
  (``RERANKQ_QUEUED_MAX_AGE_S``, short here) recovers it;
- a duplicate: an exact copy (same task id) of a message still waiting, published beside it,
  or a fresh message for a committed window.

Nothing here helps recovery: a message is only ever removed, copied while its original waits,
or put back where it was.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import amqp
from kombu import Connection

from devservers.rabbitmq_server import EmbeddedRabbitMQ
from kernel.amqp_broker import consumed_queues
from kernel.dispatch import Dispatcher

_WINDOW = re.compile(r"^rq:([^:]+):(\d+):")
#: A lost message is re-sent once its queued mark is this old: well inside the drain.
QUEUED_MAX_AGE_S = 8
#: The broker's faults and their share of the draws, beside the run's own.
FAULTS = {"rabbitmq_restart": 1, "rabbitmq_sigkill": 1}

Window = tuple[str, int]


class AmqpQueueFaults:
    """Lost and duplicate messages on RabbitMQ lane queues (``basic.get`` one, then ack, copy or put back)."""

    def __init__(self, url: str, queues: list[str], dispatcher: Dispatcher) -> None:
        self.url = url
        self.names = consumed_queues(queues)
        self.dispatcher = dispatcher
        self.copied: set[Window] = set()
        self._connection: Connection | None = None

    def _channel(self):  # type: ignore[no-untyped-def]
        if self._connection is None:
            self._connection = Connection(self.url, connect_timeout=2)
        return self._connection.default_channel

    def _reset(self) -> None:
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # noqa: BLE001 - a dead connection is dropped either way
                pass
        self._connection = None

    def _take(self, rng: random.Random) -> tuple[object, amqp.Message, str, Window] | None:
        """One waiting message, held unacked (no worker can get it meanwhile), with its window."""
        try:
            channel = self._channel()
            for name in rng.sample(self.names, len(self.names)):
                message = channel.basic_get(name, no_ack=False)
                if message is None:
                    continue
                headers = message.properties.get("application_headers") or {}
                match = _WINDOW.match(str(headers.get("id", "")))
                if match is None:
                    channel.basic_reject(message.delivery_tag, requeue=True)
                    continue
                return channel, message, name, (match.group(1), int(match.group(2)))
        except (OSError, amqp.exceptions.AMQPError, Exception):  # noqa: BLE001 - the node may be restarting
            self._reset()
        return None

    def lose_one(self, rng: random.Random) -> Window | None:
        taken = self._take(rng)
        if taken is None:
            return None
        channel, message, _, window = taken
        try:
            if window in self.copied:
                channel.basic_reject(message.delivery_tag, requeue=True)  # type: ignore[attr-defined]
                return None
            channel.basic_ack(message.delivery_tag)  # type: ignore[attr-defined]
            return window
        except Exception:  # noqa: BLE001 - unacked on a dead channel: RabbitMQ puts it back
            self._reset()
            return None

    def copy_waiting(self, rng: random.Random) -> Window | None:
        taken = self._take(rng)
        if taken is None:
            return None
        channel, message, name, window = taken
        try:
            self.copied.add(window)
            copy = amqp.Message(message.body, **message.properties)
            channel.basic_publish(copy, exchange="", routing_key=name)  # type: ignore[attr-defined]
            channel.basic_reject(message.delivery_tag, requeue=True)  # type: ignore[attr-defined]
            return window
        except Exception:  # noqa: BLE001
            self._reset()
            return None

    def resend_committed(self, window: Window, device: str = "cpu") -> Window:
        self.dispatcher.send(window[0], [window[1]], device)
        return window


class AmqpBroker:
    """The run's RabbitMQ node and the faults that act on it."""

    def __init__(self, log_dir: Path) -> None:
        self.node = EmbeddedRabbitMQ(directory=str(log_dir / "rabbitmq"))

    def start(self) -> AmqpBroker:
        self.node.start(timeout_s=120)
        return self

    def configure(self, env: dict[str, str]) -> None:
        env["RERANKQ_BROKER_URL"] = self.node.url
        env["RERANKQ_QUEUED_MAX_AGE_S"] = str(QUEUED_MAX_AGE_S)

    def queue_faults(self, queues: list[str], dispatcher: Dispatcher) -> AmqpQueueFaults:
        return AmqpQueueFaults(self.node.url, queues, dispatcher)

    def faults(self) -> dict[str, tuple[int, Callable[[], str | None]]]:
        return {
            "rabbitmq_restart": (FAULTS["rabbitmq_restart"], self.restart),
            "rabbitmq_sigkill": (FAULTS["rabbitmq_sigkill"], self.crash),
        }

    def restart(self) -> str:
        self.node.restart(crash=False)
        return "rabbitmq_restart"

    def crash(self) -> str:
        self.node.restart(crash=True)
        return "rabbitmq_sigkill"

    def stop(self) -> None:
        self.node.stop()
