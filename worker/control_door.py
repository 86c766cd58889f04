"""Remote control's door: a worker answers only the read-only commands rerankq's own tools send.

Celery's remote control is a broadcast over the broker (a fanout exchange, ``celery.pidbox``)
that every worker's main process answers, and anyone who can publish to the broker can send
it: ``rate_limit`` stalled every worker, ``shutdown`` made every worker exit with status 0,
``conf`` dumped the configuration, ``time_limit``, ``revoke``, ``cancel_consumer``,
``pool_shrink`` are there too. rerankq's tools send two commands, both read-only: ``ping`` and
``rerankq_worker`` (``rerankq inspect``, ``worker.remote_control``). A worker answers those and
the ones an operator names in ``RERANKQ_REMOTE_CONTROL_COMMANDS`` (Flower's ``stats``,
``active``, ...); every other command, and any control message that is not what Celery's own
client sends (a body that is not a map, a method that is not a name, arguments that are not a
map, a reply address outside the reply exchange, a ``pattern``/``matcher``), is refused: one
WARNING line (``control_command_refused``), one count (``reason=control``), and for a refused
command with a reply address an error reply that says so.

The hook is Celery's own: the consumer's ``Control`` bootstep builds this ``Pidbox``, whose
mailbox node is given only the allowed handlers, and which reads each message itself (kombu's
``on_message``) instead of letting kombu decode and dispatch it.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from celery import bootsteps
from celery.worker import pidbox
from celery.worker.consumer.control import Control as CeleryControl
from celery.worker.control import Panel

from kernel.errors import ConfigError
from kernel.settings import Settings, variable
from worker.refusal import Refused, log_refusal, quoted
from worker.remote_control import COMMAND as RERANKQ_WORKER

#: What rerankq's own tools send (``rerankq inspect``: ``rerankq_worker``; ``ping``), all read-only.
RERANKQ_COMMANDS = frozenset({"ping", RERANKQ_WORKER})

Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}(?![\s\S])")]
Short = Annotated[str, msgspec.Meta(max_length=300)]


class ReplyTo(msgspec.Struct, forbid_unknown_fields=True):
    exchange: str
    routing_key: Short


class ControlMessage(msgspec.Struct, forbid_unknown_fields=True):
    """What Celery's client (``kombu.pidbox.Mailbox._publish``) sends; rerankq's sends no pattern."""

    method: Name
    arguments: Annotated[dict[Name, Any], msgspec.Meta(max_length=16)] | None = None
    destination: Annotated[list[Short], msgspec.Meta(max_length=1000)] | None = None
    pattern: None = None
    matcher: None = None
    reply_to: ReplyTo | None = None
    ticket: Short | None = None


class ControlHeaders(msgspec.Struct, forbid_unknown_fields=True):
    clock: Annotated[int, msgspec.Meta(ge=0)] = 0
    expires: Annotated[float, msgspec.Meta(ge=0)] = 0


def allowed_commands(settings: Settings) -> frozenset[str]:
    return RERANKQ_COMMANDS | settings.worker.extra_control_commands()


def check_remote_control(settings: Settings) -> None:
    """Refuse, at start, a command name in ``RERANKQ_REMOTE_CONTROL_COMMANDS`` that Celery has not."""
    unknown = sorted(settings.worker.extra_control_commands() - set(Panel.data))
    if unknown:
        raise ConfigError(
            variable("worker.remote_control_commands"),
            f"{', '.join(unknown)}: not a Celery remote-control command (known: {', '.join(sorted(Panel.data))})",
        )


class GuardedPidbox(pidbox.Pidbox):  # type: ignore[misc]  # Celery's, unannotated
    """Celery's worker mailbox, answering only the allowed commands, each message checked first."""

    def __init__(self, c: Any) -> None:
        super().__init__(c)
        settings = getattr(c.app, "rerankq_settings", None)
        allowed = allowed_commands(settings) if settings is not None else RERANKQ_COMMANDS
        self.node.handlers = {name: Panel.data[name] for name in allowed if name in Panel.data}
        self.count_refusal = getattr(c, "count_refusal", lambda reason: None)

    def start(self, c: Any) -> None:
        super().start(c)
        # kombu hands the message to on_message undecoded, instead of decoding and
        # dispatching it (callbacks): the check below sees every message first.
        self.consumer.on_message = self.on_raw_message

    def on_raw_message(self, message: Any) -> None:
        try:
            checked = self.check(message)
        except Refused as refusal:
            log_refusal("control_command_refused", refusal)
            self.count_refusal(refusal.reason)
            return
        except Exception as exc:  # noqa: BLE001 - nothing of a message's making reaches the loop
            log_refusal("control_command_refused", Refused("control", f"unreadable: {type(exc).__name__}"))
            self.count_refusal("control")
            return
        if checked is None:
            return
        body, method_allowed = checked
        if not method_allowed:
            not_answered = Refused("control", f"command {body.method!r} is not one this worker answers")
            log_refusal("control_command_refused", not_answered, method=body.method)
            self.count_refusal("control")
            if body.reply_to is not None:
                self.node.reply(
                    {self.hostname: {"error": f"refused: {body.method!r} is not enabled on this worker"}},
                    exchange=body.reply_to.exchange,
                    routing_key=body.reply_to.routing_key,
                    ticket=body.ticket,
                )
            return
        self.on_message(
            {
                "method": body.method,
                "arguments": body.arguments or {},
                "reply_to": msgspec.to_builtins(body.reply_to) if body.reply_to else None,
                "ticket": body.ticket,
            },
            message,
        )

    def check(self, message: Any) -> tuple[ControlMessage, bool] | None:
        """The checked message and whether its command is allowed; None when it is for another worker."""
        refusal = getattr(message, "refusal", None)
        if refusal is not None:
            raise Refused("control", refusal.detail)
        try:
            msgspec.convert(message.headers, ControlHeaders)
        except msgspec.ValidationError as exc:
            raise Refused("control", f"headers: {str(exc)[:200]}") from None
        try:
            decoded = message.decode()
        except Exception as exc:  # noqa: BLE001 - a body kombu cannot decode is refused
            raise Refused("control", f"undecodable: {type(exc).__name__}") from None
        try:
            body = msgspec.convert(decoded, ControlMessage)
        except msgspec.ValidationError as exc:
            raise Refused("control", f"not a control message: {str(exc)[:200]}") from None
        if body.destination is not None and self.hostname not in body.destination:
            return None
        if body.reply_to is not None and body.reply_to.exchange != self.node.mailbox.reply_exchange.name:
            raise Refused("control", f"a reply to {quoted(body.reply_to.exchange, 60)}, not the reply exchange")
        if body.arguments and "state" in body.arguments:
            raise Refused("control", "an argument named state")
        return body, body.method in self.node.handlers


class Control(CeleryControl):  # type: ignore[misc]  # Celery's, unannotated
    """Celery's remote-control bootstep with the guarded mailbox (any pool: rerankq runs no green one)."""

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.is_green = False
        self.box = GuardedPidbox(c)
        self.start = self.box.start
        self.stop = self.box.stop
        self.shutdown = self.box.shutdown
        bootsteps.StartStopStep.__init__(self, c, **kwargs)
