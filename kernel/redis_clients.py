"""Every Redis client rerankq opens, for every deployment shape, built in this one place.

URLs, for the store (``RERANKQ_REDIS_URL``) and the broker (``RERANKQ_BROKER_URL``):

- ``redis://``, ``rediss://`` (TLS), ``unix://``: one Redis server.
- ``redis+sentinel://[:password@]host:port[,host:port...]/<service>[/<db>]``: Redis Sentinel.
  Every sentinel is listed; the client asks them for the service's master on every new
  connection and reconnects to the new master after a failover (a write that meets the old
  master, demoted, is retried there). ``?sentinel_password=`` when the sentinels have their
  own password. Store and broker both.
- ``redis+cluster://[:password@]host:port[,host:port...]``: Redis Cluster, the store only
  (Celery has no Redis Cluster transport). Any reachable nodes bootstrap the slot map; reads
  go to masters only (a replica's read could miss a write a reader saw acknowledged).

Each new connection checks the server's version (``MIN_REDIS_VERSION``), so an unsupported
Redis is refused with a clear error on first use rather than failing inside a script.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from kernel.errors import ConfigError, UnsupportedRedis

#: The oldest server the scripts run on (ZADD GT, XADD MAXLEN ~); Valkey reports a redis_version too.
MIN_REDIS_VERSION = (6, 2)
#: The longest blocking read a client makes (``XREAD BLOCK`` on a stream's event log).
BLOCK_CHUNK_S = 5.0


class NoReplicasError(redis.ConnectionError):
    """The master refused a write with ``NOREPLICAS``: fewer replicas in sync than its
    ``min-replicas-to-write`` (its replica was promoted, is resyncing, or is cut off). Redis
    refuses before the command runs - a script, at its first write, so it wrote nothing. A
    connection error, so the client drops the connection and its retry asks Sentinel again for
    the master: after a failover that finds the promoted replica."""


def is_no_replicas(exc: BaseException) -> bool:
    """Whether a Redis error is a ``NOREPLICAS`` refusal: plain, inside a script's error (Redis
    6.2: ``Error running script ... -NOREPLICAS``), or a pipeline's (``... caused error: NOREPLICAS``)."""
    return isinstance(exc, redis.ResponseError) and "NOREPLICAS" in str(exc)


class _RefusalReconnects:
    """A connection that turns ``NOREPLICAS`` into ``NoReplicasError`` after dropping itself
    (the way redis-py's Sentinel connection treats READONLY): the old master of a failover
    refuses writes as soon as its replica leaves it, seconds before the sentinels demote it."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ResponseError as exc:
            if not is_no_replicas(exc):
                raise
            self.disconnect()  # type: ignore[attr-defined]
            raise NoReplicasError(
                "the master refused a write: not enough replicas in sync (NOREPLICAS); nothing was written"
            ) from exc


_C = TypeVar("_C")
_REFUSAL_CLASSES: dict[type, type] = {}


def refusal_reconnects(connection_class: type[_C]) -> type[_C]:
    """``connection_class`` with ``NOREPLICAS`` handled as ``_RefusalReconnects`` says (cached per class)."""
    if issubclass(connection_class, _RefusalReconnects):
        return connection_class
    if connection_class not in _REFUSAL_CLASSES:
        _REFUSAL_CLASSES[connection_class] = type(
            f"RefusalReconnects{connection_class.__name__}", (_RefusalReconnects, connection_class), {}
        )
    refusing: type[_C] = _REFUSAL_CLASSES[connection_class]
    return refusing


def _reconnect_on_refusal(client: redis.Redis) -> redis.Redis:
    pool = client.connection_pool
    pool.connection_class = refusal_reconnects(pool.connection_class)
    return client


#: What a store raises while it cannot serve for a moment: unreachable, timed out, a master
#: refusing writes for want of replicas in sync (``NoReplicasError``, a ``ConnectionError``), or,
#: on a cluster, a slot without a master during a failover (CLUSTERDOWN, TRYAGAIN, not covered).
#: Callers treat them alike: wait within their deadline, or report the store unavailable.
UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)

SINGLE_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
STORE_SCHEMES = (*SINGLE_SCHEMES, SENTINEL_SCHEME, CLUSTER_SCHEME)
BROKER_REDIS_SCHEMES = (*SINGLE_SCHEMES, SENTINEL_SCHEME)


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_cluster(url: str | None) -> bool:
    return bool(url) and scheme(url or "") == CLUSTER_SCHEME


def is_sentinel(url: str | None) -> bool:
    return bool(url) and scheme(url or "") == SENTINEL_SCHEME


def is_redis_broker(url: str) -> bool:
    """Whether a broker URL is a Redis (one server or Sentinel) whose lists rerankq can read."""
    return scheme(url) in BROKER_REDIS_SCHEMES


@dataclass(frozen=True)
class MultiHostUrl:
    """A ``redis+sentinel://`` or ``redis+cluster://`` URL, parsed."""

    hosts: list[tuple[str, int]]
    username: str | None
    password: str | None
    service: str | None
    db: int
    query: dict[str, str]


