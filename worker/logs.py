"""structlog set-up for workers: JSON or console lines, secrets redacted from every event."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

# Keys whose values never reach a log line, and URL passwords wherever they appear.
_SECRET_KEYS = re.compile(r"(api_?key|password|secret|token|authorization)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@\s]+)@", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._\-~+/=]+", re.IGNORECASE)


def redact_text(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _BEARER.sub(r"\1***", text)


def _redact(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEYS.search(str(k)) else _redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact(v) for v in value)
    return value


def redact_secrets(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    return {k: "***" if _SECRET_KEYS.search(k) else _redact(v) for k, v in event.items()}


def redact_rendered(logger: Any, method: str, rendered: Any) -> Any:
    """Runs after the renderer: tracebacks are formatted there, after redact_secrets saw the event."""
    return redact_text(rendered) if isinstance(rendered, str) else rendered


class _RedactingFormatter(logging.Formatter):
    """Scrubs the finished line, traceback included (the filter sees only the message)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class _RedactingFilter(logging.Filter):
    """Redacts stdlib records too (Celery, kombu and redis-py log URLs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_text(record.getMessage())
        record.args = None
        return True


def configure_logging(*, level: str = "INFO", json: bool = False) -> None:
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            renderer,
            redact_rendered,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RedactingFilter())
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
