"""The job config: every field documented, typos and wrong types rejected with the field named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import BaseModel

from agent_loop.config import EpisodeConfig, ManagerConfig
from launcher.jobconfig import (
    ConfigInvalid,
    TrainConfig,
    explain_lines,
    explain_markdown,
    load_config,
    loop_config,
    manager_config,
    step_config,
)
from pqrl.settings import fields_of
from trainer.config import AlgorithmConfig, LoopConfig, StepConfig

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def test_the_shipped_examples_are_valid():
    for name in ("quickstart.yaml", "search.yaml", "search_server.yaml", "coding.yaml", "repo.yaml"):
        cfg = load_config(ROOT / "examples" / name)
        assert cfg.embedded and cfg.tasks.suites


def test_every_field_has_a_description():
    def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                out += leaves(f.annotation, f"{prefix}{name}.")
            elif not f.description:
                out.append(prefix + name)
        return out

    assert leaves(TrainConfig) == []
    assert any(line.startswith("train.lr: float") for line in explain_lines())


def test_unknown_fields_and_wrong_types_name_the_field(tmp_path):
    bad = "run: x\ntasks:\n  suites: [{generate: calc}]\ntrain:\n  stepz: 3\n  lr: fast\n"
    with pytest.raises(ConfigInvalid) as e:
        load_config(_write(tmp_path, bad))
    msg = str(e.value)
    assert "train.stepz" in msg and "train.lr" in msg and "2 problem(s)" in msg


def test_a_suite_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigInvalid, match="tasks.suites.0"):
        load_config(_write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc, path: a.jsonl}]\n"))
    with pytest.raises(ConfigInvalid, match="run"):
        load_config(_write(tmp_path, "run: 'bad id'\ntasks:\n  suites: [{generate: calc}]\n"))


def test_overrides_use_dotted_paths_and_yaml_values(tmp_path):
    path = _write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc}]\n")
    cfg = load_config(
        path, {"train.steps": 3, "services.redis_url": "redis://h:1/0", "services.engines": ["u"]}
    )
    assert cfg.train.steps == 3 and not cfg.embedded and cfg.services.engines == ["u"]
    with pytest.raises(ConfigInvalid):
        load_config(tmp_path / "missing.yaml")


def test_on_off_yes_no_are_words_where_a_word_is_meant_and_booleans_where_a_bool_is(tmp_path):
    # YAML 1.1 reads `off` as False: `is_mode: off` was refused with a message naming 'off'
    from launcher.train_command import _overrides

    text = "run: x\ntasks:\n  suites: [{generate: calc}]\nalgorithm: {is_mode: off}\ntrain: {stream: on}\n"
    cfg = load_config(_write(tmp_path, text))
    assert cfg.algorithm.is_mode == "off" and cfg.train.stream is True
    sets = _overrides(["algorithm.is_mode=off", "train.stream=no", "train.gradient_checkpointing=yes"])
    cfg = load_config(_write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc}]\n"), sets)
    assert cfg.algorithm.is_mode == "off" and not cfg.train.stream
    assert cfg.train.gradient_checkpointing is True


def test_model_name_is_shorthand_for_the_model_section(tmp_path):
    """``model: NAME`` names the model alone, in pqrl train as in pqrl sft; --set still reaches the
    section's other fields, and the section's checks still hold."""
    path = _write(tmp_path, "run: x\nmodel: some/dir\ntasks:\n  suites: [{generate: calc}]\n")
    cfg = load_config(path, {"model.tool_parser": "mistral"})
    assert (cfg.model.name, cfg.model.tool_parser) == ("some/dir", "mistral")
    with pytest.raises(ConfigInvalid, match="model.tool_parser"):
        load_config(path, {"model.tool_parser": "nope"})


def test_each_setting_has_one_default_the_components_own(tmp_path):
    """A job that sets nothing gets exactly the defaults the components declare."""
    cfg = load_config(_write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc}]\n"))
    manager, loop = manager_config(cfg), loop_config(cfg)
    for built, cls in ((manager, ManagerConfig), (manager.episode, EpisodeConfig), (loop, LoopConfig),
                       (loop.step, StepConfig)):  # fmt: skip
        for f in fields_of(cls):
            section = cfg.rollout if cls in (ManagerConfig, EpisodeConfig) else cfg.train
            if f.name in type(section).model_fields:
                assert getattr(built, f.name) == f.default, f"{cls.__name__}.{f.name}"


def test_settings_one_component_takes_from_another_cannot_disagree(tmp_path):
    text = "run: x\ntasks:\n  suites: [{generate: calc}]\nrollout: {temperature: 0.6, max_staleness: 3}\n"
    cfg = load_config(_write(tmp_path, text), {"train.groups_per_step": 5})
    step, manager = step_config(cfg), manager_config(cfg)
    assert step.temperature == manager.episode.temperature == 0.6
    assert step.max_staleness == manager.max_staleness == 3
    assert manager.groups_per_step == loop_config(cfg).groups_per_step == 5
    # the trainer's copies are not settings of the job: they have no default and no YAML key
    assert "temperature" not in type(cfg.train).model_fields
    assert {f.name for f in fields_of(StepConfig) if f.required} == {"temperature", "max_staleness"}


def test_the_algorithm_section_reaches_the_step_and_impossible_combinations_are_named(tmp_path):
    base = "run: x\ntasks:\n  suites: [{generate: calc}]\nrollout: {max_total_tokens: 900}\n"
    cfg = load_config(
        _write(tmp_path, base + "algorithm: {advantage: rloo, loss_agg: seq_mean_token_sum_norm}\n")
    )
    alg = step_config(cfg).algorithm
    assert (alg.advantage, alg.loss_agg, alg.agg_tokens) == ("rloo", "seq_mean_token_sum_norm", 900)
    assert "context_tokens" not in type(cfg.algorithm).model_fields, "derived from the rollout budget"
    bad = {
        "advantage: rloo, scale_by_std: false": "scale_by_std applies to grpo only",
        "kl_in_reward: true": "kl_in_reward needs kl_coef > 0",
        "overlong_buffer: 900": "overlong_buffer \\(900\\) must be below the token budget \\(900\\)",
        "loss_agg_tokens: 64": "loss_agg_tokens applies to loss_agg seq_mean_token_sum_norm only",
        "dual_clip_c: 1.0": "algorithm.dual_clip_c",
        "lam: 0.9": "lam apply to advantage ppo only",
        "advantage: a2c": "algorithm.advantage",
    }
    for text, message in bad.items():
        with pytest.raises(ConfigInvalid, match=message):
            load_config(_write(tmp_path, base + f"algorithm: {{{text}}}\n"))


def test_component_bounds_hold_in_the_job_config_and_in_code(tmp_path):
    with pytest.raises(ConfigInvalid, match="rollout.max_turns"):
        load_config(
            _write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc}]\nrollout: {max_turns: 0}\n")
        )
    with pytest.raises(ValueError, match="EpisodeConfig.max_turns must be >= 1"):
        EpisodeConfig(max_turns=0)
    with pytest.raises(ValueError, match="AlgorithmConfig.kl_estimator must be one of"):
        AlgorithmConfig(kl_estimator="k9")
    assert dataclasses.replace(EpisodeConfig(), max_turns=2).max_turns == 2
    with pytest.raises(ConfigInvalid, match="rollout.temperature must be > 0 for training"):
        load_config(
            _write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc}]\nrollout: {temperature: 0}\n")
        )


def test_a_group_kept_with_one_valid_episode_is_refused_as_the_trainer_would_drop_it(tmp_path):
    base = "run: x\ntasks:\n  suites: [{generate: calc}]\n"
    with pytest.raises(ConfigInvalid, match="rollout.min_valid"):
        load_config(_write(tmp_path, base + "rollout: {min_valid: 1}\n"))
    with pytest.raises(ValueError, match="ManagerConfig.min_valid must be >= 2"):
        ManagerConfig(groups_per_step=1, min_valid=1)
    assert manager_config(load_config(_write(tmp_path, base + "rollout: {min_valid: 2}\n"))).min_valid == 2


def test_the_config_reference_in_docs_is_generated_from_the_classes():
    """docs/config.md holds the table ``pqrl train --explain --markdown`` prints."""
    text = (ROOT / "docs" / "config.md").read_text()
    assert explain_markdown() in text, "docs/config.md is stale: regenerate its table"


@pytest.mark.parametrize("hardware", [True, False, None])
def test_dtype_auto_autocasts_a_cpu_trainer_only_where_the_cpu_multiplies_bfloat16(
    tmp_path, monkeypatch, hardware
):
    import launcher.precision

    monkeypatch.setattr(launcher.precision, "cpu_has_bf16_matmul", lambda: hardware)
    text = "run: x\ntasks:\n  suites: [{generate: calc}]\n"
    for dtype, cpu_autocast, step_dtype in (
        ("auto", bool(hardware), "bfloat16"),  # bfloat16 on a GPU whatever the CPU
        ("bfloat16", True, "bfloat16"),
        ("float32", False, "float32"),
    ):
        cfg = load_config(_write(tmp_path, text), {"model.dtype": dtype})
        step = step_config(cfg)
        assert (step.cpu_autocast, step.dtype) == (cpu_autocast, step_dtype), dtype
        assert launcher.precision.cpu_bfloat16(dtype) is cpu_autocast


def test_the_cpu_probe_reads_the_bfloat16_flags_of_this_machine():
    from launcher.precision import cpu_has_bf16_matmul

    flags = set(Path("/proc/cpuinfo").read_text().split())
    assert cpu_has_bf16_matmul() is bool(flags & {"avx512_bf16", "amx_bf16"})


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_non_finite_number_is_refused_in_the_job_config_and_in_code(tmp_path, value):
    # an infinity passes vf_clip's bound (> 0) and would clip nothing; every float setting refuses it
    base = "run: x\ntasks:\n  suites: [{generate: calc}]\n"
    with pytest.raises(ConfigInvalid, match="algorithm.vf_clip"):
        load_config(_write(tmp_path, base + f"algorithm: {{vf_clip: {value}}}\n"))
    with pytest.raises(ValueError, match="AlgorithmConfig.vf_clip must be a finite number"):
        AlgorithmConfig(vf_clip=float(value.replace(".", "")))


def test_a_suite_entry_may_replace_the_suites_reward(tmp_path):
    from tasks.storage import queued_task
    from tasks.suite import SuiteInvalid

    reward = "[exact_match, {fn: tool_format, weight: 0.1}]"
    text = f"run: x\ntasks:\n  suites: [{{generate: calc, n: 2, reward: {reward}}}]\n"
    ref = load_config(_write(tmp_path, text)).tasks.suites[0]
    plain, rescored = ref.model_copy(update={"reward": None}).build(), ref.build()
    assert rescored.id != plain.id and rescored.tasks == plain.tasks, "the scoring is part of the content"
    assert [t["fn"] for t in queued_task(rescored, 0)["reward"]] == ["env", "tool_format"]
    bad = load_config(
        _write(tmp_path, "run: x\ntasks:\n  suites: [{generate: calc, n: 2, reward: qa_em_f1}]\n")
    )
    with pytest.raises(SuiteInvalid, match="suite.reward: unknown reward function 'qa_em_f1'"):
        bad.tasks.suites[0].build()
