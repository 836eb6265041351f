"""One episode's token stream, exactly as the engine saw it, and the Trajectory built from it.

``EpisodeBuilder`` accumulates, in order: the prompt (mask 0), each assistant turn's tokens straight
from the engine's ``output_ids`` with their logprobs and per-token versions (generated 1, mask 1
unless the turn is masked out), the turn-closing tokens the engine did not generate (mask 0), and
each observation's template delta (mask 0). It enforces a context budget (``max_total_tokens``)
with a ``TruncationPolicy``: stop the episode, or cut a tool output to fit with a visible marker.
Either way the record says what was cut, and training uses exactly the tokens the model saw.

Deliberately left out: parsing tool calls (the agent loop decodes ``TurnInfo.content_ids`` and
reports calls back through ``set_tool_calls``), resuming aborted generations (the engine client
hands over one merged output per turn), overlong-penalty rewards, and packing several episodes into
training rows (the trainer's concern).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from loss_masking.template import ChatRenderer, MessageDict
from loss_masking.truncation import TruncationPolicy, cut_observation, summarize
from pqrl.trajectory import Status, ToolCall, Trajectory, Truncation, TruncationKind, Turn

__all__ = ["EpisodeBuilder", "ObservationInfo", "TurnInfo"]

_Expect = Literal["turn", "turn_or_observation", "done"]


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """One appended assistant turn.

    Attributes:
        index: the turn's position among the episode's turns.
        start, end: the engine's tokens, ``tokens[start:end]`` (the Trajectory's Turn span).
        content_ids: the engine's tokens without the closing tokens it generated itself; decode
            these to parse tool calls.
        closing_added: how many closing tokens were appended (mask 0) after ``end``.
        finish_reason: as the engine reported it (``stop`` | ``length`` | ``abort``).
        budget_hit: the turn ran out of context budget; the episode is stopped.
    """

    index: int
    start: int
    end: int
    content_ids: tuple[int, ...]
    closing_added: int
    finish_reason: str
    budget_hit: bool


@dataclass(frozen=True, slots=True)
class ObservationInfo:
    """One observation delta (or the record that it did not fit).

    Attributes:
        start, end: the delta's tokens, ``tokens[start:end]`` (empty when ``stopped``).
        messages: the messages as rendered, with any cut applied; ``delta(messages)`` gives back
            exactly these tokens.
        cut: a message was shortened to fit the budget.
        stopped: the observation did not fit and the episode ended before it.
    """

    start: int
    end: int
    messages: tuple[dict[str, Any], ...]
    cut: bool
    stopped: bool


class EpisodeBuilder:
    """Accumulates one episode's tokens, masks, logprobs and versions; builds its Trajectory.

    Args:
        renderer: the chat renderer of the model's template.
        messages: the initial conversation; rendered once with ``renderer.prompt``.
        tools: tool schemas for the template's tools block (``None`` when described in the system
            message).
        max_total_tokens: the context budget for prompt + all turns and observations; ``None`` for
            no limit.
        truncation: what to do when an observation does not fit.
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        messages: Sequence[MessageDict],
        tools: Sequence[Any] | None = None,
        *,
        max_total_tokens: int | None = None,
        truncation: TruncationPolicy | None = None,
    ) -> None:
        self.renderer = renderer
        self.tools = list(tools) if tools else None
        self.max_total_tokens = max_total_tokens
        self.policy = truncation or TruncationPolicy()
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        prompt = renderer.prompt(messages, self.tools)
        # NOTE: prompt tokens (system message, tool schemas, the task, the first generation prompt)
        # are loss mask 0 and version -1: the policy conditions on them but did not sample them.
        self._tokens: list[int] = list(prompt)
        self._generated: list[int] = [0] * len(prompt)
        self._mask: list[int] = [0] * len(prompt)
        self._logprobs: list[float] = [0.0] * len(prompt)
        self._versions: list[int] = [-1] * len(prompt)
        self.prompt_len = len(prompt)
        self._turns: list[TurnInfo] = []
        self._tool_calls: list[tuple[ToolCall, ...]] = []
        self._events: list[Truncation] = []
        self.stopped = False
        self._expect: _Expect = "turn"
        if self._room() is not None and self._room() < self.policy.min_new_tokens:
            self._stop(f"the prompt of {self.prompt_len} tokens leaves no room for a turn")

    # -- counts the agent loop reads -------------------------------------------------------------

    @property
    def input_ids(self) -> list[int]:
        """The tokens so far (a copy): the next ``/generate`` request's ``input_ids``."""
        return list(self._tokens)

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def num_turns(self) -> int:
        return len(self._turns)

    @property
    def num_generated(self) -> int:
        return sum(self._generated)

    @property
    def num_trainable(self) -> int:
        return sum(self._mask)

    @property
    def turns(self) -> tuple[TurnInfo, ...]:
        return tuple(self._turns)

    @property
    def truncations(self) -> tuple[Truncation, ...]:
        """Every cut and stop, in order (the Trajectory's ``truncation`` summarizes them)."""
        return tuple(self._events)

    def max_new_tokens(self, cap: int) -> int:
        """The generation budget for the next turn: ``cap``, limited by the context budget.

        Returns 0 when the episode is stopped or fewer than ``policy.min_new_tokens`` fit; the
        latter records a ``stop_episode`` truncation.
        """
        if self.stopped:
            return 0
        room = self._room()
        if room is None:
            return cap
        if room < self.policy.min_new_tokens:
            self._stop(f"{room} tokens left, fewer than min_new_tokens={self.policy.min_new_tokens}")
            return 0
        return min(cap, room)

    # -- appending -------------------------------------------------------------------------------

    def add_turn(
        self,
        output_ids: Sequence[int],
        logprobs: Sequence[float],
        versions: Sequence[int] | int,
        *,
        finish_reason: str = "stop",
        train: bool = True,
        tool_calls: Sequence[ToolCall] = (),
    ) -> TurnInfo:
        """Appends one assistant turn from the engine's response, then its missing closing tokens.

        Args:
            output_ids: the engine's ``output_ids``, kept exactly (never re-tokenized).
            logprobs: the engine's logprob of each output token.
            versions: the policy version of each output token, or one version for all.
            finish_reason: ``stop`` | ``length`` | ``abort``, as the engine reported it.
            train: False masks the whole turn out of the loss (e.g. an invalid or overlong turn);
                its tokens stay generated, with their logprobs.
            tool_calls: the calls parsed from the turn, if already known.

        Raises:
            RuntimeError: the episode is stopped, or a turn was appended without an observation
                in between.
            ValueError: lengths disagree, a version is negative, or the output exceeds the budget.
        """
        if self.stopped or self._expect != "turn":
            raise RuntimeError("add_turn needs a prompt or observation before it, in a running episode")
        out = [int(t) for t in output_ids]
        lps = [float(x) for x in logprobs]
        vers = [int(versions)] * len(out) if isinstance(versions, int) else [int(v) for v in versions]
        if not len(lps) == len(vers) == len(out):
            raise ValueError(f"{len(out)} tokens, {len(lps)} logprobs, {len(vers)} versions")
        if vers and min(vers) < 0:
            raise ValueError("versions of generated tokens must be >= 0")
        room = self._room()
        if room is not None and len(out) > room:
            raise ValueError(f"the engine returned {len(out)} tokens but only {room} fit the budget")
        start = len(self._tokens)
        self._append(out, generated=1, mask=int(train), logprobs=lps, versions=vers)
        content_len, missing = self.renderer.split_closing(out)
        # NOTE: closing tokens the engine did not generate (the template's `<|im_end|>\n` after a stop
        # string or a length stop, or just the `\n` after an engine-sampled `<|im_end|>`) get loss
        # mask 0 and version -1: the policy never sampled them, so they have no behaviour logprob.
        self._append(missing, generated=0, mask=0)
        budget_hit = finish_reason == "length" and room is not None and len(out) >= room
        info = TurnInfo(
            index=len(self._turns),
            start=start,
            end=start + len(out),
            content_ids=tuple(out[:content_len]),
            closing_added=len(missing),
            finish_reason=finish_reason,
            budget_hit=budget_hit,
        )
        self._turns.append(info)
        self._tool_calls.append(tuple(tool_calls))
        self.messages.append({"role": "assistant", "content": self.renderer.decode(info.content_ids)})
        self._expect = "turn_or_observation"
        if budget_hit:
            self._stop(f"turn {info.index} used all {room} tokens of context left")
        return info

    def mask_turn(self, index: int = -1) -> None:
        """Masks a turn out of the loss after the fact (e.g. its tool call turned out invalid)."""
        info = self._turns[index]
        # NOTE: an excluded turn keeps generated=1, its logprobs and versions; only loss_mask drops to 0
        # so the trainer skips it while metrics still see what the engine sampled.
        self._mask[info.start : info.end] = [0] * (info.end - info.start)

    def set_tool_calls(self, calls: Sequence[ToolCall], index: int = -1) -> None:
        """Records the tool calls (and their status) of a turn, usually the last one."""
        self._tool_calls[index] = tuple(calls)

    def add_observation(
        self, messages: Sequence[MessageDict], *, add_generation_prompt: bool = True
    ) -> ObservationInfo:
        """Appends tool results / user messages as a template delta, within the context budget.

        Args:
            messages: the observation messages, all rendered in one delta (templates that group
                consecutive tool results need them together).
            add_generation_prompt: end with the next turn's generation prompt (False only for a
                final observation that no turn follows).

        Returns:
            Where the delta went and what was rendered; ``stopped`` when it did not fit under the
            ``stop_episode`` policy (or could not be cut enough), in which case nothing is appended.

        Raises:
            RuntimeError: no assistant turn precedes it, or the episode is stopped.
        """
        if self.stopped or self._expect != "turn_or_observation":
            raise RuntimeError("add_observation must follow an assistant turn in a running episode")
        msgs = tuple(dict(m) for m in messages)
        ids = self.renderer.delta(msgs, add_generation_prompt=add_generation_prompt)
        limit = self._observation_limit(add_generation_prompt)
        start = len(self._tokens)
        cut = False
        if limit is not None and len(ids) > limit:
            found = None
            if self.policy.kind is TruncationKind.CUT_TOOL_OUTPUT:
                found = cut_observation(self.renderer, msgs, ids, limit, self.policy, add_generation_prompt)
            if found is None:
                self._stop(f"an observation of {len(ids)} tokens does not fit the {max(limit, 0)} left")
                return ObservationInfo(start, start, msgs, cut=False, stopped=True)
            msgs, ids, offset, detail = found
            self._events.append(Truncation(TruncationKind.CUT_TOOL_OUTPUT, start + offset, detail))
            cut = True
        # NOTE: observation tokens (tool outputs, user messages and the template glue around them,
        # including the next generation prompt) are loss mask 0: the policy did not produce them.
        self._append(ids, generated=0, mask=0)
        self.messages.extend(msgs)
        self._expect = "turn" if add_generation_prompt else "done"
        return ObservationInfo(start, len(self._tokens), msgs, cut=cut, stopped=False)

    # -- output ----------------------------------------------------------------------------------

    def verify_history(self) -> None:
        """Re-checks the template against this episode's actual messages (renders vs renders).

        Raises:
            TemplateRewritesHistory: the template renders this conversation differently from the
                token stream built here.
        """
        self.renderer.check_history(self.messages, self.tools)

    @property
    def truncation(self) -> Truncation | None:
        """The Trajectory's truncation record (see ``loss_masking.truncation.summarize``)."""
        return summarize(self._events)

    def build(
        self,
        *,
        id: str,
        run_id: str,
        task_id: str,
        group_id: str,
        env: str,
        reward: float = 0.0,
        reward_info: Mapping[str, Any] | None = None,
        status: Status | str | None = None,
        timings: Mapping[str, float] | None = None,
    ) -> Trajectory:
        """The validated Trajectory of the episode so far.

        ``status`` defaults to ``truncated`` when the episode was stopped by the budget and
        ``completed`` otherwise (a cut tool output alone does not end the episode).
        """
        if status is None:
            stopped = any(t.kind is TruncationKind.STOP_EPISODE for t in self._events)
            status = Status.TRUNCATED if stopped else Status.COMPLETED
        turns = tuple(
            Turn(t.start, t.end, t.finish_reason, calls)
            for t, calls in zip(self._turns, self._tool_calls, strict=True)
        )
        return Trajectory(
            id=id,
            run_id=run_id,
            task_id=task_id,
            group_id=group_id,
            env=env,
            tokens=np.asarray(self._tokens, dtype=np.int32),
            generated=np.asarray(self._generated, dtype=np.uint8),
            loss_mask=np.asarray(self._mask, dtype=np.uint8),
            behavior_logprobs=np.asarray(self._logprobs, dtype=np.float32),
            versions=np.asarray(self._versions, dtype=np.int32),
            prompt_len=self.prompt_len,
            turns=turns,
            reward=reward,
            reward_info=dict(reward_info or {}),
            status=status,
            truncation=self.truncation,
            timings=dict(timings or {}),
        )

    # -- internals -------------------------------------------------------------------------------

    def _append(
        self,
        ids: Sequence[int],
        *,
        generated: int,
        mask: int,
        logprobs: Sequence[float] | None = None,
        versions: Sequence[int] | None = None,
    ) -> None:
        n = len(ids)
        self._tokens.extend(ids)
        self._generated.extend([generated] * n)
        self._mask.extend([mask] * n)
        self._logprobs.extend(logprobs if logprobs is not None else [0.0] * n)
        self._versions.extend(versions if versions is not None else [-1] * n)

    def _room(self) -> int | None:
        """Tokens the next turn may generate, with room kept for its closing tokens."""
        if self.max_total_tokens is None:
            return None
        return self.max_total_tokens - len(self._tokens) - len(self.renderer.closing_ids)

    def _observation_limit(self, add_generation_prompt: bool) -> int | None:
        if self.max_total_tokens is None:
            return None
        left = self.max_total_tokens - len(self._tokens)
        if add_generation_prompt:
            left -= len(self.renderer.closing_ids) + self.policy.min_new_tokens
        return left

    def _stop(self, detail: str) -> None:
        self.stopped = True
        self._events.append(Truncation(TruncationKind.STOP_EPISODE, len(self._tokens), detail))
