"""The job config: every field documented, typos and wrong types rejected with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from launcher.jobconfig import ConfigInvalid, TrainConfig, explain, load_config

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return p


def test_the_shipped_examples_are_valid():
    for name in ("quickstart.yaml", "search.yaml", "coding.yaml"):
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
    assert any(line.startswith("train.lr: float") for line in explain())


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
