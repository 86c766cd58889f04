"""What a task message must be before Celery acts on it: exactly what ``kernel.dispatch`` sends.

rerankq's dispatch calls Celery's ``send_task`` with a task id, a queue, a priority and one
header of its own (``rerankq_sent_at``); Celery's protocol 2 (``app.amqp.as_task_v2``) then
sends these headers, each with the one value (or type) rerankq's options give it:

======================  ==========================================  =================================
header                  rerankq sends                               accepted
======================  ==========================================  =================================
task                    ``rerankq.score_window``                    that name (else ``task``)
id, root_id             ``rq:<stream>:<window>:<nonce>``            a token of ``A-Z a-z 0-9 _ . : -``
parent_id               null, or the id of the window whose commit  null or such a token
                        released this one (sent from in a task)
eta                     null                                        null (else ``eta``)
expires, shadow         null                                        null
group, group_index      null                                        null
timelimit               ``[null, null]``                            ``[null, null]``
retries                 0                                           0
replaced_task_nesting   0                                           0
stamped_headers         null                                        null
stamps                  ``{}``                                      ``{}``
ignore_result           null                                        null
lang                    ``py``                                      ``py``
argsrepr, kwargsrepr    Celery's repr of the arguments              a string of up to 1,024 characters
origin                  ``gen<pid>@<host>``                         a string of up to 300 characters
rerankq_sent_at         epoch seconds                               a finite number >= 0
======================  ==========================================  =================================

plus what a broker adds on its own: kombu's Redis restore of an unacked message sets
``redelivered: true``, a RabbitMQ quorum queue sets ``x-delivery-count``. Any other header,
and any other value of these, is refused (``headers``): Celery's strategy and ``Request`` read
most of them (``stamped_headers: 5`` once crash-looped every worker from ``revoked()``;
``timelimit: [0.1, 0.05]`` had the pool kill every process that ran the window; ``expires``
that is not a date raised in Celery's consumer). The body must be ``[[stream_id, window], {},
embed]`` with nothing in ``embed`` (``body``), and the two arguments must name a window some
stream could have (``arguments``). What they name in Redis (a stream that exists, a window
it admitted) the store checks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from kombu.exceptions import ContentDisallowed

from kernel.celery_config import TASK_NAME
from kernel.errors import ValidationError
from kernel.ids import check_stream_id
from kernel.limits import MAX_STAGES
from worker.refusal import Refused, quoted

#: The task names a worker runs; every other name is refused.
RERANKQ_TASKS = frozenset({TASK_NAME})

TaskId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.:\-]{1,160}(?![\s\S])")]
Repr = Annotated[str, msgspec.Meta(max_length=1024)]
Origin = Annotated[str, msgspec.Meta(max_length=300)]
SentAt = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
Empty = Annotated[dict[str, Any], msgspec.Meta(max_length=0)]
DeliveryCount = Annotated[int, msgspec.Meta(ge=0)]


class TaskHeaders(msgspec.Struct, forbid_unknown_fields=True):
    """The protocol-2 headers of a rerankq task message, each exactly as rerankq sends it."""

    task: str
    id: TaskId
    lang: Literal["py"] = "py"
    shadow: None = None
    eta: None = None
    expires: None = None
    group: None = None
    group_index: None = None
    retries: Literal[0] = 0
    timelimit: tuple[None, None] = (None, None)
    root_id: TaskId | None = None
    # A window the fair share released is sent from inside the task that committed another.
    parent_id: TaskId | None = None
    argsrepr: Repr = ""
    kwargsrepr: Repr = ""
    origin: Origin = ""
    ignore_result: None = None
    replaced_task_nesting: Literal[0] = 0
    stamped_headers: None = None
    stamps: Empty = {}
    rerankq_sent_at: SentAt | None = None
    # Set by the broker, not the sender: kombu's Redis restore, RabbitMQ's quorum queues.
    redelivered: bool | None = None
    delivery_count: DeliveryCount | None = msgspec.field(default=None, name="x-delivery-count")


class Embed(msgspec.Struct, forbid_unknown_fields=True):
    """What Celery would run after, or around, the task: rerankq sends none of it."""

    callbacks: None = None
    errbacks: None = None
    chain: None = None
    chord: None = None


class TaskBody(msgspec.Struct, array_like=True):
    """``[[stream_id, window], {}, embed]``: what ``kernel.dispatch`` sends."""

    args: tuple[Any, Any]
    kwargs: dict[str, Any]
    embed: Embed | None


def valid_task_args(stream_id: object, window: object, max_candidates: int) -> bool:
    """A real stream id and a window number that some stream could have (not a bool, not negative;
    a cascade's later stages number their windows after the first stage's, ``kernel.windows``)."""
    try:
        check_stream_id(stream_id)  # type: ignore[arg-type]
    except ValidationError:
        return False
    return type(window) is int and 0 <= window < max_candidates * MAX_STAGES


def check_headers(raw: Any) -> TaskHeaders:
    if not isinstance(raw, dict):
        raise Refused("headers", f"headers that are not a map: {type(raw).__name__}")
    task = raw.get("task")
    if not isinstance(task, str) or task not in RERANKQ_TASKS:
        raise Refused("task", f"not a rerankq task: {quoted(task)}")
    if raw.get("eta") is not None:
        # A window is due now; a message for later would be held in memory, not acked,
        # and handed back at every shutdown until then.
        raise Refused("eta", f"a message due later ({quoted(raw.get('eta'), 40)}); rerankq sends none")
    try:
        return msgspec.convert(raw, TaskHeaders)
    except msgspec.ValidationError as exc:
        raise Refused("headers", f"not what rerankq sends: {str(exc)[:200]}") from None


def check_body(decoded: Any, max_candidates: int) -> TaskBody:
    # msgspec reads an array_like struct from the first elements and ignores the rest:
    # [[s, 0], {}, {}, 1] would pass and then fail Celery's unpacking of exactly three.
    if not isinstance(decoded, list) or len(decoded) != 3:
        raise Refused("body", f"not [[stream_id, window], {{}}, embed]: {quoted(decoded, 60)}")
    try:
        body = msgspec.convert(decoded, TaskBody)
    except msgspec.ValidationError as exc:
        raise Refused("body", f"not [[stream_id, window], {{}}, embed]: {str(exc)[:200]}") from None
    if body.kwargs:
        raise Refused("body", "keyword arguments; rerankq sends none")
    stream_id, window = body.args
    if not valid_task_args(stream_id, window, max_candidates):
        raise Refused("arguments", f"arguments that name no window: {quoted(body.args)}")
    return body


def check_task_message(message: Any, max_candidates: int) -> None:
    """Raise ``Refused`` unless ``message`` (a kombu message) is a rerankq task message."""
    check_headers(message.headers)
    try:
        decoded = message.decode()
    except ContentDisallowed as exc:
        raise Refused("content", str(exc)[:200]) from None
    except Exception as exc:  # noqa: BLE001 - any body kombu cannot decode is a bad body
        raise Refused("body", f"undecodable: {type(exc).__name__}") from None
    check_body(decoded, max_candidates)
