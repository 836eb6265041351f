"""``SamplingParams``: the ``sampling_params`` object of SGLang's ``/generate`` (the subset pqrl uses).

One definition for the client (what it sends), the server (what it accepts: pydantic validates this
dataclass inside ``engine.types.GenerateRequest``, unknown keys refused) and the batcher (what it
samples with). A stdlib dataclass, so the batcher imports it on a machine without pydantic; bounds
are checked on creation too (``pqrl.settings``), so a bad value fails where it is written.
"""

from __future__ import annotations

import dataclasses

from pqrl.settings import Settings, setting

__all__ = ["SamplingParams"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams(Settings):
    """Per-request sampling, with SGLang's field names and JSON shape.

    RL defaults: top_p 1 and top_k -1, so the distribution the engine samples from is the one the
    trainer scores. ``stop`` and ``stop_token_ids`` are stored as tuples (lists are accepted).
    """

    temperature: float = setting(1.0, "softmax temperature; 0 decodes greedily", ge=0)
    top_p: float = setting(1.0, "nucleus mass kept (1: the whole distribution)", gt=0, le=1)
    top_k: int = setting(-1, "most likely tokens kept (-1: the whole vocabulary)")
    max_new_tokens: int = setting(128, "most tokens generated", ge=0)
    stop: tuple[str, ...] = setting((), "strings that end the generation (cut from the text)")
    stop_token_ids: tuple[int, ...] = setting((), "token ids that end the generation (kept)")
    ignore_eos: bool = setting(False, "keep generating past the model's end-of-sequence tokens")
    skip_special_tokens: bool = setting(True, "leave special tokens out of the response text")
    no_stop_trim: bool = setting(False, "keep the matched stop string or token in the text")
    sampling_seed: int | None = setting(None, "this request's seed (None: drawn by the engine)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (no limit) or >= 1, got {self.top_k}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
