"""The typed configuration of a training job (``pqrl train CONFIG``).

One YAML file describes a whole job. Every field is documented here (``pqrl train --explain``
prints them); unknown fields and wrong types are errors that name the field, so a typo never turns
into a silently ignored option. Without ``services`` URLs the job is *embedded*: one command starts
a private Redis, an engine process, an in-process env server, the rollout manager and the trainer.
With URLs it joins shared services, so rollout workers and trainers run on different machines.

Only pydantic and the standard library here: reading a config needs nothing of the rest.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["ConfigInvalid", "TrainConfig", "explain", "load_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    name: str = Field(
        "smollm2-135m-instruct", description="built-in model name or a Hugging Face model directory"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="trainer weights: auto = float32 on CPU, bfloat16 autocast on GPU"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (GPU)")


class WeightSyncSection(_Section):
    method: Literal["disk", "distributed"] = Field(
        "disk",
        description="disk: save under output_dir, engines load it with /update_weights_from_disk (they must "
        "see that path); distributed: broadcast to every engine over a process group "
        "(SGLang's /update_weights_from_distributed)",
    )
    address: str = Field(
        "127.0.0.1", description="distributed: an address of the trainer that every engine reaches"
    )
    port: int | None = Field(
        None, ge=1, le=65535, description="distributed: a free port there; empty = pick one"
    )
    backend: Literal["nccl", "gloo"] | None = Field(
        None, description="distributed: empty = nccl when the trainer has a GPU, else gloo"
    )


class ServicesSection(_Section):
    redis_url: str | None = Field(None, description="shared Redis; empty = a private one (embedded mode)")
    engines: list[str] = Field(
        default_factory=list, description="engine URLs (SGLang or built-in); empty = start one engine process"
    )
    env_servers: list[str] = Field(
        default_factory=list, description="env-server URLs; empty = environments in the rollout process"
    )
    env_token: str | None = Field(None, description="bearer token of the env servers ($PQRL_ENV_TOKEN)")
    engine_threads: int = Field(1, ge=1, description="embedded: CPU threads of the engine process")
    trainer_threads: int = Field(1, ge=1, description="embedded: CPU threads of the trainer")
    weight_sync: WeightSyncSection = Field(
        default_factory=WeightSyncSection, description="how new weights reach the engines"
    )


class SuiteRef(_Section):
    path: str | None = Field(None, description="a suite JSONL file")
    generate: Literal["calc", "search", "coding"] | None = Field(
        None, description="a built-in suite instead of a file (coding: the shipped 66 tasks; n, seed ignored)"
    )
    n: int = Field(256, ge=1, description="generate: number of tasks")
    seed: int = Field(0, description="generate: task seed (keep training and eval seeds disjoint)")
    shots: int = Field(1, ge=0, description="generate: worked examples in each prompt")
    level: Literal[1, 2] = Field(2, description="generate calc: 1 = one operation, 2 = multi-step")
    format_reward: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="generate calc: credit for a wrong answer computed from the problem's numbers",
    )
    weight: float = Field(1.0, gt=0, description="mixing weight among the run's suites")

    @model_validator(mode="after")
    def _one_source(self) -> SuiteRef:
        if (self.path is None) == (self.generate is None):
            raise ValueError("give exactly one of path or generate")
        return self


class TasksSection(_Section):
    suites: list[SuiteRef] = Field(min_length=1, description="training suites, mixed by weight")
    epochs: int | None = Field(
        None, ge=1, description="passes over each suite; empty = until the step budget"
    )
    seed: int = Field(0, description="shuffling seed of the task sampler")


class RolloutSection(_Section):
    group_size: int = Field(8, ge=2, description="G: episodes per task (one group)")
    max_staleness: int = Field(1, ge=0, description="admit no group that lags the policy by more versions")
    max_concurrent_groups: int = Field(4, ge=1, description="groups in flight per rollout manager")
    max_turns: int = Field(4, ge=1, description="assistant turns per episode at most")
    max_new_tokens: int = Field(64, ge=1, description="per assistant turn")
    max_total_tokens: int = Field(1536, ge=16, description="context budget of one episode")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (the trainer uses the same)")
    episode_deadline_s: float = Field(600.0, gt=0, description="wall-clock limit of one episode")
    infra_retries: int = Field(2, ge=0, description="reruns of an episode whose infrastructure failed")


class TrainSection(_Section):
    steps: int = Field(20, ge=1, description="optimizer-step budget of the run (outer steps)")
    groups_per_step: int = Field(4, ge=1, description="groups consumed per outer step")
    lr: float = Field(1e-6, gt=0, description="AdamW peak learning rate")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW moment decay rates")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient-norm clip per optimizer step")
    eps_low: float = Field(0.2, ge=0, description="clip range below 1")
    eps_high: float = Field(0.28, ge=0, description="clip range above 1 (DAPO clip-higher)")
    is_cap: float = Field(2.0, gt=0, description="C: cap of the single off-policy weight")
    micro_batch_tokens: int = Field(8192, ge=64, description="token budget of one packed micro-batch")
    ppo_epochs: int = Field(1, ge=1, description="K: passes over each step's trajectories")
    minibatches: int = Field(1, ge=1, description="optimizer steps per pass (warm-up counts these)")
    max_extra_reads: int = Field(
        3,
        ge=0,
        description="dynamic sampling: extra reads while fewer than groups_per_step groups carry signal",
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL term to the initial model (0: off)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (DESIGN.md section 5)")
    compile: bool = Field(False, description="torch.compile the vocabulary math (CUDA only)")
    max_time_min: float | None = Field(None, gt=0, description="stop after this many minutes (checkpointed)")
    read_timeout_s: float = Field(1800.0, gt=0, description="fail when no group arrives for this long")


class CheckpointSection(_Section):
    every: int = Field(5, ge=1, description="outer steps between checkpoints (groups are acked after one)")
    keep: int = Field(2, ge=1, description="checkpoints kept on disk")


class EvalSection(_Section):
    every: int = Field(0, ge=0, description="outer steps between evaluations; 0 = only before and after")
    suite: SuiteRef | None = Field(None, description="held-out tasks (never trained on); none = no eval")
    k: int = Field(4, ge=1, description="samples per task for pass@k (greedy pass@1 is separate)")


class TrainConfig(_Section):
    run: str = Field(description="run id: names its Redis keys and its output directory")
    output_dir: str = Field("runs", description="checkpoints, metrics and plots go to OUTPUT_DIR/RUN")
    seed: int = Field(0, description="trainer seed (torch RNG)")
    model: ModelSection = ModelSection()
    services: ServicesSection = ServicesSection()
    tasks: TasksSection
    rollout: RolloutSection = RolloutSection()
    train: TrainSection = TrainSection()
    checkpoint: CheckpointSection = CheckpointSection()
    eval: EvalSection = EvalSection()
    tensorboard: bool = Field(True, description="also write TensorBoard event files")

    @model_validator(mode="after")
    def _run_id(self) -> TrainConfig:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.run):
            raise ValueError("run must be 1-64 characters of letters, digits, '_', '.', '-'")
        return self

    @property
    def embedded(self) -> bool:
        return self.services.redis_url is None

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run


class ConfigInvalid(ValueError):
    """The config file cannot be used; the message lists every problem with its field path."""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Reads and validates a YAML config; ``overrides`` maps dotted field paths to values."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigInvalid(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigInvalid(f"{path}: the top level must be a mapping of sections")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"{path}: {e.error_count()} problem(s)"]
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigInvalid("\n".join(lines)) from None


def explain(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    """One line per field: dotted path, type, default, description (``pqrl train --explain``)."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += explain(ann, f"{prefix}{name}.")
            continue
        default = "required" if f.is_required() else f"default {f.get_default(call_default_factory=True)!r}"
        type_name = getattr(ann, "__name__", str(ann)).replace("typing.", "")
        out.append(f"{prefix}{name}: {type_name} ({default}) {f.description or ''}".rstrip())
    return out