def parse_multi_host(url: str, field: str = "RERANKQ_REDIS_URL") -> MultiHostUrl:
    """Parse a multi-host URL; a bad one is a ``ConfigError`` naming ``field`` (never the password)."""
    kind = scheme(url)
    parts = urlsplit(url)
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, secret = auth.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) or None)
    hosts = []
    for item in netloc.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(field, f"{kind}:// needs host:port[,host:port...], got {item.strip()!r}")
        hosts.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    service = None
    if kind == SENTINEL_SCHEME:
        if not path:
            raise ConfigError(
                field, "redis+sentinel:// needs the service name: redis+sentinel://host:port,host:port/<service>[/<db>]"
            )
        service, path = path[0], path[1:]
    if len(path) > 1 or (path and not path[0].isdigit()):
        raise ConfigError(
            field, f"{kind}:// takes at most a database number after the {'service' if service else 'hosts'}"
        )
    db = int(path[0]) if path else 0
    if kind == CLUSTER_SCHEME and db != 0:
        raise ConfigError(field, "Redis Cluster has database 0 only")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return MultiHostUrl(hosts=hosts, username=username, password=password, service=service, db=db, query=query)


def check_url(url: str, field: str, *, broker: bool) -> None:
    """The settings' check of a store or broker URL (``kernel.settings``)."""
    kind = scheme(url)
    if broker:
        if kind == CLUSTER_SCHEME:
            raise ConfigError(
                field,
                "Celery has no Redis Cluster transport: use one Redis, redis+sentinel://, "
                "or amqp:// for the broker, and keep redis+cluster:// for RERANKQ_REDIS_URL",
            )
        if kind == "sentinel":
            raise ConfigError(field, "write Sentinel as redis+sentinel://host:port[,host:port]/<service>[/<db>]")
        if kind not in BROKER_REDIS_SCHEMES and kind not in ("amqp", "amqps", "pyamqp"):
            raise ConfigError(field, "must be a redis://, rediss://, unix://, redis+sentinel:// or amqp:// URL")
    elif kind not in STORE_SCHEMES:
        if kind == "sentinel":
            raise ConfigError(field, "write Sentinel as redis+sentinel://host:port[,host:port]/<service>[/<db>]")
        raise ConfigError(field, "must be a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL")
    if kind in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        parse_multi_host(url, field)


# -- the version check ------------------------------------------------------------------------


def server_version(info: str) -> tuple[int, ...]:
    for line in info.splitlines():
        if line.startswith("redis_version:"):
            return tuple(int(part) for part in line.split(":", 1)[1].strip().split(".")[:3] if part.isdigit())
    return ()


