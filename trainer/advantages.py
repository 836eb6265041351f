"""Advantage and return estimators: group baselines (GRPO, Dr.GRPO, RLOO), batch-mean REINFORCE, GAE.

Pure functions of torch tensors, computed without autograd (advantages are targets, never
differentiated). The group functions accept either a dense ``[G, n]`` layout (one row per group)
or a flat ``[N]`` vector plus ``group_ids``. A boolean ``valid`` mask removes members from the
group statistics (e.g. ``failed_infra`` trajectories, whose zero reward says nothing about the
policy); such members get advantage 0.

Deliberately left out: per-turn / process rewards, reward whitening across the whole batch
(REINFORCE++), and an overlong penalty; those shape rewards before they reach this module.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "agent_token_gae",
    "broadcast_to_tokens",
    "estimate_advantages",
    "gae",
    "groups_with_signal",
    "grpo_advantages",
    "reinforce_batch_mean_advantages",
    "rloo_advantages",
]


def _flatten_groups(
    rewards: Tensor, group_ids: Tensor | None, valid: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Returns (flat float rewards, flat bool valid, group index in [0, num_groups), num_groups)."""
    r = rewards.detach()
    if not r.is_floating_point():
        r = r.to(torch.get_default_dtype())
    if group_ids is None:
        if r.dim() != 2:
            raise ValueError(f"without group_ids, rewards must be [G, n]; got {tuple(r.shape)}")
        num_groups, size = r.shape
        index = torch.arange(num_groups, device=r.device).repeat_interleave(size)
    else:
        if r.dim() != 1 or group_ids.shape != r.shape:
            raise ValueError("with group_ids, rewards and group_ids must both be [N]")
        uniq, index = torch.unique(group_ids, return_inverse=True)
        num_groups = uniq.numel()
    if valid is None:
        v = torch.ones(r.shape, dtype=torch.bool, device=r.device)
    else:
        if valid.shape != r.shape:
            raise ValueError(f"valid must match rewards' shape {tuple(r.shape)}")
        v = valid.to(device=r.device, dtype=torch.bool)
    return r.reshape(-1), v.reshape(-1), index, num_groups


