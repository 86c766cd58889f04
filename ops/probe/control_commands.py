"""Remote control from a client of the broker, against the probe's worker (``ops.probe.queue_messages``).

Any client that can publish to the broker can broadcast Celery's remote-control commands. Each
probe here sends one to the probe's worker alone (``destination``) the way Celery's own client
does (``app.control.broadcast``), or a control message Celery's client would never send, and
checks that the worker refused it (an error reply where one was asked for, one count of
``reason="control"``), stayed the same process and still scores windows. ``ping`` and
``rerankq_worker``, what rerankq's tools send, must be answered instead.

Every command Celery registers is sent, with the arguments that would do harm where it takes
some: ``rate_limit`` once stalled every worker (1/h), ``shutdown`` made it exit with status 0,
``conf`` dumped its configuration, ``cancel_consumer`` stopped it consuming its queue.
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable
from typing import Any

from celery import Celery

from kernel.celery_config import TASK_NAME, celery_config
from kernel.settings import load_settings
from ops.probe.queue_cases import JSON, UTF8, bz2_bomb

#: What rerankq's own tools send; the worker answers these.
ANSWERED = ("ping", "rerankq_worker")
CONTROL_EXCHANGE = "celery.pidbox"
REPLY_TIMEOUT_S = 3.0


def harmful_arguments(queue: str) -> dict[str, dict[str, Any]]:
    """Arguments for the commands that take some, each chosen to do harm if obeyed."""
    return {
        "rate_limit": {"task_name": TASK_NAME, "rate_limit": "1/h"},
        "time_limit": {"task_name": TASK_NAME, "soft": 0.01, "hard": 0.02},
        "cancel_consumer": {"queue": queue},
        "add_consumer": {"queue": queue + ".elsewhere"},
        "autoscale": {"max": 16, "min": 8},
        "pool_grow": {"n": 8},
        "pool_shrink": {"n": 1},
        "revoke": {"task_id": "rq:s_" + "0" * 32 + ":0:000000000000", "terminate": True},
        "terminate": {"signal": "SIGKILL", "task_id": "rq:s_" + "0" * 32 + ":0:000000000000"},
        "conf": {"with_defaults": True},
        "memdump": {"samples": 1},
        "query_task": {"ids": ["x"]},
    }


def celery_commands() -> list[str]:
    """Every remote-control command the worker's Celery has (rerankq's own included)."""
    from celery.worker.control import Panel

    import worker.remote_control  # noqa: F401 - registers rerankq_worker

    return sorted(Panel.meta)


class ControlClient:
    """A plain Celery client of the probe's broker, aiming at the probe's worker alone."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.app = Celery("probe-control", set_as_current=False)
        self.app.conf.update(celery_config(load_settings(probe.env)))

    def hostname(self) -> str:
        assert self.probe.worker is not None and self.probe.worker.proc is not None
        return f"rerankq-cpu-{self.probe.worker.proc.pid}@{socket.gethostname()}"

    def broadcast(self, command: str, arguments: dict[str, Any] | None = None, *, reply: bool = True) -> list[Any]:
        return (
            self.app.control.broadcast(
                command, arguments=arguments or {}, destination=[self.hostname()], reply=reply, timeout=REPLY_TIMEOUT_S
            )
            or []
        )

    def publish(
        self,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        content_type: str = JSON,
        routing_key: str | bytes = "",
    ) -> None:
        """A message on the control exchange as it is: whatever body and headers it is given."""
        from kombu import Producer

        exchange = self.app.control.mailbox.exchange
        with self.app.connection_for_write() as connection:
            Producer(connection.default_channel).publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                declare=[exchange],
                headers={"clock": 1, "expires": 0, **(headers or {})},
                content_type=content_type,
                content_encoding=UTF8,
                serializer=None,
            )

    def publish_to_redis_channel(self, data: bytes) -> None:
        """Raw data on the Redis channel kombu carries the control exchange on (Redis brokers)."""
        db = self.probe.raw.connection_pool.connection_kwargs.get("db", 0)
        self.probe.raw.publish(f"/{db}.{CONTROL_EXCHANGE}", data)

    def close(self) -> None:
        self.app.close()


def _refusal_replies(replies: list[Any], hostname: str) -> str | None:
    answers = [r[hostname] for r in replies if isinstance(r, dict) and hostname in r]
    if not answers:
        return None  # no reply: refused without one (or lost); the count decides
    if all(isinstance(a, dict) and "refused" in str(a.get("error", "")) for a in answers):
        return None
    return f"the worker answered {json.dumps(answers, default=str)[:200]}"


