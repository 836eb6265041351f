"""Chat-template token deltas, loss masks and truncation records for token-in, token-out rollouts.

Pure token logic over a Hugging Face tokenizer: no environments, sandboxes or engines.

- ``ChatRenderer`` (``loss_masking.template``): prompt tokens, turn-closing tokens and observation
  deltas computed against a fixed base conversation; rejects templates that rewrite history.
- ``EpisodeBuilder`` (``loss_masking.episode``): one episode's tokens exactly as the engine saw
  them, with masks, logprobs and versions, built into a validated ``pqrl.trajectory.Trajectory``.
- ``TruncationPolicy`` (``loss_masking.truncation``): stop the episode or cut a tool output when the
  context budget runs out; recorded in ``Trajectory.truncation``.

Packing several trajectories into training rows is the trainer's concern (``trainer.packing``).
"""

from loss_masking.episode import EpisodeBuilder, ObservationInfo, TurnInfo
from loss_masking.template import (
    ChatRenderer,
    MessageDict,
    TemplateError,
    TemplateRewritesHistory,
    describe_tools,
)
from loss_masking.truncation import TruncationPolicy, cut_observation, summarize

__all__ = [
    "ChatRenderer",
    "EpisodeBuilder",
    "MessageDict",
    "ObservationInfo",
    "TemplateError",
    "TemplateRewritesHistory",
    "TruncationPolicy",
    "TurnInfo",
    "cut_observation",
    "describe_tools",
    "summarize",
]