def _group_stats(
    r: Tensor, v: Tensor, index: Tensor, num_groups: int, *, unbiased: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group (count, mean, std, spread = max - min) over valid members only."""
    zeros = r.new_zeros(num_groups)
    # where(), not multiplication: an excluded member's reward may be NaN.
    r_valid = torch.where(v, r, 0.0)
    count = zeros.index_add(0, index, v.to(r.dtype))
    mean = zeros.index_add(0, index, r_valid) / count.clamp(min=1)
    dev = torch.where(v, r - mean[index], 0.0)
    sq_sum = zeros.index_add(0, index, dev * dev)
    dof = (count - 1) if unbiased else count
    std = (sq_sum / dof.clamp(min=1)).sqrt()
    inf = torch.tensor(float("inf"), dtype=r.dtype, device=r.device)
    gmax = zeros.scatter_reduce(0, index, torch.where(v, r, -inf), "amax", include_self=False)
    gmin = zeros.scatter_reduce(0, index, torch.where(v, r, inf), "amin", include_self=False)
    spread = torch.where(count > 0, gmax - gmin, 0.0)
    return count, mean, std, spread


@torch.no_grad()
def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> Tensor:
    """Group-relative advantages ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``.

    GRPO (Shao et al., 2024) with ``scale_by_std=True``; Dr.GRPO (Liu et al., 2025) with
    ``scale_by_std=False``, i.e. ``A_i = r_i - mean(r_group)``.

    Args:
        rewards: ``[G, n]`` (row = group) or ``[N]`` together with ``group_ids``.
        group_ids: ``[N]`` integer group labels (any values) for the flat layout.
        valid: bool mask shaped like ``rewards``; False members are excluded from the group
            mean/std and get advantage 0.
        scale_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
        eps: added to the std before dividing.
        unbiased_std: Bessel-corrected std (``torch.std`` default, as GRPO implementations use).

    Returns:
        Advantages shaped like ``rewards``. Groups whose valid rewards are all equal (including
        single-member groups) get exactly 0, never NaN.
    """
    r, v, index, num_groups = _flatten_groups(rewards, group_ids, valid)
    count, mean, std, spread = _group_stats(r, v, index, num_groups, unbiased=unbiased_std)
    adv = r - mean[index]
    if scale_by_std:
        adv = adv / (std[index] + eps)
    # Exact zero for no-signal groups: sum/count rounding leaves r - mean ~1e-9, which
    # eps-division would inflate to ~1e-3 (e.g. three rewards of 0.1 in float32).
    has_signal = (spread > 0)[index]
    return torch.where(v & has_signal, adv, 0.0).reshape(rewards.shape)


@torch.no_grad()
def rloo_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    valid: Tensor | None = None,
) -> Tensor:
    """Leave-one-out advantages ``A_i = r_i - mean_{j != i} r_j`` (Ahmadian et al., 2024).

    Equal to ``n / (n - 1) * (r_i - mean(r_group))`` with ``n`` the number of valid members;
    the baseline excludes the sample itself, so the gradient estimate stays unbiased.

    Args:
        rewards: ``[G, n]`` or ``[N]`` with ``group_ids``.
        group_ids: ``[N]`` group labels for the flat layout.
        valid: bool mask; excluded members neither enter any baseline nor get an advantage.

    Returns:
        Advantages shaped like ``rewards``; 0 for groups with fewer than two valid members.
    """
    r, v, index, num_groups = _flatten_groups(rewards, group_ids, valid)
    count, mean, _, spread = _group_stats(r, v, index, num_groups)
    n = count[index]
    adv = n / (n - 1).clamp(min=1) * (r - mean[index])
    has_signal = (n >= 2) & (spread[index] > 0)
    return torch.where(v & has_signal, adv, 0.0).reshape(rewards.shape)


@torch.no_grad()
def reinforce_batch_mean_advantages(rewards: Tensor, *, valid: Tensor | None = None) -> Tensor:
    """REINFORCE with a batch-mean baseline: ``A_i = r_i - mean(r_batch)``.

    Args:
        rewards: any shape; the whole tensor is one batch.
        valid: bool mask shaped like ``rewards``; excluded entries get 0 and leave the mean.

    Returns:
        Advantages shaped like ``rewards``.
    """
    flat_ids = torch.zeros(rewards.numel(), dtype=torch.long, device=rewards.device)
    flat_valid = None if valid is None else valid.reshape(-1)
    adv = grpo_advantages(rewards.reshape(-1), flat_ids, valid=flat_valid, scale_by_std=False)
    return adv.reshape(rewards.shape)


def estimate_advantages(
    rewards: list[float], group_ids: list[int], estimator: str, *, scale_by_std: bool = True
) -> list[float]:
    """One advantage per sequence by the named estimator: ``grpo`` (``scale_by_std`` or not),
    ``dr_grpo`` (group mean, no std), ``rloo`` (leave one out) or ``reinforce_baseline`` (the
    mean of the whole batch)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    ids = torch.tensor(group_ids, dtype=torch.long)
    if estimator == "grpo":
        adv = grpo_advantages(r, ids, scale_by_std=scale_by_std)
    elif estimator == "dr_grpo":
        adv = grpo_advantages(r, ids, scale_by_std=False)
    elif estimator == "rloo":
        adv = rloo_advantages(r, ids)
    elif estimator == "reinforce_baseline":
        adv = reinforce_batch_mean_advantages(r)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}")
    return adv.tolist()


