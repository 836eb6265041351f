"""End to end in real Docker sandboxes, with real parts only: SmolLM2-135M-Instruct served by the
built-in engine over loopback HTTP, an env server in a process of its own behind a bearer token
(with a warm sandbox pool), a real Redis, and the real rollout manager, which takes the tasks
queued in the store and writes the finished groups to the TrajectoryStore. Every tool call is the
model's own sample: no injected text, no forced or biased tokens. Environments: ``shell-v1`` and
``coding-v1`` (one task of the shipped suite).

Cost on this 2-core machine: about 47 s for the module (the two groups run at once, about 40 s),
twice that while other jobs share the cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from prometheus_client import generate_latest

from agent_loop.agent import EpisodeConfig
from agent_loop.manager import ManagerConfig, RolloutManager
from agent_loop.tool_parser import tool_call_text
from engine.client import EngineClient
from env_server.client import HttpEnvClient
from env_server.sessions import SessionManager
from loss_masking import ChatRenderer
from pqrl.store import GroupEntry, TrajectoryStore
from pqrl.trajectory import Status, ToolStatus, Trajectory
from sandboxes.docker import owner_id
from sandboxes.docker_api import DockerAPI
from tasks.coding.env import builtin_suite
from tests.models import mask_runs, trajectory_logprobs
from tests.servers import env_server_process

TOKEN = "pytest-sandbox-e2e"
POOL = 2  # the env server's warm pool: spare sandboxes kept started
SANDBOX_TOOLS = {"run", "read_file", "write_file", "edit_file"}  # the tools that act in the container


# Worked examples, written as a plain-text transcript with each role's name on a line of its own
# (the layout of the model's chat template): SmolLM2-135M follows that layout far better than
# "User: ... Assistant: ..." labels. On a two-example version of the coding prompt, at T = 0.7, the
# first sampled token opened a call with probability 0.90 against 0.09.
def _transcript(examples: list[tuple[str, list[str]]]) -> str:
    return "\n\n".join(f"user\n{ask}\nassistant\n" + "\n".join(calls) for ask, calls in examples)


SHELL_PROMPT = "Answer with tool calls only. Examples:\n\n" + _transcript([
    ("list the files, then show notes.txt",
     [tool_call_text("run", command="ls"), tool_call_text("run", command="cat notes.txt")]),
    ("make a folder named data, then list it",
     [tool_call_text("run", command="mkdir data"), tool_call_text("run", command="ls data")]),
]) + "\n\nuser\nwrite hello into hello.txt, then show hello.txt"  # fmt: skip
SHELL_TASK = {"prompt": SHELL_PROMPT, "check": "grep -qx hello hello.txt"}

CODING_TASK_ID = "roman-04"  # the suite's smallest repository


def _coding_example(issue: str, module: str) -> tuple[str, list[str]]:
    """A bug report laid out as coding-v1 shows one, answered with two commands."""
    ask = (f"{issue}\n\n---\nRepository files:\n- {module}.py\n- tests/test_{module}.py\n\n"
           f"Source files (only these are graded): {module}.py")  # fmt: skip
    return ask, [tool_call_text("run", command="ls"), tool_call_text("run", command="python3 -m pytest -q")]


def coding_task() -> dict[str, Any]:
    """The suite's task (repository, hidden tests) with worked examples before its issue's title.
    Its full issue (a code block and a traceback) talks the model out of calling tools: on the
    two-example prompt, a call opened the first turn with probability 0.08 against 0.40."""
    task = builtin_suite().task(CODING_TASK_ID)
    examples = _transcript([
        _coding_example("calc: add is broken (it raises TypeError)", "calc"),
        _coding_example("shapes: area is wrong", "shapes"),
        _coding_example("words: count is broken (it raises KeyError)", "words"),
    ])  # fmt: skip
    title = task.issue.splitlines()[0]
    issue = f"Answer with tool calls only. Examples:\n\n{examples}\n\nuser\n{title}"
    return {**task.model_dump(), "issue": issue}


@dataclass(frozen=True)
class Case:
    env_id: str
    task: dict[str, Any]
    group_size: int
    episode: EpisodeConfig
    in_prompt: str  # text of the task the prompt tokens must hold
    graded: str  # a key of reward_info that only the environment's grader writes


def cases() -> list[Case]:
    """One group per environment, at fixed sampling seeds: the same samples on every run here.

    Measured here (sandbox calls that returned ok, per episode of the group); the commands are
    mostly nonsense (``wf``, ``write hello.txt``, ``python3 -m pytest -w``), but they ran:
    - shell-v1, seed 3: [4, 1, 4, 4], two ``run`` calls in each turn of three episodes; seeds 1 to
      4 with three turns gave 1, 1, 3 and 1 episodes of 4 with two or more.
    - coding-v1, seed 1: [2, 0, 0, 2], two ``run`` calls in the first turn (the other two episodes
      wrote broken calls or prose); seeds 1 to 6 gave 2, 1, 1, 1, 1 and 1 episodes of 4 with two or
      more. Two calls take about 60 tokens: at 64 new tokens the second one was often cut.
    """
    shell = EpisodeConfig(max_turns=2, max_new_tokens=64, max_total_tokens=512, temperature=0.7, seed=3)
    coding = EpisodeConfig(max_turns=2, max_new_tokens=80, max_total_tokens=1024, temperature=0.7, seed=1)
    title = builtin_suite().task(CODING_TASK_ID).issue.splitlines()[0]
    return [
        Case("shell-v1", SHELL_TASK, 4, shell, "write hello into hello.txt", graded="exit_code"),
        Case("coding-v1", coding_task(), 4, coding, title, graded="task_id"),
    ]


def sandbox_calls(t: Trajectory) -> int:
    """The episode's tool calls that ran in its container and returned."""
    return sum(c.name in SANDBOX_TOOLS and c.status is ToolStatus.OK for u in t.turns for c in u.tool_calls)


