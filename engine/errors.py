"""Errors of the engine client; ``EngineError`` is what an ``engine.protocol.Engine`` raises."""

from __future__ import annotations

__all__ = [
    "EngineError",
    "EngineHTTPError",
    "EngineRequestFailed",
    "EngineUnavailable",
    "WeightUpdateFailed",
]


class EngineError(RuntimeError):
    """Base of the engine client's errors."""


class EngineUnavailable(EngineError):
    """No server accepted a connection (after the retries); nothing was sent."""


class EngineRequestFailed(EngineError):
    """The connection failed after the request may have reached the server; it was not retried."""


class EngineHTTPError(EngineError):
    """The server answered with an error status."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {body[:500]}")
        self.url, self.status, self.body = url, status, body
        # for pqrl.faults: no such route (or model) at that URL is the job's setup, not this request
        self.code = "engine_not_found" if status == 404 else ""


class WeightUpdateFailed(EngineError):
    """At least one server did not load the new weights."""
