"""Every algorithm setting the job config accepts, run through the training step on real SmolLM2
samples, with the metric that shows the chosen variant ran: the advantage estimators' mean
|advantage| against hand-computed values, each aggregation's denominator, the dual clip, the
off-policy weight per token or per sequence (capped or masked), KL as a loss or in the reward,
the entropy bonus, the overlong penalty and the truncation filter, PPO's critic and GAE."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from launcher.demo import DemoConfig, sample_group
from pqrl.model_cache import load_model, load_tokenizer
from pqrl.trajectory import Status
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer.config import AlgorithmConfig, StepConfig
from trainer.critic import ValueHead
from trainer.screening import ended_at_a_limit
from trainer.step import train_step


@pytest.fixture(scope="module")
def samples():
    """Two groups of four real samples: rewards [1, 1, 0, 0] and [1, 1, 1, 1]."""
    torch.manual_seed(0)
    model, tok = load_model(dtype=torch.float32).eval(), load_tokenizer()
    cfg = DemoConfig(group_size=4, max_new_tokens=10, temperature=1.0)
    task = {"id": "t1", "question": "What is 3 + 4?", "answer": "7"}
    mixed = [
        dataclasses.replace(t, reward=float(i < 2))
        for i, t in enumerate(sample_group(model, tok, task, cfg, "r"))
    ]
    solved = [
        dataclasses.replace(t, reward=1.0, group_id="g2") for t in sample_group(model, tok, task, cfg, "r")
    ]
    return model, mixed, solved


def step(model, groups, *, lr=1e-5, epochs=1, minibatches=1, ref_model=None, **algorithm):
    """One step on a copy of ``model``; (metrics, the copy)."""
    trained = copy.deepcopy(model)
    cfg = StepConfig(temperature=1.0, max_staleness=1, ppo_epochs=epochs, minibatches=minibatches,
                     algorithm=AlgorithmConfig(**algorithm))  # fmt: skip
    optimizer = torch.optim.SGD(trained.parameters(), lr=lr)
    return train_step(trained, optimizer, groups, version=0, cfg=cfg, ref_model=ref_model), trained


def moved(a, b) -> float:
    with torch.no_grad():
        return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


# rewards [1, 1, 0, 0]: mean 0.5, unbiased std 1/sqrt(3); |r - mean| = 0.5 for every member
@pytest.mark.parametrize(
    "algorithm, abs_mean, used",
    [
        ({}, 0.5 * 3**0.5, 4),  # grpo: 0.5 / std
        ({"scale_by_std": False}, 0.5, 4),
        ({"advantage": "dr_grpo"}, 0.5, 4),
        ({"advantage": "rloo"}, 4 / 3 * 0.5, 4),  # n / (n - 1) * (r - mean)
        # the batch mean of both groups is 0.75: the solved group now has a signal too
        ({"advantage": "reinforce_baseline"}, (2 * 0.25 + 2 * 0.75 + 4 * 0.25) / 8, 8),
    ],
)
def test_advantage_estimators(samples, algorithm, abs_mean, used):
    model, mixed, solved = samples
    m, _ = step(model, [mixed, solved], **algorithm)
    assert m["rollout/trajectories_used"] == used
    assert m["advantages/abs_mean"] == pytest.approx(abs_mean, rel=1e-4)
    assert m["losses/grad_norm"] > 0


@pytest.mark.parametrize(
    "loss_agg", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_loss_aggregations(samples, loss_agg):
    """The denominator each aggregation divides by; the same advantages, so the loss changes only by
    the weights: a sum over tokens is ``tokens / sequences`` times a token mean."""
    model, mixed, _ = samples
    tokens = sum(int(t.loss_mask[1:].sum()) for t in mixed)
    extra = {"loss_agg_tokens": 64} if loss_agg == "seq_mean_token_sum_norm" else {}
    m, _ = step(model, [mixed], loss_agg=loss_agg, **extra)
    expected = {"token_mean": tokens, "seq_mean_token_sum_norm": 4 * 64}.get(loss_agg, 4)
    assert m["losses/agg_normalizer"] == expected
    base, _ = step(model, [mixed])
    if loss_agg == "seq_mean_token_sum":
        # every advantage is +-0.866 and every ratio 1 at the first update, with two sequences each
        # way: the token sums differ by the sequences' lengths only
        assert m["losses/pg_loss"] != pytest.approx(base["losses/pg_loss"])


def test_dual_clip_caps_negative_advantage_tokens_after_the_policy_moved(samples):
    """pi_prox is the policy at the start of the step, so ratios leave 1 only through the step's
    own updates: with two epochs of two minibatches at a large rate, a minibatch that raised the
    tokens a negative-advantage sample shares with a rewarded one pushes that sample's ratio past
    c, and the cap is counted (the minibatch order is seeded: the same on every run)."""
    model, mixed, _ = samples
    m, _ = step(model, [mixed], lr=0.2, epochs=2, minibatches=2, dual_clip_c=1.5)
    assert m["losses/dual_clipfrac"] > 0 and m["losses/clipfrac"] > 0
    plain, _ = step(model, [mixed], lr=0.2, epochs=2, minibatches=2)
    assert "losses/dual_clipfrac" not in plain


def _shifted(group, delta):
    """The group with the engine's logprob of the first trained token of member 0 lowered by ``delta``:
    a behaviour policy that differs from the trainer's on one token."""
    t = group[0]
    behav = t.behavior_logprobs.copy()
    behav[np.flatnonzero(t.loss_mask[1:])[0] + 1] -= delta
    return [dataclasses.replace(t, behavior_logprobs=behav), *group[1:]]