def _refuse_old(version: tuple[int, ...]) -> None:
    if version and version < MIN_REDIS_VERSION:
        found = ".".join(map(str, version))
        raise UnsupportedRedis(
            f"Redis {found} is older than {'.'.join(map(str, MIN_REDIS_VERSION))}, "
            "the oldest rerankq runs on (Valkey 7.2+ works too)"
        )


def _check_version_on_connect(connection: Any) -> None:
    """Runs on every new connection, after the handshake: refuse a server the scripts cannot run on."""
    connection.on_connect()
    connection.send_command("INFO", "server")
    raw = connection.read_response()
    info = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        _refuse_old(server_version(info))
    except UnsupportedRedis:
        connection.disconnect()  # redis-py cleans up after its own errors only
        raise


def _check_master_on_connect(connection: Any) -> None:
    """The version check, then that the server is a master: a sentinel that has not yet heard
    of a failover still names the old master, which may already be a replica serving stale
    reads (or, not yet demoted, taking writes its successor will never see). Refusing it
    makes the client retry, asking the sentinels again."""
    _check_version_on_connect(connection)
    connection.send_command("ROLE")
    role = connection.read_response()
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    if kind != "master":
        connection.disconnect()
        raise redis.ConnectionError(f"the server Sentinel named is a {kind}, not the master (a failover under way)")


# -- synchronous clients -----------------------------------------------------------------------


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=5)


def _common(**extra: Any) -> dict[str, Any]:
    return {
        "retry": _retry(),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        # Above the longest blocking read, so a wait is never cut short.
        "socket_timeout": BLOCK_CHUNK_S + 10,
        "socket_connect_timeout": 5,
        **extra,
    }


def store_client(url: str, **overrides: Any) -> Any:
    """The store's client: ``redis.Redis`` (one server, or the master a Sentinel names) or
    ``redis.cluster.RedisCluster``. ``overrides`` replace the socket and retry settings."""
    kind = scheme(url)
    if kind == CLUSTER_SCHEME:
        return _cluster_client(url, **overrides)
    if kind == SENTINEL_SCHEME:
        return _sentinel_client(url, **overrides)
    options = _common(health_check_interval=30, redis_connect_func=_check_version_on_connect)
    options.update(overrides)
    return _reconnect_on_refusal(redis.Redis.from_url(url, **options))


def broker_client(url: str, **overrides: Any) -> redis.Redis:
    """A client of a Redis broker (one server, or Sentinel's master), for reading its queues."""
    if scheme(url) == CLUSTER_SCHEME:
        raise ConfigError("RERANKQ_BROKER_URL", "Celery has no Redis Cluster transport")
    client: redis.Redis = store_client(url, **overrides)  # not a cluster: checked above
    return client


def health_client(url: str) -> Any:
    """A client whose calls give up quickly (2 s, no retries): for health checks and probes,
    which must answer within an orchestrator's timeout even when Redis does not."""
    return store_client(
        url,
        socket_timeout=2,
        socket_connect_timeout=2,
        retry_on_timeout=False,
        retry=Retry(ExponentialBackoff(), retries=0),
        retry_on_error=[],
    )


def _sentinel_client(url: str, **overrides: Any) -> redis.Redis:
    parsed = parse_multi_host(url)
    options = _common(health_check_interval=30, redis_connect_func=_check_master_on_connect)
    options.update(overrides)
    sentinel_password = parsed.query.get("sentinel_password")
    sentinel = redis.sentinel.Sentinel(
        parsed.hosts,
        sentinel_kwargs={
            "socket_timeout": 2,
            "socket_connect_timeout": 2,
            **({"password": sentinel_password} if sentinel_password else {}),
        },
    )
    assert parsed.service is not None  # parse_multi_host refuses a Sentinel URL without one
    return _reconnect_on_refusal(
        sentinel.master_for(
            parsed.service,
            redis_class=redis.Redis,
            db=parsed.db,
            username=parsed.username,
            password=parsed.password,
            **options,
        )
    )


