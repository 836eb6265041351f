"""Altered exec agents, for tests of what the host does when the agent misbehaves.

Each is the real agent's source with a few lines added before ``main()`` runs; put one in place
with ``monkeypatch.setattr("sandboxes.docker.AGENT_SOURCE", ...)``.
"""

from __future__ import annotations

from sandboxes.docker import AGENT_SOURCE

# The command that makes the flooding agent write to the host channel instead of running anything.
FLOOD_COMMAND = "flood the host channel"

_MAIN = '\n\nif __name__ == "__main__":'


def _with(lines: str) -> str:
    assert _MAIN in AGENT_SOURCE, "the agent no longer ends with its __main__ guard"
    return AGENT_SOURCE.replace(_MAIN, "\n\n" + lines.strip("\n") + "\n" + _MAIN)


def flooding_agent_source(nbytes: int = 400_000_000) -> str:
    """An agent that answers FLOOD_COMMAND with ``nbytes`` without a newline on its stdout: what
    anything that reached the host channel could do, now that commands cannot."""
    return _with(f"""
_real_exec = op_exec


def op_exec(req):
    if req.get("cmd") != {FLOOD_COMMAND!r}:
        return _real_exec(req)
    chunk = b"x" * (1 << 20)
    with _LOCK:
        for _ in range({nbytes} >> 20):
            _OUT.write(chunk)
        _OUT.flush()
    return {{}}


OPS["exec"] = op_exec
""")


def dumpable_agent_source() -> str:
    """An agent that stays dumpable (as on a kernel or image where prctl fails)."""
    return _with("_undumpable = lambda: False")
