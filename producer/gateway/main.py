"""``python -m producer.gateway``: serve the gateway, or make an API key (``keygen``).

Exit status: 0 after a clean shutdown, 2 for a configuration error (the variable is named),
3 when the server could not start (a port in use, Redis settings that do not load).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from producer.errors import ConfigError
from producer.gateway.auth import ALL_DEVICES, KeyRing, digest, load_keyring, new_key
from producer.gateway.config import GatewaySettings, load_gateway_settings, variable
from producer.logs import get_logger
from producer.settings import Settings, load_settings

log = get_logger("rerankq.gateway")
CONFIG_ERROR, STARTUP_FAILURE = 2, 3


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m producer.gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", help="address to listen on (RERANKQ_GATEWAY_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (RERANKQ_GATEWAY_PORT, default 8080)")
    parser.add_argument("--workers", type=int, help="server processes (RERANKQ_GATEWAY_WORKERS, default 1)")
    parser.add_argument("--keys-file", help="JSON file of hashed API keys (RERANKQ_GATEWAY_KEYS_FILE)")
    parser.add_argument("--insecure-no-auth", action="store_true", default=None,
                        help="serve without API keys: anyone who reaches the port may use the queue")
    parser.add_argument("--device", choices=ALL_DEVICES, help="default device queue (RERANKQ_GATEWAY_DEVICE)")
    parser.add_argument("--timeout-s", type=float, help="how long a rerank call waits (RERANKQ_GATEWAY_TIMEOUT_S)")
    parser.add_argument("--access-log", action="store_true", default=None, help="log every request line")
    parser.add_argument("--log-level", help="INFO, WARNING, ... (RERANKQ_GATEWAY_LOG_LEVEL)")
    return parser


def keygen_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m producer.gateway keygen",
                                     description="Make an API key: prints the key once (give it to the client) "
                                                 "and the entry to add to the keys file (it holds the hash only).")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--chain", help="chain profile the key is bound to (RERANKQ_CHAIN_<NAME>)")
    parser.add_argument("--devices", default="cpu", help="comma-separated: cpu,gpu,any (the first is the default)")
    return parser


def keygen(argv: list[str]) -> int:
    args = keygen_parser().parse_args(argv)
    key = new_key()
    entry = {"key_sha256": digest(key), "tenant": args.tenant, "devices": args.devices.split(",")}
    if args.chain:
        entry["chain"] = args.chain.lower()
    print(f"key (shown once, store it in the client): {key}")
    print(f"entry for {variable('keys_file')}: {json.dumps(entry)}")
    return 0


def main(argv: list[str] | None = None, *, host_logging: Callable[[str], None] | None = None) -> int:
    """Serve the Cohere- and TEI-compatible rerank HTTP gateway over the queue (`keygen` makes a key).

    ``host_logging(level)`` is the host's way to render records (``rerankq serve`` passes one);
    this module never configures logging itself.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["keygen"]:
        return keygen(argv[1:])
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    args = serve_parser().parse_args(argv)
    overrides = {name: getattr(args, name) for name in ("host", "port", "workers", "keys_file", "insecure_no_auth",
                                                        "device", "timeout_s", "access_log", "log_level")}
    level = (args.log_level or os.environ.get(variable("log_level")) or "INFO").upper()
    if host_logging is not None:
        host_logging(level)
    try:
        settings = load_settings()
        config = load_gateway_settings(**overrides)
        keyring = load_keyring(config, settings)
    except ConfigError as exc:
        log.error("gateway_config_error", variable=exc.variable, problem=exc.message)
        return CONFIG_ERROR
    if keyring.insecure:
        log.warning("gateway_auth_disabled", reason="--insecure-no-auth: every caller is served without a key")
    return serve(settings, config, keyring, overrides)


def serve(settings: Settings, config: GatewaySettings, keyring: KeyRing, overrides: dict[str, Any]) -> int:
    import uvicorn

    from producer.gateway.app import create_app
    from producer.gateway.connections import GuardedHttpTools, GuardedHttpToolsFromEnvironment

    common = {"host": config.host, "port": config.port, "access_log": config.access_log,
              "log_level": config.log_level.lower(), "lifespan": "on", "log_config": None,
              # Behind a proxy the client address comes from it; the gateway logs no addresses anyway.
              "proxy_headers": False, "server_header": False,
              # Long-polls and event streams would hold a shutdown forever: cut them after this.
              "timeout_graceful_shutdown": 10,
              "timeout_keep_alive": config.keep_alive_s,
              # Bounds h11 too, should anyone run the app under it (GuardedHttpTools bounds httptools).
              "h11_max_incomplete_event_size": config.max_header_bytes}
    if config.workers > 1:
        # Each process builds its own app from the environment: carry the command line there.
        for name, value in overrides.items():
            if value is not None:
                os.environ[variable(name)] = str(value).lower() if isinstance(value, bool) else str(value)
        uvicorn.run("producer.gateway.app:app_from_environment", factory=True, workers=config.workers,
                    http=f"{GuardedHttpToolsFromEnvironment.__module__}:{GuardedHttpToolsFromEnvironment.__name__}",
                    **common)
        return 0
    server = uvicorn.Server(uvicorn.Config(create_app(settings, config, keyring), http=GuardedHttpTools.bounded(config),
                                           **common))
    server.run()
    return 0 if server.started else STARTUP_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
