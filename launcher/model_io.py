"""How a command reads and writes the model's conversation: its chat template, the template's
kwargs and how a history-rewriting template is used. The job config's ``model`` section holds
them for ``pqrl train``; ``pqrl rollout``, ``pqrl eval`` and ``pqrl tasks filter`` take the same
as flags (the tool parser is an episode setting there: ``--tool-parser``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pqrl.errors import UsageError

__all__ = ["add_template_arguments", "renderer_from_args", "renderer_of"]


def _kwargs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def add_template_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja file or a built-in (chatml, gemma, qwen3); default: the model's own",
    )
    p.add_argument(
        "--template-kwargs",
        type=_kwargs,
        default=None,
        help="template variables as a JSON object, e.g. '{\"enable_thinking\": false}'",
    )
    p.add_argument(
        "--template-history",
        choices=("strict", "as_generated"),
        default=None,
        help="a template that rewrites earlier turns: refused (strict) or every turn kept as generated",
    )


def renderer_from_args(args: argparse.Namespace, model: str, run_model: Any = None) -> Any:
    """The renderer the flags choose; a run's ``model`` section (``run_model``) fills what they leave out."""
    base = run_model.model_dump() if run_model is not None else {}
    return _load(
        model,
        args.chat_template or base.get("chat_template"),
        args.template_kwargs if args.template_kwargs is not None else base.get("template_kwargs") or {},
        args.template_history or base.get("template_history") or "strict",
    )


def renderer_of(section: Any) -> Any:
    """The renderer of a job config's ``model`` section."""
    return _load(section.name, section.chat_template, section.template_kwargs, section.template_history)


def _load(model: str, template: str | None, kwargs: dict[str, Any], history: str) -> Any:
    from loss_masking import TemplateError
    from loss_masking.chat_templates import load_renderer

    try:
        how: Any = history  # checked by argparse or the job config
        return load_renderer(model, chat_template=template, template_kwargs=kwargs, history=how)
    except TemplateError as e:
        raise UsageError(f"{model}: its chat template cannot be used: {e}") from None
