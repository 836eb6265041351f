"""Context-budget truncation: the policy, cutting a tool output to fit, and the record it leaves.

When an observation would overflow the context budget the episode either stops before it
(``stop_episode``) or its messages are shortened to fit, with a visible marker the model reads
(``cut_tool_output``). The cut is made on the message text and re-rendered through the template's
delta, so the tokens appended are exactly ``renderer.delta(cut_messages)``: the record reproduces.

Deliberately left out: cutting in the middle (head + tail) or by lines, summarizing an output with
a model, and dropping earlier turns to make room (that would rewrite the history the model saw).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loss_masking.template import ChatRenderer
from pqrl.trajectory import Truncation, TruncationKind

__all__ = ["TruncationPolicy", "cut_observation", "summarize"]


@dataclass(frozen=True, slots=True)
class TruncationPolicy:
    """What to do when an observation does not fit the context budget.

    Attributes:
        kind: ``STOP_EPISODE`` ends the episode before the observation; ``CUT_TOOL_OUTPUT`` shortens
            the observation's messages (last first) to fit, appending ``marker``, and stops the
            episode only when even markers alone do not fit.
        marker: text appended to a cut message; ``{omitted}`` and ``{total}`` are filled with
            character counts.
        min_new_tokens: room that must remain for the next assistant turn after an observation
            (beyond the closing tokens); with less, the observation counts as not fitting.
    """

    kind: TruncationKind = TruncationKind.STOP_EPISODE
    marker: str = "\n[... {omitted} of {total} characters cut to fit the context ...]"
    min_new_tokens: int = 32

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", TruncationKind(self.kind))
        except ValueError:
            raise ValueError(f"unknown truncation kind {self.kind!r}") from None
        if self.min_new_tokens < 1:
            raise ValueError("min_new_tokens must be >= 1")


def cut_observation(
    renderer: ChatRenderer,
    messages: Sequence[dict[str, Any]],
    ids: Sequence[int],
    limit: int,
    policy: TruncationPolicy,
    add_generation_prompt: bool = True,
) -> tuple[tuple[dict[str, Any], ...], list[int], int, str] | None:
    """Shortens an observation's messages so its delta has at most ``limit`` tokens.

    The last message is cut first, to the longest content prefix (found by bisection over
    characters) whose delta with the marker fits; a message that does not fit even as the marker
    alone is replaced by the marker and the one before it is cut.

    Args:
        renderer: renders the delta of each trial.
        messages: the observation as the environment returned it.
        ids: the uncut delta's tokens (to locate where the cut tokens start to differ).
        limit: the most tokens the delta may have.
        policy: supplies the marker.
        add_generation_prompt: as for ``ChatRenderer.delta``.

    Returns:
        ``(messages, ids, offset, detail)``: the cut messages, their delta tokens, the index within
        the delta where they first differ from the uncut tokens, and a description; ``None`` when
        nothing fits.
    """
    if limit <= 0:
        return None
    work = [dict(m) for m in messages]
    emptied: list[int] = []
    for i in reversed(range(len(work))):
        content = messages[i].get("content")
        if not isinstance(content, str) or not content:
            continue

        def trial(keep: int, i: int = i, content: str = content) -> list[int]:
            marker = policy.marker.format(omitted=len(content) - keep, total=len(content))
            work[i]["content"] = content[:keep] + marker
            return renderer.delta(work, add_generation_prompt=add_generation_prompt)

        if len(trial(0)) > limit:
            emptied.append(i)  # even the marker alone is too long: cut an earlier message as well
            continue
        # Token counts grow (almost) monotonically with the kept prefix; bisection keeps the
        # invariant that keeping `lo` characters fits, whatever small non-monotonicity there is.
        lo, hi = 0, len(content)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(trial(mid)) <= limit:
                lo = mid
            else:
                hi = mid - 1
        cut_ids = trial(lo)
        offset = next((k for k, (a, b) in enumerate(zip(ids, cut_ids, strict=False)) if a != b), len(cut_ids))
        detail = (
            f"message {i} ({work[i].get('role')}): kept {lo} of {len(content)} characters; "
            f"observation {len(ids)} -> {len(cut_ids)} tokens (limit {limit})"
        )
        if emptied:
            detail += f"; messages {sorted(emptied)} replaced by the marker"
        return tuple(work), cut_ids, offset, detail
    return None


def summarize(events: Sequence[Truncation]) -> Truncation | None:
    """One record for the Trajectory: the stop if there was one, else the first cut.

    With several events, ``detail`` lists each as ``kind@at_token: detail``, in order.
    """
    if not events:
        return None
    primary = next((t for t in events if t.kind is TruncationKind.STOP_EPISODE), events[0])
    if len(events) == 1:
        return primary
    detail = "; ".join(f"{t.kind}@{t.at_token}: {t.detail}" for t in events)
    return Truncation(primary.kind, primary.at_token, detail)
