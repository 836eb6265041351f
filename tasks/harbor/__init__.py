"""Harbor (Terminal-Bench) task directories as a task kind, ``harbor``, run by ``harbor-v1``."""

from tasks.harbor.env import HarborEnv
from tasks.harbor.task import HarborTask

__all__ = ["HarborEnv", "HarborTask"]
