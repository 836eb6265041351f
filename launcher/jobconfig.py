"""The typed configuration of a training job (``pqrl train CONFIG``).

One YAML file describes a whole job. Every field is documented here (``pqrl train --explain``
prints them); unknown fields and wrong types are errors that name the field, so a typo never turns
into a silently ignored option. Without ``services`` URLs the job is *embedded*: one command starts
a private Redis, an engine process, an in-process env server, the rollout manager and the trainer.
With URLs it joins shared services, so rollout workers and trainers run on different machines.

Only pydantic, the standard library and the components' settings classes (standard library
themselves) here: reading a config imports no torch, Redis, FastAPI or Docker client.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from agent_loop.config import MAX_FAILED_INFRA, EpisodeConfig, ManagerConfig
from launcher.lora_config import check_lora_job, publishes_merged
from launcher.model_section import ModelSection
from launcher.precision import cpu_bfloat16
from pqrl.settings import fields_of, type_name
from pqrl.yaml_text import load_yaml
from tasks.rewards import RewardSpec
from trainer.config import AlgorithmConfig, LoopConfig, StepConfig

__all__ = [
    "ConfigInvalid",
    "TrainConfig",
    "episode_config",
    "explain",
    "explain_lines",
    "explain_markdown",
    "load_config",
    "loop_config",
    "manager_config",
    "shared_settings",
    "step_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
        default_factory=list,
        description="engine URLs, of the kind services.engine names (checked at start); empty = start one",
    )
    env_servers: list[str] = Field(
        default_factory=list, description="env-server URLs; empty = environments in the rollout process"
    )
    env_token: str | None = Field(None, description="bearer token of the env servers ($PQRL_ENV_TOKEN)")
    sandbox_pool: int = Field(
        0,
        ge=0,
        description="embedded: warm sandboxes of the private env server; 0 = group_size x concurrent groups",
    )
    engine: Literal["builtin", "vllm"] = Field(
        "builtin", description="builtin (also for SGLang URLs: SGLang's API) or vllm (its weights: disk)"
    )
    engine_threads: int = Field(1, ge=1, description="embedded: CPU threads of the engine process")
    trainer_threads: int = Field(1, ge=1, description="embedded: CPU threads of the trainer")
    weight_sync: WeightSyncSection = Field(
        default_factory=WeightSyncSection, description="how new weights reach the engines"
    )


class SuiteRef(_Section):
    path: str | None = Field(None, description="a suite JSONL file")
    generate: Literal["calc", "data", "search", "coding"] | None = Field(
        None,
        description="a built-in suite instead of a file (data runs in sandboxes; coding: the shipped 66 "
        "tasks, n and seed ignored)",
    )
    n: int = Field(256, ge=1, description="generate: number of tasks")
    seed: int = Field(0, description="generate: task seed (keep training and eval seeds disjoint)")
    shots: int | None = Field(
        None,
        ge=0,
        description="generate: worked examples in each prompt (default calc 1, data 2, search and coding 0)",
    )
    level: Literal[1, 2] | None = Field(
        None, description="generate calc/data: 1 = one operation, 2 = two steps (default calc 2, data 1)"
    )
    format_reward: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="generate calc/data/search: credit for a wrong answer that used the tools on the task",
    )
    weight: float = Field(1.0, gt=0, description="mixing weight among the run's suites")
    defaults: dict[str, Any] = Field(
        {},
        description="the environment's settings over the suite's own defaults (a file's or a generated "
        "one's: shots, test_timeout, retriever_url, ...), checked against its config model",
    )
    reward: RewardSpec | None = Field(
        None,
        description="the scoring instead of the suite's reward: 'env' or reward functions with weights "
        "(docs/suites.md#rewards)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> SuiteRef:
        if (self.path is None) == (self.generate is None):
            raise ValueError("give exactly one of path or generate")
        if self.generate is not None:
            from tasks.generators import check

            check(self._generate())
        return self

    def _generate(self) -> Any:
        from tasks.generators import Generate

        return Generate(self.generate, n=self.n, seed=self.seed, shots=self.shots,  # type: ignore[arg-type]
                        level=self.level, format_reward=self.format_reward)  # fmt: skip

    def build(self) -> Any:
        """The suite this entry names: a built-in generated one or a file, scored by ``reward`` and
        with ``defaults`` over its own where given (a new suite id: both are part of the content)."""
        from tasks.suite import load_suite

        if self.generate is None:
            suite = load_suite(self.path)  # type: ignore[arg-type]
        else:
            from tasks.generators import generate_suite

            suite = generate_suite(self._generate())
        if self.reward is None and not self.defaults:
            return suite
        changes: dict[str, Any] = {} if self.reward is None else {"reward": self.reward}
        if self.defaults:
            changes["defaults"] = {**suite.manifest.defaults, **self.defaults}
        shown = [f"reward {self.reward}"] if self.reward is not None else []
        shown += [f"defaults {sorted(self.defaults)}"] if self.defaults else []
        return suite.with_manifest(changes, source=f"{self.path or self.generate} with {', '.join(shown)}")


class TasksSection(_Section):
    suites: list[SuiteRef] = Field(min_length=1, description="training suites, mixed by weight")
    epochs: int | None = Field(
        None, ge=1, description="passes over each suite; empty = until the step budget"
    )
    seed: int = Field(0, description="shuffling seed of the task sampler")
    skip_flat: int = Field(
        0,
        ge=0,
        description="a task whose last group had no signal (all rewards equal) gives up its next "
        "skip_flat draws, then runs again; 0: every draw runs",
    )


def _component_fields(cls: type, *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The job-config form of a component's settings: every field with a default, its description
    and bounds taken from the component's own dataclass. Fields without a default are the ones the
    job derives from another section (the trainer's temperature is the episode's), so they are left
    out, as are nested settings and ``exclude``."""
    return {
        f.name: (f.type, Field(f.default, description=f.description, **f.bounds))
        for f in fields_of(cls)
        if not (f.required or f.name in exclude or dataclasses.is_dataclass(f.type))
    }


