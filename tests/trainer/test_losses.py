"""Policy-loss functions checked against numbers worked out by hand, plus the seed's sanity checks."""

import math

import pytest
import torch
from torch.testing import assert_close

from trainer.advantages import grpo_advantages, rloo_advantages
from trainer.losses import (
    clipped_surrogate,
    clipped_value_loss,
    entropy_from_logits,
    kl_estimate,
    sequence_weights,
    truncated_is_weights,
)


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def logs(values):
    return torch.log(t(values))


# The worked example of the slime RL framework: ratios [2, 2, .5], A [2, -2, 2], eps 0.2.
SLIME_RATIOS = [[2.0, 2.0, 0.5]]
SLIME_ADV = [[2.0, -2.0, 2.0]]


# --- clipped surrogate -----------------------------------------------------------------------


def test_slime_example_with_dual_clip():
    # tok0: max(-2*2, -2*1.2) = max(-4, -2.4) = -2.4            (clip active)
    # tok1: max(2*2, 2*1.2) = 4; A < 0 so min(4, -(-2)*1.5 = 3) = 3   (dual clip active)
    # tok2: max(-2*0.5, -2*0.8) = max(-1, -1.6) = -1             (nothing active)
    out = clipped_surrogate(logs(SLIME_RATIOS), torch.zeros(1, 3), t(SLIME_ADV), dual_clip_c=1.5)
    assert_close(out.loss, t([[-2.4, 3.0, -1.0]]))
    assert_close(out.ratio, t(SLIME_RATIOS))
    assert out.clipped.tolist() == [[True, False, False]]
    assert out.dual_clipped.tolist() == [[False, True, False]]


def test_slime_example_without_dual_clip():
    out = clipped_surrogate(logs(SLIME_RATIOS), torch.zeros(1, 3), t(SLIME_ADV))
    assert_close(out.loss, t([[-2.4, 4.0, -1.0]]))
    assert not out.dual_clipped.any()


def test_surrogate_gradient_zero_where_clipped():
    # d loss / d logp = -A * ratio on unclipped tokens, 0 where a clip is active.
    # With dual clip: [0, 0, -2*0.5 = -1]. Without: tok1 unclipped -> -(-2)*2 = 4.
    logp = logs(SLIME_RATIOS).requires_grad_()
    clipped_surrogate(logp, torch.zeros(1, 3), t(SLIME_ADV), dual_clip_c=1.5).loss.sum().backward()
    assert_close(logp.grad, t([[0.0, 0.0, -1.0]]))
    logp.grad = None
    clipped_surrogate(logp, torch.zeros(1, 3), t(SLIME_ADV)).loss.sum().backward()
    assert_close(logp.grad, t([[0.0, 4.0, -1.0]]))


def test_dapo_clip_higher_is_asymmetric():
    # eps_low 0.2, eps_high 0.28, ratios [2, 0.5], A [2, -2]:
    # tok0: max(-4, -2*1.28) = -2.56; tok1: max(2*0.5, 2*0.8) = max(1, 1.6) = 1.6 (clipped low).
    out = clipped_surrogate(logs([[2.0, 0.5]]), torch.zeros(1, 2), t([[2.0, -2.0]]), eps_high=0.28)
    assert_close(out.loss, t([[-2.56, 1.6]]))
    assert out.clipped.tolist() == [[True, True]]


def test_surrogate_argument_checks():
    with pytest.raises(ValueError):
        clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2))  # per-seq A
    with pytest.raises(ValueError):
        clipped_surrogate(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), dual_clip_c=1.0)


def test_surrogate_extreme_ratio_is_finite():
    # logp - logp_old = 1000 would overflow exp(); with A = 0 a naive product gives 0 * inf = NaN.
    logp = t([[1000.0, -1000.0]]).requires_grad_()
    out = clipped_surrogate(logp, torch.zeros(1, 2), torch.zeros(1, 2))
    out.loss.sum().backward()
    assert torch.isfinite(out.loss).all() and torch.isfinite(logp.grad).all()


# --- importance weights -----------------------------------------------------------------------


