"""LoRA adapters on the policy (``model.lora``): PEFT's layers injected into the Hugging Face model in
place, so the model keeps its own class (``base_model``, ``lm_head``, attention switches) and the
step runs unchanged; only the adapters' parameters require grad.

An adapter leaves this process in PEFT's format, a directory of ``adapter_config.json`` and
``adapter_model.safetensors``: checkpoints (``save_weights``) and disk weight syncs alike. The
built-in engine merges it into its base weights (``engine.lora_merge``); PEFT and SGLang load it too.
Engines that load whole weights only (vLLM, SGLang's ``/update_weights_from_disk``) are sent the
merged weights instead (``save_weights(merged=True)``), computed beside the live model.
The reference model of the KL term is the same model with its adapters switched off (``base_only``),
no second copy.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pqrl.errors import UsageError
from pqrl.model_cache import adapter_base

__all__ = ["adapter_bytes", "apply_lora", "base_only", "is_lora", "load_adapter", "save_weights"]

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."  # PEFT's files name tensors as a PeftModel wraps the model


def _lora_layers(model: Any) -> list[Any]:
    # nothing injected adapters in this process (peft is an extra), or tensors without modules (a
    # sharded trainer's gathered whole model)
    if "peft" not in sys.modules or not hasattr(model, "modules"):
        return []
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def is_lora(model: Any) -> bool:
    return bool(_lora_layers(model))


def _check_targets(model: Any, targets: list[str]) -> None:
    """Every target names at least one ``nn.Linear`` of the model, and none is tied to the embeddings
    (merging into a tied head would change the embeddings too)."""
    tied = {id(p) for p in model.get_input_embeddings().parameters()}
    head = model.get_output_embeddings()
    problems = []
    for target in targets:
        hits = [(n, m) for n, m in model.named_modules() if n == target or n.endswith("." + target)]
        if not hits:
            problems.append(f"{target!r} matches no layer of the model")
        elif any(not isinstance(m, torch.nn.Linear) for _, m in hits):
            kinds = sorted({type(m).__name__ for _, m in hits if not isinstance(m, torch.nn.Linear)})
            problems.append(f"{target!r} matches {', '.join(kinds)} layers (only nn.Linear takes adapters)")
        elif any(id(m.weight) in tied for _, m in hits):
            problems.append(f"{target!r} shares its weight with the input embeddings")
        elif any(m is head for _, m in hits):  # PEFT would ship the whole head with every adapter
            problems.append(f"{target!r} is the output head")
    if problems:
        raise UsageError(
            f"model.lora.target_modules: {'; '.join(problems)}",
            fix="name the model's linear projections, e.g. q_proj, v_proj (pqrl train --explain)",
        )


def apply_lora(model: Any, spec: Any, base: str | None = None) -> Any:
    """Injects adapters per ``spec`` (``model.lora``) into ``model`` in place and freezes every other
    parameter; returns the model. ``B`` starts at zero, so the model computes what it did before.
    ``base``: the base model's name as ``pqrl.model_cache.load_model`` takes it (saved adapters name it).

    Raises:
        UsageError: a target module that is missing, not linear, or tied to the embeddings.
    """
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise UsageError("model.lora needs PEFT", fix="pip install 'pqrl[lora]'") from None
    _check_targets(model, list(spec.target_modules))
    if base is not None and adapter_base(base) is not None:  # its checkpoints would name an adapter as base
        raise UsageError(
            f"model.name {base} is a LoRA adapter: train new adapters on a whole model",
            fix="merge it first (PEFT's merge_and_unload, then save_pretrained) and name that directory",
        )
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=spec.dropout,
        bias="none",
        base_model_name_or_path=str(Path(base).resolve()) if base and Path(base).is_dir() else base,
    )
    model = inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    model._pqrl_lora_config = config  # saved with every adapter
    return model


def _adapter_state(model: Any) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    # no embedding layers: "auto" would look the base up on the Hugging Face Hub at every save
    state = get_peft_model_state_dict(model, adapter_name="default", save_embedding_layers=False)
    return {_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def adapter_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".lora_" in n)


def _merged_state(model: Any) -> dict[str, torch.Tensor]:
    """``model``'s whole weights with its adapters merged, under the base model's own names: each
    targeted ``W0 + (alpha/r) B A``, summed in float32 in a new tensor, so the live model (and the
    frozen base it keeps training against) is unchanged."""
    layers = {id(m) for m in _lora_layers(model)}
    deltas = {name: m for name, m in model.named_modules() if id(m) in layers}
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, t in model.state_dict().items():
            if ".lora_" in key:
                continue
            name = key.replace(".base_layer.", ".")
            owner, _, leaf = name.rpartition(".")
            if leaf == "weight" and owner in deltas:
                t = (t.float() + deltas[owner].get_delta_weight("default").float()).to(t.dtype)
            state[name] = t
    return state


def save_weights(model: Any, path: str | Path, *, merged: bool = False) -> None:
    """``model``'s published form: its adapter in PEFT's format when it has one (``merged``: its whole
    weights with the adapter merged, which any engine loads), else the whole model (``save_pretrained``)."""
    if not is_lora(model):
        model.save_pretrained(path)
        return
    if merged:
        model.save_pretrained(path, state_dict=_merged_state(model))
        return
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = model._pqrl_lora_config.to_dict()
    config["target_modules"] = sorted(config["target_modules"])  # a set in PEFT's config
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    save_file(_adapter_state(model), str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def load_adapter(model: Any, path: str | Path) -> None:
    """Copies the adapter saved in ``path`` into ``model``'s own adapters (same rank and targets).

    Raises:
        UsageError: the saved adapter does not fit the configured one (another rank or targets).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = load_file(str(Path(path) / WEIGHTS_FILE))
    state = {k.removeprefix(_PREFIX): v for k, v in saved.items()}
    own = {k.removeprefix(_PREFIX): v for k, v in _adapter_state(model).items()}
    wrong = sorted(set(state) ^ set(own)) + sorted(
        k for k in own if k in state and state[k].shape != own[k].shape
    )
    if wrong:
        raise UsageError(
            f"{path} holds another adapter than model.lora configures (e.g. {wrong[0]})",
            fix="resume with the model.lora settings the run started with",
        )
    set_peft_model_state_dict(model, state, adapter_name="default")


@contextlib.contextmanager
def base_only(model: Any) -> Iterator[None]:
    """``model`` computes with its base weights only while inside (no-op without adapters)."""
    layers = _lora_layers(model)
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)
