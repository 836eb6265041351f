"""The multi-turn agent loop: one task, one environment session, one Trajectory.

Each turn: generate from the exact token list so far (engine ``output_ids`` and logprobs, never
re-tokenized), parse the tool calls from the generated text (in ``cfg.tool_parser``'s format), run
the calls in the environment, and append the tool results as a chat-template delta (loss mask 0).
The episode stops when the environment says done, the model makes no tool call, the turn or token
budget runs out, or too many consecutive turns had only invalid calls. Then the environment scores it.

Transient failures of the environment's infrastructure (its server, its sandbox, a grader that
raised) give a ``failed_infra`` Trajectory with the cause, never a silent zero reward; the trainer
keeps those out of advantage statistics. Permanent ones (``pqrl.faults``) raise, for the manager.

A queued task may carry ``reward`` terms (its suite's reward functions, tasks.rewards): the
environment's score is then one input of their weighted sum, computed here where the episode's
text and calls are known.

Deliberately left out: streaming and parallel tool calls across turns.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from agent_loop.config import EpisodeConfig
from agent_loop.tool_parser import ToolFormat, as_openai_calls, get_parser
from engine.protocol import Engine, SamplingParams
from env_server.client import EnvClient
from env_server.sessions import EnvServerError
from env_server.types import Message, Observation
from loss_masking import ChatRenderer, EpisodeBuilder, TruncationPolicy, describe_tools
from pqrl.faults import Fault, fault_of
from pqrl.trajectory import Status, ToolCall, ToolStatus, Trajectory
from tasks.rewards import Episode, combine

__all__ = ["EpisodeConfig", "failed_trajectory", "prompt_messages", "run_episode"]


@dataclass
class _Outcome:
    status: Status = Status.COMPLETED
    reason: str = ""
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # why a failed_infra episode failed (the stop reason says how its turns ended)


async def run_episode(
    queued: dict[str, Any],
    *,
    engine: Engine,
    env: EnvClient,
    renderer: ChatRenderer,
    run_id: str,
    group_id: str,
    index: int = 0,
    cfg: EpisodeConfig | None = None,
) -> Trajectory:
    """Runs one episode of a queued task (``{"env_id", "task", "task_id", "env_kwargs"}``)."""
    ids = _EpisodeIds(run_id, group_id, index)
    return await _Episode(queued, engine, env, renderer, ids, cfg or EpisodeConfig()).run()


class _EpisodeIds(NamedTuple):
    run_id: str
    group_id: str
    index: int


class _Episode:
    """One episode's state: its collaborators, timings, the invalid-call streak and the outcome."""

    def __init__(
        self, queued: dict[str, Any], engine: Engine, env: EnvClient, renderer: ChatRenderer,
        ids: _EpisodeIds, cfg: EpisodeConfig,
    ) -> None:  # fmt: skip
        self.queued, self.engine, self.env, self.renderer = queued, engine, env, renderer
        self.run_id, self.group_id, self.index = ids
        self.cfg = cfg
        self.parser = get_parser(cfg.tool_parser)
        self.tools: list[dict[str, Any]] | None = None  # the session's schemas: typed parameters
        self.rollout_id = f"{ids.group_id}-{ids.index}"
        # env time split by phase: opening the session (a sandbox from the pool, the task's setup),
        # the tool calls, and the grading; env_s is their sum
        self.timings: dict[str, float] = {"generate_s": 0.0, "open_s": 0.0, "tools_s": 0.0, "grade_s": 0.0}
        self.t_start = time.perf_counter()
        self.out = _Outcome()
        self.invalid_streak = 0
        self.texts: list[str] = []  # each turn's decoded text, for reward functions
        self.calls: list[ToolStatus] = []  # every call's status, likewise
        self.numbered = 0  # calls of the conversation so far (worked examples included): their ids

    def record(self, kind: str, t0: float) -> None:
        self.timings[kind] = self.timings.get(kind, 0.0) + time.perf_counter() - t0

    async def run(self) -> Trajectory:
        """Opens a session, plays the turns, scores them; a session that won't open is failed_infra."""
        t0 = time.perf_counter()
        try:
            session = await self.env.create_session(
                self.queued["env_id"],
                self.queued["task"],
                seed=None,
                env_kwargs=self.queued.get("env_kwargs") or {},
            )
        except EnvServerError as e:
            # the environment side could not open it: failed_infra with the cause and its class
            # (pqrl.faults), for the manager to rerun it, dead-letter the task or wait out an outage;
            # a job-wide fault (a wrong token, an unknown environment) raises
            if fault_of(e) is Fault.JOB:
                raise
            t = failed_trajectory(self.queued, self.run_id, self.group_id, self.rollout_id,
                                  f"could not open a session: {e}", self.timings)  # fmt: skip
            t.reward_info.update(_fault_info(e))
            return t
        self.record("open_s", t0)
        self.tools = session.observation.tools
        builder = _new_builder(self.renderer, session.observation, self.cfg, self.parser)
        self.numbered = _calls_in(session.observation)
        await self._play(session.session_id, builder)
        return self._build(builder)

    async def _play(self, session_id: str, builder: EpisodeBuilder) -> None:
        """Turns until a stop condition, then the score; always releases the engine and the session."""
        try:
            for turn in range(self.cfg.max_turns):
                reason = await self._turn(session_id, builder, turn)
                if reason is not None:
                    self.out.reason = reason
                    break
            t0 = time.perf_counter()
            scored = await self.env.evaluate(session_id)
            self.record("grade_s", t0)
            self.out.reward, self.out.reward_info = scored.reward, dict(scored.info)
            if self.queued.get("reward"):
                self._combine(builder)
        except EnvServerError as e:
            if fault_of(e) is Fault.JOB:
                raise
            self.out.status, self.out.error = Status.FAILED_INFRA, str(e)
            self.out.reward_info = _fault_info(e)
            self.out.reason = self.out.reason or "the environment failed"
        finally:
            self.engine.release(self.rollout_id)
            with contextlib.suppress(EnvServerError):  # expired or gone: nothing left to release
                await self.env.close_session(session_id)

    def _combine(self, builder: EpisodeBuilder) -> None:
        """The suite's reward functions over this episode; one that fails fails the episode like a
        grader that raised (failed_infra, the cause kept)."""
        ok = sum(s is ToolStatus.OK for s in self.calls)
        ep = Episode(
            env_reward=self.out.reward,
            env_info=dict(self.out.reward_info),
            completion="".join(self.texts),
            turns=builder.num_turns,
            tool_calls=len(self.calls),
            ok_calls=ok,
            generated_tokens=builder.num_generated,
            task=dict(self.queued["task"]),
        )
        try:
            total, values = combine(self.queued["reward"], ep)
        except ValueError as e:
            self.out.status, self.out.error = Status.FAILED_INFRA, f"reward: {e}"
            return
        self.out.reward_info |= {"env_reward": self.out.reward, "reward_terms": values}
        self.out.reward = total

    async def _turn(self, session_id: str, builder: EpisodeBuilder, turn: int) -> str | None:
        """Generates one turn and runs its tool calls: the reason to stop, or None to go on."""
        budget = builder.max_new_tokens(self.cfg.max_new_tokens)
        if budget == 0:
            return "context budget"
        params = self._sampling(budget, turn)
        t0 = time.perf_counter()
        # a template that opens the reasoning block in the prompt: the turn starts inside it
        thinking = self.parser.thinking_after(self.renderer.decode(builder.input_ids[-8:]))
        gen = await self.engine.generate(builder.input_ids, params, rollout_id=self.rollout_id)
        self.record("generate_s", t0)
        info = builder.add_turn(
            gen.output_ids, gen.logprobs, gen.versions, finish_reason=gen.finish_reason.type
        )
        text = self.renderer.decode(info.content_ids)
        self.texts.append(text)
        calls = self.parser.parse(text, tools=self.tools, thinking=thinking)
        if info.budget_hit or builder.stopped:
            return "context budget"
        if not calls:
            return "no tool call"
        return await self._act(session_id, builder, calls, turn)

    def _sampling(self, budget: int, turn: int) -> SamplingParams:
        cfg = self.cfg
        return SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=budget,
            stop_token_ids=list(cfg.stop_token_ids),
            sampling_seed=None
            if cfg.seed is None
            else (cfg.seed * 1_000_003 + self.index * 1009 + turn) % 2**31,
        )

    async def _act(
        self, session_id: str, builder: EpisodeBuilder, calls: list[ToolCall], turn: int
    ) -> str | None:
        """Runs a turn's calls and appends their results (loss mask 0) unless the episode stops here."""
        t0 = time.perf_counter()
        ids = [self.parser.call_id(self.numbered + i) for i in range(len(calls))]
        self.numbered += len(calls)
        results, records, done = await _run_calls(self.env, session_id, calls, ids)
        self.record("tools_s", t0)
        builder.set_tool_calls(records)
        self.calls += [r.status for r in records]
        failed = all(r.status is not ToolStatus.OK for r in records)
        self.invalid_streak = self.invalid_streak + 1 if failed else 0
        if done:
            return "done"
        if self.invalid_streak >= self.cfg.max_invalid_turns:
            return f"{self.invalid_streak} turns of invalid calls"
        if turn == self.cfg.max_turns - 1:
            return "max turns"
        obs = builder.add_observation(results)
        return "context budget" if obs.stopped else None

    def _build(self, builder: EpisodeBuilder) -> Trajectory:
        """The Trajectory of the turns played, with the stop reason; a failed_infra one scores 0."""
        self.timings["total_s"] = time.perf_counter() - self.t_start
        self.timings["env_s"] = sum(self.timings[k] for k in ("open_s", "tools_s", "grade_s"))
        out, queued = self.out, self.queued
        reward_info = {**out.reward_info, "stop_reason": out.reason}
        if out.error:  # under the key failed_trajectory uses
            reward_info["error"] = out.error
        return builder.build(
            id=f"{self.rollout_id}-{uuid.uuid4().hex[:6]}",
            run_id=self.run_id,
            task_id=str(queued.get("task_id") or queued["task"].get("id", "?")),
            group_id=self.group_id,
            env=queued["env_id"],
            reward=out.reward if out.status is not Status.FAILED_INFRA else 0.0,
            reward_info=reward_info,
            status=out.status if out.status is Status.FAILED_INFRA else None,
            timings=self.timings,
        )


