"""Logging for the worker process (an application, so it may configure logging; the library may not).

Everything goes through stdlib ``logging`` and one formatter: the worker's structlog events,
the library's events (``kernel.logs``: stdlib records carrying their fields), and Celery's,
kombu's and redis-py's records. Console or JSON lines, secrets redacted from every event and
from the finished line (tracebacks included).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from typing import Any

import structlog
from structlog.typing import EventDict

from kernel.logs import LevelCheckedLogger
from kernel.masking import mask_text

# Keys whose values never reach a log line; in text, what kernel.masking masks everywhere
# (URL credentials, secret query values, Bearer tokens).
_SECRET_KEYS = re.compile(r"(api_?key|password|secret|token|authorization)", re.IGNORECASE)


#: One masking for every line, the worker's, the gateway's and every command's message.
redact_text = mask_text


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEYS.search(str(k)) else _redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact(v) for v in value)
    return value


@functools.lru_cache(maxsize=1024)
def _secret_key(key: str) -> bool:
    # Keys are the code's own few names (and a host's): decided once each.
    return bool(_SECRET_KEYS.search(key))


def redact_secrets(logger: Any, method: str, event: EventDict) -> EventDict:
    return {k: "***" if _secret_key(k) else _redact(v) for k, v in event.items()}


def redact_rendered(logger: Any, method: str, rendered: Any) -> Any:
    """Runs after the renderer: tracebacks are formatted there, after redact_secrets saw the event."""
    return redact_text(rendered) if isinstance(rendered, str) else rendered


def lift_library_fields(logger: Any, method: str, event: EventDict) -> EventDict:
    """A library record (``kernel.logs``) becomes its event and fields again, not a flat message."""
    record = event.get("_record")
    name = getattr(record, "rerankq_event", None)
    if name is not None:
        event["event"] = name
        event.update(getattr(record, "rerankq", {}))
    return event


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def log_formatter(*, json: bool = False) -> logging.Formatter:
    """The one formatter every record goes through: structlog's, the library's and stdlib's."""
    render: list[Any] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if json
        # Plain tracebacks: a rich one prints every frame's locals, API keys included.
        else [structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)]
    )
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[lift_library_fields, *_shared_processors()[1:]],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            redact_secrets,
            *render,
            redact_rendered,
        ],
    )


def configure_logging(*, level: str = "INFO", json: bool = False) -> None:
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=LevelCheckedLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter(json=json))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def stdlib_host_logging(level: str) -> None:
    """Plain stdlib records on stderr at ``level``, for the gateway and the exporter run as
    ``rerankq serve`` / ``rerankq exporter`` (the host decides; their producer modules never do)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    if logging.getLevelName(level) != logging.DEBUG:
        # The library logs every stream it opens at INFO: behind the gateway, a line per request.
        logging.getLogger("rerankq.producer").setLevel(logging.WARNING)
