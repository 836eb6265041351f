"""Trajectory groups in the shape of calc episodes, tokenized with the real tokenizer: a group with
signal (a tool error, a turn excluded from the loss), one whose rewards are all equal, and one with
an infrastructure failure and a stale member. The rollout log's and the viewer's tests read them."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from pqrl.trajectory import ToolCall, Trajectory, Turn

PROMPT = "<|im_start|>user\nWhat is 12 / (5 - 5)? Use the calculator.<|im_end|>\n<|im_start|>assistant\n"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expr": "12 / (5 - 5)"}}</tool_call>'
ERROR_OUTPUT = "<|im_start|>tool\nZeroDivisionError: division by zero<|im_end|>\n<|im_start|>assistant\n"
OK_OUTPUT = "<|im_start|>tool\n2.4<|im_end|>\n<|im_start|>assistant\n"
INFRA_ERROR = "sandbox container exited 137 (OOM) while opening"


def _enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def episode(
    tok: Any, group_id: str, index: int, *, reward: float, version: int, tool: str = "ok",
    answer: str = "The answer is 2.4", masked_turn: bool = False, status: str = "completed",
    reward_info: dict[str, Any] | None = None,
) -> Trajectory:  # fmt: skip
    """One episode: the prompt, a turn calling the calculator (``tool``: its status), the tool's
    output, then a final answer turn (excluded from the loss with ``masked_turn``)."""
    rng = np.random.default_rng([zlib.crc32(group_id.encode()), index])
    parts: list[tuple[list[int], int]] = [(_enc(tok, PROMPT), 0)]
    parts.append((_enc(tok, CALL), 1))
    parts.append((_enc(tok, ERROR_OUTPUT if tool == "error" else OK_OUTPUT), 0))
    parts.append((_enc(tok, answer + "<|im_end|>"), 1))
    tokens = np.concatenate([np.array(p, np.int32) for p, _ in parts])
    generated = np.concatenate([np.full(len(p), g, np.uint8) for p, g in parts])
    loss_mask = generated.copy()
    turns, at = [], len(parts[0][0])
    call_end = at + len(parts[1][0])
    turns.append(
        Turn(at, call_end, "stop", (ToolCall("calculator", {"expr": "12 / (5 - 5)"}, tool, id="0"),))
    )
    answer_start = call_end + len(parts[2][0])
    turns.append(Turn(answer_start, len(tokens), "stop"))
    if masked_turn:
        loss_mask[answer_start:] = 0
    if status == "failed_infra":  # the sandbox failed before the first turn: the prompt alone
        tokens = tokens[: len(parts[0][0])]
        generated, loss_mask, turns = np.zeros(len(tokens), np.uint8), np.zeros(len(tokens), np.uint8), []
    versions = np.where(generated == 1, version, -1).astype(np.int32)
    logprobs = np.where(generated == 1, -rng.random(len(tokens)) * 2, 0).astype(np.float32)
    return Trajectory(
        id=f"{group_id}-{index}", run_id="r", task_id=f"calc-{group_id}", group_id=group_id, env="calc-v1",
        tokens=tokens, generated=generated, loss_mask=loss_mask, behavior_logprobs=logprobs,
        versions=versions, prompt_len=len(parts[0][0]), turns=tuple(turns), reward=reward,
        reward_info=reward_info if reward_info is not None else {"exact": reward == 1.0, "answer": "2.4"},
        status=status, timings={"generate_s": 0.5},
    )  # fmt: skip


def mixed_groups(tok: Any, version: int, stale_version: int) -> list[list[Trajectory]]:
    """Three groups read at ``version``: ``sig`` trains (a tool error, masked turns), ``flat`` has
    no signal, ``infra`` trains its two good members and drops a failed one and a stale one
    (generated at ``stale_version``)."""
    sig = [
        episode(tok, "sig", 0, reward=1.0, version=version),
        episode(
            tok,
            "sig",
            1,
            reward=0.0,
            version=version,
            tool="error",
            answer="I cannot divide by zero",
            masked_turn=True,
            reward_info={"exact": False, "why": "no number in the answer"},
        ),
        episode(tok, "sig", 2, reward=0.2, version=version, masked_turn=True),
        episode(tok, "sig", 3, reward=1.0, version=version),
    ]
    nan = {"exact": False, "similarity": float("nan")}  # a grader's own NaN: JSON has none
    flat = [
        episode(tok, "flat", i, reward=0.0, version=version, answer="It is 7", reward_info=nan)
        for i in range(4)
    ]
    infra = [
        episode(tok, "infra", 0, reward=1.0, version=version),
        episode(tok, "infra", 1, reward=0.0, version=version, answer="It is 3"),
        episode(
            tok,
            "infra",
            2,
            reward=0.0,
            version=version,
            status="failed_infra",
            reward_info={"error": INFRA_ERROR, "fault_class": "transient"},
        ),
        episode(tok, "infra", 3, reward=1.0, version=stale_version),
    ]
    return [sig, flat, infra]
