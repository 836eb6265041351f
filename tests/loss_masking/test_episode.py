"""EpisodeBuilder: token streams exactly as the engine saw them, masks, closing tokens, truncation."""

from __future__ import annotations

import numpy as np
import pytest

from loss_masking import ChatRenderer, EpisodeBuilder, TruncationPolicy, describe_tools
from pqrl import codec
from pqrl.trajectory import Status, ToolCall, ToolStatus, Trajectory, TruncationKind
from tests.loss_masking.templates import CALC, CALL, HOW_TO_CALL

IDS = {"id": "t0", "run_id": "run1", "task_id": "calc-1", "group_id": "g0", "env": "calc-v1"}


def engine(r: ChatRenderer, text: str, end: str = "eos") -> tuple[list[int], list[float]]:
    """A stand-in for the engine's output_ids and logprobs: ``text`` tokenized canonically (test only;
    the builder never tokenizes model text), plus the stop token when ``end == "eos"``."""
    ids = r.encode(text) + (r.closing_ids[:1] if end == "eos" else [])
    return ids, [-0.1 - 0.01 * k for k in range(len(ids))]


def start(r: ChatRenderer, **kw) -> tuple[EpisodeBuilder, list[dict]]:
    tools = [CALC] if r.supports_tools else None
    system = "You solve arithmetic." + ("" if tools else "\n\n" + describe_tools([CALC], HOW_TO_CALL))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "What is 6*7, then +1?"}]
    return EpisodeBuilder(r, messages, tools, **kw), tools


def runs(mask: np.ndarray) -> int:
    """Number of maximal runs of 1s."""
    m = np.concatenate([[0], mask.astype(np.int8)])
    return int((np.diff(m) == 1).sum())


def two_tool_episode(r: ChatRenderer) -> tuple[EpisodeBuilder, list[dict]]:
    b, tools = start(r)
    b.add_turn(*engine(r, "I will compute. " + CALL), versions=3)
    b.add_observation([{"role": "tool", "content": "42"}])
    ids, lps = engine(r, CALL.replace("6*7", "42+1"))
    b.add_turn(ids, lps, versions=[3] * 3 + [4] * (len(ids) - 3))
    b.add_observation([{"role": "tool", "content": "43"}, {"role": "tool", "content": "(cached)"}])
    b.add_turn(*engine(r, "The answer is 43."), versions=4)
    return b, tools


def test_tokens_are_what_the_template_renders_for_the_whole_conversation(renderer):
    b, tools = two_tool_episode(renderer)
    expected = [
        *b.messages[:2],
        {"role": "assistant", "content": "I will compute. " + CALL},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": CALL.replace("6*7", "42+1")},
        {"role": "tool", "content": "43"},
        {"role": "tool", "content": "(cached)"},
        {"role": "assistant", "content": "The answer is 43."},
    ]
    assert b.messages == expected
    traj = b.build(**IDS, reward=1.0)
    assert traj.tokens.tolist() == renderer.encode(renderer.render(expected, tools))
    b.verify_history()
    assert traj.prompt_len == len(renderer.prompt(expected[:2], tools))
    assert [t.finish_reason for t in traj.turns] == ["stop"] * 3


def test_masks_versions_and_logprobs_line_up(renderer):
    b, _ = two_tool_episode(renderer)
    traj = b.build(**IDS)
    gen = traj.generated.astype(bool)
    assert runs(traj.loss_mask) == len(traj.turns) == b.num_turns == 3
    assert np.array_equal(traj.loss_mask, traj.generated)  # every turn trains
    for t in traj.turns:
        assert traj.generated[t.start : t.end].all()
    assert sum(t.end - t.start for t in traj.turns) == gen.sum() == b.num_generated == b.num_trainable
    assert np.array_equal(traj.versions < 0, ~gen)  # -1 exactly where not generated
    assert (traj.behavior_logprobs[~gen] == 0).all() and (traj.behavior_logprobs[gen] < 0).all()
    second = traj.turns[1]
    assert traj.versions[second.start : second.end].tolist()[:4] == [3, 3, 3, 4]  # a mid-turn update
    # The engine's stop token trains (the model must learn to stop); the appended newline does not.
    im_end = renderer.closing_ids[0]
    for t in traj.turns:
        assert traj.tokens[t.end - 1] == im_end and traj.loss_mask[t.end - 1] == 1
        assert traj.loss_mask[t.end] == 0 and traj.versions[t.end] == -1


