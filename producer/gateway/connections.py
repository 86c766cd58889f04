"""Bounds on a connection before any route sees it: header size, header time, and a log
line without secrets.

uvicorn's httptools protocol reads a request head of any size and waits for it forever: a
64 MB ``Authorization`` header is buffered whole before authentication can refuse it, and a
connection that sends nothing, or a byte a second, is held open indefinitely (its keep-alive
timeout starts only after a response). ``GuardedHttpTools`` adds what it lacks:

- **Head size**: the request line and headers may take at most
  ``RERANKQ_GATEWAY_MAX_HEADER_BYTES``; the bytes are counted as they arrive, before the
  parser buffers them, and past the bound the answer is 431 and the connection is closed.
- **Head time**: a request head must be complete within ``RERANKQ_GATEWAY_HEADER_TIMEOUT_S``
  of the connection opening or of its previous response; else 408 and the connection is
  closed. Between requests uvicorn's own keep-alive timeout (``RERANKQ_GATEWAY_KEEP_ALIVE_S``)
  closes an idle connection sooner.
- **Access log**: with ``--access-log``, the values of secret-looking query parameters
  (``api_key``, ``x_api_key``, ``token``, ``bearer``, ``key[]``, ...) are masked in the line
  uvicorn writes, by the masking every other log line and message uses (``kernel.masking``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kernel.masking import mask_text
from producer.gateway.config import GatewaySettings

_END_OF_HEAD = b"\r\n\r\n"


class MaskingAccessLogger:
    """uvicorn's access logger, its path argument masked (``"%s - "%s %s HTTP/%s" %d"``)."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        self.logger.info(message, *(mask_text(a) if isinstance(a, str) else a for a in args), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


def _status(code: int, reason: str, message: str) -> bytes:
    body = message.encode()
    return (
        f"HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded request head (size and time) and a masked access log."""

    max_header_bytes = 32 * 1024
    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.access_logger = MaskingAccessLogger(self.access_logger)  # type: ignore[assignment]
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_timer: asyncio.TimerHandle | None = None

    # -- the head's time ------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408, "Request Timeout", "the request headers did not arrive in time")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        # The next bytes start the next request's head (keep-alive or pipelined).
        self._in_head, self._head_bytes, self._tail = True, 0, b""
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._in_head and not self.transport.is_closing():
            self._arm_head_timer()

    # -- the head's size ------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused: what else arrives is not read
        if self._in_head:
            # Count only the head's bytes: a chunk may carry the start of the body too.
            window = self._tail + data
            end = window.find(_END_OF_HEAD)
            counted = len(data) if end < 0 else max(0, end + len(_END_OF_HEAD) - len(self._tail))
            self._head_bytes += counted
            if self._head_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"the request headers are over the limit of {self.max_header_bytes} bytes",
                )
                return
            self._tail = window[-(len(_END_OF_HEAD) - 1) :]
        super().data_received(data)

    def _refuse(self, code: int, reason: str, message: str) -> None:
        self._disarm_head_timer()
        self.transport.write(_status(code, reason, message))
        self.transport.close()
        self.parser = None  # type: ignore[assignment]

    # -- configured -----------------------------------------------------------

    @classmethod
    def bounded(cls, config: GatewaySettings) -> type[GuardedHttpTools]:
        """The protocol with ``config``'s bounds (uvicorn builds one per connection from the class)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "max_header_bytes": config.max_header_bytes,
                "header_timeout_s": config.header_timeout_s,
                "__module__": cls.__module__,
            },
        )


class GuardedHttpToolsFromEnvironment(GuardedHttpTools):
    """The protocol as ``RERANKQ_GATEWAY_*`` bounds it: what each process of a multi-process
    server imports by name (a class made at run time cannot travel to a spawned process)."""

    _loaded = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        if not cls._loaded:
            from producer.gateway.config import load_gateway_settings

            config = load_gateway_settings()
            cls.max_header_bytes, cls.header_timeout_s, cls._loaded = (
                config.max_header_bytes,
                config.header_timeout_s,
                True,
            )
        super().__init__(*args, **kwargs)