@torch.no_grad()
def groups_with_signal(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    valid: Tensor | None = None,
    atol: float = 0.0,
) -> Tensor:
    """DAPO dynamic-sampling filter: which groups have rewards that are not all equal.

    A group whose valid rewards are all equal has all-zero group advantages, so it carries no
    gradient (Yu et al., 2025); the trainer drops it and counts it as rejected.

    Args:
        rewards: ``[G, n]`` or ``[N]`` with ``group_ids``.
        group_ids: ``[N]`` group labels for the flat layout.
        valid: bool mask; only valid members are compared.
        atol: rewards within ``atol`` of each other count as equal.

    Returns:
        Bool keep mask: ``[G]`` for the dense layout, ``[N]`` per member for the flat layout
        (True where the member's group is kept). Groups with < 2 valid members are dropped.
    """
    r, v, index, num_groups = _flatten_groups(rewards, group_ids, valid)
    count, _, _, spread = _group_stats(r, v, index, num_groups)
    keep = (count >= 2) & (spread > atol)
    return keep if group_ids is None else keep[index]


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor) -> Tensor:
    """Gives every token of a sequence its sequence's value (e.g. advantage), 0 where masked.

    Args:
        seq_values: ``[B]`` per-sequence values.
        mask: ``[B, T]`` 0/1 or bool loss mask.

    Returns:
        ``[B, T]`` tensor in ``seq_values``' dtype.
    """
    if seq_values.dim() != 1 or mask.dim() != 2 or mask.shape[0] != seq_values.shape[0]:
        raise ValueError("expected seq_values [B] and mask [B, T]")
    return torch.where(mask.bool(), seq_values[:, None], 0.0).to(seq_values.dtype)


@torch.no_grad()
def gae(
    rewards: Tensor,
    values: Tensor,
    *,
    gamma: float,
    lam: float,
    dones: Tensor | None = None,
    mask: Tensor | None = None,
    bootstrap_value: float | Tensor = 0.0,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al., 2015, arXiv:1506.02438).

    ``delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}``; returns are ``A_t + V_t``.

    Args:
        rewards: ``[..., T]``.
        values: ``[..., T + 1]`` (last column is the bootstrap value of the state after step
            ``T - 1``) or ``[..., T]`` (then ``bootstrap_value`` is used).
        gamma: discount.
        lam: GAE lambda; 0 gives one-step TD, 1 gives Monte-Carlo returns minus ``V``.
        dones: ``[..., T]`` 1 where the episode terminated after step t (no bootstrapping
            across it). Must sit on valid positions.
        mask: ``[..., T]`` 0/1; positions with 0 are not steps (e.g. tool-output tokens): they
            are skipped, as if removed, and get advantage and return 0.
        bootstrap_value: ``V`` after the last step when ``values`` has length ``T``.

    Returns:
        ``(advantages, returns)``, both shaped like ``rewards``.
    """
    num_steps = rewards.shape[-1]
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    values = values.to(rewards.dtype)
    batch_shape = rewards.shape[:-1]
    if values.shape[-1] == num_steps + 1:
        next_value = values[..., num_steps].clone()
        values = values[..., :num_steps]
    elif values.shape[-1] == num_steps:
        boot = torch.as_tensor(bootstrap_value, dtype=rewards.dtype, device=rewards.device)
        next_value = boot.expand(batch_shape).clone()
    else:
        raise ValueError("values must have T or T + 1 entries on the last dim")
    not_done = torch.ones_like(rewards) if dones is None else 1.0 - dones.to(rewards.dtype)
    step = torch.ones_like(rewards, dtype=torch.bool) if mask is None else mask.bool()

    advantages = torch.zeros_like(rewards)
    next_adv = torch.zeros(batch_shape, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(num_steps)):
        nonterminal = not_done[..., t]
        delta = rewards[..., t] + gamma * nonterminal * next_value - values[..., t]
        adv_t = delta + gamma * lam * nonterminal * next_adv
        is_step = step[..., t]
        advantages[..., t] = torch.where(is_step, adv_t, 0.0)
        # Skipped positions pass the later step's value and advantage through unchanged.
        next_value = torch.where(is_step, values[..., t], next_value)
        next_adv = torch.where(is_step, adv_t, next_adv)
    returns = torch.where(step, advantages + values, 0.0)
    return advantages, returns


def agent_token_gae(values: Tensor, reward: float, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over one episode's agent tokens, in order, with the verifier's reward after the last:
    the tokens between them (prompt, tool output) are not actions, so they are left out before
    this is called (``gae`` with a ``mask`` over the full layout gives the same numbers).

    Args:
        values: ``[n]`` ``V(s_t)`` at each agent token (the state before it).
        reward: the episode's reward, given at its last agent token; 0 at the others.

    Returns:
        ``(advantages, returns)``, each ``[n]``; the value after the last token is 0 (terminal).
    """
    rewards = torch.zeros_like(values, dtype=torch.float64)
    if values.numel():
        rewards[-1] = reward
    return gae(rewards, values.to(torch.float64), gamma=gamma, lam=lam)