def test_masked_turns_keep_their_logprobs(smollm):
    b, _ = start(smollm)
    ids, lps = engine(smollm, "<tool_call>{oops</tool_call>")
    bad = b.add_turn(ids, lps, versions=0, train=False, tool_calls=[ToolCall("?", {}, ToolStatus.INVALID)])
    b.add_observation([{"role": "tool", "content": "error: invalid JSON"}])
    late_ids, late_lps = engine(smollm, CALL)
    late = b.add_turn(late_ids, late_lps, versions=0)
    b.set_tool_calls([ToolCall("calculator", {"expr": "6*7"}, ToolStatus.INVALID)])
    b.mask_turn()  # judged invalid after the fact
    b.add_observation([{"role": "tool", "content": "error: unknown"}])
    good = b.add_turn(*engine(smollm, "42"), versions=1)
    traj = b.build(**IDS)
    for t, logprobs in ((bad, lps), (late, late_lps)):
        assert traj.generated[t.start : t.end].all() and not traj.loss_mask[t.start : t.end].any()
        assert np.allclose(traj.behavior_logprobs[t.start : t.end], logprobs)
    assert traj.loss_mask[good.start : good.end].all()
    assert runs(traj.loss_mask) == 1 and runs(traj.generated) == 3
    assert traj.turns[0].tool_calls[0].status is ToolStatus.INVALID
    assert traj.turns[1].tool_calls[0].name == "calculator"


def test_non_canonical_engine_split_is_kept_as_is(smollm, tok):
    text = "The calculator says 42."
    canonical = tok.encode(text)
    split = tok.encode("The calcu") + tok.encode("lator says 42.")
    assert split != canonical and tok.decode(split) == text
    b, _ = start(smollm)
    turn = b.add_turn([*split, smollm.closing_ids[0]], [-0.5] * (len(split) + 1), versions=0)
    traj = b.build(**IDS)
    assert traj.tokens[turn.start : turn.end].tolist() == [*split, smollm.closing_ids[0]]
    assert list(turn.content_ids) == split
    assert b.messages[-1] == {"role": "assistant", "content": text}
    b.verify_history()  # renders vs renders: the odd split does not trip the check


@pytest.mark.parametrize(
    ("end", "finish", "added"),
    [("eos", "stop", 1), ("stop_string", "stop", 2), ("length", "length", 2)],
)
def test_closing_tokens_appended_only_where_the_engine_did_not_generate_them(renderer, end, finish, added):
    b, _ = start(renderer)
    ids, lps = engine(renderer, "I will compute. " + CALL, end)
    turn = b.add_turn(ids, lps, versions=2, finish_reason=finish)
    traj = b.build(**IDS)
    assert turn.closing_added == added and turn.end == turn.start + len(ids)
    tail = traj.tokens[turn.start : turn.end + added].tolist()
    assert tail[-2:] == renderer.closing_ids  # the turn ends with the template's closing either way
    closing = slice(turn.end, turn.end + added)
    assert not traj.generated[closing].any() and not traj.loss_mask[closing].any()
    assert (traj.versions[closing] == -1).all() and traj.turns[0].finish_reason == finish
    assert traj.generated[turn.start : turn.end].all() and traj.loss_mask[turn.start : turn.end].all()
    assert traj.num_tokens == b.num_tokens == turn.end + added


def run_stop_episode(r: ChatRenderer) -> tuple[EpisodeBuilder, Trajectory]:
    b, _ = start(r, max_total_tokens=400, truncation=TruncationPolicy("stop_episode", min_new_tokens=16))
    b.add_turn(*engine(r, CALL), versions=0)
    info = b.add_observation([{"role": "tool", "content": "row\n" * 400}])
    assert info.stopped and not info.cut and info.start == info.end
    return b, b.build(**IDS)


def test_truncation_stop_episode_is_recorded_and_reproducible(renderer):
    b, traj = run_stop_episode(renderer)
    assert b.stopped and b.max_new_tokens(100) == 0
    with pytest.raises(RuntimeError):
        b.add_turn([1], [-1.0], versions=0)
    assert traj.status == Status.TRUNCATED and traj.truncation.kind is TruncationKind.STOP_EPISODE
    assert traj.truncation.at_token == traj.num_tokens  # the observation never reached the model
    assert traj.tokens[-2:].tolist() == renderer.closing_ids
    assert run_stop_episode(renderer)[1] == traj
    assert codec.decode(codec.encode(traj)) == traj


def run_cut(r: ChatRenderer, outputs: list[str]) -> tuple[EpisodeBuilder, object, Trajectory]:
    policy = TruncationPolicy("cut_tool_output", min_new_tokens=24)
    b, _ = start(r, max_total_tokens=500, truncation=policy)
    b.add_turn(*engine(r, CALL), versions=0)
    obs = [{"role": "tool", "content": out} for out in outputs]
    info = b.add_observation(obs)
    room = b.max_new_tokens(1000)
    b.add_turn(*engine(r, "The answer is 42."), versions=1)
    return b, (info, room), b.build(**IDS)


