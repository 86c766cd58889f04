"""The gateway's listening sockets, bound before anything else starts.

uvicorn binds only after the app's startup (its lifespan: Redis clients, the backlog
sampler), and when the bind fails it runs the app's shutdown and exits from inside its
event loop. That shutdown can wait forever: a cancellation that lands while redis-py (8.1)
is opening its first connection is lost, so the sampler the shutdown waits on never ends,
and uvicorn's signal handlers only ask a server that never started to stop. Binding first,
here, makes "a port in use" or "a host that does not resolve" what it is: nothing has
started, so the command says why and exits (``producer.gateway.main``: status 3).
"""

from __future__ import annotations

import socket

#: uvicorn's default accept backlog.
BACKLOG = 2048


def address(host: str, port: int) -> str:
    """``host:port`` as a person reads it (``[::1]:8080`` for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (as asyncio's ``create_server``
    would bind them); ``OSError`` (``socket.gaierror`` included) when any cannot be bound."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, where in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # One socket per family, as create_server binds them: no dual-stack surprise.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(where)
            sock.listen(BACKLOG)
            # A multi-process server hands them to its spawned processes.
            sock.set_inheritable(True)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def bound_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return address(host, port)
