"""``pqrl demo``: a short tour of the data path, with every part real.

A private Redis (or ``--redis-url``), the run's task queue, SmolLM2-135M-Instruct sampling G answers
per arithmetic task with the engine's logprob convention (log_softmax(logits / T) of the sampled
token), Trajectory records with exact-answer rewards, groups written to the trajectory stream, and a
trainer-side consumer group that reads, scores (GRPO group advantages) and acknowledges them,
after which the stream is trimmed to empty. It has no tools, sandboxes or optimizer step:
``pqrl train`` is the whole job.

Like the CLI, this module starts everything, so it may import above the floor (trainer.advantages).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from pqrl.model_cache import DEFAULT_MODEL, load_model, load_tokenizer
from pqrl.redis_server import RedisServer
from pqrl.settings import Settings, setting
from pqrl.store import TrajectoryStore
from pqrl.trajectory import Trajectory, Turn

__all__ = ["DemoConfig", "run_demo"]


@dataclass(frozen=True, kw_only=True)
class DemoConfig(Settings):
    tasks: int = setting(4, "number of tasks (one group each)", ge=1)
    group_size: int = setting(4, "samples per task (G)", ge=2)
    max_new_tokens: int = setting(32, "tokens per answer at most", ge=1)
    temperature: float = setting(0.7, "sampling temperature", gt=0)
    seed: int = setting(0, "task and sampling seed")
    model: str = setting(DEFAULT_MODEL, "built-in model name or a model directory")
    redis_url: str | None = setting(None, "use this Redis instead of a private one")


def make_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)  # small enough for a 135M model to get some right
        tasks.append({"id": f"add-{seed}-{i}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
    return tasks


def exact_answer_reward(text: str, answer: str) -> float:
    """1 when the last number in the response is the answer."""
    numbers = re.findall(r"-?\d+", text)
    return float(bool(numbers) and numbers[-1] == answer)


def sample_group(
    model: Any, tokenizer: Any, task: dict[str, Any], cfg: DemoConfig, run_id: str
) -> list[Trajectory]:
    import torch

    messages = [{"role": "user", "content": task["question"] + " Answer with just the number."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    input_ids = torch.tensor([prompt] * cfg.group_size)
    with torch.no_grad():
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=cfg.temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=cfg.max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.eos_token_id,
        )
    new = out.sequences[:, len(prompt) :]
    # SGLang's convention: log_softmax(logits / T) of the sampled token, no top-p/top-k renormalization.
    logits = torch.stack(out.logits, dim=1).float() / cfg.temperature
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    group_id = uuid.uuid4().hex[:12]
    group = []
    for i in range(cfg.group_size):
        ids = new[i].tolist()
        n = ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids)
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        T = len(prompt) + n
        generated = np.zeros(T, np.uint8)
        generated[len(prompt) :] = 1
        behavior = np.zeros(T, np.float32)
        behavior[len(prompt) :] = logprobs[i, :n].numpy()
        group.append(
            Trajectory(
                id=f"{group_id}-{i}",
                run_id=run_id,
                task_id=task["id"],
                group_id=group_id,
                env="demo-add",
                tokens=np.array(prompt + ids[:n], np.int32),
                generated=generated,
                loss_mask=generated.copy(),
                behavior_logprobs=behavior,
                versions=np.where(generated == 1, 0, -1).astype(np.int32),
                prompt_len=len(prompt),
                turns=(Turn(len(prompt), T, "stop" if ids[n - 1] == tokenizer.eos_token_id else "length"),),
                reward=exact_answer_reward(text, task["answer"]),
                reward_info={"response": text, "answer": task["answer"]},
            )
        )
    return group


async def _run(cfg: DemoConfig, redis_url: str) -> dict[str, Any]:
    import torch

    from trainer.advantages import grpo_advantages  # torch: imported when the demo runs, not for its flags

    torch.manual_seed(cfg.seed)
    run_id = f"demo-{int(time.time())}-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model).eval()
    print(
        f"model {cfg.model} loaded in {time.perf_counter() - t0:.1f}s; run {run_id} on {redis_url}",
        flush=True,
    )

    async with TrajectoryStore(redis_url, run_id, max_backlog=cfg.tasks) as store:
        await store.groups.create_consumer_group("trainer")
        await store.tasks.push(make_tasks(cfg.tasks, cfg.seed))
        # Rollout side: take each task from the queue, sample a group, publish it, ack the task.
        for k in range(cfg.tasks):
            (entry,) = await store.tasks.take("rollout", "demo-worker", count=1)
            t1 = time.perf_counter()
            group = sample_group(model, tokenizer, entry.task, cfg, run_id)
            await store.groups.put(group, timeout=30)
            await store.tasks.ack("rollout", [entry.entry_id])
            rewards = [t.reward for t in group]
            sample = group[0].reward_info["response"].replace("\n", " ")[:60]
            print(
                f"[rollout {k + 1}/{cfg.tasks}] {entry.task['question']} e.g. {sample!r} "
                f"-> rewards {rewards} "
                f"({sum(t.num_generated for t in group)} tokens, {time.perf_counter() - t1:.1f}s)",
                flush=True,
            )
        backlog_before = await store.groups.backlog()
        # Trainer side: read, compute group advantages, acknowledge (which trims the stream).
        tokens = used = 0
        reward_sum = 0.0
        while entries := await store.groups.read("trainer", "demo-trainer", count=16):
            for e in entries:
                r = torch.tensor([[t.reward for t in e.trajectories]])
                adv = grpo_advantages(r)[0].numpy()
                tokens += sum(t.num_generated for t in e.trajectories)
                reward_sum += float(r.sum())
                used += r.shape[1]
                print(
                    f"[trainer] group {e.entry_id}: advantages {[round(float(a), 2) for a in adv]}",
                    flush=True,
                )
            await store.groups.ack("trainer", [e.entry_id for e in entries])
        summary = {
            "run_id": run_id,
            "groups": cfg.tasks,
            "trajectories": used,
            "reward_mean": reward_sum / max(used, 1),
            "generated_tokens": tokens,
            "backlog_before_ack": backlog_before,
            "backlog_after_ack": await store.groups.backlog(),
            "seconds": round(time.perf_counter() - t0, 1),
        }
    return summary


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Runs the demo and prints a JSON summary line; returns the summary."""
    if cfg.redis_url:
        summary = asyncio.run(_run(cfg, cfg.redis_url))
    else:
        with RedisServer() as server:
            summary = asyncio.run(_run(cfg, server.url))
    print(json.dumps(summary), flush=True)
    return summary
