"""Registers the task suites' environments (entry point ``pqrl.environments: tasks``)."""

from __future__ import annotations

import random

from env_server.registry import register_environment

__all__ = ["register"]


def register() -> None:
    from tasks.calc import make_calc_task
    from tasks.search import search_suite

    sample = make_calc_task(random.Random(0), "calc-sample").model_dump()
    register_environment("calc-v1", entry_point="tasks.calc:CalcEnv", max_turns=8, sample_task=sample)
    # A small built-in corpus by default; a suite names its own (env_kwargs["corpus"]: inline, a file
    # or a digest) or a retrieval server (env_kwargs["retriever_url"]), see tasks.retrieval.
    demo = search_suite(24, seed=0, name="search-demo")
    register_environment(
        "search-v1",
        entry_point="tasks.search:SearchEnv",
        max_turns=8,
        sample_task=demo.tasks[0].model_dump(),
        corpus=demo.manifest.defaults["corpus"],
    )
    from tasks.data import make_data_task

    sample = make_data_task(random.Random(0), "data-sample").model_dump()
    register_environment("data-v1", entry_point="tasks.data:DataEnv", max_turns=6, sample_task=sample)
    register_environment("coding-v1", "tasks.coding:CodingEnv", max_turns=30, sample_task={"ref": "roman-00"})
    from tasks.repo.sample import sample_task

    # the run tool allows 300 s; a real repository's test run takes that long
    register_environment(
        "repo-v1", "tasks.repo.env:RepoEnv", max_turns=50, tool_timeout_s=330.0, sample_task=sample_task()
    )
    from tasks.harbor.task import SAMPLE_TASK

    register_environment("harbor-v1", "tasks.harbor.env:HarborEnv", max_turns=40, sample_task=SAMPLE_TASK)
