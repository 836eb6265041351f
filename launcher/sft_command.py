"""``pqrl sft CONFIG.yaml``: supervised fine-tuning on demonstrations (``trainer.sft``).

The config holds ``trainer.sft.SFTConfig``'s settings and the job config's ``model`` section
(``launcher.model_section``): the same fields, read the same way, as ``pqrl train``'s. Demonstrations
built in place (``calc:N``, ``suite:FILE[:N]``) are rendered with that section's chat template and
template kwargs and their calls written in its tool parser's format, so the model learns the calls
the RL job will parse; train from the result with the same section and ``name: OUTPUT_DIR``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from launcher.model_section import ModelSection
from trainer.sft import SFTConfig

__all__ = ["SFTJobConfig", "load_sft_config", "sft_command"]

# (spec, renderer, tool parser) -> the demonstration Trajectories
Loader = Callable[..., list[Any]]


class SFTJobConfig(SFTConfig):
    """An SFT config file: the training settings and the model section ``pqrl train`` reads."""

    model: ModelSection = Field(
        default_factory=ModelSection,
        description="The model to fine-tune and how its conversation is written: the model section of "
        "pqrl train (name, tool_parser, chat_template, template_kwargs, template_history); a bare "
        "string names the model alone.",
    )

    @field_validator("model")
    @classmethod
    def _what_sft_trains(cls, section: ModelSection) -> ModelSection:
        if section.dtype == "bfloat16":
            raise ValueError("model.dtype: pqrl sft trains in float32 (leave dtype auto or float32)")
        if section.lora.enabled:
            raise ValueError("model.lora: pqrl sft trains every weight (LoRA is for pqrl train)")
        return section


def load_sft_config(path: str | Path, **overrides: Any) -> SFTJobConfig:
    """The config in a YAML file, with the non-None ``overrides`` applied."""
    from pqrl.yaml_text import load_yaml

    data = load_yaml(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of SFT config fields")
    data |= {k: v for k, v in overrides.items() if v is not None}
    return SFTJobConfig.model_validate(data)


def _read_file(spec: str, renderer: Any, tool_parser: str) -> list[Any]:
    from pqrl import codec

    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(
            f"demonstrations {spec!r}: no such file (calc:N specs need the CLI's demonstrations loader)"
        )
    return codec.decode_many(path.read_bytes())


def sft_command(args: argparse.Namespace, *, load_demonstrations: Loader | None = None) -> int:
    """Runs ``pqrl sft``; returns the exit status (2 for a bad config).

    Args:
        args: the parsed ``pqrl sft`` arguments.
        load_demonstrations: ``(spec, renderer, tool_parser) -> Trajectories``; the CLI passes
            ``agent_loop.demonstrations.resolve_demonstrations`` (which also builds ``calc:N`` and
            ``suite:FILE[:N]`` in place). Without it, only files are read.
    """
    import torch

    from launcher.model_io import renderer_of
    from pqrl.model_cache import load_model
    from trainer.sft import train_sft

    try:
        cfg = load_sft_config(
            args.config,
            output_dir=args.output_dir,
            demonstrations=args.demonstrations,
            max_steps=args.max_steps,
            device=args.device,
        )
    except (ValidationError, ValueError, OSError) as e:
        print(f"pqrl sft: {args.config}: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(cfg.seed)
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    renderer = renderer_of(cfg.model)  # the template and kwargs the RL job renders with
    loader = load_demonstrations or _read_file
    demos = loader(cfg.demonstrations, renderer, cfg.model.tool_parser)
    model = load_model(cfg.model.name, dtype=torch.float32).to(device)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft_config.json").write_text(cfg.model_dump_json(indent=2))
    with (out / "metrics.jsonl").open("w") as f:

        def log(row: dict[str, Any]) -> None:
            f.write(json.dumps(row) + "\n")
            f.flush()

        history = train_sft(cfg, model, demos, log=log, progress=not getattr(args, "quiet", False))
    model.save_pretrained(out)
    renderer.tokenizer.save_pretrained(out)  # with the chosen chat template, if one was named
    first, last = history[0]["losses/sft_loss"], history[-1]["losses/sft_loss"]
    print(f"sft: {len(history)} steps on {len(demos)} demonstrations, loss {first:.4f} -> {last:.4f}; {out}")
    return 0
