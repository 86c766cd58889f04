"""How the library logs: structlog events handed to stdlib ``logging``, configured by nobody here.

``producer`` runs inside other people's processes, so it never configures logging and
never prints: each event goes to the stdlib logger ``rerankq.<part>`` (structlog's stdlib
integration, with its own processors, so structlog's global configuration is not needed
and not touched). The host decides levels and handlers; with none configured, stdlib
shows warnings and errors on stderr and nothing else.

A record's message reads ``event key=value ...``; the same fields ride on the record as
``record.rerankq`` (a dict) and the event name as ``record.rerankq_event``, for hosts that
render structured logs (the worker does).
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from structlog.typing import EventDict, WrappedLogger


def _to_stdlib(logger: WrappedLogger, method: str, event_dict: EventDict) -> dict[str, Any]:
    event = str(event_dict.pop("event", ""))
    exc_info = event_dict.pop("exc_info", None)
    text = " ".join([event, *(f"{k}={v!r}" for k, v in event_dict.items())])
    kwargs: dict[str, Any] = {"msg": text, "extra": {"rerankq": event_dict, "rerankq_event": event}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return kwargs


class LevelCheckedLogger(structlog.stdlib.BoundLogger):
    """structlog's stdlib logger that asks the stdlib logger's level before anything else: a
    call at a level that is off returns at once (no event dict, no processors), where
    ``filter_by_level`` would drop it only inside the processor chain."""

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return super().debug(event, *args, **kw) if self._logger.isEnabledFor(logging.DEBUG) else None

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return super().info(event, *args, **kw) if self._logger.isEnabledFor(logging.INFO) else None

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return super().warning(event, *args, **kw) if self._logger.isEnabledFor(logging.WARNING) else None


def get_logger(name: str) -> Any:
    """A bound structlog logger over ``logging.getLogger(name)``; cheap when its level is off."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, _to_stdlib],
        wrapper_class=LevelCheckedLogger,
        # Built on first use and kept: its processors are its own, no global configuration
        # can change them, and rebuilding it per call is most of a call's cost.
        cache_logger_on_first_use=True,
    )