def test_truncated_is_weights_token_level():
    # pi_prox / pi_behavior = [1.5, 3.0, 0.25] -> min(., 2) = [1.5, 2.0, 0.25]; masked -> 0.
    prox = logs([[0.3, 0.6, 0.1, 0.5]])
    behav = logs([[0.2, 0.2, 0.4, 0.1]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert_close(truncated_is_weights(prox, behav, mask), t([[1.5, 2.0, 0.25, 0.0]]))
    # Uncapped: [1.5, 3, 0.25]. Masked IS: the 3.0 token is dropped instead of capped.
    assert_close(truncated_is_weights(prox, behav, mask, cap=None), t([[1.5, 3.0, 0.25, 0.0]]))
    assert_close(truncated_is_weights(prox, behav, mask, mode="mask"), t([[1.5, 0.0, 0.25, 0.0]]))
    with pytest.raises(ValueError):
        truncated_is_weights(prox, behav, mask, level="turn")
    with pytest.raises(ValueError):
        truncated_is_weights(prox, behav, mask, mode="clip")


def test_truncated_is_weights_sequence_level():
    # Row 0: 1.5 * 3.0 * 0.25 = 1.125 (under the cap). Row 1: only the first two tokens count,
    # 1.5 * 3.0 = 4.5 -> capped to 2 (or dropped -> 0 in mask mode).
    prox = logs([[0.3, 0.6, 0.1], [0.3, 0.6, 0.1]])
    behav = logs([[0.2, 0.2, 0.4], [0.2, 0.2, 0.4]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = truncated_is_weights(prox, behav, mask, level="sequence")
    assert_close(w, t([[1.125, 1.125, 1.125], [2.0, 2.0, 0.0]]))
    w = truncated_is_weights(prox, behav, mask, level="sequence", mode="mask")
    assert_close(w, t([[1.125, 1.125, 1.125], [0.0, 0.0, 0.0]]))


def test_sequence_weight_of_a_long_sequence_is_the_cap():
    # 200 tokens each with log-ratio 1: exp(200) is beyond float32, the capped weight is exactly 2.
    w = truncated_is_weights(torch.ones(1, 200), torch.zeros(1, 200), torch.ones(1, 200), level="sequence")
    assert_close(w, torch.full((1, 200), 2.0))


# --- KL and entropy ------------------------------------------------------------------------------


def test_kl_estimators_hand_numbers():
    # p = 0.5, ref = 0.25: logratio = ln 2 = 0.6931472.
    # k1 = 0.6931472; k2 = 0.5 * 0.480453 = 0.2402265; k3 = 0.5 - ln(0.5) - 1 = 0.1931472.
    logp, ref = logs([0.5, 0.3]), logs([0.25, 0.3])
    assert_close(kl_estimate(logp, ref, "k1"), t([0.6931472, 0.0]))
    assert_close(kl_estimate(logp, ref, "k2"), t([0.2402265, 0.0]))
    assert_close(kl_estimate(logp, ref, "k3"), t([0.1931472, 0.0]))
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k4")


def test_kl_k1_k3_are_unbiased_monte_carlo():
    # p = [0.5, 0.3, 0.2], ref = [0.2, 0.3, 0.5]:
    # KL(p || ref) = 0.5 ln 2.5 + 0 + 0.2 ln 0.4 = 0.4581454 - 0.1832581 = 0.2748872.
    gen = torch.Generator().manual_seed(0)
    p, ref = t([0.5, 0.3, 0.2]), t([0.2, 0.3, 0.5])
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    for kind in ("k1", "k3"):
        k = kl_estimate(p.log()[x], ref.log()[x], kind).double()
        se = k.std() / math.sqrt(k.numel())
        assert abs(k.mean().item() - 0.2748872) < 4 * se.item()


def test_kl_gradient_only_through_logp():
    logp, ref = logs([0.5]).requires_grad_(), logs([0.25]).requires_grad_()
    # d k3 / d logp = -exp(ref - logp) + 1 = -0.5 + 1 = 0.5.
    kl_estimate(logp, ref, "k3").sum().backward()
    assert_close(logp.grad, t([0.5]))
    assert ref.grad is None


def test_entropy_from_logits():
    # Uniform over 4: ln 4 = 1.3862944. p = [0.25, 0.75] from logits [0, ln 3]:
    # -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3465736 + 0.2157616 = 0.5623351.
    logits = t([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -math.inf, -math.inf]])
    assert_close(entropy_from_logits(logits), t([1.3862944, 0.5623351]))
    # Huge logits stay stable: two equal logits of 1e4 -> ln 2.
    assert_close(entropy_from_logits(t([1e4, 1e4])), t(math.log(2.0)))
    # bfloat16 input is upcast.
    assert entropy_from_logits(torch.zeros(3, dtype=torch.bfloat16)).dtype == torch.float32


def test_entropy_gradient_finite_with_banned_tokens():
    logits = t([[0.0, 1.0, -math.inf]]).requires_grad_()
    entropy_from_logits(logits).sum().backward()
    assert torch.isfinite(logits.grad).all()
    # dH/dz_i = -p_i (ln p_i + H); the banned token has p = 0, so 0.
    assert logits.grad[0, 2].item() == 0.0


# --- aggregation --------------------------------------------------------------------------------

LOSS = [[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]]
MASK = [[1, 1, 1], [1, 0, 0]]


def _aggregate(loss, mask, mode, max_len=None):
    """``sum_i w_i * (sequence i's token sum)``, one sequence at a time as micro-batches add up."""
    w = sequence_weights(mask.sum(-1).tolist(), mode, max_len)
    return sum(wi * float(torch.where(mask[i].bool(), loss[i], 0.0).sum()) for i, wi in enumerate(w))


def test_sequence_weights_give_each_aggregation_hand_numbers():
    loss, mask = t(LOSS), torch.tensor(MASK)
    # token-mean: (1 + 2 + 3 + 4) / 4 = 2.5
    assert _aggregate(loss, mask, "token_mean") == pytest.approx(2.5)
    # seq_mean_token_mean: (6/3 + 4/1) / 2 = 3
    assert _aggregate(loss, mask, "seq_mean_token_mean") == pytest.approx(3.0)
    # seq_mean_token_sum_norm with max_len 3: (6/3 + 4/3) / 2 = 5/3; with 4: (1.5 + 1)/2
    assert _aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=3) == pytest.approx(5.0 / 3.0)
    assert _aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=4) == pytest.approx(1.25)
    # seq_mean_token_sum: (6 + 4) / 2 = 5
    assert _aggregate(loss, mask, "seq_mean_token_sum") == pytest.approx(5.0)
    with pytest.raises(ValueError, match="unknown aggregation"):
        sequence_weights([3, 1], "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_len"):
        sequence_weights([3, 1], "seq_mean_token_sum_norm")


def test_a_sequence_without_tokens_weighs_nothing_and_does_not_dilute():
    # A third, empty row changes nothing: still (2 + 4) / 2 = 3, 10 / 4 and (6 + 4) / 2.
    loss = t(LOSS + [[5.0, 5.0, 5.0]])
    mask = torch.tensor(MASK + [[0, 0, 0]])
    assert _aggregate(loss, mask, "seq_mean_token_mean") == pytest.approx(3.0)
    assert _aggregate(loss, mask, "token_mean") == pytest.approx(2.5)
    assert _aggregate(loss, mask, "seq_mean_token_sum") == pytest.approx(5.0)
    assert sequence_weights([3, 1, 0], "seq_mean_token_mean")[2] == 0.0


# --- seed sanity checks ---------------------------------------------------------------------------


def test_loaded_die_importance_sampling():
    # Importance sampling by hand: loaded die p = [.1]*5 + [.5], f(x) = x^2, samples from a fair die q.
    # E_p[f] = 0.1 * (1 + 4 + 9 + 16 + 25) + 0.5 * 36 = 5.5 + 18 = 23.5; E_q[f] = 91/6 = 15.17.
    # Weights p/q come from the library's IS function (token level, uncapped).
    gen = torch.Generator().manual_seed(0)
    p = t([0.1] * 5 + [0.5])
    q = torch.full((6,), 1 / 6)
    x = torch.multinomial(q, 100_000, replacement=True, generator=gen)  # face index 0..5
    f = (x + 1).double() ** 2
    w = truncated_is_weights(p.log()[x], q.log()[x], torch.ones_like(f), cap=None).double()
    assert_close(w.unique(), torch.tensor([0.6, 3.0], dtype=torch.float64))
    est = (w * f).mean().item()
    se = (w * f).std().item() / math.sqrt(f.numel())
    assert abs(est - 23.5) < 4 * se
    assert abs(f.mean().item() - 91 / 6) < 4 * f.std().item() / math.sqrt(f.numel())
    # Truncating at C = 2 trades variance for bias: E_q[min(w, 2) f] = (0.6 * 55 + 2 * 36) / 6
    # = (33 + 72) / 6 = 17.5, not 23.5.
    w_tis = truncated_is_weights(p.log()[x], q.log()[x], torch.ones_like(f), cap=2.0).double()
    est_tis = (w_tis * f).mean().item()
    assert abs(est_tis - 17.5) < 4 * (w_tis * f).std().item() / math.sqrt(f.numel())


# Six-armed bandit in the seed's "every game scores 90-100" regime: rewards sit on a large
# offset, so without a baseline the useful differences hide under big numbers.
ARM_MEANS = t([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
OFFSET, NOISE = 10.0, 0.5


def _pull(logits, n, gen):
    probs = torch.softmax(logits.detach(), dim=-1)
    arms = torch.multinomial(probs, n, replacement=True, generator=gen)
    rewards = OFFSET + ARM_MEANS[arms] + NOISE * torch.randn(n, generator=gen)
    return arms, rewards


def _batch_gradient(logits, arms, advantages):
    # REINFORCE estimate of -grad J through the library's surrogate: with logp_old = logp
    # (detached) the ratio is 1 and d loss / d logp = -A, exactly REINFORCE.
    logp = torch.log_softmax(logits, dim=-1)[arms][None]
    out = clipped_surrogate(logp, logp.detach(), advantages[None])
    (grad,) = torch.autograd.grad(out.loss.mean(), logits)
    return -grad


def test_bandit_baseline_is_unbiased_and_lowers_variance():
    # At uniform logits the exact gradient is pi * (mu - pi . mu) = (mu - 0.5) / 6; the offset
    # cancels because sum_a grad pi_a = 0. RLOO's leave-one-out baseline keeps it unbiased.
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(6, requires_grad=True)
    exact = (ARM_MEANS - 0.5) / 6
    plain, baselined = [], []
    for _ in range(400):
        arms, rewards = _pull(logits, 16, gen)
        plain.append(_batch_gradient(logits, arms, rewards))
        baselined.append(_batch_gradient(logits, arms, rloo_advantages(rewards[None])[0]))
    plain, baselined = torch.stack(plain), torch.stack(baselined)
    for grads in (plain, baselined):
        se = grads.std(dim=0) / math.sqrt(grads.shape[0])
        assert ((grads.mean(dim=0) - exact).abs() < 4 * se).all()
    var_plain = plain.var(dim=0).sum().item()
    var_baselined = baselined.var(dim=0).sum().item()
    assert var_baselined < var_plain
    assert var_baselined < 0.05 * var_plain  # offset 10 vs spread ~0.6: orders of magnitude


def test_bandit_reinforce_with_baseline_finds_best_arm():
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(6, requires_grad=True)
    opt = torch.optim.SGD([logits], lr=1.0)
    for _ in range(150):
        arms, rewards = _pull(logits, 32, gen)
        adv = grpo_advantages(rewards[None])[0]
        logp = torch.log_softmax(logits, dim=-1)[arms][None]
        out = clipped_surrogate(logp, logp.detach(), adv[None])
        opt.zero_grad()
        out.loss.mean().backward()
        opt.step()
    probs = torch.softmax(logits.detach(), dim=-1)
    assert probs.argmax().item() == 5
    assert probs[5].item() > 0.9


def test_clipped_value_loss_hand_numbers():
    # V 1.0, old 0.5, R 2: unclipped 1; V_clip 0.7 -> 1.69 wins (0.845). V 0, old 0.5, R 0.4:
    # unclipped 0.16; V_clip 0.3 -> 0.01, the unclipped term wins (0.08).
    values = t([1.0, 0.0]).requires_grad_()
    loss, clipped = clipped_value_loss(values, t([0.5, 0.5]), t([2.0, 0.4]), clip=0.2)
    assert_close(loss, t([0.845, 0.08]))
    assert clipped.tolist() == [True, False]
    loss.sum().backward()
    assert_close(values.grad, t([0.0, -0.4]))  # the clipped token passes no gradient
    plain, never = clipped_value_loss(t([1.0]), t([0.5]), t([2.0]), clip=None)
    assert_close(plain, t([0.5])) and not never.any()
