"""The Trajectory record: one rollout, exactly as the engine saw and produced it.

This is the one record that crosses the rollout/train boundary. It is validated on construction,
so a record that exists is a record the trainer can use: the token arrays line up, the masks are
0/1, training never touches a token the engine did not generate, and every generated token says
which policy version produced it.

Imports numpy and the standard library only, so the trainer's compute path can load it anywhere.
Records decoded from a blob are built in bulk by the codec (pqrl.codec), with the checks here.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pqrl.tool_calls import ToolCall, ToolStatus

__all__ = [
    "Status",
    "ToolCall",
    "ToolStatus",
    "Trajectory",
    "TrajectoryError",
    "Truncation",
    "TruncationKind",
    "Turn",
    "check_token_arrays",
]


class TrajectoryError(ValueError):
    """A Trajectory failed validation; ``field`` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"Trajectory.{field}: {reason}")
        self.field = field
        self.reason = reason


class Status(enum.StrEnum):
    """How a rollout ended. Only ``failed_infra`` is excluded from advantage statistics."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED_INFRA = "failed_infra"
    FAILED_ENV = "failed_env"


@dataclass(frozen=True, slots=True)
class Turn:
    """One assistant turn: the generated span ``[start, end)`` of ``Trajectory.tokens``."""

    start: int
    end: int
    finish_reason: str = "stop"  # stop | length | abort, as the engine reported it
    tool_calls: tuple[ToolCall, ...] = ()


class TruncationKind(enum.StrEnum):
    """What a context limit did to an episode."""

    STOP_EPISODE = "stop_episode"  # the episode ended at the budget
    CUT_TOOL_OUTPUT = "cut_tool_output"  # a tool output was shortened with a marker


@dataclass(frozen=True, slots=True)
class Truncation:
    """What a context limit cut, so training sees the same tokens the model saw.

    ``kind`` is a ``TruncationKind`` (coerced from its string value); ``at_token`` is the index
    where the cut happened.
    """

    kind: TruncationKind
    at_token: int
    detail: str = ""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", TruncationKind(self.kind))
        except ValueError:
            raise TrajectoryError(
                "truncation", f"kind {self.kind!r} is not one of {[k.value for k in TruncationKind]}"
            ) from None


_LOGPROB_SLACK = 1e-3

_ARRAY_DTYPES: dict[str, np.dtype] = {
    "tokens": np.dtype(np.int32),
    "generated": np.dtype(np.uint8),
    "loss_mask": np.dtype(np.uint8),
    "behavior_logprobs": np.dtype(np.float32),
    "versions": np.dtype(np.int32),
}


@dataclass(frozen=True, slots=True, eq=False)
class Trajectory:
    """One rollout: its tokens, masks, logprobs and versions, and how it went.

    Token arrays all have length ``T`` = prompt + every turn and observation:

    - ``tokens``: int32 token ids, exactly as the engine saw them.
    - ``generated``: uint8, 1 on tokens the engine produced.
    - ``loss_mask``: uint8, 1 on tokens that train; a subset of ``generated`` so a generated span
      can be excluded (an invalid turn) while keeping its logprobs.
    - ``behavior_logprobs``: float32, the engine's logprob of each generated token, 0 elsewhere.
    - ``versions``: int32, the policy version that produced each generated token, -1 exactly where
      ``generated`` is 0.

    Arrays are converted to their dtypes on construction (no copy when they already match) and
    held as read-only views, so a validated record stays valid; decoded records view the blob.
    """

    id: str
    run_id: str
    task_id: str
    group_id: str
    env: str
    tokens: np.ndarray
    generated: np.ndarray
    loss_mask: np.ndarray
    behavior_logprobs: np.ndarray
    versions: np.ndarray
    prompt_len: int
    turns: tuple[Turn, ...] = ()
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.COMPLETED
    truncation: Truncation | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, dtype in _ARRAY_DTYPES.items():
            object.__setattr__(self, name, _read_only(_as_array(name, getattr(self, name), dtype)))
        check_token_arrays(self.tokens, self.generated, self.loss_mask, self.behavior_logprobs, self.versions)
        self._check_rest()

    def _check_rest(self) -> None:
        for name in _STRING_FIELDS:
            _check_string(name, getattr(self, name))
        object.__setattr__(self, "status", _as_status(self.status))
        object.__setattr__(self, "turns", tuple(self.turns))
        object.__setattr__(self, "reward", _as_float("reward", self.reward))
        n = self.num_tokens
        _check_prompt_len(n, self.prompt_len)
        if np.count_nonzero(self.generated[: self.prompt_len]):  # cheaper than .any(): no ufunc reduction
            raise TrajectoryError("generated", _GENERATED_PROMPT)
        _check_turns(n, self.prompt_len, self.turns, self.truncation)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_generated(self) -> int:
        return int(np.count_nonzero(self.generated))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f), getattr(other, f))
            if f in _ARRAY_DTYPES
            else getattr(self, f) == getattr(other, f)
            for f in self.__dataclass_fields__
        )


_STRING_FIELDS = ("id", "run_id", "task_id", "group_id", "env")
_STATUSES = {s.value: s for s in Status}


def _check_string(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise TrajectoryError(name, f"must be a non-empty string, got {value!r}")


def _as_status(value: Any) -> Status:
    try:
        return _STATUSES[value]  # a dict lookup: Status(value) costs several times more
    except (KeyError, TypeError):
        raise TrajectoryError("status", f"{value!r} is not one of {[s.value for s in Status]}") from None


def _read_only(arr: np.ndarray) -> np.ndarray:
    """A read-only view: the caller's array stays writable, the validated record cannot drift."""
    view = arr.view()
    view.flags.writeable = False
    return view


