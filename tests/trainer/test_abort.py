"""A step asked to stop (the second Ctrl-C) gives way before its first optimizer step and changes
nothing; once it has updated the weights it finishes instead of leaving them half trained."""

from __future__ import annotations

import copy
import dataclasses
import threading

import pytest
import torch

from launcher.demo import DemoConfig, sample_group
from pqrl.model_cache import load_model, load_tokenizer
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer.batch import StepAborted
from trainer.config import StepConfig
from trainer.step import train_step


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model, tok = load_model(dtype=torch.float32).eval(), load_tokenizer()
    task = {"id": "t", "question": "What is 6 * 7?", "answer": "42"}
    samples = sample_group(model, tok, task, DemoConfig(group_size=4, max_new_tokens=6, temperature=1.0), "r")
    return model, [[dataclasses.replace(t, reward=float(i < 2)) for i, t in enumerate(samples)]]


def _state(model, optimizer):
    return [p.detach().clone() for p in model.parameters()], copy.deepcopy(optimizer.state_dict())


def test_an_aborted_step_changes_nothing(setup):
    base, groups = setup
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = StepConfig(temperature=1.0, max_staleness=1, ppo_epochs=2)  # proximal pass, then two updates
    abort = threading.Event()
    abort.set()
    with pytest.raises(StepAborted):
        train_step(model, optimizer, groups, version=0, cfg=cfg, abort=abort)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), base.parameters(), strict=True))
    assert optimizer.state_dict()["state"] == {}, "no optimizer step was taken"
    metrics = train_step(model, optimizer, groups, version=0, cfg=cfg, abort=threading.Event())
    assert metrics["perf/optimizer_steps"] == 2.0  # an unset event changes nothing


def test_a_step_past_its_first_update_finishes(setup):
    base, groups = setup
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    abort = threading.Event()
    first_step = optimizer.step

    def step_then_ask_to_stop(*args, **kwargs):
        out = first_step(*args, **kwargs)
        abort.set()  # the user presses Ctrl-C twice right after the first update
        return out

    optimizer.step = step_then_ask_to_stop
    cfg = StepConfig(temperature=1.0, max_staleness=1, ppo_epochs=2)
    metrics = train_step(model, optimizer, groups, version=0, cfg=cfg, abort=abort)
    assert abort.is_set() and metrics["perf/optimizer_steps"] == 2.0


def _stopped_from_inside(setup, checkpointing, arrange):
    """Runs a step whose stop ``arrange(layers, abort)`` asks for from inside its pass: it must raise
    StepAborted and leave the weights and the optimizer state as they were."""
    from trainer.layers import decoder_layers

    base, groups = setup
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    abort, layers = threading.Event(), decoder_layers(model)
    assert len(layers) > 3
    arrange(layers, abort)
    cfg = StepConfig(temperature=1.0, max_staleness=1, gradient_checkpointing=checkpointing)
    with pytest.raises(StepAborted):
        train_step(model, optimizer, groups, version=0, cfg=cfg, abort=abort)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), base.parameters(), strict=True))
    assert optimizer.state_dict()["state"] == {}, "no optimizer step was taken"


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_stop_asked_during_the_forward_raises_at_the_next_layer(setup, checkpointing):
    last_after_stop = []

    def arrange(layers, abort):
        layers[1].register_forward_hook(lambda *_: abort.set())  # Ctrl-C twice while layer 1 runs
        layers[-1].register_forward_hook(lambda *_: last_after_stop.append(abort.is_set()))

    _stopped_from_inside(setup, checkpointing, arrange)
    assert last_after_stop == [], "the pass went on past the layer after the stop"


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_stop_asked_during_the_backward_raises_before_the_next_layer_backward(setup, checkpointing):
    first_backward = []

    def arrange(layers, abort):
        layers[-1].register_full_backward_hook(lambda *_: abort.set())  # after the last layer's backward
        layers[0].register_full_backward_hook(lambda *_: first_backward.append(1))

    _stopped_from_inside(setup, checkpointing, arrange)
    assert first_backward == [], "the backward went on down to the first layer after the stop"