def _composed(name: str, base: type[_Section], *parts: dict[str, Any]) -> Any:
    fields: dict[str, Any] = {}
    for part in parts:
        clash = (set(fields) | set(base.model_fields)) & set(part)
        if clash:
            raise TypeError(f"{name}: fields declared twice: {sorted(clash)}")
        fields |= part
    return create_model(name, __base__=base, __module__=__name__, **fields)


# the rollout manager's and each episode's settings in one section (the tool parser is the model's)
RolloutSection = _composed(
    "RolloutSection",
    _Section,
    _component_fields(ManagerConfig),
    _component_fields(EpisodeConfig, exclude=("tool_parser",)),
)


class RolloutLogSection(_Section):
    enabled: bool = Field(
        True,
        description="write every trajectory the trainer reads (trained or dropped, with why) to "
        "RUN_DIR/rollouts/step-N.parquet; pqrl view RUN_DIR shows them",
    )
    keep_steps: int | None = Field(
        1000, ge=1, description="steps of the rollout log kept on disk (the oldest go); empty = all"
    )


class _TrainBase(_Section):
    steps: int = Field(20, ge=1, description="optimizer-step budget of the run (outer steps)")
    lr: float = Field(1e-6, gt=0, description="AdamW peak learning rate")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW moment decay rates")
    max_time_min: float | None = Field(None, gt=0, description="stop after this many minutes (checkpointed)")
    read_timeout_s: float = Field(1800.0, gt=0, description="fail when no group arrives for this long")
    compact_memory: bool = Field(
        False, description="glibc: large blocks always from mmap (CPU quickstart: peak RSS -27%, step +46%)"
    )
    rollout_log: RolloutLogSection = Field(
        default_factory=RolloutLogSection, description="the durable log of every trajectory read"
    )
    report_to: list[Literal["wandb"]] = Field(
        [], description="trackers mirroring metrics, manifest, sampled episodes: wandb (offline, pqrl[wandb])"
    )


