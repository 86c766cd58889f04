"""What a command prints when Redis, the broker or the project says no: one line that names what
was tried and what to do, never a traceback.

``explain`` turns the errors a command can meet into that line (None for anything else: a bug
keeps its traceback). Command-line words only: the variables to check, not Python arguments.
"""

from __future__ import annotations

import os

import redis
from kombu.exceptions import OperationalError

from kernel.errors import RerankqError, StoreError, mask_url

CHECK = "check RERANKQ_REDIS_URL (and RERANKQ_BROKER_URL, RERANKQ_CONFIG_FILE) and that the server runs there"


#: A package a command imports only where its extra is installed -> that extra (pyproject.toml).
EXTRA_OF = {
    "torch": "worker",
    "transformers": "worker",
    "sentence_transformers": "worker",
    "starlette": "gateway",
    "uvicorn": "gateway",
    "ir_measures": "eval",
    "matplotlib": "eval",
    "sklearn": "eval",
}


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """``No module named 'starlette'`` in words: the extra that brings it."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    return f"{top} is not installed, and this command needs it: pip install 'rerankq[{extra}]'"


def _urls() -> str:
    """The store and broker URLs this command was configured with, passwords masked."""
    try:
        from kernel.settings import load_settings

        settings = load_settings()
        store, broker = settings.store.redis_url, settings.store.broker_url or settings.store.redis_url
    except Exception:  # the settings themselves may be what is wrong; fall back to the raw variables
        store = os.environ.get("RERANKQ_REDIS_URL")
        broker = os.environ.get("RERANKQ_BROKER_URL") or store
    if broker and broker != store:
        return f"store {mask_url(store)}, broker {mask_url(broker)}"
    return mask_url(store)


def store_trouble(exc: StoreError) -> str:
    """A store error in command-line words: what failed at which URL, and what to check.

    The library's advice speaks of idempotency keys; a command sets its own (``submit``) or
    only reads, so it is replaced by what a person at the command line can do.
    """
    return f"{exc.problem}; {CHECK}"


def explain(exc: BaseException) -> str | None:
    """One line for an error a command should report rather than crash on; None otherwise."""
    if isinstance(exc, StoreError):
        return store_trouble(exc)
    if isinstance(exc, ModuleNotFoundError):
        return missing_extra(exc)
    if isinstance(exc, RerankqError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return f"Redis is full (maxmemory reached) at {_urls()}: free memory or raise maxmemory"
    if isinstance(exc, (redis.RedisError, OperationalError, ConnectionError, TimeoutError)):
        return f"cannot reach Redis or the broker ({type(exc).__name__}) at {_urls()}; {CHECK}"
    return None
