"""A LoRA adapter in PEFT's format, merged into the built-in engine's weights.

``/update_weights_from_disk`` pointed at a directory with ``adapter_config.json`` (what a LoRA
trainer publishes) serves base + adapter: every targeted weight becomes ``W0 + (alpha/r) B @ A``,
computed in float32 from a copy of ``W0`` kept the first time that weight is merged, so the next
version merges into the same base (never into an earlier merge). A weight an earlier adapter changed
and this one does not target goes back to ``W0``. Loading whole weights ends this: the new weights are
the base from then on.

Only plain LoRA is accepted; DoRA, rsLoRA, per-layer ranks, bias training, ``modules_to_save`` and
``fan_in_fan_out`` layouts are refused whole, before anything changes.

Imports torch, safetensors and the standard library only, like ``weights_loading``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

__all__ = ["AdapterMerger", "is_adapter"]

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."
# config fields whose non-default value changes what the adapter computes beyond W0 + (alpha/r) B A
_UNSUPPORTED = {
    "use_dora": False,
    "use_rslora": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "bias": "none",
}


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def _scale(config: dict[str, object], source: str) -> float:
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{source}: peft_type {config.get('peft_type')!r} is not LoRA")
    for key, plain in _UNSUPPORTED.items():
        if config.get(key, plain) not in (plain, None, {}, [], False):
            raise ValueError(f"{source}: {key}={config[key]!r} is not supported (plain LoRA only)")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not (isinstance(r, int) and r > 0 and isinstance(alpha, int | float) and alpha > 0):
        raise ValueError(f"{source}: r and lora_alpha must be positive numbers (got {r!r}, {alpha!r})")
    return float(alpha) / r


class AdapterMerger:
    """The base copies of the weights adapters changed (the engine's, one per engine)."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}

    def forget(self, names: object = None) -> None:
        """New whole weights arrived for ``names`` (all when None): they are the base now."""
        if names is None:
            self.base.clear()
        else:
            for n in list(names):  # type: ignore[call-overload]
                self.base.pop(n, None)

    def merged(self, path: str | Path, own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors to load so that the model (state ``own``) serves base + the adapter in ``path``.

        Raises:
            ValueError: a malformed or unsupported adapter, or one that does not fit the model; the
                base copies are unchanged then.
        """
        from safetensors.torch import load_file

        source = str(path)
        try:
            config = json.loads((Path(path) / CONFIG_FILE).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: {CONFIG_FILE} is not JSON: {e}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{source}: {CONFIG_FILE} is not a JSON object")
        scale = _scale(config, source)
        tensors = load_file(str(Path(path) / WEIGHTS_FILE), device="cpu")
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            name = key.removeprefix(_PREFIX)
            for part in ("A", "B"):
                suffix = f".lora_{part}.weight"
                if name.endswith(suffix):
                    pairs.setdefault(name.removesuffix(suffix) + ".weight", {})[part] = t
                    break
            else:
                raise ValueError(f"{source}: tensor {key!r} is not a LoRA A or B matrix")
        deltas: dict[str, torch.Tensor] = {}
        storages = Counter(t.data_ptr() for t in own.values())
        for target, ab in sorted(pairs.items()):
            if set(ab) != {"A", "B"}:
                raise ValueError(f"{source}: {target} has lora_{''.join(ab)} without its pair")
            a, b = ab["A"].float(), ab["B"].float()
            w = own.get(target)
            if w is None:
                raise ValueError(f"{source}: the model has no weight {target}")
            if storages[w.data_ptr()] > 1:  # merging into it would change the tied weight as well
                raise ValueError(f"{source}: {target} is tied to another weight of the model")
            if (
                a.dim() != 2
                or b.dim() != 2
                or (b.shape[0], a.shape[1]) != tuple(w.shape)
                or b.shape[1] != a.shape[0]
            ):
                raise ValueError(
                    f"{source}: {target}: B {tuple(b.shape)} @ A {tuple(a.shape)} is not {tuple(w.shape)}"
                )
            deltas[target] = scale * (b @ a)
        # every check passed: only now are base copies taken
        out: dict[str, torch.Tensor] = {}
        for target, delta in deltas.items():
            base = self.base.setdefault(target, own[target].detach().clone())
            out[target] = (base.float() + delta.to(base.device)).to(base.dtype)
        for target in set(self.base) - set(deltas):  # changed by an earlier adapter, not by this one
            out[target] = self.base[target]
        return out
