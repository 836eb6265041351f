"""bench/grpo_peer_trl.py's step shape, checked without TRL (its module imports the standard library
only): one optimizer step must be the peer's 2 prompts x 8 completions, as pqrl's bench step is."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _trl_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_peer_trl", ROOT / "bench" / "grpo_peer_trl.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_optimizer_step_is_two_prompts_of_eight_completions() -> None:
    k = _trl_script().grpo_kwargs(prompts_per_step=2, generations=8, max_new_tokens=48, steps=7, bf16=True,
                                  out_dir="/tmp/x")  # fmt: skip
    per_step = k["per_device_train_batch_size"] * k["gradient_accumulation_steps"]
    assert per_step == k["generation_batch_size"] == 16
    assert k["generation_batch_size"] // k["num_generations"] == 2
    # one gradient step per generation: no second pass over the same completions, no old-logprob pass
    assert k["num_iterations"] == 1 and k["gradient_accumulation_steps"] == 1
    assert (k["max_completion_length"], k["temperature"], k["top_p"], k["top_k"]) == (48, 0.7, 1.0, 0)
    assert (k["beta"], k["epsilon"], k["epsilon_high"], k["learning_rate"]) == (0.0, 0.2, 0.28, 2e-5)
    assert k["lr_scheduler_type"] == "constant" and k["shuffle_dataset"] is False
    assert k["max_steps"] == 7 and k["report_to"] == [] and k["save_strategy"] == "no"


def test_every_group_gets_both_rewards() -> None:
    """TRL lays each prompt's completions side by side: alternating rewards give each group 0 and 1."""
    script = _trl_script()
    rewards = script._alternating(["c"] * 16, completion_ids=[[1, 2]] * 16)
    assert [set(rewards[g * 8 : (g + 1) * 8]) for g in range(2)] == [{0.0, 1.0}] * 2
    assert script._COUNTS == [32]  # the completion tokens of that batch, counted for the report
