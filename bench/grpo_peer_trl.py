"""TRL's side of bench/grpo_peer.py: ``GRPOTrainer`` steps on the peer shape, timed; runs in TRL's venv.

Standard library at import (so pqrl's tests can check ``grpo_kwargs``); trl, transformers and torch
only inside ``main``, never pqrl. Reads a JSON spec (``--spec FILE``: model directory, the prompts
as text and as the token ids pqrl renders, steps, threads, bf16) and prints one JSON line per step
(``step_s``, ``generate_s``: TRL's ``_generate_and_score_completions``, ``completion_tokens``) and a
last line with the versions.

One optimizer step = ``prompts_per_step`` prompts x ``generations`` completions: the whole
generation batch is one micro-batch (per_device_train_batch_size = generation_batch_size =
prompts x generations), one gradient step per generation, so TRL skips its old-logprob pass. Rewards
alternate 0/1 inside each group. Prompts are taken in the spec's order (``shuffle_dataset=False``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def grpo_kwargs(
    *, prompts_per_step: int, generations: int, max_new_tokens: int, steps: int, bf16: bool, out_dir: str
) -> dict[str, Any]:
    """``GRPOConfig``'s arguments for the peer shape: beta 0, clip 0.2/0.28, fused AdamW at a constant lr
    2e-5, gradient norm clipped at 1, as bench/grpo_step.py's pqrl step."""
    batch = prompts_per_step * generations
    return {
        "output_dir": out_dir,
        "per_device_train_batch_size": batch,
        "generation_batch_size": batch,
        "gradient_accumulation_steps": 1,
        "num_generations": generations,
        "num_iterations": 1,
        "max_completion_length": max_new_tokens,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "beta": 0.0,
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "learning_rate": 2e-5,
        "lr_scheduler_type": "constant",  # the bench's pqrl optimizer has no schedule either
        "warmup_steps": 0,
        "optim": "adamw_torch_fused",  # pqrl's AdamW is the fused kernel too, betas and eps the defaults
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "max_steps": steps,
        "shuffle_dataset": False,
        "bf16": bf16,
        "use_cpu": True,
        "gradient_checkpointing": True,
        "model_init_kwargs": {"dtype": "float32"},  # weights and AdamW states in float32, as pqrl's
        "logging_strategy": "no",
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
    }


def _alternating(completions: list[Any], **kwargs: Any) -> list[float]:
    """0, 1, 0, 1 ... across the batch: each group of an even size gets both rewards."""
    ids = kwargs.get("completion_ids") or []
    _COUNTS.append(sum(len(c) for c in ids))
    return [float(i % 2) for i in range(len(completions))]


_COUNTS: list[int] = []  # completion tokens of each generation batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    with open(ap.parse_args().spec) as f:
        spec = json.load(f)
    threads = spec["threads"]
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import tempfile

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    for text, ids in zip(spec["prompts"], spec["prompt_ids"], strict=True):
        got = tokenizer(text=[text])["input_ids"][0]  # as TRL tokenizes a text prompt
        if got != ids:
            raise SystemExit(f"TRL would see other prompt tokens than pqrl's: {len(got)} vs {len(ids)}")

    gen_times: list[float] = []

    class Timed(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen_times.append(time.perf_counter() - t0)
            return out

    step_times: list[float] = []
    checkpointing: list[bool] = []  # whether the model recomputed activations, each step

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_times.append(time.perf_counter() - self.t0)
            checkpointing.append(kw["model"].is_activation_checkpointing)

    with tempfile.TemporaryDirectory() as out:
        kwargs = grpo_kwargs(prompts_per_step=spec["prompts_per_step"], generations=spec["generations"],
                             max_new_tokens=spec["max_new_tokens"], steps=spec["steps"], bf16=spec["bf16"],
                             out_dir=out)  # fmt: skip
        trainer = Timed(
            model=spec["model"],
            reward_funcs=_alternating,
            args=GRPOConfig(**kwargs),
            train_dataset=Dataset.from_dict({"prompt": spec["prompts"]}),
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        trainer.train()
    counts = (len(step_times), len(gen_times), len(_COUNTS))
    if counts != (spec["steps"],) * 3:
        raise SystemExit(f"expected {spec['steps']} steps, generations and rewards: {counts}")
    for s, g, n in zip(step_times, gen_times, _COUNTS, strict=True):
        print(json.dumps({"step_s": round(s, 3), "generate_s": round(g, 3), "completion_tokens": n}))
    versions = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__}
    config = {k: v for k, v in kwargs.items() if k != "output_dir"}
    info = {"threads": torch.get_num_threads(), "bf16": spec["bf16"], "checkpointing": all(checkpointing)}
    print(json.dumps(versions | info | {"config": config}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
