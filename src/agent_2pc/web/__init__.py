"""``agent-2pc web``: a live dashboard of one workspace in the browser (docs/monitoring.md).

A Starlette app on uvicorn, bound to localhost by default. Every request carries the token
printed at start (``?token=`` or the ``X-Agent2PC-Token`` header): without it, 401 and nothing
else, for pages, static files, the API and the event stream alike. Read-only (the monitor
changes nothing) unless started with ``allow_actions``: then commit and abort also need the
page's CSRF header and a same-origin request. The page and its scripts ship in this package
(``static/``): no build step, no CDN. Only those files, the monitor's answers and the logs of a
live transaction's checks (inside its scratch directory) are ever served.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import sys

from ..errors import UsageError, WorkspaceError


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is printed: a port in use is a clear
    error (exit 2), and ``port=0`` gets a free one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r} is not an address of this machine ({exc})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise WorkspaceError(
                f"port {port} on {host} is in use (another 'agent-2pc web'?); choose another "
                "with --port N, or --port 0 for any free port", code="port_in_use",
                port=port) from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def serve(root: str, host: str = "127.0.0.1", port: int = 8642, allow_actions: bool = False,
          token: str | None = None) -> None:
    """Serve the dashboard until interrupted. The first line of stdout is the URL."""
    try:
        import uvicorn

        from ._app import make_app
    except ImportError as exc:
        raise WorkspaceError(f"'agent-2pc web' needs Starlette and uvicorn ({exc.name} is "
                             "missing): pip install 'agent-2pc[monitor]'",
                             code="dependency_missing") from None
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    token = token or os.environ.get("AGENT2PC_WEB_TOKEN") or secrets.token_urlsafe(24)
    app = make_app(root, token=token, allow_actions=allow_actions,
                   hosts=_allowed_hosts(host, bound))
    sys.stdout.write(f"http://{url_host(host)}:{bound}/?token={token}\n")
    sys.stdout.flush()
    loopback = host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
    sys.stderr.write(f"agent-2pc web: serving {root} "
                     f"({'commit and abort allowed' if allow_actions else 'read-only'}); "
                     "Ctrl-C stops it\n")
    if not loopback:
        sys.stderr.write(f"agent-2pc web: warning: listening on {host}, not only on this "
                         "machine; anyone with the URL can read the workspace\n")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2, ws="none")
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def _allowed_hosts(host: str, port: int) -> set[str]:
    """Host headers accepted (a DNS-rebinding page names another host)."""
    names = {host, url_host(host)}
    if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::"):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    if host in ("0.0.0.0", "::"):
        names |= {socket.gethostname()}
        try:
            names |= {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
        except OSError:
            pass
    return {f"{n}:{port}" for n in names}


__all__ = ["serve"]