def _cluster_client(url: str, **overrides: Any) -> redis.cluster.RedisCluster:
    parsed = parse_multi_host(url)
    options = _common(redis_connect_func=_check_version_on_connect)
    options.update(overrides)
    options.pop("retry_on_error", None)  # the cluster client retries connection errors itself
    options.pop("health_check_interval", None)
    retry = options.pop("retry", _retry())
    return redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in parsed.hosts],
        username=parsed.username,
        password=parsed.password,
        # Reads go to masters only (redis-py's default; no load_balancing_strategy): a reader
        # must never see less than what a write it saw acknowledged left.
        # A failed-over or re-sharded slot is looked up again at the first MOVED.
        reinitialize_steps=1,
        retry=retry,
        **options,
    )


# -- asyncio clients (the gateway) -------------------------------------------------------------


def async_store_client(url: str, *, max_connections: int | None = None, pool_timeout_s: float | None = None) -> Any:
    """The gateway's asyncio client of the store, with the store's socket bounds.

    ``max_connections`` bounds the pool; on one server (or Sentinel's master) a caller that
    finds every connection taken waits up to ``pool_timeout_s`` for one to come back
    (``BlockingConnectionPool``) rather than failing at once; a cluster client bounds each
    node's pool and fails when one is full (redis-py has no blocking cluster pool)."""
    kind = scheme(url)
    options: dict[str, Any] = {"socket_timeout": BLOCK_CHUNK_S + 10, "socket_connect_timeout": 5}
    if kind == CLUSTER_SCHEME:
        parsed = parse_multi_host(url)
        bound: dict[str, Any] = {"max_connections": max_connections} if max_connections else {}
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port) for host, port in parsed.hosts],
            username=parsed.username,
            password=parsed.password,
            **options,
            **bound,
        )
    blocking: dict[str, Any] = {"max_connections": max_connections or 2**31, "timeout": pool_timeout_s}
    if kind == SENTINEL_SCHEME:
        parsed = parse_multi_host(url)
        sentinel_password = parsed.query.get("sentinel_password")
        sentinel = redis.asyncio.sentinel.Sentinel(
            parsed.hosts,
            sentinel_kwargs={"socket_timeout": 2, **({"password": sentinel_password} if sentinel_password else {})},
        )
        assert parsed.service is not None  # parse_multi_host refuses a Sentinel URL without one
        return sentinel.master_for(
            parsed.service,
            redis_class=redis.asyncio.Redis,
            db=parsed.db,
            username=parsed.username,
            password=parsed.password,
            connection_pool_class=BlockingSentinelConnectionPool,
            **blocking,
            **options,
        )
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, health_check_interval=30, **blocking, **options)
    return redis.asyncio.Redis.from_pool(pool)


class BlockingSentinelConnectionPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """Sentinel's pool (which asks the sentinels for the master) that waits when full, as
    ``BlockingConnectionPool`` does."""


# -- the broker, as Celery / kombu take it ------------------------------------------------------


def kombu_broker(url: str) -> tuple[str, dict[str, Any]]:
    """The URL kombu is given for a broker URL, and the transport options it needs on top.

    ``redis+sentinel://h1:p1,h2:p2/<service>/<db>`` becomes kombu's own Sentinel form,
    ``sentinel://h1:p1/<db>;sentinel://h2:p2/<db>`` with ``master_name=<service>``.
    """
    if scheme(url) != SENTINEL_SCHEME:
        return url, {}
    parsed = parse_multi_host(url, "RERANKQ_BROKER_URL")
    auth = ""
    if parsed.password or parsed.username:
        from urllib.parse import quote

        auth = f"{quote(parsed.username or '', safe='')}:{quote(parsed.password or '', safe='')}@"
    kombu_url = ";".join(f"sentinel://{auth}{host}:{port}/{parsed.db}" for host, port in parsed.hosts)
    options: dict[str, Any] = {"master_name": parsed.service}
    sentinel_password = parsed.query.get("sentinel_password")
    if sentinel_password:
        options["sentinel_kwargs"] = {"password": sentinel_password}
    return kombu_url, options
