"""Advantage estimators checked against numbers worked out by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from trainer.advantages import (
    agent_token_gae,
    broadcast_to_tokens,
    gae,
    groups_with_signal,
    grpo_advantages,
    reinforce_batch_mean_advantages,
    rloo_advantages,
)

EPS = 1e-6


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# --- GRPO / Dr.GRPO -------------------------------------------------------------------------


def test_grpo_dense_layout_hand_numbers():
    # Group [0, 2, 4]: mean 2, unbiased var (4 + 0 + 4) / 2 = 4, std 2 -> [-1, 0, 1].
    # Group [1, 1, 1, 5] would not fit a dense row, so second row [1, 1, 4]:
    #   mean 2, dev [-1, -1, 2], var (1 + 1 + 4) / 2 = 3, std sqrt(3).
    rewards = t([[0.0, 2.0, 4.0], [1.0, 1.0, 4.0]])
    adv = grpo_advantages(rewards)
    s3 = math.sqrt(3.0)
    expected = t([[-2 / (2 + EPS), 0.0, 2 / (2 + EPS)], [-1 / (s3 + EPS), -1 / (s3 + EPS), 2 / (s3 + EPS)]])
    assert_close(adv, expected)


def test_grpo_population_std_option():
    # [0, 2, 4]: population var 8 / 3, std 1.632993 -> +-2 / 1.632993 = +-1.224745.
    adv = grpo_advantages(t([[0.0, 2.0, 4.0]]), unbiased_std=False)
    assert_close(adv, t([[-1.2247449, 0.0, 1.2247449]]), atol=1e-5, rtol=1e-5)


def test_dr_grpo_drops_the_std():
    # [0, 2, 4] - 2 = [-2, 0, 2]; [1, 1, 4] - 2 = [-1, -1, 2].
    adv = grpo_advantages(t([[0.0, 2.0, 4.0], [1.0, 1.0, 4.0]]), scale_by_std=False)
    assert_close(adv, t([[-2.0, 0.0, 2.0], [-1.0, -1.0, 2.0]]))


def test_grpo_flat_layout_with_arbitrary_group_ids():
    # Group 7: [0, 2, 4] -> [-1, 0, 1]. Group 9: [10, 20, 30], mean 20, var (100+0+100)/2,
    # std 10 -> [-1, 0, 1]. Members are interleaved in the flat vector.
    rewards = t([0.0, 10.0, 2.0, 20.0, 4.0, 30.0])
    ids = torch.tensor([7, 9, 7, 9, 7, 9])
    adv = grpo_advantages(rewards, ids)
    assert_close(adv, t([-1.0, -1.0, 0.0, 0.0, 1.0, 1.0]), atol=1e-5, rtol=0)


def test_grpo_seed_worked_example_three_of_eight():
    # Worked by hand: rewards [1,1,1,0,0,0,0,0], mean 3/8. Unbiased var
    # (3 * 0.625^2 + 5 * 0.375^2) / 7 = 1.875 / 7, std 0.5175492.
    # A = 0.625 / 0.5175492 = 1.2076147 (correct), -0.375 / 0.5175492 = -0.7245688 (wrong).
    adv = grpo_advantages(t([[1.0, 1, 1, 0, 0, 0, 0, 0]]))
    expected = t([[1.2076147] * 3 + [-0.7245688] * 5])
    assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_invalid_members_leave_the_statistics_and_get_zero():
    # A failed_infra member (reward 100, or even NaN) is excluded: the group is [0, 2, 4].
    for bad in (100.0, float("nan")):
        rewards = t([[0.0, 2.0, bad, 4.0]])
        valid = torch.tensor([[True, True, False, True]])
        adv = grpo_advantages(rewards, valid=valid)
        assert_close(adv, t([[-1.0, 0.0, 0.0, 1.0]]), atol=1e-5, rtol=0)


def test_grpo_no_signal_groups_are_exactly_zero():
    # All equal: in float32 (0.9 + 0.9 + 0.9) / 3 rounds to 0.9 - 6e-8, and 6e-8 / (std + 1e-6)
    # would be ~0.06; the same happens to seven rewards of 0.1. Both must give exactly 0.
    assert torch.equal(grpo_advantages(t([[0.9, 0.9, 0.9], [1.0, 1.0, 1.0]])), torch.zeros(2, 3))
    assert torch.equal(grpo_advantages(t([[0.1] * 7])), torch.zeros(1, 7))
    assert torch.equal(rloo_advantages(t([[0.9, 0.9, 0.9]])), torch.zeros(1, 3))
    # Single-member group, and a group whose members are all invalid.
    assert torch.equal(grpo_advantages(t([[5.0]])), torch.zeros(1, 1))
    adv = grpo_advantages(t([[1.0, 2.0]]), valid=torch.tensor([[False, False]]))
    assert torch.equal(adv, torch.zeros(1, 2))
    # Flat layout with a singleton group next to a real one.
    adv = grpo_advantages(t([3.0, 0.0, 2.0]), torch.tensor([0, 1, 1]), scale_by_std=False)
    assert_close(adv, t([0.0, -1.0, 1.0]))


def test_grpo_rejects_ambiguous_layout():
    with pytest.raises(ValueError):
        grpo_advantages(t([1.0, 2.0]))  # flat rewards need group_ids
    with pytest.raises(ValueError):
        grpo_advantages(t([1.0, 2.0]), torch.tensor([0, 0, 1]))


def test_grpo_int_rewards_become_float():
    adv = grpo_advantages(torch.tensor([[0, 1]]), scale_by_std=False)
    assert adv.is_floating_point()
    assert_close(adv, t([[-0.5, 0.5]]))


# --- RLOO / REINFORCE ------------------------------------------------------------------------


def test_rloo_hand_numbers():
    # [0, 2, 4]: A_0 = 0 - (2+4)/2 = -3, A_1 = 2 - (0+4)/2 = 0, A_2 = 4 - (0+2)/2 = 3.
    # [1, 1, 4]: A = 1 - 2.5 = -1.5, -1.5, 4 - 1 = 3.
    adv = rloo_advantages(t([[0.0, 2.0, 4.0], [1.0, 1.0, 4.0]]))
    assert_close(adv, t([[-3.0, 0.0, 3.0], [-1.5, -1.5, 3.0]]))


def test_rloo_valid_mask_and_degenerate_groups():
    # Excluding the 3rd member leaves [0, 2, 4] -> [-3, 0, 3]; the excluded one gets 0.
    adv = rloo_advantages(t([[0.0, 2.0, 9.0, 4.0]]), valid=torch.tensor([[1, 1, 0, 1]]).bool())
    assert_close(adv, t([[-3.0, 0.0, 0.0, 3.0]]))
    # Single valid member: no leave-one-out baseline exists -> 0. All equal -> 0.
    adv = rloo_advantages(t([[7.0, 1.0]]), valid=torch.tensor([[True, False]]))
    assert torch.equal(adv, torch.zeros(1, 2))
    assert torch.equal(rloo_advantages(t([[0.3] * 7])), torch.zeros(1, 7))


def test_rloo_flat_layout():
    # Group 0: [1, 3] -> [1 - 3, 3 - 1] = [-2, 2]; group 1: [5, 5, 8] -> [5 - 6.5, -1.5, 8 - 5].
    adv = rloo_advantages(t([1.0, 5.0, 3.0, 5.0, 8.0]), torch.tensor([0, 1, 0, 1, 1]))
    assert_close(adv, t([-2.0, -1.5, 2.0, -1.5, 3.0]))


def test_reinforce_batch_mean():
    # mean(1, 2, 3, 6) = 3 -> [-2, -1, 0, 3]; excluding 6: mean 2 -> [-1, 0, 1, 0].
    assert_close(reinforce_batch_mean_advantages(t([1.0, 2.0, 3.0, 6.0])), t([-2.0, -1.0, 0.0, 3.0]))
    valid = torch.tensor([True, True, True, False])
    adv = reinforce_batch_mean_advantages(t([1.0, 2.0, 3.0, 6.0]), valid=valid)
    assert_close(adv, t([-1.0, 0.0, 1.0, 0.0]))
    # Any shape: [2, 2] batch, mean 2.5.
    adv = reinforce_batch_mean_advantages(t([[1.0, 2.0], [3.0, 4.0]]))
    assert_close(adv, t([[-1.5, -0.5], [0.5, 1.5]]))


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = broadcast_to_tokens(t([2.0, -1.0]), mask)
    assert_close(out, t([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]))
    with pytest.raises(ValueError):
        broadcast_to_tokens(t([[2.0]]), mask)


# --- dynamic sampling filter -----------------------------------------------------------------


def test_groups_with_signal_dense():
    rewards = t([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert groups_with_signal(rewards).tolist() == [False, True, False]
    # Excluding the only differing member leaves an all-equal group; one valid member: drop.
    valid = torch.tensor([[True, True, True], [True, False, True], [True, False, False]])
    assert groups_with_signal(rewards, valid=valid).tolist() == [False, False, False]
    # atol: 0.5 vs 0.5000001 counts as equal.
    assert groups_with_signal(t([[0.5, 0.5000001]]), atol=1e-4).tolist() == [False]


def test_groups_with_signal_flat_is_per_member():
    rewards = t([1.0, 0.0, 1.0, 0.0])
    ids = torch.tensor([0, 1, 0, 1])  # group 0: [1, 1] dropped; group 1: [0, 0] dropped
    assert groups_with_signal(rewards, ids).tolist() == [False] * 4
    ids = torch.tensor([0, 0, 1, 1])  # both groups [1, 0] kept
    assert groups_with_signal(rewards, ids).tolist() == [True] * 4


# --- GAE ---------------------------------------------------------------------------------------


def test_gae_hand_numbers_with_bootstrap_column():
    # gamma 0.9, lam 0.5, r = [1, 0, 2], V = [0.5, 1.0, 0.0], bootstrap V_3 = 0.8.
    # delta_2 = 2 + 0.9*0.8 - 0 = 2.72;  delta_1 = 0 + 0.9*0 - 1 = -1;  delta_0 = 1 + 0.9*1 - 0.5 = 1.4
    # A_2 = 2.72; A_1 = -1 + 0.45*2.72 = 0.224; A_0 = 1.4 + 0.45*0.224 = 1.5008
    # returns = A + V = [2.0008, 1.224, 2.72]
    adv, ret = gae(t([1.0, 0.0, 2.0]), t([0.5, 1.0, 0.0, 0.8]), gamma=0.9, lam=0.5)
    assert_close(adv, t([1.5008, 0.224, 2.72]))
    assert_close(ret, t([2.0008, 1.224, 2.72]))
    # Same with values of length T and bootstrap_value.
    adv2, _ = gae(t([1.0, 0.0, 2.0]), t([0.5, 1.0, 0.0]), gamma=0.9, lam=0.5, bootstrap_value=0.8)
    assert_close(adv2, adv)


def test_gae_done_cuts_bootstrapping():
    # done after t=1: delta_1 = 0 - 1 = -1, A_1 = -1 (no A_2 term); A_0 = 1.4 + 0.45*(-1) = 0.95.
    # returns = [0.95 + 0.5, -1 + 1, 2.72 + 0] = [1.45, 0, 2.72]
    adv, ret = gae(t([1.0, 0.0, 2.0]), t([0.5, 1.0, 0.0, 0.8]), gamma=0.9, lam=0.5, dones=t([0, 1, 0]))
    assert_close(adv, t([0.95, -1.0, 2.72]))
    assert_close(ret, t([1.45, 0.0, 2.72]))


def test_gae_lambda_one_is_monte_carlo():
    # gamma = lam = 1, no bootstrap: returns are reward-to-go [3, 2, 2]; A = returns - V.
    adv, ret = gae(t([1.0, 0.0, 2.0]), t([0.5, 1.0, 0.0]), gamma=1.0, lam=1.0)
    assert_close(ret, t([3.0, 2.0, 2.0]))
    assert_close(adv, t([2.5, 1.0, 2.0]))


def test_gae_mask_skips_positions_and_batches():
    # Row 0 inserts a masked step (reward 9, value 7) into the hand example: it is skipped.
    rewards = t([[1.0, 9.0, 0.0, 2.0], [1.0, 0.0, 2.0, 0.0]])
    values = t([[0.5, 7.0, 1.0, 0.0, 0.8], [0.5, 1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])
    dones = t([[0, 0, 0, 0], [0, 0, 1, 0]])  # row 1: episode ends at t=2, then a fresh step
    adv, ret = gae(rewards, values, gamma=0.9, lam=0.5, mask=mask, dones=dones)
    assert_close(adv[0], t([1.5008, 0.0, 0.224, 2.72]))
    assert_close(ret[0], t([2.0008, 0.0, 1.224, 2.72]))
    # Row 1, t=3: delta = 0 + 0.9*0 - 0 = 0. t=2 done: A = 2 - 0 = 2.
    # t=1: delta = 0 + 0.9*0 - 1 = -1, A = -1 + 0.45*2 = -0.1; t=0: delta = 1.4, A = 1.4 - 0.045.
    assert_close(adv[1], t([1.355, -0.1, 2.0, 0.0]))


def test_gae_rejects_bad_value_length():
    with pytest.raises(ValueError):
        gae(t([1.0, 2.0]), t([1.0, 2.0, 3.0, 4.0]), gamma=1.0, lam=1.0)


def test_estimators_carry_no_gradient():
    rewards = t([[0.0, 1.0]]).requires_grad_()
    assert not grpo_advantages(rewards).requires_grad
    values = t([0.5, 1.0, 0.0]).requires_grad_()
    adv, ret = gae(t([1.0, 0.0]), values, gamma=0.9, lam=0.9)
    assert not adv.requires_grad and not ret.requires_grad


def test_gae_over_the_agent_tokens_of_a_multi_turn_episode_hand_numbers():
    """[prompt prompt a1 a2 tool tool a3 a4], reward 1 after a4, gamma 1, lambda 0.5, V at the agent
    tokens 0.2 0.4 0.5 0.8. Deltas (tool tokens are not steps): a4 1 - 0.8 = 0.2, a3 0.8 - 0.5 = 0.3,
    a2 0.5 - 0.4 = 0.1, a1 0.4 - 0.2 = 0.2; A = 0.35 0.3 0.4 0.2; returns A + V."""
    v = torch.tensor([0.2, 0.4, 0.5, 0.8], dtype=torch.float64)
    adv, ret = agent_token_gae(v, 1.0, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([0.35, 0.3, 0.4, 0.2], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([0.55, 0.7, 0.9, 1.0], dtype=torch.float64))
    # the full layout with the mask: whatever V says at the masked positions, the same numbers there
    mask = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    full_v = torch.tensor([9.0, 9.0, 0.2, 0.4, 9.0, 9.0, 0.5, 0.8], dtype=torch.float64)
    rewards = torch.zeros(8, dtype=torch.float64)
    rewards[7] = 1.0
    full_adv, full_ret = gae(rewards, full_v, gamma=1.0, lam=0.5, mask=mask)
    torch.testing.assert_close(full_adv[mask.bool()], adv)
    torch.testing.assert_close(full_ret[mask.bool()], ret)
    assert full_adv[~mask.bool()].abs().sum() == 0
