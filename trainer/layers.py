"""The model's decoder layers, and the heap trims at their backward that lower a CPU step's peak.

A CPU training step peaks at the end of its backward: every gradient is held by then, beside the
working set of the layer being differentiated (recomputed, with gradient checkpointing). The
background trimmer (``pqrl.heap.trimming``) lets free heap pages grow by up to its threshold
before it hands them back, and whatever is free at that moment adds to the peak. Trimming at the
start of the backward of each layer and of its parts (attention, MLP, norms; the peak can fall
inside the last layer), only while the process is near its peak (``trim_near_peak``), leaves what
comes next little but fresh pages: a few trims a step, where trimming on finer growth everywhere
cost about a tenth of the step. On the CPU quickstart's shape the peak fell by about 1% at the
same step time (bench/results/trainer_memory_cpu.log).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from pqrl.heap import trim_near_peak

__all__ = ["checks_at_layers", "decoder_layers", "trim_before_optimizer_step", "trims_before_layer_backward"]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules whose class the model names in ``_no_split_modules`` (transformers sets it, e.g.
    ``LlamaDecoderLayer``): its repeated blocks, in forward order; empty if it names none."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def _trim(module: nn.Module, grad_output: Any) -> None:
    trim_near_peak()


def trim_before_optimizer_step(device: torch.device) -> None:
    """The same trim before the optimizer step, where every gradient is held as at the end of
    backward (and the update adds no layer's working set). CPU only, as below."""
    if device.type == "cpu":
        trim_near_peak()


@contextlib.contextmanager
def trims_before_layer_backward(model: nn.Module, device: torch.device) -> Iterator[None]:
    """While open, the backward of each decoder layer and of each of its direct children first trims
    the heap if the process is near its peak. CPU only: on an accelerator the step's tensors are not
    on this heap."""
    if device.type != "cpu":
        yield
        return
    # the layer, then its parts (attention, MLP, norms): the peak can fall inside the last layer
    points = [m for layer in decoder_layers(model) for m in (layer, *layer.children())]
    handles = [m.register_full_backward_pre_hook(_trim) for m in points]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def checks_at_layers(model: nn.Module, check: Callable[[], None]) -> Iterator[None]:
    """While open, ``check()`` runs before each decoder layer's forward; and before each layer's
    backward for the forwards run meanwhile, even once closed (a hook on the layer's output). What
    it raises stops the pass there: a stop asked for in the middle of a long pass (minutes on a
    CPU) need not wait for its end."""

    def before_backward(grad: torch.Tensor) -> None:
        check()

    def after_forward(module: nn.Module, args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(before_backward)

    layers = decoder_layers(model)
    handles = [layer.register_forward_pre_hook(lambda *_: check()) for layer in layers]
    handles += [layer.register_forward_hook(after_forward) for layer in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
