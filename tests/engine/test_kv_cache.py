"""The engine's KV cache whose layers grow in place: the same keys and values as concatenation, without
copying the cache at every append; and on the real SmolLM2, the same logits as transformers' own cache."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, LlamaForCausalLM

from engine.kv_cache import cache_from, kv_layers, new_cache

_FORWARD_ARGS = inspect.signature(LlamaForCausalLM.forward).parameters
_CACHE_ARG = "cache" if "cache" in _FORWARD_ARGS else "past_key_values"  # renamed in transformers 5


def _cols(B: int, n: int, start: int = 0) -> torch.Tensor:
    """``[B, 2, n, 3]`` columns whose values name their row and position (to check what lands where)."""
    pos = torch.arange(start, start + n, dtype=torch.float32)[None, None, :, None]
    rows = torch.arange(B, dtype=torch.float32)[:, None, None, None] * 1000
    return (pos + rows).expand(B, 2, n, 3).clone()


def test_appends_equal_concatenation_and_reuse_the_buffer():
    cache = new_cache()
    want = _cols(3, 5)
    cache.update(want, -want, 0)
    ptrs = set()
    for t in range(5, 40):
        col = _cols(3, 1, start=t)
        keys, values = cache.update(col, -col, 0)
        want = torch.cat([want, col], dim=-2)
        assert torch.equal(keys, want) and torch.equal(values, -want)
        ptrs.add(keys.data_ptr())
    assert len(ptrs) == 1  # 40 columns fit in the first buffer's room: no copy per append
    assert cache.get_seq_length() == 40


def test_rows_selected_keep_their_columns_and_the_room_to_grow():
    cache = cache_from([(_cols(4, 6), -_cols(4, 6))])
    cache.update(_cols(4, 1, start=6), -_cols(4, 1, start=6), 0)  # allocates the room
    cache.batch_select_indices(torch.tensor([3, 1]))
    ((keys, _),) = kv_layers(cache)
    assert torch.equal(keys, _cols(4, 7)[[3, 1]])
    before = keys.data_ptr()
    keys, values = cache.update(_cols(2, 1, start=7) + 5, -_cols(2, 1, start=7), 0)
    assert keys.data_ptr() == before  # written into the kept room
    assert torch.equal(keys[:, :, -1], (_cols(2, 1, start=7) + 5)[:, :, 0])
    assert torch.equal(keys[:, :, :7], _cols(4, 7)[[3, 1]])


def test_a_cache_built_from_tensors_does_not_write_into_them():
    k = _cols(2, 4)
    original = k.clone()
    cache = cache_from([(k[..., 1:, :], -k[..., 1:, :])])  # a view, as when the engine trims padding
    keys, _ = cache.update(_cols(2, 1, start=9), -_cols(2, 1, start=9), 0)
    assert torch.equal(k, original)
    assert torch.equal(keys, torch.cat([original[..., 1:, :], _cols(2, 1, start=9)], dim=-2))


def test_the_model_decodes_the_same_logits_as_with_transformers_cache(smollm):
    model, _ = smollm
    prompt = torch.tensor([[1, 42, 7, 99, 3, 17, 5], [1, 8, 8, 8, 8, 2, 4]])
    logits = {}
    for name, cache in (("dynamic", DynamicCache()), ("growing", new_cache())):
        ids, steps = prompt, []
        with torch.inference_mode():
            for _ in range(6):
                out = model(input_ids=ids, **{_CACHE_ARG: cache}, use_cache=True)
                steps.append(out.logits[:, -1])
                ids = out.logits[:, -1].argmax(-1, keepdim=True)
        logits[name] = torch.stack(steps)
        assert {type(layer).__name__ for layer in cache.layers} == {
            "DynamicLayer" if name == "dynamic" else "GrowingLayer"
        }
    assert (logits["dynamic"] - logits["growing"]).abs().max() < 1e-4
