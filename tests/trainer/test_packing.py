"""Packed rows give the logprobs and gradients of separate unpadded forwards, for every isolation mode.

Tiny random-initialized Llama and Qwen2 models (grouped-query attention, Qwen2's qkv bias) in
float32 on CPU: packing is about layout, not about what the weights know.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer import packing
from trainer.packing import (
    block_causal_mask,
    enable_packed_attention,
    first_fit_decreasing,
    pack_row,
    packed_model_kwargs,
    segment_attention,
)

VOCAB = 101
SIZES = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
)


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(**SIZES, num_key_value_heads=2, attn_implementation="sdpa")
        return LlamaForCausalLM(cfg).eval()
    cfg = Qwen2Config(**SIZES, num_key_value_heads=2, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).eval()


def _seqs(lengths=(7, 1, 12, 5)) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, VOCAB, n) for n in lengths]


def test_first_fit_decreasing_fills_rows_within_the_budget():
    lengths = [5, 9, 3, 7, 2, 12]
    rows = first_fit_decreasing(lengths, budget=10)
    # longest first: 12 alone (over the budget), 9 leaves no room, then 7 + 3 and 5 + 2
    assert rows == [[5], [1], [3, 2], [0, 4]]
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows if len(r) > 1)


def test_pack_row_restarts_positions_and_keeps_tokens():
    seqs = _seqs((3, 2))
    row = pack_row(seqs)
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert row.input_ids[0].tolist() == np.concatenate(seqs).tolist()
    assert row.seq_lens == (3, 2) and row.offsets == [0, 3]


def test_block_causal_mask_blocks_other_sequences_and_the_future():
    allowed = block_causal_mask([2, 1], torch.float32, "cpu")[0, 0] == 0
    assert allowed.tolist() == [[True, False, False], [True, True, False], [False, False, True]]


def _separate_logits(model, seqs):
    return torch.cat([model(input_ids=torch.tensor(s)[None]).logits[0] for s in seqs])


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["varlen", "mask"])
def test_packed_forward_equals_separate_unpadded_forwards(kind, mode):
    model = _model(kind)
    seqs = _seqs()
    with torch.no_grad():
        expected = _separate_logits(model, seqs)
        used = enable_packed_attention(model, mode)
        row = pack_row(seqs)
        packed = model(**packed_model_kwargs(model, row, used)).logits[0]
    assert used == mode
    assert torch.allclose(packed.log_softmax(-1), expected.log_softmax(-1), atol=1e-5)


def test_packed_gradients_equal_separate_ones_with_and_without_checkpointing():
    seqs = _seqs()
    grads = []
    for how in ("separate", "packed", "packed+checkpointing"):
        model = _model("qwen2")
        if how == "separate":
            loss = _separate_logits(model, seqs).log_softmax(-1)[:, :7].sum()
        else:
            mode = enable_packed_attention(model)
            if how.endswith("checkpointing"):
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                model.train()  # transformers checkpoints in training mode only; this model has no dropout
            logits = model(**packed_model_kwargs(model, pack_row(seqs), mode)).logits[0]
            loss = logits.log_softmax(-1)[:, :7].sum()
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[1], grads[0], atol=1e-5)
    assert torch.allclose(grads[2], grads[0], atol=1e-5)


def test_default_attention_is_the_default_again_for_unpacked_calls():
    model = _model("llama")
    tokens = torch.tensor(np.stack([_seqs((6,))[0], _seqs((6,))[0]]))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    with torch.no_grad():
        before = model(input_ids=tokens, attention_mask=mask).logits
        generated = model.generate(tokens[:1], max_new_tokens=4, do_sample=False)
        assert enable_packed_attention(model) == "varlen" and enable_packed_attention(model) == "varlen"
        assert model.config._attn_implementation == "pqrl_packed:sdpa"
        after = model(input_ids=tokens, attention_mask=mask).logits
        assert torch.equal(model.generate(tokens[:1], max_new_tokens=4, do_sample=False), generated)
    assert torch.allclose(after[mask.bool()], before[mask.bool()], atol=1e-6)


def test_the_varlen_mode_builds_no_dense_mask():
    model = _model("llama")
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw.get("attention_mask")), with_kwargs=True
    )
    mode = enable_packed_attention(model)
    with torch.no_grad():
        model(**packed_model_kwargs(model, pack_row(_seqs()), mode))
    assert seen == [None]


def _graph_nodes(t: torch.Tensor) -> list[str]:
    seen, stack, names = set(), [t.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack += [n for n, _ in node.next_functions]
    return names


def test_segment_attention_backward_writes_no_row_sized_zeros_per_segment():
    # A slice's backward scatters its gradient into zeros the size of the whole row: with one slice
    # per segment the backward cost segments x row length. Splitting once has a single cat instead.
    q, k, v = (torch.randn(1, 4, 40, 8, requires_grad=True) for _ in range(3))
    lens, parents = [10, 6, 6, 6, 12], [-1, 0, 0, 0, -1]
    out = segment_attention(q, k, v, lens, scaling=None, dropout=0.0, parents=parents)
    nodes = _graph_nodes(out)
    assert nodes.count("SplitWithSizesBackward0") == 3 and "SliceBackward0" not in nodes
    out.square().sum().backward()
    for x in (q, k, v):  # every segment, the last root's too, gets its gradient back through the cat
        assert all(g.abs().sum() > 0 for g in x.grad.split(lens, dim=2))


def test_grouped_query_heads_read_in_place_equal_repeated_ones(monkeypatch):
    # the CPU reads grouped key/value heads in place; other devices repeat them: the same attention
    lens, parents = [10, 6, 6, 12], [-1, 0, 0, -1]
    q0, k0, v0 = torch.randn(1, 4, 34, 8), torch.randn(1, 2, 34, 8), torch.randn(1, 2, 34, 8)
    results = []
    for native in (True, False):
        monkeypatch.setattr(packing, "_native_gqa", lambda _q, native=native: native)
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        out = segment_attention(q, k, v, lens, scaling=None, dropout=0.0, parents=parents)
        out.square().sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
    assert packing._sdpa_takes_gqa()  # torch >= 2.5: the in-place path above really ran
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