def test_off_policy_weight_per_token_or_per_sequence_truncated_or_masked(samples):
    model, mixed, _ = samples
    group = _shifted(mixed, 2.0)  # that token's ratio pi_prox / pi_behavior is e^2 ~ 7.4
    n = [int(t.loss_mask[1:].sum()) for t in group]
    total = sum(n)
    token, _ = step(model, [group], is_cap=2.0)
    # one token capped at 2, every other token ~1
    assert token["offpolicy/is_weight_mean"] == pytest.approx((total - 1 + 2.0) / total, abs=2e-3)
    sequence, _ = step(model, [group], is_cap=2.0, is_level="sequence")
    # every token of member 0 gets its sequence's weight, capped at 2
    assert sequence["offpolicy/is_weight_mean"] == pytest.approx(
        (total - n[0] + 2.0 * n[0]) / total, abs=2e-3
    )
    masked, _ = step(model, [group], is_cap=2.0, is_level="sequence", is_mode="mask")
    assert masked["offpolicy/is_masked_frac"] == pytest.approx(n[0] / total)
    one, _ = step(model, [group], is_cap=2.0, is_mode="mask")
    assert one["offpolicy/is_masked_frac"] == pytest.approx(1 / total)


def test_kl_as_a_loss_or_in_the_reward(samples):
    model, mixed, _ = samples
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    as_loss, _ = step(model, [mixed], ref_model=ref, kl_coef=0.1, kl_estimator="k3")
    assert as_loss["losses/kl_ref"] > 0 and "rewards/kl_penalty_mean" not in as_loss
    in_reward, _ = step(model, [mixed], ref_model=ref, kl_coef=0.1, kl_estimator="k1", kl_in_reward=True)
    assert "losses/kl_ref" not in in_reward and in_reward["rewards/kl_penalty_mean"] != 0
    # the penalty differs per sequence, so the advantages are no longer exactly +-0.866
    assert in_reward["advantages/abs_mean"] != pytest.approx(0.5 * 3**0.5, rel=1e-6)
    with pytest.raises(ValueError, match="needs ref_model"):
        step(model, [mixed], kl_coef=0.1)


def test_entropy_bonus_changes_the_update(samples):
    model, mixed, _ = samples
    plain_m, plain = step(model, [mixed], lr=1e-3)
    bonus_m, bonus = step(model, [mixed], lr=1e-3, entropy_coef=0.5)
    assert bonus_m["losses/entropy_bonus"] > 0 and "losses/entropy_bonus" not in plain_m
    assert moved(plain, bonus) > 0


def test_overlong_penalty_and_truncation_filter(samples):
    model, mixed, _ = samples
    longest = max(t.num_tokens for t in mixed)
    budget = {"context_tokens": longest, "overlong_buffer": longest // 2}
    m, _ = step(model, [mixed], **budget)
    assert m["rewards/overlong_penalty_mean"] < 0
    # an episode that hit the budget, and the samples whose last turn was cut at max_new_tokens
    # (the first two samples stopped by themselves, the last two at max_new_tokens)
    cut = [
        mixed[0],
        dataclasses.replace(mixed[1], reward=0.0),
        dataclasses.replace(mixed[2], status=Status.TRUNCATED),
        mixed[3],
    ]
    limited = sum(ended_at_a_limit(t) for t in cut)
    assert limited == 2 and not any(ended_at_a_limit(t) for t in cut[:2])
    m, _ = step(model, [cut], filter_truncated=True)
    assert m["dropped/truncated"] == limited and m["rollout/trajectories_used"] == 4 - limited
    m, _ = step(model, [cut])
    assert "dropped/truncated" not in m and m["rollout/trajectories_used"] == 4


def test_ppo_gae_on_agent_tokens_value_loss_and_the_critic_learns(samples):
    """The critic starts at 0, so each token's advantage is lam^(tokens after it) * R (gamma 1);
    one step trains it toward the returns: its values move and the value loss falls."""
    model, mixed, solved = samples
    trained = copy.deepcopy(model)
    critic = ValueHead(model.config.hidden_size)
    optimizer = torch.optim.AdamW([*trained.parameters(), *critic.parameters()], lr=1e-3)
    cfg = StepConfig(temperature=1.0, max_staleness=1, algorithm=AlgorithmConfig(advantage="ppo", lam=0.9))
    groups = [mixed, solved]
    first = train_step(trained, optimizer, groups, 0, cfg, critic=critic)
    lengths = [int(t.loss_mask[1:].sum()) for g in groups for t in g]
    rewards = [t.reward for g in groups for t in g]
    expected = [r * 0.9**k for n, r in zip(lengths, rewards, strict=True) for k in range(n)]
    assert first["rollout/trajectories_used"] == 8, "a critic gives the all-solved group a signal"
    assert first["critic/value_before_mean"] == 0.0
    assert first["advantages/abs_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    assert first["losses/value_loss"] > 0 and first["critic/value_mean"] == 0.0
    second = train_step(trained, optimizer, groups, 1, cfg, critic=critic)
    assert second["critic/value_before_mean"] > 0, "the critic moved toward the positive returns"
    assert second["losses/value_loss"] < first["losses/value_loss"]
    with pytest.raises(ValueError, match="critic"):
        train_step(trained, optimizer, groups, 2, cfg)
