"""One GRPO step on real SmolLM2 samples: the update moves the policy toward rewarded answers,
stale / failed / signal-free samples are dropped and counted, micro-batching changes nothing."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from pqrl.demo import DemoConfig, sample_group
from pqrl.model_cache import load_model, load_tokenizer
from pqrl.trajectory import Status
from trainer.step import StepConfig, token_logprobs, train_step


@pytest.fixture(scope="module")
def model_and_group():
    torch.manual_seed(0)
    model, tok = load_model(dtype=torch.float32).eval(), load_tokenizer()
    cfg = DemoConfig(group_size=4, max_new_tokens=12, temperature=1.0)
    group = sample_group(model, tok, {"id": "t1", "question": "What is 3 + 4?", "answer": "7"}, cfg, "r")
    group = [dataclasses.replace(t, reward=float(i < 2)) for i, t in enumerate(group)]  # 2 right, 2 wrong
    return model, group


def _response_logp(model, group) -> torch.Tensor:
    with torch.no_grad():
        out = []
        for t in group:
            tokens = torch.tensor(t.tokens[None, :], dtype=torch.long)
            logp = token_logprobs(model, tokens, torch.ones_like(tokens), 1.0)[0]
            out.append(float((logp * torch.tensor(t.loss_mask, dtype=torch.float32)).sum()))
        return torch.tensor(out)


def test_a_step_moves_the_policy_toward_the_rewarded_answers(model_and_group):
    base, group = model_and_group
    model = copy.deepcopy(base)
    before = _response_logp(model, group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    metrics = train_step(model, optimizer, [group], version=0)
    delta = _response_logp(model, group) - before
    assert delta[:2].mean() > delta[2:].mean(), f"rewarded answers did not gain: {delta.tolist()}"
    assert metrics["rollout/trajectories_used"] == 4
    # behaviour logprobs came from the same weights: the two parts of q != p are near zero
    assert abs(metrics["offpolicy/mismatch_kl"]) < 1e-2
    assert metrics["offpolicy/tis_weight_mean"] == pytest.approx(1.0, abs=0.02)
    assert metrics["losses/clipfrac"] == 0.0 and metrics["losses/grad_norm"] > 0


def test_stale_failed_and_signal_free_samples_are_dropped_and_counted(model_and_group):
    base, group = model_and_group
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    params = [p.detach().clone() for p in model.parameters()]
    failed = [dataclasses.replace(group[0], status=Status.FAILED_INFRA), *group[1:]]
    same = [dataclasses.replace(t, reward=1.0) for t in group]
    m = train_step(model, optimizer, [group], version=5, cfg=StepConfig(max_staleness=1))
    assert m["dropped/stale"] == 4 and m["offpolicy/staleness_5"] == 4 and m["rollout/trajectories_used"] == 0
    assert m["dropped/groups_too_few_valid"] == 1
    m = train_step(model, optimizer, [same], version=0)
    assert m["dropped/no_signal_groups"] == 1
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True)), "nothing to learn"
    m = train_step(model, optimizer, [failed], version=0)
    assert m["dropped/failed_infra"] == 1 and m["rollout/trajectories_used"] == 3


def test_micro_batches_give_the_same_update_as_one_batch(model_and_group):
    base, group = model_and_group
    updated = []
    for budget in (100_000, 40):  # one micro-batch, or one trajectory per micro-batch
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        m = train_step(model, optimizer, [group], version=0, cfg=StepConfig(micro_batch_tokens=budget))
        updated.append((m["perf/micro_batches"], [p.detach() for p in model.parameters()]))
    (n1, one), (n4, many) = updated
    assert n1 == 1 and n4 == 4
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(one, many, strict=True))
