"""The environment variables pqrl reads: one ``PQRL_*`` name per setting, read through ``setting``.

A setting that once had another name still accepts it, with a one-line warning naming the new one;
when both are set the new name wins. docs/environment.md lists every variable (a test keeps the
table and this module in step).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from pqrl.errors import UsageError

__all__ = ["OLD_NAMES", "SETTINGS", "checked_redis_url", "redis_url", "setting"]

log = logging.getLogger("pqrl.env")

# name -> what it sets; docs/environment.md has the defaults and who reads each
SETTINGS: dict[str, str] = {
    "PQRL_REDIS_URL": "the run's Redis (every subcommand that talks to one)",
    "PQRL_ENGINES": "engine URLs, comma-separated (pqrl train)",
    "PQRL_ENV_SERVERS": "env-server URLs, comma-separated (pqrl train)",
    "PQRL_ENV_TOKEN": "the env server's bearer token (server and clients)",
    "PQRL_ENGINE_API_KEY": "the built-in engine server's API key",
    "PQRL_VLLM_PYTHON": "the interpreter of a venv with vLLM (engine serve --backend vllm)",
    "PQRL_CACHE": "where models, venvs and images are cached",
    "PQRL_DEBIAN_MIRROR": "debootstrap's mirror for pqrl sandbox build-image",
    "PQRL_SANDBOX_UID_DIR": "the lock directory of sandbox user ids",
    "PQRL_GRADER_CONCURRENCY": "coding-grader runs at once per event loop",
    "PQRL_DEBUG": "1: print the traceback of a failure (as --debug)",
}
# an old name -> the setting it is now
OLD_NAMES: dict[str, str] = {"REDIS_URL": "PQRL_REDIS_URL"}

_warned: set[str] = set()


def setting(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of setting ``name`` (a key of ``SETTINGS``), else of an old name of it, else
    ``default``; an empty value counts as unset."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a pqrl setting; add it to pqrl.envvars.SETTINGS")
    env = os.environ if environ is None else environ
    value = env.get(name) or None
    for old in (o for o, new in OLD_NAMES.items() if new == name):
        if env.get(old) and old not in _warned:
            _warned.add(old)
            if value is None:
                log.warning("pqrl: %s is deprecated; set %s instead", old, name)
            elif env[old] != value:
                log.warning("pqrl: %s is ignored: %s is set and wins", old, name)
        value = value or env.get(old) or None
    return default if value is None else value


def redis_url(given: str | None) -> str:
    """The ``--redis-url`` flag, else ``$PQRL_REDIS_URL``; a UsageError naming both when neither is set."""
    url = given or setting("PQRL_REDIS_URL")
    if not url:
        raise UsageError("no Redis URL given", fix="give --redis-url or set PQRL_REDIS_URL")
    return checked_redis_url(url)


def checked_redis_url(url: str) -> str:
    """``url`` when it is a Redis URL; a UsageError (naming no password) when it is not."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise UsageError(f"{url.rpartition('@')[2]!r} is not a Redis URL",
                         fix="give redis://HOST:PORT/DB, rediss://... or unix:///PATH")  # fmt: skip
    return url