@pytest.mark.parametrize(
    "outputs", [["x = 42\n" * 300], ["first: 6*7", "second: " + "digits 0123456789 " * 200]]
)
def test_truncation_cut_tool_output_keeps_exactly_what_the_model_saw(renderer, outputs):
    b, (info, room), traj = run_cut(renderer, outputs)
    assert info.cut and not info.stopped and room >= 24
    seen = traj.tokens[info.start : info.end].tolist()
    assert seen == renderer.delta(info.messages)  # the record reproduces from the cut messages
    assert "characters cut to fit the context" in renderer.decode(seen)
    assert info.messages[:-1] == tuple({"role": "tool", "content": o} for o in outputs[:-1])  # last first
    assert info.end + len(renderer.closing_ids) + 24 <= 500
    t = traj.truncation
    assert t.kind is TruncationKind.CUT_TOOL_OUTPUT and info.start < t.at_token < info.end
    uncut = renderer.delta([{"role": "tool", "content": o} for o in outputs])
    assert seen[: t.at_token - info.start] == uncut[: t.at_token - info.start]
    assert traj.status == Status.COMPLETED and traj.num_tokens <= 500
    assert run_cut(renderer, outputs)[2] == traj
    b.verify_history()


def test_cut_that_cannot_fit_even_the_marker_stops(smollm):
    turn = engine(smollm, CALL)
    probe, _ = start(smollm)
    probe.add_turn(*turn, versions=0)
    budget = probe.num_tokens + 200 + 10  # 10 tokens for the observation: the marker alone needs more
    b, _ = start(
        smollm, max_total_tokens=budget, truncation=TruncationPolicy("cut_tool_output", min_new_tokens=198)
    )
    b.add_turn(*turn, versions=0)
    info = b.add_observation([{"role": "tool", "content": "x" * 5000}])
    assert info.stopped and b.build(**IDS).truncation.kind is TruncationKind.STOP_EPISODE


def test_length_stop_at_the_context_budget_stops_the_episode(smollm):
    b, _ = start(smollm, max_total_tokens=420, truncation=TruncationPolicy(min_new_tokens=8))
    n = b.max_new_tokens(1000)
    assert n == 420 - b.num_tokens - 2
    ids = (smollm.encode(" and so on") * 100)[:n]
    turn = b.add_turn(ids, [-1.0] * n, versions=0, finish_reason="length")
    traj = b.build(**IDS)
    assert turn.budget_hit and b.stopped and traj.num_tokens == 420
    assert traj.status == Status.TRUNCATED and traj.truncation.at_token == 420
    assert traj.tokens[-2:].tolist() == smollm.closing_ids and traj.loss_mask[: turn.end].sum() == n


def test_prompt_over_budget_and_misuse(smollm):
    b, _ = start(smollm, max_total_tokens=50)
    assert b.stopped and b.max_new_tokens(10) == 0 and b.build(**IDS).status == Status.TRUNCATED
    b, _ = start(smollm, max_total_tokens=1000)
    with pytest.raises(RuntimeError):
        b.add_observation([{"role": "tool", "content": "42"}])
    with pytest.raises(ValueError, match="only"):
        b.add_turn([1] * 2000, [-1.0] * 2000, versions=0)
    with pytest.raises(ValueError, match="logprobs"):
        b.add_turn([1, 2], [-1.0], versions=0)
    with pytest.raises(ValueError, match=">= 0"):
        b.add_turn([1], [-1.0], versions=-1)
    b.add_turn(*engine(smollm, "hi"), versions=0)
    with pytest.raises(RuntimeError):
        b.add_turn(*engine(smollm, "hi"), versions=0)
    b.add_observation([{"role": "user", "content": "Bye."}], add_generation_prompt=False)  # final
    with pytest.raises(RuntimeError):
        b.add_turn(*engine(smollm, "hi"), versions=0)
    assert b.build(**IDS).tokens[-2:].tolist() == smollm.closing_ids  # ends closed, no generation prompt


def test_cut_replaces_a_last_output_that_cannot_fit_and_cuts_the_one_before(renderer):
    b, (info, _), traj = run_cut(renderer, ["alpha " * 300, "beta " * 300])
    first, last = (m["content"] for m in info.messages)
    assert first.startswith("alpha alpha") and "cut to fit" in first
    assert last == "\n[... 1500 of 1500 characters cut to fit the context ...]"
    assert "replaced by the marker" in traj.truncation.detail
    assert traj.tokens[info.start : info.end].tolist() == renderer.delta(info.messages)
