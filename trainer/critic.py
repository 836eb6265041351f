"""The critic of PPO: ``V(s_t)`` for every agent token, read off the policy's own features.

A value head on the policy model: one linear layer on the final hidden state at the position that
predicts token ``t`` (the state before the action). The head reads the trunk's features detached,
so the value loss trains the head only and never pulls the policy's representation toward a
regression target; it costs one ``[H] x 1`` product per token instead of a second model's forward.
It starts at zero, so the first advantages are the discounted rewards themselves. It is saved
beside the policy in every checkpoint (``critic.pt``) and restored with it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["CRITIC_FILE", "ValueHead", "load_critic", "save_critic"]

CRITIC_FILE = "critic.pt"


class ValueHead(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.v = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.v.weight)
        nn.init.zeros_(self.v.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """``[N, H]`` hidden states (detached here) -> ``[N]`` float32 values."""
        return self.v(hidden.detach().float()).squeeze(-1)


def save_critic(critic: ValueHead, directory: str | Path) -> None:
    torch.save(critic.state_dict(), Path(directory) / CRITIC_FILE)


def load_critic(critic: ValueHead, directory: str | Path) -> bool:
    """Loads ``directory/critic.pt`` into ``critic``; False when the checkpoint has none."""
    path = Path(directory) / CRITIC_FILE
    if not path.is_file():
        return False
    critic.load_state_dict(torch.load(path, map_location=critic.v.weight.device))
    return True
