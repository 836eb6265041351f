"""The built-in engine's prefix sharing: the cache's bookkeeping (pure), and on the real SmolLM2 that a
shared or cached prefix gives the tokens and logprobs of a fresh prefill while computing fewer tokens."""

from __future__ import annotations

import torch

from engine.batcher import BatchEngine, Sequence
from engine.prefix_cache import PrefixCache, common_prefix_len
from engine.sampling_params import SamplingParams
from tests.models import chat_prompt, forced_logprobs, max_abs_diff

MAX_LOGPROB_DIFF = 1e-4


def _kv(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A one-layer KV for ``n`` tokens whose values name their position (to check slicing)."""
    k = torch.arange(n, dtype=torch.float32)[None, :, None].expand(2, n, 3) + fill
    return [(k.clone(), k.clone())]


def test_common_prefix_len():
    t = torch.tensor
    assert common_prefix_len(t([1, 2, 3]), t([1, 2, 4])) == 2
    assert common_prefix_len(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix_len(t([5]), t([1, 2])) == 0
    assert common_prefix_len(t([1, 2, 3]), t([1, 2, 3])) == 3


def test_match_takes_the_longest_common_prefix_up_to_the_limit():
    cache = PrefixCache(100)
    cache.insert([1, 2, 3, 4], _kv(4, fill=0))
    cache.insert([1, 2, 9, 9, 9], _kv(5, fill=100))
    n, kv = cache.match([1, 2, 9, 9, 7, 7], limit=5)
    assert n == 4 and kv[0][0][0, 0, 0] == 100  # the second entry: 4 tokens in common
    n, kv = cache.match([1, 2, 3, 4], limit=3)  # a full hit still leaves the last token to compute
    assert n == 3 and kv[0][0][0, 0, 0] == 0
    assert cache.match([7, 1, 2], limit=2) == (0, None)
    assert cache.match([1, 2], limit=0) == (0, None)


def test_insert_drops_covered_entries_and_evicts_least_recently_used():
    cache = PrefixCache(10)
    cache.insert([1, 2], _kv(2))
    cache.insert([1, 2, 3], _kv(3))  # covers [1, 2]
    assert len(cache) == 1 and cache.tokens == 3
    cache.insert([1, 2], _kv(2))  # already covered: nothing added
    assert len(cache) == 1 and cache.tokens == 3
    cache.insert([4, 5, 6], _kv(3))
    cache.match([1, 2, 3, 0], limit=3)  # [1, 2, 3] is now the most recently used
    cache.insert([7, 8, 9, 10, 11], _kv(5))  # 11 tokens: over budget, [4, 5, 6] goes
    assert cache.tokens == 8 and cache.match([4, 5, 6, 0], limit=3) == (0, None)
    assert cache.match([1, 2, 3, 0], limit=3)[0] == 3
    cache.insert(list(range(20, 40)), _kv(20))  # longer than the whole budget: not held
    assert cache.tokens == 8
    cache.flush()
    assert len(cache) == 0 and cache.tokens == 0 and cache.match([1, 2, 3], limit=2) == (0, None)
    off = PrefixCache(0)
    off.insert([1, 2], _kv(2))
    assert len(off) == 0


def _run(engine: BatchEngine, prompts: list[list[int]], temperature: float, n: int = 12) -> list[Sequence]:
    seqs = [
        Sequence(
            rid=str(i),
            prompt_ids=list(p),
            params=SamplingParams(
                temperature=temperature, max_new_tokens=n, sampling_seed=i, ignore_eos=True
            ),
        )
        for i, p in enumerate(prompts)
    ]
    engine.step(seqs)
    while engine.rows:
        engine.step([])
    return seqs


def test_shared_and_cached_prefixes_reproduce_fresh_prefills(smollm):
    model, tok = smollm
    rules = "You solve arithmetic word problems with a calculator tool. Show the operation, then answer. " * 4
    first = chat_prompt(tok, rules + "Ann has 3 apples and buys 4 more. How many now?")
    second = chat_prompt(tok, rules + "A box holds 12 eggs. How many eggs are in 7 boxes?")
    group = [first] * 4 + [second] * 2  # two GRPO groups that share the instructions
    fresh = BatchEngine(model, tok, prefix_cache_tokens=0)
    shared = BatchEngine(model, tok, prefix_cache_tokens=8192)

    # Turn 1: a group's copies are prefilled once, and the two groups' instructions once.
    expected = _run(fresh, group, temperature=0.8)
    got = _run(shared, group, temperature=0.8)
    assert fresh.stats.prefill_tokens == sum(map(len, group)) == shared.stats.prompt_tokens
    instructions = common_prefix_len(torch.tensor(first), torch.tensor(second))
    assert instructions > 50
    assert shared.stats.prefill_tokens == len(first) + len(second) - instructions
    assert [s.output_ids for s in got] == [s.output_ids for s in expected]
    assert len({tuple(s.output_ids) for s in got[:4]}) > 1  # each copy samples on its own
    for s in got:
        reference = forced_logprobs(model, s.prompt_ids, s.output_ids, temperature=0.8)
        assert max_abs_diff(reference, s.logprobs) < MAX_LOGPROB_DIFF

    # Turn 2: each episode resends its conversation plus a tool result; only the new part is computed
    # (its response's last token was never fed back, so it is computed too).
    tool = list(tok("<tool_response>7</tool_response>", add_special_tokens=False)["input_ids"])
    turn2 = [s.prompt_ids + s.output_ids + tool for s in got]
    before = shared.stats.prefill_tokens
    expected2 = _run(fresh, turn2, temperature=0)
    got2 = _run(shared, turn2, temperature=0)
    assert shared.stats.prefill_tokens - before == len(turn2) * (len(tool) + 1)
    assert [s.output_ids for s in got2] == [s.output_ids for s in expected2]
    for s, e in zip(got2, expected2, strict=True):
        assert max_abs_diff(e.logprobs, s.logprobs) < MAX_LOGPROB_DIFF

    # A new task with the same instructions computes only what follows them.
    third = chat_prompt(tok, rules + "Tom had 20 marbles and lost 6. How many are left?")
    before = shared.stats.prefill_tokens
    got3 = _run(shared, [third], temperature=0)
    computed = shared.stats.prefill_tokens - before
    assert computed == len(third) - common_prefix_len(torch.tensor(first), torch.tensor(third))
    assert computed < len(third) / 3
    assert got3[0].output_ids == _run(fresh, [third], temperature=0)[0].output_ids


def test_new_weights_flush_the_cache_and_stale_rows_are_not_remembered(smollm):
    model, tok = smollm
    engine = BatchEngine(model, tok, prefix_cache_tokens=8192)
    prompt = chat_prompt(tok, "Tell me about the sea.")
    _run(engine, [prompt], temperature=0, n=4)
    assert len(engine.prefix_cache) == 1
    engine.load_state({})  # any weight update, even an empty one, flushes
    assert len(engine.prefix_cache) == 0

    # A row whose KV predates an update finishes under the new weights: its KV is not kept.
    seq = Sequence(rid="a", prompt_ids=prompt, params=SamplingParams(temperature=0, max_new_tokens=6))
    engine.step([seq])
    engine.load_state({})
    while engine.rows:
        engine.step([])
    assert seq.finished and len(engine.prefix_cache) == 0
    before = engine.stats.prefill_tokens
    _run(engine, [prompt], temperature=0, n=2)
    assert engine.stats.prefill_tokens - before == len(prompt)  # nothing reused


def test_rows_admitted_together_compute_their_common_start_once(smollm):
    """A group resumed after a weight update: the cache is empty, every row has the prompt and then
    its own tokens so far. The prompt is computed once, each row's own tokens once."""
    model, tok = smollm
    prompt = chat_prompt(tok, "Write a short story about a lighthouse keeper and a storm at sea. " * 3)
    own = [[tok.convert_tokens_to_ids(w)] + list(range(1000 + 10 * i, 1004 + 10 * i)) for i, w in
           enumerate(["The", "Once", "A", "In"])]  # fmt: skip
    rows = [prompt + o for o in own]
    fresh = BatchEngine(model, tok, prefix_cache_tokens=0)
    shared = BatchEngine(model, tok, prefix_cache_tokens=8192)
    expected = _run(fresh, rows, temperature=0)
    got = _run(shared, rows, temperature=0)
    assert shared.stats.prefill_tokens == len(prompt) + sum(map(len, own))
    assert fresh.stats.prefill_tokens == sum(map(len, rows))
    assert [s.output_ids for s in got] == [s.output_ids for s in expected]
    for s, e in zip(got, expected, strict=True):
        assert max_abs_diff(e.logprobs, s.logprobs) < MAX_LOGPROB_DIFF
