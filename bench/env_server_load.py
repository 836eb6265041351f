"""A lean load generator for bench/env_server.py, run in its own process so its CPU is measured
apart from the server's and from the bench's in-process phases.

Each simulated agent holds one keep-alive HTTP/1.1 connection (raw asyncio streams: no client
library's per-request cost in the figure) and loops: create an echo-v1 session, step it
STEPS_PER_SESSION times (each step's reply read in full and its status checked, the JSON parsed),
close it. Run: python bench/env_server_load.py URL TOKEN SESSIONS SECONDS THINK; prints one JSON
line: step latencies (s), errors, wall seconds and this process's CPU seconds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

STEPS_PER_SESSION = 7  # echo-v1 ends after 8 turns
_CREATE = json.dumps({"env_id": "echo-v1", "task": {"prompt": "p", "expected": "x"}}).encode()
_STEP = b'{"tool_calls":[{"name":"echo","arguments":{"text":"x"}}],"request_id":"%s"}'


class Conn:
    """One keep-alive connection; ``call`` sends a request and returns (status, parsed JSON)."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, object]:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        self.writer.write(head + self.auth + b"\r\n" + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length, close = 0, False
        for line in raw.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
            elif name == b"transfer-encoding":
                raise RuntimeError("chunked replies are not expected")
        data = await self.reader.readexactly(length) if length else b""
        if close:
            self.writer.close()
            self.writer = None
        return status, json.loads(data) if data else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run(url: str, token: str, sessions: int, seconds: float, think: float) -> dict[str, object]:
    host, _, port = url.removeprefix("http://").partition(":")
    lat: list[float] = []
    errors: list[str] = []
    stop = time.monotonic() + seconds

    async def agent(offset: float) -> None:
        conn = Conn(host, int(port), token)
        await asyncio.sleep(offset)
        n = 0
        while time.monotonic() < stop:
            try:
                status, info = await conn.call("POST", "/sessions", _CREATE)
                if status != 201:
                    raise RuntimeError(f"create answered {status}: {info}")
                sid = info["session_id"]  # type: ignore[index]
                for _ in range(STEPS_PER_SESSION):
                    n += 1
                    t = time.perf_counter()
                    status, reply = await conn.call(
                        "POST", f"/sessions/{sid}/step", _STEP % f"{id(conn):x}-{n}".encode()
                    )
                    lat.append(time.perf_counter() - t)
                    if status != 200 or not reply["messages"]:  # type: ignore[index]
                        raise RuntimeError(f"step answered {status}: {reply}")
                    await asyncio.sleep(max(0.0, think - (time.perf_counter() - t)))
                status, _ = await conn.call("DELETE", f"/sessions/{sid}")
                if status != 204:
                    raise RuntimeError(f"close answered {status}")
            except Exception as e:
                errors.append(repr(e))
                conn.close()
                conn = Conn(host, int(port), token)
        conn.close()

    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(agent(think * i / sessions) for i in range(sessions)))
    return {"lat": lat, "errors": errors[:20], "n_errors": len(errors),
            "wall_s": time.monotonic() - t0, "cpu_s": time.process_time() - cpu0}  # fmt: skip


if __name__ == "__main__":
    url, token, sessions, seconds, think = sys.argv[1:6]
    print(json.dumps(asyncio.run(run(url, token, int(sessions), float(seconds), float(think)))))
