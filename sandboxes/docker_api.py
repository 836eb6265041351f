"""A small async client for the Docker Engine API over its unix socket.

Only what sandboxes need: create/start/inspect/kill/remove/list containers, image inspect, and a
raw attach stream to a container's stdio. httpx speaks HTTP over the socket; attach upgrades the
connection to a raw stream, so it is opened with asyncio directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from typing import Any

import httpx

from sandboxes.protocol import ImageMissing, SandboxError, SandboxUnavailable

__all__ = ["AttachStream", "DockerAPI", "DockerError"]

API_VERSION = "v1.41"  # Docker 20.10, Debian bookworm's docker.io


class DockerError(SandboxError):
    """The engine answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"docker engine error {status}: {message}")
        self.status = status


def default_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        raise SandboxUnavailable(f"DOCKER_HOST={host!r}: only unix sockets are supported")
    return host[len("unix://") :]


class DockerAPI:
    """One connection pool to the engine; share it between sandboxes."""

    def __init__(self, socket_path: str | None = None, *, timeout: float = 60.0) -> None:
        self.socket_path = socket_path or default_socket()
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=self.socket_path),
            base_url=f"http://docker/{API_VERSION}",
            timeout=timeout,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = await self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError, OSError) as e:
            raise SandboxUnavailable(
                f"cannot reach the Docker engine at unix://{self.socket_path}: {e} "
                "(is dockerd running? scripts/setup.sh starts it)"
            ) from e
        if r.status_code >= 400:
            try:
                message = r.json().get("message", r.text)
            except ValueError:
                message = r.text
            raise DockerError(r.status_code, message)
        return r

    async def ping(self) -> None:
        await self._request("GET", "/_ping")

    async def image_exists(self, image: str) -> bool:
        try:
            await self._request("GET", f"/images/{image}/json")
            return True
        except DockerError as e:
            if e.status == 404:
                return False
            raise

    async def create(self, name: str, config: dict[str, Any]) -> str:
        try:
            r = await self._request("POST", "/containers/create", params={"name": name}, json=config)
        except DockerError as e:
            if e.status == 404 and "image" in str(e).lower():
                raise ImageMissing(
                    f"sandbox image {config.get('Image')!r} is not in the engine: "
                    "run `pqrl sandbox build-image` (scripts/setup.sh does)"
                ) from e
            raise
        return r.json()["Id"]

    async def start(self, cid: str) -> None:
        await self._request("POST", f"/containers/{cid}/start")

    async def inspect(self, cid: str) -> dict[str, Any]:
        return (await self._request("GET", f"/containers/{cid}/json")).json()

    async def kill(self, cid: str) -> None:
        try:
            await self._request("POST", f"/containers/{cid}/kill")
        except DockerError as e:
            if e.status not in (404, 409):  # gone, or not running
                raise

    async def remove(self, cid: str) -> None:
        try:
            await self._request("DELETE", f"/containers/{cid}", params={"force": "true", "v": "true"})
        except DockerError as e:
            if e.status not in (404, 409):  # gone, or removal already in progress
                raise

    async def list(self, labels: dict[str, str] | list[str], *, all: bool = True) -> list[dict[str, Any]]:
        wanted = [f"{k}={v}" for k, v in labels.items()] if isinstance(labels, dict) else list(labels)
        params = {"all": "true" if all else "false", "filters": json.dumps({"label": wanted})}
        return (await self._request("GET", "/containers/json", params=params)).json()

    async def attach(self, cid: str) -> AttachStream:
        """Opens stdin/stdout/stderr of a created (not yet started) container as a raw stream."""
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path, limit=1 << 24)
        except OSError as e:
            raise SandboxUnavailable(
                f"cannot reach the Docker engine at unix://{self.socket_path}: {e}"
            ) from e
        request = (
            f"POST /{API_VERSION}/containers/{cid}/attach?stream=1&stdin=1&stdout=1&stderr=1 HTTP/1.1\r\n"
            "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
        )
        writer.write(request.encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status not in (101, 200):
            writer.close()
            raise DockerError(status, head.decode(errors="replace").strip())
        return AttachStream(reader, writer)


class AttachStream:
    """The multiplexed stdio of a container without a TTY: 8-byte frame headers, then payload."""

    _HEADER = struct.Struct(">BxxxI")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read_frame(self) -> tuple[int, bytes]:
        """(stream, payload) with stream 1 = stdout, 2 = stderr; raises EOFError at the end."""
        try:
            header = await self.reader.readexactly(self._HEADER.size)
            kind, size = self._HEADER.unpack(header)
            return kind, await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            raise EOFError("container stdio closed") from e

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()
