"""The gateway's command: ``rerankq serve`` (also ``python -m producer.gateway``), and
``rerankq serve keygen``, which makes an API key.

Exit status: 0 after a clean shutdown, 2 for a configuration error (the variable is named),
3 when the server could not start (a port in use, Redis settings that do not load).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from kernel.command_line import Host, apply_host_logging, run_command
from kernel.errors import ConfigError
from kernel.logs import get_logger
from kernel.settings import Settings, load_settings
from producer.gateway.auth import ALL_DEVICES, KeyRing, load_keyring
from producer.gateway.config import GatewaySettings, load_gateway_settings, variable
from producer.gateway.keygen import keygen

log = get_logger("rerankq.gateway")
CONFIG_ERROR, STARTUP_FAILURE = 2, 3

EPILOG = """\b
Examples:
  rerankq serve --keys-file keys.json                    # Cohere v1/v2, TEI and stream APIs on 127.0.0.1:8080
  rerankq serve --host 0.0.0.0 --workers 4               # every interface, four server processes
  rerankq serve --insecure-no-auth                       # no API keys: only on a trusted network
  rerankq serve keygen --tenant acme --keys-file keys.json   # a key for tenant acme, added to keys.json

Every option has a RERANKQ_GATEWAY_* variable (named in its help); the option wins.
"""


@click.group(
    name="serve", invoke_without_command=True, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option("--host", default=None, help="address to listen on (RERANKQ_GATEWAY_HOST, default 127.0.0.1)")
@click.option("--port", type=int, default=None, help="port (RERANKQ_GATEWAY_PORT, default 8080)")
@click.option("--workers", type=int, default=None, help="server processes (RERANKQ_GATEWAY_WORKERS, default 1)")
@click.option("--keys-file", default=None, help="JSON file of hashed API keys (RERANKQ_GATEWAY_KEYS_FILE)")
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    default=None,
    help="serve without API keys: anyone who reaches the port may use the queue",
)
@click.option(
    "--device", type=click.Choice(ALL_DEVICES), default=None, help="default device queue (RERANKQ_GATEWAY_DEVICE)"
)
@click.option("--timeout-s", type=float, default=None, help="how long a rerank call waits (RERANKQ_GATEWAY_TIMEOUT_S)")
@click.option("--access-log", is_flag=True, default=None, help="log every request line")
@click.option("--log-level", default=None, help="INFO, WARNING, ... (RERANKQ_GATEWAY_LOG_LEVEL)")
@click.pass_context
def serve(ctx: click.Context, /, **overrides: Any) -> int | None:
    """Serve the Cohere- and TEI-compatible rerank HTTP gateway over the queue.

    It answers from the same Redis and device queues the workers serve, and imports no
    torch: run it on hosts without a model.
    """
    if ctx.invoked_subcommand is not None:
        return None
    try:
        settings = load_settings()
        settings.store.broker  # noqa: B018 - raises ConfigError when no Redis is named; checked before the app starts
        config = load_gateway_settings(**overrides)
    except ConfigError as exc:
        apply_host_logging((overrides["log_level"] or "INFO").upper())
        log.error("gateway_config_error", variable=exc.variable, problem=exc.message)
        return CONFIG_ERROR
    apply_host_logging(config.log_level.upper())
    try:
        keyring = load_keyring(config, settings)
    except ConfigError as exc:
        log.error("gateway_config_error", variable=exc.variable, problem=exc.message)
        return CONFIG_ERROR
    if keyring.insecure:
        log.warning("gateway_auth_disabled", reason="--insecure-no-auth: every caller is served without a key")
    return run_server(settings, config, keyring, overrides)


serve.add_command(keygen)


def run_server(settings: Settings, config: GatewaySettings, keyring: KeyRing, overrides: dict[str, Any]) -> int:
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from producer.gateway.app import create_app
    from producer.gateway.connections import GuardedHttpTools, GuardedHttpToolsFromEnvironment
    from producer.gateway.listen import address, bind, bound_address

    # Bound before the app starts: a port in use exits here, having started nothing.
    try:
        sockets = bind(config.host, config.port)
    except OSError as exc:
        log.error("gateway_cannot_listen", address=address(config.host, config.port), problem=str(exc))
        return STARTUP_FAILURE
    for sock in sockets:
        log.info("gateway_listening", address=bound_address(sock), workers=config.workers)
    common: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "access_log": config.access_log,
        "log_level": config.log_level.lower(),
        "lifespan": "on",
        "log_config": None,
        # Behind a proxy the client address comes from it; the gateway logs no addresses anyway.
        "proxy_headers": False,
        "server_header": False,
        # Long-polls and event streams would hold a shutdown forever: cut them after this.
        "timeout_graceful_shutdown": 10,
        "timeout_keep_alive": config.keep_alive_s,
        # Bounds h11 too, should anyone run the app under it (GuardedHttpTools bounds httptools).
        "h11_max_incomplete_event_size": config.max_header_bytes,
    }
    try:
        if config.workers > 1:
            # Each process builds its own app from the environment: carry the command line there.
            for name, value in overrides.items():
                if value is not None:
                    os.environ[variable(name)] = str(value).lower() if isinstance(value, bool) else str(value)
            multi = uvicorn.Config(
                "producer.gateway.app:app_from_environment",
                factory=True,
                workers=config.workers,
                http=f"{GuardedHttpToolsFromEnvironment.__module__}:{GuardedHttpToolsFromEnvironment.__name__}",
                **common,
            )
            Multiprocess(multi, sockets=sockets).run()
            return 0
        server = uvicorn.Server(
            uvicorn.Config(create_app(settings, config, keyring), http=GuardedHttpTools.bounded(config), **common)
        )
        server.run(sockets=sockets)
        return 0 if server.started else STARTUP_FAILURE
    finally:
        for sock in sockets:
            sock.close()


def main(
    argv: Sequence[str] | None = None,
    *,
    host_logging: Callable[[str], None] | None = None,
    prog_name: str = "python -m producer.gateway",
) -> int:
    """Run ``serve`` (or ``keygen``) on ``argv`` and return the exit status.

    ``host_logging(level)`` is the host's way to render records; this module never
    configures logging itself.
    """
    return run_command(
        serve, sys.argv[1:] if argv is None else argv, prog_name=prog_name, host=Host(logging=host_logging)
    )