# the job's own training settings, the trainer loop's and the step's; where weights and
# checkpoints go is the job's choice (the run directory), and the model section sets dtypes
TrainSection = _composed(
    "TrainSection",
    _TrainBase,
    _component_fields(
        LoopConfig,
        exclude=(
            "weights_dir",
            "publish_merged",
            "ckpt_dir",
            "keep_checkpoints",
            "consumer",
            "manifest",
            "rollout_log_dir",
            "rollout_log_keep_steps",
        ),  # fmt: skip
    ),
    _component_fields(StepConfig, exclude=("dtype", "cpu_autocast", "seed")),
)


# what the step optimises; the episode token budget comes from the rollout section
AlgorithmSection = _composed(
    "AlgorithmSection", _Section, _component_fields(AlgorithmConfig, exclude=("context_tokens",))
)


class CheckpointSection(_Section):
    every: int = Field(5, ge=1, description="outer steps between checkpoints (groups are acked after one)")
    keep: int = Field(2, ge=1, description="checkpoints kept on disk")


class EvalSection(_Section):
    every: int = Field(0, ge=0, description="outer steps between evaluations; 0 = only before and after")
    suite: SuiteRef | None = Field(None, description="held-out tasks (never trained on); none = no eval")
    k: int = Field(4, ge=1, description="samples per task for pass@k (greedy pass@1 is separate)")
    max_failed_infra: float = Field(
        MAX_FAILED_INFRA,
        ge=0,
        le=1,
        description="report no pass rate when a larger share of the tasks failed on infrastructure "
        "(their episodes never ran)",
    )


class TrainConfig(_Section):
    run: str = Field(description="run id: names its Redis keys and its output directory")
    output_dir: str = Field("runs", description="checkpoints, metrics and plots go to OUTPUT_DIR/RUN")
    seed: int = Field(0, description="trainer seed (torch RNG)")
    model: ModelSection = ModelSection()
    services: ServicesSection = ServicesSection()
    tasks: TasksSection
    rollout: RolloutSection = Field(default_factory=RolloutSection)  # type: ignore[valid-type]
    train: TrainSection = Field(default_factory=TrainSection)  # type: ignore[valid-type]
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)  # type: ignore[valid-type]
    checkpoint: CheckpointSection = CheckpointSection()
    eval: EvalSection = EvalSection()
    tensorboard: bool = Field(True, description="also write TensorBoard event files")

    @model_validator(mode="after")
    def _run_id(self) -> TrainConfig:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", self.run):
            raise ValueError("run must be 1-64 characters of letters, digits, '_', '.', '-'")
        if self.rollout.temperature <= 0:  # greedy episodes have no logprobs for the trainer to correct
            raise ValueError("rollout.temperature must be > 0 for training (0 is for greedy evaluation)")
        algorithm_config(self)  # combinations the step cannot run are config errors, named here
        check_lora_job(self)
        return self

    @property
    def embedded(self) -> bool:
        return self.services.redis_url is None

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run


def _pick(cls: type, section: BaseModel, **given: Any) -> Any:
    values = {
        f.name: getattr(section, f.name) for f in fields_of(cls) if f.name in type(section).model_fields
    }
    return cls(**(values | given))


def episode_config(cfg: TrainConfig) -> EpisodeConfig:
    return _pick(EpisodeConfig, cfg.rollout, tool_parser=cfg.model.tool_parser)


def manager_config(cfg: TrainConfig) -> ManagerConfig:
    return _pick(
        ManagerConfig, cfg.rollout, groups_per_step=cfg.train.groups_per_step, episode=episode_config(cfg)
    )


def algorithm_config(cfg: TrainConfig) -> AlgorithmConfig:
    return _pick(AlgorithmConfig, cfg.algorithm, context_tokens=cfg.rollout.max_total_tokens)


