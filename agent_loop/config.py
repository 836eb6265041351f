"""The rollout side's settings, declared once: the job config, ``pqrl rollout``'s flags and
``pqrl train --explain`` are derived from these. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pqrl.settings import Settings, setting
from pqrl.staleness import MIN_GROUP_EPISODES

__all__ = ["MAX_FAILED_INFRA", "EpisodeConfig", "ManagerConfig"]

# an evaluation that lost a larger share of its tasks to infrastructure reports no pass rate
MAX_FAILED_INFRA = 0.2


@dataclass(frozen=True, kw_only=True)
class EpisodeConfig(Settings):
    """Limits and sampling of one episode. RL samples the policy as it is: top_p 1, top_k -1."""

    max_turns: int = setting(8, "assistant turns per episode at most", ge=1)
    max_new_tokens: int = setting(256, "tokens per assistant turn at most", ge=1)
    max_total_tokens: int = setting(2048, "context budget of one episode (prompt, turns, tool output)", ge=16)
    temperature: float = setting(
        1.0, "sampling temperature (0: greedy, for evaluation; the trainer recomputes logprobs at it)", ge=0
    )
    top_p: float = setting(1.0, "nucleus sampling (1: off, the unbiased choice for RL)", gt=0, le=1)
    top_k: int = setting(-1, "top-k sampling (-1: off)", ge=-1)
    max_invalid_turns: int = setting(
        2, "stop after this many consecutive turns whose every call failed", ge=1
    )
    truncation: Literal["stop_episode", "cut_tool_output"] = setting(
        "cut_tool_output", "over the context budget: end the episode, or cut the tool output to fit"
    )
    stop_token_ids: tuple[int, ...] = setting((), "extra token ids that end a turn")
    seed: int | None = setting(
        None, "per-turn sampling seeds derive from it: reproducible whatever the batching"
    )
    tool_parser: str = setting(
        "hermes",
        "how the model writes tool calls (a parser named as SGLang/vLLM name theirs: hermes, qwen3_coder, "
        "llama3_json, mistral, pythonic, gemma; or a plug-in's)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        from agent_loop.tool_parser import get_parser

        get_parser(self.tool_parser)  # an unknown name fails where it is written, naming the known ones


@dataclass(frozen=True, kw_only=True)
class ManagerConfig(Settings):
    """How one rollout manager runs groups. ``groups_per_step`` is the trainer's setting (groups it
    consumes per step, which sizes the staleness gate): the job passes it, so the two cannot differ."""

    groups_per_step: int = setting(description="groups the trainer consumes per step (sizes the gate)", ge=1)
    group_size: int = setting(8, "G: episodes per task (one group)", ge=2)
    max_staleness: int = setting(1, "admit no group that would lag the policy by more versions", ge=0)
    max_concurrent_groups: int = setting(4, "groups in flight per rollout manager", ge=1)
    infra_retries: int = setting(3, "reruns of an episode whose infrastructure failed", ge=0)
    # a restarting env server or engine is back within seconds: retrying at once would spend every
    # rerun before it answers and drop the group
    infra_backoff_s: float = setting(2.0, "wait before the first rerun; doubled before each next one", ge=0)
    backend_grace_s: float = setting(
        60.0,
        "how long a sandbox backend that is down (Docker unreachable) is waited for before the job "
        "stops with a permanent fault",
        gt=0,
    )
    dead_tasks_to_stop: int = setting(
        3,
        "tasks dead-lettered (a permanent fault of their own) before any group was written that stop "
        "the job: every task failing at once is the suite's fault, not a task's",
        ge=1,
    )
    redis_grace_s: float = setting(
        300.0, "how long Redis may stay unreachable before the rollout side stops (exit status 4)", gt=0
    )
    min_valid: int = setting(
        MIN_GROUP_EPISODES, "a group with fewer usable episodes is dropped", ge=MIN_GROUP_EPISODES
    )
    episode_deadline_s: float = setting(600.0, "wall-clock limit of one episode", gt=0)
    lease_timeout_s: float = setting(900.0, "a task leased this long by a silent manager is taken over", gt=0)
    put_timeout_s: float = setting(600.0, "how long a finished group waits for room in the stream", gt=0)
    progress_every_s: float = setting(30.0, "seconds between progress lines", gt=0)
    cull_stale: bool = setting(
        True, "cancel a group once the policy has moved too far past its tokens for it to be trained"
    )
    stale_requeues: int = setting(1, "times a task whose group was cancelled as stale is run again", ge=0)
    episode: EpisodeConfig = setting(factory=EpisodeConfig, description="limits and sampling of each episode")