def _metric(text: str, name: str) -> float:
    (value,) = [float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return value


async def _pool_gauges(client: httpx.AsyncClient, idle: int, timeout_s: float = 30.0) -> dict[str, float]:
    """The env server's warm-pool gauges from /metrics, polled until the pool holds ``idle``
    spares (it creates them in the background) or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await client.get("/metrics")
        assert r.status_code == 200, r.text
        gauges = {k: _metric(r.text, f"pqrl_env_sandbox_pool_{k}") for k in ("idle", "created")}
        if gauges["idle"] == idle or time.monotonic() > deadline:
            return gauges
        await asyncio.sleep(0.2)


async def _containers(labels: dict[str, str]) -> list[dict[str, Any]]:
    api = DockerAPI()
    try:
        return await api.list(labels)
    finally:
        await api.close()


async def _leftover_sandboxes(labels: dict[str, str], timeout_s: float = 20.0) -> list[str]:
    """Containers (in any state) with these labels, polled until none is left or the time is up;
    whatever is left is then removed, and its ids returned."""
    api = DockerAPI()
    try:
        deadline = time.monotonic() + timeout_s
        while (left := await api.list(labels)) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for c in left:
            with contextlib.suppress(Exception):
                await api.remove(c["Id"])
        return [c["Id"][:12] for c in left]
    finally:
        await api.close()


async def _engine_version(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        return int((await c.get("/get_weight_version")).json()["weight_version"])


def check_record(t: Trajectory, tokenizer: Any, case: Case, version: int) -> None:
    """One episode's record: the masks cover exactly the sampled spans, every sampled token has its
    version, the prompt holds the task, and each turn's tool results follow it."""
    where = f"{case.env_id} episode {t.id}"
    assert t.status is not Status.FAILED_INFRA, (where, t.reward_info)
    assert case.graded in t.reward_info and t.reward in (0.0, 1.0), (where, t.reward_info)
    assert t.turns and t.prompt_len == t.turns[0].start, where
    assert case.in_prompt in tokenizer.decode(t.tokens[: t.prompt_len].tolist()), where
    sampled = np.zeros(len(t.tokens), np.uint8)
    for turn in t.turns:
        sampled[turn.start : turn.end] = 1
    # 1 exactly on each turn's engine output_ids; 0 on the prompt, on the template's closing tokens
    # and on every observation (the tool outputs and the template's glue around them).
    assert np.array_equal(t.generated, sampled), where
    assert np.array_equal(t.loss_mask, sampled), where
    assert mask_runs(t.loss_mask) == len(t.turns), where
    gen = sampled.astype(bool)
    assert np.all(t.behavior_logprobs[gen] <= 0) and np.all(t.behavior_logprobs[~gen] == 0), where
    assert set(t.versions[gen].tolist()) == {version} and set(t.versions[~gen].tolist()) == {-1}, where
    # Every turn but the last is followed by its calls' results (the last turn's calls ran too,
    # but the episode ended before their results were shown).
    for turn, nxt in zip(t.turns, t.turns[1:], strict=False):
        observed = tokenizer.decode(t.tokens[turn.end : nxt.start].tolist())
        for call in turn.tool_calls:
            if call.name == "run" and call.status is ToolStatus.OK:  # ShellEnv.run's header
                assert "[exit code" in observed or "[timed out" in observed, (where, observed)
            elif call.status is ToolStatus.INVALID:
                assert "Error" in observed, (where, observed)


async def run_group(
    redis_url: str, engine_url: str, env_url: str, renderer: ChatRenderer, case: Case
) -> tuple[Any, list[GroupEntry]]:
    """A run of its own: its rollout manager turns the one queued task into one stored group."""
    queued = {"env_id": case.env_id, "task": case.task, "task_id": f"e2e-{case.env_id}", "env_kwargs": {}}
    cfg = ManagerConfig(group_size=case.group_size, groups_per_step=1, max_concurrent_groups=1,
                        infra_retries=0, min_valid=case.group_size, episode=case.episode)  # fmt: skip
    store = TrajectoryStore(redis_url, f"e2e-{case.env_id}")
    engine, env = EngineClient(engine_url), HttpEnvClient(env_url, token=TOKEN)
    try:
        await store.tasks.push([queued])
        await store.groups.create_consumer_group("trainer")
        t0 = time.perf_counter()
        stats = await RolloutManager(store, engine, env, renderer, cfg).run()
        print(f"{case.env_id}: a group of {case.group_size} in {time.perf_counter() - t0:.1f} s")
        return stats, await store.groups.read("trainer", "t", count=5)
    finally:
        await engine.aclose()
        await env.aclose()
        await store.close()


async def test_the_models_own_tool_calls_run_in_sandboxes(served, smollm, redis_server):
    """Both environments at once on one env server (two runs, each with its rollout manager), then
    each environment's group is checked on its own."""
    engine_url, _ = served
    model, tokenizer = smollm
    todo = cases()
    with env_server_process(TOKEN, sandbox_pool_size=POOL) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=10) as raw:
            assert (await raw.get("/metrics")).status_code == 401, "the env server must require the token"
            raw.headers.update(live.auth)
            renderer = ChatRenderer(tokenizer)
            done = await asyncio.gather(
                *(run_group(redis_server.url, engine_url, live.url, renderer, case) for case in todo)
            )
            pool = await _pool_gauges(raw, POOL)
            assert (await raw.get("/healthz")).json() == {"ok": True, "sessions": 0}
            spares = await _containers({"pqrl.owner": live.owner})
    # The server is stopped: none of its containers (sessions, spares, graders) may remain.
    left = await _leftover_sandboxes({"pqrl.owner": live.owner})
    version = await _engine_version(engine_url)

    for case, (stats, entries) in zip(todo, done, strict=True):
        assert (stats.groups_written, stats.groups_dropped, dict(stats.failures)) == (1, 0, {}), stats
        (entry,) = entries
        group = entry.trajectories
        calls = [sandbox_calls(t) for t in group]
        print(f"{case.env_id}: sandbox calls per episode {calls}, rewards {[t.reward for t in group]}")
        for t in group:
            print("   ", [(c.name, c.status.value) for u in t.turns for c in u.tool_calls])
        assert len(group) == case.group_size and {t.env for t in group} == {case.env_id}
        for t in group:
            check_record(t, tokenizer, case, version)
        multi = [t for t in group if sandbox_calls(t) >= 2]
        assert multi, f"{case.env_id}: no episode made two sandbox calls: {calls}"
        # The mask-1 tokens are the engine's samples: its logprobs, recomputed by a fresh forward pass.
        forced = trajectory_logprobs(model, multi[0].tokens, case.episode.temperature)
        gen = multi[0].generated.astype(bool)
        assert np.abs(forced[gen] - multi[0].behavior_logprobs[gen]).max() < 1e-3, case.env_id
    # Every session took a fresh sandbox from the pool, which was refilled behind it.
    assert pool["idle"] == POOL, pool
    assert pool["created"] >= sum(case.group_size for case in todo) + POOL, pool
    assert len(spares) >= POOL, "the label query finds the server's containers while it runs"
    assert left == [], f"sandboxes outlived the env server: {left}"


async def test_metrics_report_the_warm_pool():
    """The pool gauges the test above reads: spares ready now, and sandboxes created so far."""
    manager = SessionManager(pool_size=1, run=TOKEN)
    try:
        text = generate_latest(manager.metrics).decode()
        assert _metric(text, "pqrl_env_sandbox_pool_idle") == 0.0, "no pool before the first session"
        assert _metric(text, "pqrl_env_sandbox_pool_created") == 0.0
        info = await manager.create("shell-v1", {"prompt": "p", "check": "true"})
        (pool,) = manager._pools.values()
        deadline = time.monotonic() + 30
        while pool.idle < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        text = generate_latest(manager.metrics).decode()
        assert _metric(text, "pqrl_env_sandbox_pool_idle") == pool.idle == 1, "one spare beside the session"
        assert _metric(text, "pqrl_env_sandbox_pool_created") == pool.stats.created == 2
        await manager.close(info.session_id)
    finally:
        await manager.shutdown()
    assert await _leftover_sandboxes({"pqrl.run": TOKEN, "pqrl.owner": owner_id()}) == []
