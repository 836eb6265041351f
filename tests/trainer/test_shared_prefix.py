"""A prompt shared by several sequences of a packed row is computed once, and every logprob and
gradient is still that of the unshared computation: on tiny random models for each isolation
mode, and through the training step on real SmolLM2 samples."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from launcher.demo import DemoConfig, sample_group
from pqrl.model_cache import load_model, load_tokenizer
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from tests.trainer.test_packing import VOCAB, _model, _separate_logits
from trainer.config import StepConfig
from trainer.packing import (
    block_causal_mask,
    enable_packed_attention,
    pack_row,
    packed_model_kwargs,
    share_prefixes,
    shared_rows,
)
from trainer.step import train_step


def _group(prompt_len=9, tails=(4, 1, 6), other=5) -> tuple[list[np.ndarray], list[int]]:
    """Three sequences that start with one prompt and a fourth that does not; their shareable lengths."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, VOCAB, prompt_len)
    seqs = [np.concatenate([prompt, rng.integers(0, VOCAB, n)]) for n in tails]
    seqs.insert(1, rng.integers(0, VOCAB, other))
    return seqs, [prompt_len, 2, prompt_len, prompt_len]


def test_the_layout_stores_a_shared_prompt_once_and_maps_every_position():
    seqs, shareable = _group()
    layout = share_prefixes(seqs, shareable)
    # the prompt, its three continuations, and the sequence with nothing to share with
    assert [len(s) for s in layout.segments] == [9, 4, 1, 6, 5]
    assert layout.parents == [-1, 0, 0, 0, -1]
    assert layout.shared == [9, 0, 9, 9] and layout.prefix == [0, -1, 0, 0]
    row = pack_row(layout.segments, parents=layout.parents)
    assert row.position_ids[0].tolist() == [*range(9), *range(9, 13), 9, *range(9, 15), *range(5)]
    flat = row.input_ids[0].numpy()
    for i, s in enumerate(seqs):  # every token of every sequence is where rows_of says
        assert np.array_equal(flat[layout.rows_of(i, np.arange(len(s)), row.offsets)], s)


def test_a_prefix_is_shared_only_when_its_length_and_tokens_match():
    seqs, _ = _group()
    layout = share_prefixes(seqs, [9, 2, 8, 9])  # the third shares a shorter prefix: not the same key
    assert layout.shared == [9, 0, 0, 9]
    with pytest.raises(ValueError, match="token of its own"):
        share_prefixes(seqs, [len(seqs[0]), 0, 0, 0])
    with pytest.raises(ValueError, match="parents"):
        pack_row(seqs[:2], parents=[1, -1])  # a parent must come first


def test_shared_rows_count_the_prompt_once_per_row():
    lengths, shared = [100, 30, 110, 105, 120], [90, 0, 90, 90, 90]
    keys = [b"p", None, b"p", b"p", b"p"]
    rows = shared_rows(lengths, keys, shared, budget=150)
    # longest first, 120 + 20 = 140, then + 15 is over: a second bundle 105 + 10; the other
    # sequence (30) fits beside the second bundle, not beside the first
    assert rows == [[4, 2], [3, 0, 1]]
    assert shared_rows(lengths, [None] * 5, shared, budget=150) == [[4, 1], [2], [3], [0]]


def test_the_mask_lets_a_continuation_see_its_whole_parent_and_not_its_siblings():
    allowed = block_causal_mask([2, 2, 1], torch.float32, "cpu", parents=[-1, 0, 0])[0, 0] == 0
    assert allowed.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],
    ]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["varlen", "mask"])
def test_shared_logits_and_gradients_equal_separate_forwards(kind, mode):
    seqs, shareable = _group()
    layout = share_prefixes(seqs, shareable)
    logps, grads = [], []
    for how in ("separate", "shared"):
        model = _model(kind)
        if how == "separate":
            logits = _separate_logits(model, seqs)
        else:
            used = enable_packed_attention(model, mode)
            row = pack_row(layout.segments, parents=layout.parents)
            packed = model(**packed_model_kwargs(model, row, used)).logits[0]
            index = [layout.rows_of(i, np.arange(len(s)), row.offsets) for i, s in enumerate(seqs)]
            logits = packed[torch.from_numpy(np.concatenate(index))]
        logp = logits.log_softmax(-1)
        logp[:, :7].sum().backward()
        logps.append(logp.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(logps[1], logps[0], atol=1e-5)
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[1], grads[0], atol=1e-5)


def test_the_step_on_real_samples_is_the_same_with_the_prompt_shared():
    """Two real SmolLM2 groups (4 episodes of one calc prompt each): the trained weights and the
    logged logprob statistics match the unshared step, with the prompt forwarded once per group."""
    torch.manual_seed(0)
    model, tok = load_model(dtype=torch.float32).eval(), load_tokenizer()
    demo = DemoConfig(group_size=4, max_new_tokens=8, temperature=1.0)
    groups = []
    for g, task in enumerate([{"id": "a", "question": "What is 12 * 3?", "answer": "36"},
                              {"id": "b", "question": "What is 9 + 40?", "answer": "49"}]):  # fmt: skip
        samples = sample_group(model, tok, task, demo, "r")
        groups.append(
            [dataclasses.replace(t, reward=float(i % 2), group_id=f"g{g}") for i, t in enumerate(samples)]
        )
    results = {}
    for share in (False, True):
        trained = copy.deepcopy(model)
        cfg = StepConfig(
            temperature=1.0, max_staleness=1, share_prefix=share, micro_batch_tokens=4096, ppo_epochs=2
        )  # fmt: skip  (two epochs: proximal logprobs run the shared path too)
        optimizer = torch.optim.SGD(trained.parameters(), lr=1e-4)
        results[share] = train_step(trained, optimizer, groups, version=0, cfg=cfg), trained
    (plain, a), (shared, b) = results[False], results[True]
    prompt_len = groups[0][0].prompt_len
    total = sum(t.num_tokens for g in groups for t in g)
    assert plain["perf/forward_tokens"] == total
    assert shared["perf/forward_tokens"] == total - 2 * 3 * prompt_len  # each prompt once, not 4 times
    for key in ("losses/pg_loss", "policy/entropy", "offpolicy/tis_weight_mean"):
        assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    moved = max(
        float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), a.parameters(), strict=True)
    )
    diff = max(
        float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )
    assert moved > 1e-6 and diff < 1e-3 * moved
