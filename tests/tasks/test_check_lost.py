"""``tasks.check``: a check the machine lost (an infrastructure failure, not a grader's bug) is
tried again after a backoff, and one lost every time is reported as not checked, never as a task
that fails (generation would drop it for good, ``validate --check`` would call the suite bad)."""

from __future__ import annotations

import asyncio

from env_server.sessions import GraderFailure, InfraFailure
from tasks import check
from tasks.generators import Generate, generate_suite


def _run(monkeypatch, outcomes: list[BaseException | None]) -> tuple[list[check.CheckFailure], int]:
    calls = []

    async def episodes(*args, **kwargs):
        calls.append(1)
        out = outcomes[min(len(calls), len(outcomes)) - 1]
        if out is not None:
            raise out
        return [], []

    monkeypatch.setattr(check, "scripted_episodes", episodes)
    monkeypatch.setattr(check, "BACKOFF_S", 0.0)
    suite = generate_suite(Generate("calc", n=1, seed=3))
    return asyncio.run(check.check_suite(suite, progress=lambda m: None)), len(calls)


def test_a_lost_check_is_tried_again_and_then_passes(monkeypatch):
    failures, calls = _run(monkeypatch, [InfraFailure("sandbox died"), None])
    assert failures == [] and calls == 2


def test_a_check_lost_every_time_is_not_checked_rather_than_failed(monkeypatch):
    failures, calls = _run(monkeypatch, [InfraFailure("reference lost")])
    assert calls == check.TRIES and len(failures) == 1 and failures[0].transient
    assert "reference lost" in failures[0].reason


def test_a_graders_bug_is_the_tasks_failure_at_once(monkeypatch):
    failures, calls = _run(monkeypatch, [GraderFailure("KeyError")])
    assert calls == 1 and len(failures) == 1 and not failures[0].transient


def test_a_task_retired_because_its_reference_was_lost_is_not_checked_not_failed(monkeypatch):
    from env_server.sessions import BadTask
    from tasks.repo.grading import ReferenceRetired

    retired = BadTask("session s: repo-v1: ReferenceRetired: no gold record in 3 tries")
    retired.__cause__ = ReferenceRetired("task t: no gold record in 3 tries: timed out")
    failures, calls = _run(monkeypatch, [retired])
    assert calls == check.TRIES and failures[0].transient
    failures, calls = _run(monkeypatch, [BadTask("session s: repo-v1: the gold patch fails")])
    assert calls == 1 and not failures[0].transient  # a task that is wrong fails at once