def _fault_info(e: EnvServerError) -> dict[str, Any]:
    """What a failed_infra episode records of a permanent fault (a task's, an outage): its class,
    status and code; nothing for a transient one."""
    fault = fault_of(e)
    if fault is Fault.TRANSIENT:
        return {}
    return {"fault_class": fault.value, "fault_status": e.status, "fault_code": e.code}


def _new_builder(
    renderer: ChatRenderer, observation: Observation, cfg: EpisodeConfig, parser: ToolFormat
) -> EpisodeBuilder:
    """The token builder over the first observation's messages (and tools, where the template has them)."""
    messages, tools = prompt_messages(renderer, observation, parser)
    return EpisodeBuilder(
        renderer,
        messages,
        tools if renderer.supports_tools else None,
        max_total_tokens=cfg.max_total_tokens,
        truncation=TruncationPolicy(kind=cfg.truncation),
    )


async def _run_calls(
    env: EnvClient, session_id: str, calls: list[ToolCall], ids: list[str]
) -> tuple[list[dict[str, Any]], list[ToolCall], bool]:
    """Tool messages in call order, the calls as they ended (for the Trajectory), and whether the
    env is done. The calls still to run go to the environment in one step. Every call, a malformed
    one too, gets its id from ``ids`` (the format's: its tool message answers to it)."""
    calls = [replace(c, id=i) for c, i in zip(calls, ids, strict=True)]
    pending = [c for c in calls if c.pending]
    replies: list[Message] = []
    done = False
    if pending:
        step = await env.step(session_id, pending)
        if len(step.messages) != len(pending):
            raise ValueError(f"{len(pending)} tool calls were answered with {len(step.messages)} messages")
        replies, done = step.messages, step.done
    answers = iter(replies)
    messages, records = [], []
    for call in calls:
        if not call.pending:  # never ran: its error is the answer
            error = call.error or f"Error: {call.name} was not run"
            messages.append({"role": "tool", "content": error, "tool_call_id": call.id})
            records.append(call)
            continue
        reply = next(answers)
        messages.append(
            {"role": "tool", "name": call.name, "content": reply.content, "tool_call_id": call.id}
        )
        records.append(call.ended(reply.status or ToolStatus.OK))
    return messages, records, done