def step_config(cfg: TrainConfig) -> StepConfig:
    """The trainer recomputes logprobs at the episodes' temperature and drops what the gate would not
    have admitted: both come from the rollout section, never from a second setting."""
    dtype = "float32" if cfg.model.dtype == "float32" else "bfloat16"
    return _pick(StepConfig, cfg.train, temperature=cfg.rollout.temperature, algorithm=algorithm_config(cfg),
                 max_staleness=cfg.rollout.max_staleness, seed=cfg.seed, dtype=dtype,
                 cpu_autocast=cpu_bfloat16(cfg.model.dtype))  # fmt: skip


# how one rollout process paces itself: workers may differ here, never in what they sample
_PER_PROCESS = {"max_concurrent_groups", "progress_every_s", "put_timeout_s", "lease_timeout_s",
                "episode_deadline_s", "backend_grace_s"}  # fmt: skip


# how the model's text and turns are read and written: every worker must do it alike
_MODEL_IO = {"tool_parser", "chat_template", "template_kwargs", "template_history"}


def shared_settings(cfg: TrainConfig) -> dict[str, Any]:
    """What every process of a run must agree on: the model, the task plan, how episodes are sampled
    and grouped, and the groups per step that size the staleness gate. A trainer that recomputed
    logprobs at another temperature than its workers sampled at would train on the wrong ratios."""
    rollout = cfg.rollout.model_dump(mode="json")
    return {
        "model": cfg.model.name,
        "model_io": cfg.model.model_dump(mode="json", include=_MODEL_IO),
        "tasks": cfg.tasks.model_dump(mode="json"),
        "rollout": {k: v for k, v in rollout.items() if k not in _PER_PROCESS},
        "train": {"groups_per_step": cfg.train.groups_per_step},
    }


def loop_config(cfg: TrainConfig) -> LoopConfig:
    return _pick(LoopConfig, cfg.train, step=step_config(cfg), weights_dir=str(cfg.run_dir / "weights"),
                 ckpt_dir=str(cfg.run_dir / "checkpoints"), keep_checkpoints=cfg.checkpoint.keep,
                 manifest=str(cfg.run_dir / "manifest.json"), publish_merged=publishes_merged(cfg),
                 **_rollout_log(cfg))  # fmt: skip


def _rollout_log(cfg: TrainConfig) -> dict[str, Any]:
    section = cfg.train.rollout_log
    if not section.enabled:
        return {}
    return {"rollout_log_dir": str(cfg.run_dir / "rollouts"), "rollout_log_keep_steps": section.keep_steps}


class ConfigInvalid(ValueError):
    """The config file cannot be used; the message lists every problem with its field path."""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Reads and validates a YAML config; ``overrides`` maps dotted field paths to values."""
    try:
        data = load_yaml(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigInvalid(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigInvalid(f"{path}: the top level must be a mapping of sections")
    if isinstance(data.get("model"), str):  # the shorthand, so that --set model.X finds a section
        data["model"] = {"name": data["model"]}
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


def explain(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted path, type, default, description) of every field, sections flattened."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and ann is not SuiteRef:
            out += explain(ann, f"{prefix}{name}.")
            continue
        default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
        out.append((f"{prefix}{name}", type_name(ann), default, f.description or ""))
    return out


def explain_lines() -> list[str]:
    """``pqrl train --explain``: one line per field."""
    return [f"{path}: {tp} ({'required' if d == 'required' else 'default ' + d}) {desc}".rstrip()
            for path, tp, d, desc in explain()]  # fmt: skip


def explain_markdown() -> str:
    """The job-config reference table of docs/config.md (a test keeps the file equal to this)."""
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for path, tp, default, desc in explain():
        cells = (f"`{path}`", f"`{tp}`", f"`{default}`", desc)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")  # a pipe ends a cell
    return "\n".join(rows) + "\n"
