"""Slow and surplus clients over real sockets against an env server in its own process: a request
whose headers or body do not arrive in time loses its connection, connections beyond the cap are
answered 503, and a normal client is served throughout."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

from tests.env_server.conftest import serve_in_subprocess

pytestmark = pytest.mark.timeout(120)

READ_TIMEOUT_S = 1.0
HALF_HEADER = b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
HALF_BODY = b"POST /sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b'{"env_id": "echo-v1", '


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _wait_closed(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closed ``sock`` before ``deadline`` (what it sent before is read and dropped)."""
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:  # reset
        return True
    return False


def _drip(socks: list[socket.socket], chunk: bytes, stop: threading.Event) -> None:
    """Sends ``chunk`` on every socket every 0.1 s (a slowloris keeps its request alive this way)."""
    while not stop.wait(0.1):
        for s in socks:
            with contextlib.suppress(OSError):
                s.send(chunk)


def test_slow_headers_and_bodies_are_cut_off_while_a_normal_client_is_served():
    with serve_in_subprocess(request_read_timeout_s=READ_TIMEOUT_S) as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        silent = [_connect(server.url) for _ in range(50)]
        half_header = [_connect(server.url) for _ in range(50)]
        half_body = [_connect(server.url) for _ in range(50)]
        for s in half_header:
            s.sendall(HALF_HEADER)
        for s in half_body:
            s.sendall(HALF_BODY)
        t0 = time.monotonic()
        stop = threading.Event()
        for socks, chunk in ((half_header, b"X-Slow: 1\r\n"), (half_body, b" ")):
            threading.Thread(target=_drip, args=(socks, chunk, stop), daemon=True).start()
        try:
            # served meanwhile, quickly, on connections of its own
            for _ in range(5):
                started = time.monotonic()
                reply = httpx.post(
                    f"{server.url}/sessions", json={"env_id": "echo-v1", "task": {}}, headers=headers
                )
                assert reply.status_code == 201, reply.text
                assert time.monotonic() - started < 0.5
            deadline = t0 + READ_TIMEOUT_S + 2.0
            slow = silent + half_header + half_body
            still_open = [i for i, s in enumerate(slow) if not _wait_closed(s, deadline)]
        finally:
            stop.set()
        assert not still_open, (
            f"{len(still_open)} of 150 slow connections were still open after {deadline - t0:.1f}s"
        )
        assert time.monotonic() - t0 >= READ_TIMEOUT_S * 0.9  # not cut before the bound
        for s in slow:
            s.close()
        assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_kept_alive_connection_outlives_the_read_timeout_while_idle():
    """The read bound is per request: an idle keep-alive connection is timed by keep_alive_s."""
    with serve_in_subprocess(request_read_timeout_s=READ_TIMEOUT_S) as server:
        s = _connect(server.url)
        for _ in range(2):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(5)
            reply = b""
            while not reply.endswith(b"}"):  # the headers and the body may come in two reads
                reply += s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200"), reply
            time.sleep(READ_TIMEOUT_S * 1.5)
        s.close()


def test_connections_beyond_the_cap_are_answered_503_and_the_cap_frees_up():
    with serve_in_subprocess(request_read_timeout_s=30, max_connections=20) as server:
        held = [_connect(server.url) for _ in range(20)]
        time.sleep(0.2)  # the server has accepted them all
        extra = _connect(server.url)
        extra.settimeout(5)
        assert extra.recv(65536).startswith(b"HTTP/1.1 503"), "the 21st connection was not refused"
        assert _wait_closed(extra, time.monotonic() + 5)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{server.url}/healthz").raise_for_status()
        for s in held:
            s.close()
        time.sleep(0.2)
        assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_the_settings_apply_where_the_server_is_built_in_code(make_server):
    """``uvicorn_options(settings)`` (``pqrl env-server``, the in-thread servers) carries the bounds."""
    server = make_server(request_read_timeout_s=READ_TIMEOUT_S, max_connections=4)
    slow = _connect(server.url)
    slow.sendall(HALF_HEADER)
    t0 = time.monotonic()
    assert _wait_closed(slow, t0 + READ_TIMEOUT_S + 2.0)
    assert time.monotonic() - t0 >= READ_TIMEOUT_S * 0.9
    held = [_connect(server.url) for _ in range(4)]
    extra = _connect(server.url)
    extra.settimeout(5)
    assert extra.recv(65536).startswith(b"HTTP/1.1 503")
    for s in [slow, extra, *held]:
        s.close()
