"""A Redis value given as several buffers and written to the socket without joining them first.

A group's blob is a short header followed by its records' token arrays (``pqrl.codec.encode_parts``).
Joining those into one bytes object before the send copies half a megabyte per group, from arrays
that are cold by then, into a fresh allocation that glibc hands back and faults in again group after
group; the socket write then copies it once more. Handed over as parts, the write's own copy is the
only one (Python 3.12's socket transports go further and gather the buffers in one ``sendmsg``).
``bench/store.py`` reports the put's cost per group beside a raw XADD of a ready blob.

redis-py frames every argument as one RESP bulk string from one buffer, so the client's connection
class learns one more argument type: ``Parts`` is framed with its total length and its buffers
follow as they are. ``sends_parts`` installs that on a client; every other argument packs as before.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis

__all__ = ["Parts", "packs_parts", "sends_parts"]


class Parts:
    """One Redis value: the concatenation of ``buffers`` (bytes-like, each C-contiguous), never
    joined here.

    The buffers are sent from where they are, after the command is handed over: on Python 3.12 and
    later the transport may still be writing them after a command that timed out or was cancelled
    has raised. Nothing may write to them (through any view) once they are given to a command.
    """

    __slots__ = ("buffers", "nbytes")

    def __init__(self, buffers: Iterable[Any]) -> None:
        # Byte views: the packer's framing takes len() of each, which must count bytes.
        self.buffers = [memoryview(b).cast("B") for b in buffers]
        self.nbytes = sum(b.nbytes for b in self.buffers)

    def __repr__(self) -> str:
        return f"Parts({len(self.buffers)} buffers, {self.nbytes} bytes)"


def sends_parts(client: aioredis.Redis) -> aioredis.Redis:
    """Lets ``client`` take ``Parts`` arguments; returns it.

    Raises:
        ValueError: the client has opened connections already, which would not take them.
    """
    if packs_parts(client):
        return client
    pool = client.connection_pool
    if any(getattr(pool, name, ()) for name in ("_available_connections", "_in_use_connections")):
        raise ValueError("sends_parts must be applied to a client before it opens a connection")
    base: type = pool.connection_class  # as a plain type: mypy takes type[X] for unhashable
    pool.connection_class = _packing_parts(base)
    return client


def packs_parts(client: aioredis.Redis) -> bool:
    """Whether ``client`` takes ``Parts`` arguments (``sends_parts``)."""
    return issubclass(client.connection_pool.connection_class, _PacksParts)


@functools.cache  # one subclass per base, shared by every client of that kind
def _packing_parts(base: type) -> type:
    return type(base.__name__, (_PacksParts, base), {})


class _PacksParts:
    """Mixed into the client's connection class (plain, TLS or Unix socket alike)."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[Any]:
        if not any(isinstance(a, Parts) for a in args):
            return super().pack_command(*args)  # type: ignore[misc]
        # RESP: an array of bulk strings, each "$<length>\r\n<bytes>\r\n". A command name given
        # as "CONFIG GET" (or b"CONFIG GET") is several of them, as redis-py sends it.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif isinstance(args[0], bytes) and b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        out: list[Any] = []
        head = [b"*%d\r\n" % len(args)]
        for arg in args:
            if isinstance(arg, Parts):
                head.append(b"$%d\r\n" % arg.nbytes)
                out += [b"".join(head), *arg.buffers]
                head = [b"\r\n"]
            else:
                value = self.encoder.encode(arg)
                head += [b"$%d\r\n" % len(value), value, b"\r\n"]
        out.append(b"".join(head))
        return out