def control_probe_names(broker: str) -> list[str]:
    """The names ``control_probes`` gives its probes, in its order."""
    names = [f"control-{c}" for c in ANSWERED] + [f"control-{c}" for c in celery_commands() if c not in ANSWERED]
    names += [name for name, _, _ in _hostile_control_messages("worker@host", "queue")]
    names += ["control-compression-bz2-bomb"]
    names += ["control-redis-channel-not-json"] if broker == "redis" else ["control-routing-key-not-utf8"]
    return names


def _hostile_control_messages(hostname: str, queue: str) -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, body, publish options) for control messages Celery's client never sends."""

    def aimed(**fields: Any) -> dict[str, Any]:
        return {"method": "ping", "arguments": {}, "destination": [hostname], **fields}

    return [
        ("control-body-list", [1, 2], {}),
        ("control-body-not-json", b"\xff not json", {}),
        ("control-method-int", aimed(method=5), {}),
        ("control-method-unknown", aimed(method="no_such_command", reply_to=None), {}),
        ("control-arguments-list", aimed(arguments=[1]), {}),
        ("control-argument-state", aimed(arguments={"state": 1}), {}),
        ("control-reply-to-string", aimed(reply_to="x", ticket="t"), {}),
        # A reply the worker would publish into its own task queue.
        ("control-reply-to-task-queue", aimed(reply_to={"exchange": "", "routing_key": queue}, ticket="t"), {}),
        ("control-pattern-pcre", aimed(destination=None, pattern="(a+)+$", matcher="pcre"), {}),
        ("control-clock-string", aimed(), {"headers": {"clock": "x"}}),
        (
            "control-content-python-serialize",
            aimed(),
            {"content_type": "application/x-python-serialize"},
        ),  # refused: JSON only
    ]


class ControlRuns:
    """The runs of the remote-control probes, over one ControlClient of the probe's broker; each
    returns why the worker failed it, or None."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.client = ControlClient(probe)
        self.harmful = harmful_arguments(probe.queue_name)

    def refused(self, command: str) -> str | None:
        replies: list[Any] = []

        def send() -> None:
            replies.extend(self.client.broadcast(command, self.harmful.get(command)))

        why = self.probe.attempt(send, let_go=None, reason="control")
        return why or _refusal_replies(replies, self.client.hostname())

    def answered(self, command: str) -> str | None:
        replies = self.client.broadcast(command)
        answers = [r.get(self.client.hostname()) for r in replies if isinstance(r, dict)]
        if not answers or any(not isinstance(a, dict) or "error" in a for a in answers):
            return f"not answered: {json.dumps(replies, default=str)[:200]}"
        return None

    def hostile(self, name: str) -> str | None:
        # Built when run: the body names the worker's hostname, which changes if it restarts.
        [(body, options)] = [
            (b, o) for n, b, o in _hostile_control_messages(self.client.hostname(), self.probe.queue_name) if n == name
        ]
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.probe.attempt(lambda: self.client.publish(data, **options), let_go=None, reason="control")

    def bomb(self) -> str | None:
        return self.probe.attempt(
            lambda: self.client.publish(bz2_bomb(), headers={"compression": "application/x-bz2"}),
            let_go=None,
            reason="control",
        )

    def routing_key_not_utf8(self) -> str | None:
        # py-amqp decodes a delivery's routing key as UTF-8 in its frame reader; a publisher
        # picks it, and a fanout exchange (remote control's) delivers it to every worker. The
        # message itself is a ping: answered, nothing refused, so the check is that all lives.
        body = json.dumps({"method": "ping", "arguments": {}, "destination": [self.client.hostname()]}).encode()
        return self.probe.attempt(
            lambda: self.client.publish(body, routing_key=b"\xff\xfe"), let_go=None, refusals=0, reason="control"
        )

    def redis_not_json(self) -> str | None:
        return self.probe.attempt(
            lambda: self.client.publish_to_redis_channel(b"\xff not json"), let_go=None, reason="envelope"
        )


def control_probes(probe: Any) -> list[tuple[str, Callable[[], str | None]]]:
    """(name, run) for each remote-control probe; ``run()`` is why the worker failed it, or None."""
    control = ControlRuns(probe)
    runs: dict[str, Callable[[], str | None]] = {
        f"control-{c}": functools.partial(control.answered, c) for c in ANSWERED
    }
    runs.update({f"control-{c}": functools.partial(control.refused, c) for c in celery_commands() if c not in ANSWERED})
    runs.update({name: functools.partial(control.hostile, name) for name, _, _ in _hostile_control_messages("", "")})
    runs["control-compression-bz2-bomb"] = control.bomb
    runs["control-redis-channel-not-json"] = control.redis_not_json
    runs["control-routing-key-not-utf8"] = control.routing_key_not_utf8
    return [(name, runs[name]) for name in control_probe_names(probe.broker)]