def prompt_messages(
    renderer: ChatRenderer, observation: Observation, parser: ToolFormat
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The first observation as the model's template takes it, and the tools its template renders.

    A template without a tools block gets the schemas and the parser's call format in the system
    message instead, unless the prompt already shows calls in that format (worked examples); worked
    examples' calls are written as the template or the parser writes them.
    """
    dumped = [m.model_dump(exclude_none=True, exclude={"status"}) for m in observation.messages]
    messages = [_written(m, renderer, parser) for m in _numbered(dumped, parser)]
    shown = any(c.pending for m in messages for c in parser.parse(m["content"]))
    tools = observation.tools
    if not renderer.supports_tools and tools and not shown:
        messages = _with_tools_in_system(messages, describe_tools(tools, parser.instructions()))
    return messages, tools if renderer.supports_tools else None


def _calls_in(observation: Observation) -> int:
    return sum(len(m.tool_calls or ()) for m in observation.messages)


def _numbered(messages: list[dict[str, Any]], parser: ToolFormat) -> list[dict[str, Any]]:
    """The worked examples' calls with the format's ids, in conversation order, and each tool
    message after them answering the next of those ids (a template may check that they match)."""
    n, waiting, out = 0, list[str](), []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "id": parser.call_id(n + i)} for i, c in enumerate(m["tool_calls"])]
            n, waiting = n + len(calls), [c["id"] for c in calls]
            m = {**m, "tool_calls": calls}
        elif m["role"] == "tool":
            m = {**m, "tool_call_id": waiting.pop(0) if waiting else parser.call_id(n)}
        out.append(m)
    return out


def _written(message: dict[str, Any], renderer: ChatRenderer, parser: ToolFormat) -> dict[str, Any]:
    """An environment's message as the model's template takes it: an assistant message's tool
    calls (a worked example) as structured ``tool_calls`` where the template writes them, else
    written after its content in the parser's format."""
    calls = message.pop("tool_calls", None)
    if not calls:
        return message
    if renderer.renders_tool_calls:
        return {**message, "tool_calls": as_openai_calls(calls, parser)}
    content = message["content"]
    glue = "\n" if content and not content.endswith("\n") else ""  # a call opens a line of its own
    return {**message, "content": content + glue + parser.render(calls)}


def _with_tools_in_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def failed_trajectory(
    queued: dict[str, Any],
    run_id: str,
    group_id: str,
    rollout_id: str,
    reason: str,
    timings: dict[str, float] | None = None,
) -> Trajectory:
    """An empty failed_infra record: kept for metrics, never in advantage statistics."""
    empty = np.zeros(0, np.int32)
    return Trajectory(
        id=f"{rollout_id}-{uuid.uuid4().hex[:6]}",
        run_id=run_id,
        group_id=group_id,
        task_id=str(queued.get("task_id") or "?"),
        env=queued["env_id"],
        tokens=empty,
        generated=empty,
        loss_mask=empty,
        behavior_logprobs=empty,
        versions=empty,
        prompt_len=0,
        status=Status.FAILED_INFRA,
        reward=0.0,
        reward_info={"error": reason},
        timings=timings or {},
    )