def _as_array(name: str, value: Any, dtype: np.dtype) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype == dtype:
        arr = value
    else:
        try:
            src = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise TrajectoryError(name, f"not convertible to an array: {e}") from None
        if src.size and dtype.kind in "iu" and src.dtype.kind == "f":
            raise TrajectoryError(name, f"must hold integers, got {src.dtype}")
        if src.size and dtype.kind in "iu" and not np.can_cast(src.dtype, np.int64):
            raise TrajectoryError(name, f"must hold integers, got {src.dtype}")
        if src.size and dtype.kind in "iu":
            info = np.iinfo(dtype)
            lo, hi = int(src.min()), int(src.max())
            if lo < info.min or hi > info.max:
                raise TrajectoryError(name, f"values {lo}..{hi} do not fit {dtype}")
        arr = src.astype(dtype, copy=False)
    if arr.ndim != 1:
        raise TrajectoryError(name, f"must be 1-D, got shape {arr.shape}")
    return arr


def _as_float(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TrajectoryError(name, f"must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise TrajectoryError(name, f"must be finite, got {out}")
    return out


def check_token_arrays(
    tokens: np.ndarray,
    generated: np.ndarray,
    loss_mask: np.ndarray,
    behavior_logprobs: np.ndarray,
    versions: np.ndarray,
) -> None:
    """The elementwise invariants of the token arrays (of the Trajectory dtypes), for one record or
    several concatenated.

    Every decoded blob passes through here: one reduction per bound, and each relation to
    ``generated`` as one comparison of the 0/1 bytes it implies (memcmp, not a numpy pass).
    """
    _check_token_arrays(tokens, generated, loss_mask, behavior_logprobs, versions)


def _check_token_arrays(
    tokens: np.ndarray,
    generated: np.ndarray,
    loss_mask: np.ndarray,
    behavior_logprobs: np.ndarray,
    versions: np.ndarray,
) -> bytes:
    """check_token_arrays, returning ``generated`` as bytes (0 and 1) for later span checks."""
    n = tokens.shape[0]
    for name, arr in (
        ("generated", generated),
        ("loss_mask", loss_mask),
        ("behavior_logprobs", behavior_logprobs),
        ("versions", versions),
    ):
        if arr.shape[0] != n:
            raise TrajectoryError(name, f"length {arr.shape[0]} != len(tokens) {n}")
    if n == 0:
        return b""
    if tokens.min() < 0:
        raise TrajectoryError("tokens", "token ids must be >= 0")
    flags = _flags("generated", generated)
    _check_uint8("loss_mask", loss_mask)
    # Within 0/1 generated flags, OR-ing in the mask leaves them unchanged iff the mask is a 0/1 subset.
    if np.bitwise_or(loss_mask, generated).tobytes() != flags:
        _explain_loss_mask(loss_mask, generated)
    if versions.min() < -1 or (versions >= 0).tobytes() != flags:
        _explain_versions(versions, generated.view(np.bool_))
    _check_logprobs(behavior_logprobs, generated.view(np.bool_), flags)
    return flags


def _check_uint8(name: str, arr: np.ndarray) -> None:
    if arr.dtype != np.uint8:  # read as bytes and bools below, which only holds for one-byte arrays
        raise TypeError(f"{name} must be uint8, got {arr.dtype}")


def _flags(name: str, arr: np.ndarray) -> bytes:
    _check_uint8(name, arr)
    if arr.max() > 1:
        raise TrajectoryError(name, "must hold only 0 and 1")
    return arr.tobytes()


def _explain_loss_mask(mask: np.ndarray, gen: np.ndarray) -> None:
    if mask.max() > 1:
        raise TrajectoryError("loss_mask", "must hold only 0 and 1")
    i = int(np.argmax(mask > gen))
    raise TrajectoryError("loss_mask", f"is 1 at token {i} where generated is 0 (must be a subset)")


def _explain_versions(ver: np.ndarray, gen: np.ndarray) -> None:
    # Valid iff generated tokens carry a version >= 0 and all others exactly -1: past the minimum,
    # "negative" must be exactly "not generated".
    i = int(np.argmax((ver < -1) | ((ver < 0) == gen)))
    raise TrajectoryError(
        "versions",
        f"must be -1 exactly where generated is 0 and >= 0 elsewhere (token {i}: "
        f"generated={int(gen[i])}, version={int(ver[i])})",
    )


def _check_logprobs(lp: np.ndarray, gen: np.ndarray, flags: bytes) -> None:
    # max() is NaN when any entry is NaN, so the comparison fails for NaN too.
    # A small positive slack: engines round log_softmax in low precision.
    if not (lp.max() <= _LOGPROB_SLACK and lp.min() > -np.inf):
        raise TrajectoryError("behavior_logprobs", "must be finite log-probabilities (<= 0)")
    nonzero = lp != 0  # -0.0 counts as 0
    if np.bitwise_or(nonzero, gen, out=nonzero).tobytes() != flags:
        i = int(np.argmax((lp != 0) > gen))
        raise TrajectoryError("behavior_logprobs", f"must be 0 where generated is 0 (token {i}: {lp[i]})")


_GENERATED_PROMPT = "prompt tokens cannot be generated"


def _check_prompt_len(n: int, prompt_len: Any) -> None:
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, _INTEGER):
        raise TrajectoryError("prompt_len", f"must be an int, got {prompt_len!r}")
    if not 0 <= prompt_len <= n:
        raise TrajectoryError("prompt_len", f"{prompt_len} outside 0..{n}")


def _check_turns(n: int, prompt_len: int, turns: tuple[Any, ...], truncation: Truncation | None) -> None:
    """The turns' spans and the truncation point of a record of ``n`` tokens."""
    prev_end = prompt_len
    for i, turn in enumerate(turns):
        if not isinstance(turn, Turn):
            raise TrajectoryError("turns", f"turn {i} is {type(turn).__name__}, not Turn")
        if (type(turn.start) is not int or type(turn.end) is not int) and not (
            _is_int(turn.start) and _is_int(turn.end)
        ):
            raise TrajectoryError("turns", f"turn {i} span bounds must be ints")
        if not prev_end <= turn.start <= turn.end <= n:
            raise TrajectoryError(
                "turns",
                f"turn {i} span [{turn.start}, {turn.end}) must be ordered, after the "
                f"prompt/previous turn (>= {prev_end}) and within {n} tokens",
            )
        for call in turn.tool_calls:
            if not isinstance(call, ToolCall) or call.pending:
                raise TrajectoryError("turns", f"turn {i} records {call!r:.80}, not a ToolCall that has run")
        prev_end = turn.end
    if truncation is not None and not 0 <= truncation.at_token <= n:
        raise TrajectoryError("truncation", f"at_token {truncation.at_token} outside 0..{n}")


_INTEGER = (int, np.integer)  # a tuple: isinstance with a union type is several times slower


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
