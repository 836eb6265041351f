"""Registers the task suites' environments (entry point ``pqrl.environments: tasks``)."""

from __future__ import annotations

import random

from env_server.registry import register_environment

__all__ = ["register"]


def register() -> None:
    from tasks.calc import make_calc_task

    sample = make_calc_task(random.Random(0), "calc-sample").model_dump()
    register_environment("calc-v1", entry_point="tasks.calc:CalcEnv", max_turns=8, sample_task=sample)
