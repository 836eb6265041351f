"""The loss the step backpropagates: ``trainer.objective`` on numbers worked out by hand, and the
step checked to backpropagate exactly that function of its own tensors."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from tests.models import tiny_llama
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from tests.trainer.test_step import VOCAB, _cfg, _tiny_group
from trainer.advantages import estimate_advantages
from trainer.config import AlgorithmConfig
from trainer.logprobs import token_logprobs
from trainer.losses import entropy_from_logits, sequence_weights
from trainer.objective import MicroBatchLoss, aggregation, micro_batch_loss
from trainer.step import train_step


def t(values):
    return torch.tensor(values, dtype=torch.float32)


# The worked example of the slime RL framework: ratios pi_theta / pi_prox [2, 2, .5], A [2, -2, 2];
# pi_prox / pi_behavior [1.5, 3, .25], capped at 2 -> [1.5, 2, .25].
PROX = torch.log(t([0.3, 0.6, 0.1]))
LOGP = PROX + torch.log(t([2.0, 2.0, 0.5]))
BEHAV = torch.log(t([0.2, 0.2, 0.4]))
ADV = t([2.0, -2.0, 2.0])
SYMMETRIC = {"eps_low": 0.2, "eps_high": 0.2}


def _loss(alg: AlgorithmConfig, lengths=(3,), weights=(1.0, 1.0, 1.0), logp=LOGP, **kw) -> MicroBatchLoss:
    return micro_batch_loss(logp, PROX, BEHAV, ADV, t(list(weights)), list(lengths), alg, **kw)


def test_token_level_weight_times_the_clipped_surrogate_hand_numbers():
    # clipped surrogate [-2.4, 4.0, -1.0] (tok0 clipped) times w [1.5, 2, .25] -> [-3.6, 8.0, -.25]
    out = _loss(AlgorithmConfig(**SYMMETRIC))
    assert out.loss.item() == pytest.approx(-3.6 + 8.0 - 0.25)
    assert out.sums["is_weight"].item() == pytest.approx(3.75)
    assert (out.sums["clipped"], out.sums["dual_clipped"], out.sums["is_masked"]) == (1, 0, 0)
    assert out.sums["trained"].item() == 3 and out.sums["pg_loss"] is out.loss
    # dual clip 1.5 caps tok1 (A < 0) at 3 -> 2 * 3 = 6; the aggregation weights multiply each token
    out = _loss(AlgorithmConfig(**SYMMETRIC, dual_clip_c=1.5), weights=(0.5, 0.25, 1.0))
    assert out.loss.item() == pytest.approx(-3.6 * 0.5 + 6.0 * 0.25 - 0.25)
    assert out.sums["dual_clipped"] == 1


def test_sequence_level_and_masked_weights_hand_numbers():
    # sequences of 2 and 1 tokens: w = min(1.5 * 3, 2) = 2 for the first, .25 for the second
    out = _loss(AlgorithmConfig(**SYMMETRIC, is_level="sequence"), lengths=(2, 1))
    assert out.loss.item() == pytest.approx(2 * -2.4 + 2 * 4.0 + 0.25 * -1.0)
    # one sequence: w = 1.5 * 3 * .25 = 1.125, under the cap
    out = _loss(AlgorithmConfig(**SYMMETRIC, is_level="sequence"))
    assert out.loss.item() == pytest.approx(1.125 * (-2.4 + 4.0 - 1.0))
    # masked: the token whose weight is above the cap is dropped, not capped
    out = _loss(AlgorithmConfig(**SYMMETRIC, is_mode="mask"))
    assert out.loss.item() == pytest.approx(-3.6 - 0.25)
    assert out.sums["is_masked"] == 1
    # off: no weight at all, the clipped surrogate [-2.4, 4.0, -1.0] as it is, at either level
    for level in ("token", "sequence"):
        out = _loss(AlgorithmConfig(**SYMMETRIC, is_mode="off", is_level=level), lengths=(2, 1))
        assert out.loss.item() == pytest.approx(-2.4 + 4.0 - 1.0)
        assert out.sums["is_weight"].item() == 3.0 and out.sums["is_masked"] == 0


def test_entropy_kl_and_value_terms_hand_numbers():
    pg = -3.6 + 8.0 - 0.25
    entropy = t([1.0, 2.0, 3.0])
    ref = LOGP - math.log(2.0)  # k1 = ln 2 on every token
    alg = AlgorithmConfig(**SYMMETRIC, entropy_coef=0.1, kl_coef=0.5, kl_estimator="k1")
    out = _loss(alg, entropy=entropy, logp_ref=ref)
    assert out.loss.item() == pytest.approx(pg - 0.1 * 6.0 + 0.5 * 3 * math.log(2.0), rel=1e-6)
    assert out.sums["entropy_bonus"].item() == pytest.approx(6.0)
    assert out.sums["kl_ref"].item() == pytest.approx(3 * math.log(2.0))
    # the KL charged to the reward adds no loss term
    in_reward = _loss(AlgorithmConfig(**SYMMETRIC, kl_coef=0.5, kl_in_reward=True), logp_ref=ref)
    assert in_reward.loss.item() == pytest.approx(pg) and "kl_ref" not in in_reward.sums
    # PPO's value loss: per token [.845, .08, 0] (V 1 -> clipped to .7, R 2; V 0, old .5, R .4; V = R)
    ppo = AlgorithmConfig(**SYMMETRIC, advantage="ppo", vf_coef=0.5)
    values = t([1.0, 0.0, 3.0])
    out = _loss(ppo, values=values, values_old=t([0.5, 0.5, 3.0]), returns=t([2.0, 0.4, 3.0]))
    assert out.loss.item() == pytest.approx(pg + 0.5 * (0.845 + 0.08))
    assert out.sums["vf_clipped"] == 1 and out.sums["value"].item() == pytest.approx(4.0)
    with pytest.raises(ValueError, match="entropy"):
        _loss(AlgorithmConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="values_old"):
        _loss(ppo, values=values)


def test_gradient_flows_only_through_logp():
    # unclipped tokens: d loss / d logp = -w A r times the aggregation weight; tok0 and tok1 are
    # clipped / dual clipped (0); tok2: -.25 * 2 * .5 / 3 (token level), -1.125 * 2 * .5 / 3 (sequence)
    for level, w2 in (("token", 0.25), ("sequence", 1.125)):
        logp = LOGP.clone().requires_grad_()
        prox, behav, adv = PROX.clone().requires_grad_(), BEHAV.clone().requires_grad_(), ADV.clone()
        adv.requires_grad_()
        alg = AlgorithmConfig(**SYMMETRIC, dual_clip_c=1.5, is_level=level)
        out = micro_batch_loss(logp, prox, behav, adv, torch.full((3,), 1 / 3), [3], alg)
        out.loss.backward()
        assert prox.grad is None and behav.grad is None and adv.grad is None
        assert_close(logp.grad, t([0.0, 0.0, -w2 * 2 * 0.5 / 3]))


def test_an_empty_micro_batch_is_zero_with_a_finite_gradient():
    logp = torch.zeros(0, requires_grad=True)
    empty = torch.zeros(0)
    out = micro_batch_loss(logp, empty, empty, empty, empty, [], AlgorithmConfig(), entropy=empty)
    out.loss.backward()
    assert out.loss.item() == 0.0 and logp.grad is not None and logp.grad.numel() == 0


def test_aggregation_weights_and_denominator():
    weights, normalizer = aggregation([3, 1, 0], AlgorithmConfig(loss_agg="seq_mean_token_mean"))
    assert weights == [1 / 6, 1 / 2, 0.0] and normalizer == 2.0
    weights, normalizer = aggregation([3, 1], AlgorithmConfig())
    assert weights == [0.25, 0.25] and normalizer == 4.0
    alg = AlgorithmConfig(loss_agg="seq_mean_token_sum_norm", loss_agg_tokens=8)
    assert aggregation([3, 1], alg) == (sequence_weights([3, 1], "seq_mean_token_sum_norm", 8), 16.0)


# ---- the step backpropagates this function of its own tensors ----


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(VOCAB).eval()


def _backpropagated(model, groups, cfg, monkeypatch) -> list[torch.Tensor]:
    """Every tensor ``train_step`` calls ``backward`` on."""
    seen = []
    backward = torch.Tensor.backward

    def spy(self, *args, **kwargs):
        seen.append(self.detach().clone())
        return backward(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "backward", spy)
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.5), groups, 1, cfg)
    return seen


def test_the_step_backpropagates_the_objective_of_the_policy_the_engine_and_the_advantages(tiny, monkeypatch):
    """The loss of one micro-batch, rebuilt here from the model, the records and the library alone
    (no batch machinery): a step that assembled its loss otherwise, or fed it other tensors, differs."""
    group = _tiny_group(tiny, [9, 17, 12, 20], stale_upto=8, behavior_shift=0.4)  # weights e^0.4 < C
    cfg = _cfg(loss_agg="seq_mean_token_mean", entropy_coef=0.01, fused_logprobs=False, packing=False)
    (loss,) = _backpropagated(copy.deepcopy(tiny), [group], cfg, monkeypatch)
    advantages = estimate_advantages([t.reward for t in group], [0] * len(group), "grpo", scale_by_std=True)
    parts: dict[str, list[torch.Tensor]] = {"logp": [], "entropy": [], "behav": [], "adv": []}
    lengths = []
    with torch.no_grad():
        for traj, a in zip(group, advantages, strict=True):
            ids = torch.tensor(traj.tokens[None])
            pos = np.flatnonzero(traj.loss_mask[1:]) + 1  # trained positions
            parts["logp"].append(token_logprobs(tiny, ids, torch.ones_like(ids), 1.0)[0, pos])
            parts["entropy"].append(entropy_from_logits(tiny(input_ids=ids).logits[0, :-1])[pos - 1])
            parts["behav"].append(torch.tensor(traj.behavior_logprobs[pos], dtype=torch.float32))
            parts["adv"].append(torch.full((len(pos),), a))
            lengths.append(len(pos))
    logp, entropy, behav, adv = (torch.cat(v) for v in parts.values())
    factors = sequence_weights(lengths, "seq_mean_token_mean")
    w = torch.cat([torch.full((n,), f) for n, f in zip(lengths, factors, strict=True)])
    expected = micro_batch_loss(logp, logp, behav, adv, w, lengths, cfg.algorithm, entropy=entropy).loss
    assert abs(float(expected)) > 1e-3, "a loss near 0 would prove nothing"
    assert float(loss) == pytest.approx(float(expected), rel=1e-4)


def test_changing_the_library_function_changes_what_the_step_backpropagates(tiny, monkeypatch):
    import trainer.objective
    import trainer.step

    group = _tiny_group(tiny, [9, 17, 12, 20])
    calls = []

    def doubled(*args, **kwargs):
        calls.append(1)
        out = trainer.objective.micro_batch_loss(*args, **kwargs)
        return out._replace(loss=2.0 * out.loss)

    plain = _backpropagated(copy.deepcopy(tiny), [group], _cfg(micro_batch_tokens=40), monkeypatch)
    monkeypatch.setattr(trainer.step, "micro_batch_loss", doubled)
    twice = _backpropagated(copy.deepcopy(tiny), [group], _cfg(micro_batch_tokens=40), monkeypatch)
    assert len(calls) == len(twice) == len(plain) > 1  # one call per micro-batch
    assert all(float(b) == pytest.approx(2 * float(a), rel=1e-6) for a, b in zip(plain, twice, strict=True))
