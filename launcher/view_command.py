"""``pqrl view RUN_DIR``: the run's rollout log as a local web page (standard library server).

Loopback by default: the episodes are the run's data, and the server has no login. Requests whose
``Host`` is a name other than ``localhost``, ``--host`` or this machine's own are refused (addresses
are answered), so a web page elsewhere cannot reach it through DNS rebinding. Everything is read
on request, so the page follows a running job.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import socket
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from launcher.view_data import RunLog
from launcher.view_page import CSP, PAGE
from pqrl.errors import UsageError
from pqrl.serving import listening_socket

__all__ = ["add_view_parser", "make_server", "view_command"]

log = logging.getLogger("pqrl.view")


def add_view_parser(sub: Any) -> None:
    p = sub.add_parser(
        "view", help="browse a run's rollout log (every trajectory trained or dropped) in a browser"
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (OUTPUT_DIR/RUN of its job)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default loopback only)")
    p.set_defaults(func=view_command)


def make_server(run_dir: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """The page's server for ``run_dir`` on ``host``:``port`` (0: a free one), listening; a port
    that cannot be had is a ``UsageError``, as for every server of the project."""
    data = RunLog(run_dir)
    sock = listening_socket(host, port)
    server = ThreadingHTTPServer(sock.getsockname()[:2], _handler(data, host), bind_and_activate=False)
    server.socket.close()  # its own unbound one: the bound socket serves
    server.socket, server.server_address = sock, sock.getsockname()
    server.daemon_threads = True
    server.server_activate()
    return server


def view_command(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a port", fix="give 1-65535, or 0 for any free one")
    server = make_server(args.run_dir, args.host, args.port)
    host, port = server.server_address[:2]
    if not _loopback(args.host):
        print(f"pqrl view: serving on {args.host}, reachable from other machines, with no login",
              file=sys.stderr)  # fmt: skip
    print(f"pqrl view: http://{_netloc(str(host), int(port))}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host_allowed(bound: str) -> Callable[[str], bool]:
    """Which ``Host`` names the page answers: any address literal (DNS rebinding needs a name the
    attacker controls, which an address is not), ``localhost``, the ``--host`` name and this
    machine's own names. Any other name is refused, whatever address is served."""
    names = {bound.strip("[]").lower(), "localhost", socket.gethostname().lower()}

    def allowed(host: str) -> bool:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return host.lower() in names
        return True

    return allowed


def _handler(data: RunLog, bound: str) -> type[BaseHTTPRequestHandler]:
    allowed = _host_allowed(bound)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug(format, *args)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            try:
                host = urlsplit("//" + (self.headers.get("Host") or "")).hostname or ""
            except ValueError:  # "[abc": not a host at all
                return self._send(400, {"error": "malformed Host header"})
            if not allowed(host):
                return self._send(421, {"error": f"host {host!r} is not the one served"})
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path in ("/api/step", "/api/episode", "/api/group"):
                try:
                    step = int(query.get("step", ""))
                except ValueError:
                    return self._send(400, {"error": "step must be an integer"})
            try:
                if url.path == "/":
                    return self._send(200, PAGE, "text/html; charset=utf-8")
                if url.path == "/api/run":
                    return self._send(200, data.run())
                if url.path not in ("/api/step", "/api/episode", "/api/group"):
                    return self._send(404, {"error": f"no page {url.path}"})  # /favicon.ico, say
                if url.path == "/api/step":
                    return self._send(200, data.step(step))
                if url.path == "/api/episode":
                    return self._send(200, data.episode(step, query["id"]))
                if url.path == "/api/group":
                    return self._send(200, data.group(step, query["group"]))
            except KeyError as e:
                return self._send(404, {"error": str(e.args[0]) if e.args else "not found"})
            except Exception as e:  # noqa: BLE001 - an unreadable file: said on the page, the server goes on
                return self._send(500, {"error": f"{type(e).__name__}: {e}"})
            self._send(404, {"error": f"no page {url.path}"})

        def _send(self, status: int, body: Any, kind: str = "application/json") -> None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(raw)

    return Handler
