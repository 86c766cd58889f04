"""Where streams live and how work reaches the workers: the Redis store and the Celery broker."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

import msgspec

from kernel.errors import ConfigError
from kernel.settings.types import Name, doc


class StoreSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    redis_url: Annotated[
        str | None,
        doc(
            "the store: redis://, rediss:// (TLS), unix://, redis+sentinel:// or "
            "redis+cluster://; a password in the URL is never logged"
        ),
    ] = None
    broker_url: Annotated[
        str | None,
        doc(
            "the Celery broker, if it differs from the store (required with "
            "redis+cluster://): another Redis, redis+sentinel://, amqp://, "
            "amqps://"
        ),
    ] = None
    namespace: Annotated[Name, doc("prefix of every key rerankq writes")] = "rerankq"

    @property
    def broker(self) -> str:
        url = self.broker_url or self.redis_url
        if not url:
            raise ConfigError("RERANKQ_REDIS_URL", "is not set")
        return url

    @property
    def broker_kind(self) -> Literal["redis", "amqp"]:
        """Which broker Celery talks to: ``amqp`` (RabbitMQ) or ``redis``."""
        url = self.broker_url or self.redis_url or ""
        return "amqp" if re.match(r"^(amqp|amqps|pyamqp)://", url) else "redis"
