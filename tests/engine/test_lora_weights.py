"""LoRA adapters on the built-in engine: ``/update_weights_from_disk`` on a PEFT adapter directory (what
a LoRA trainer publishes) serves base + adapter, every version merged into the same base weights;
adapters the engine cannot serve exactly are refused whole. A real server over loopback HTTP; the
reference is the trainer's own model with the adapter, computed by PEFT's layers."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.batcher import BatchEngine
from engine.client import EngineClient, SamplingParams, WeightUpdateFailed
from engine.http_app import create_app
from launcher.lora_config import LoraSection
from pqrl.model_cache import load_tokenizer
from tests.models import chat_prompt, forced_logprobs, max_abs_diff
from tests.servers import serve_in_thread
from trainer.lora import apply_lora, base_only, save_weights

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=6, sampling_seed=3)


def _adapted(base: Any, seed: int) -> Any:
    """``base`` with rank-4 adapters on q_proj and down_proj whose A and B are both random."""
    model = apply_lora(
        copy.deepcopy(base), LoraSection(rank=4, alpha=8, target_modules=["q_proj", "down_proj"])
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> Iterator[tuple[str, Any, Any, BatchEngine]]:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tok = load_tokenizer(str(tiny_model_dir))
    engine = BatchEngine(copy.deepcopy(base), tok, seed=0)
    with serve_in_thread(create_app(engine)) as url:
        yield url, base, tok, engine


async def _logprobs(url: str, prompt: list[int], version: int) -> tuple[list[int], list[float]]:
    async with EngineClient(url) as client:
        g = await client.generate(prompt, PARAMS)
    assert g.versions == [version] * len(g.output_ids)
    return g.output_ids, g.logprobs


async def test_each_adapter_version_is_merged_into_the_same_base(tiny, tmp_path):
    url, base, tok, engine = tiny
    prompt = chat_prompt(tok, "What is 2 + 3?")
    first, second = _adapted(base, 1), _adapted(base, 2)
    async with EngineClient(url) as client:
        for version, model in ((1, first), (2, second)):
            save_weights(model, tmp_path / f"v{version}")
            assert sorted(p.name for p in (tmp_path / f"v{version}").iterdir()) == [
                "adapter_config.json",
                "adapter_model.safetensors",
            ]
            await client.update_weights_from_disk(str(tmp_path / f"v{version}"), version)
            ids, served = await _logprobs(url, prompt, version)
            # version 2 merged into version 1's weights would be W0 + d1 + d2, not second's W0 + d2
            assert max_abs_diff(forced_logprobs(model, prompt, ids), served) < 1e-4
            with base_only(model):
                assert max_abs_diff(forced_logprobs(model, prompt, ids), served) > 1e-2, "adapter applied"
    targeted = {k for k in engine.adapters.base}
    assert targeted and all(k.endswith(("q_proj.weight", "down_proj.weight")) for k in targeted)


async def test_an_adapter_that_changes_fewer_layers_restores_the_others(tiny, tmp_path):
    url, base, tok, engine = tiny
    wide = _adapted(base, 5)
    narrow = apply_lora(copy.deepcopy(base), LoraSection(rank=2, target_modules=["v_proj"]))
    with torch.no_grad():
        for name, p in narrow.named_parameters():
            if ".lora_" in name:
                p.normal_(0, 0.3)
    save_weights(wide, tmp_path / "wide")
    save_weights(narrow.eval(), tmp_path / "narrow")
    prompt = chat_prompt(tok, "Hi")
    async with EngineClient(url) as client:
        await client.update_weights_from_disk(str(tmp_path / "wide"), 3)
        await client.update_weights_from_disk(str(tmp_path / "narrow"), 4)
    ids, served = await _logprobs(url, prompt, 4)
    assert max_abs_diff(forced_logprobs(narrow, prompt, ids), served) < 1e-4


def _break(src: Path, dst: Path, config: dict[str, Any] | None = None, weights: dict | None = None) -> Path:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    cfg = json.loads((src / "adapter_config.json").read_text()) | (config or {})
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "adapter_model.safetensors")
    for k, v in (weights or {}).items():
        if v is None:
            tensors = {n: t for n, t in tensors.items() if not n.endswith(k)}
        else:
            tensors = {n: (v if n.endswith(k) else t) for n, t in tensors.items()}
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    return dst


@pytest.mark.parametrize(
    ("config", "weights", "message"),
    [
        ({"use_dora": True}, None, "use_dora"),
        ({"use_rslora": True}, None, "use_rslora"),
        ({"rank_pattern": {"q_proj": 8}}, None, "rank_pattern"),
        ({"peft_type": "IA3"}, None, "not LoRA"),
        ({"r": 0}, None, "positive"),
        (None, {"layers.0.self_attn.q_proj.lora_B.weight": None}, "without its pair"),
        (None, {"layers.1.mlp.down_proj.lora_A.weight": torch.zeros(4, 7)}, "is not"),
    ],
)
async def test_adapters_it_cannot_serve_exactly_are_refused_whole(tiny, tmp_path, config, weights, message):
    url, base, tok, engine = tiny
    good = _adapted(base, 7)
    save_weights(good, tmp_path / "good")
    bad = _break(tmp_path / "good", tmp_path / "bad", config, weights)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    async with EngineClient(url) as client:
        version = await client.get_weight_version()
        with pytest.raises(WeightUpdateFailed, match=message):
            await client.update_weights_from_disk(str(bad), 90)
        assert await client.get_weight_version() == version
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused adapter changed weights"


def test_an_adapter_on_a_tied_head_is_refused(tiny, tmp_path):
    _, base, tok, _ = tiny
    from safetensors.torch import save_file

    tied = copy.deepcopy(base)
    tied.lm_head.weight = tied.model.embed_tokens.weight  # as SmolLM2 ties them
    engine = BatchEngine(tied, tok)
    hidden, vocab = base.config.hidden_size, base.config.vocab_size
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2}))
    save_file(
        {
            "base_model.model.lm_head.lora_A.weight": torch.ones(2, hidden),
            "base_model.model.lm_head.lora_B.weight": torch.ones(vocab, 2),
        },
        str(tmp_path / "adapter_model.safetensors"),
    )
    before = tied.model.embed_tokens.weight.clone()
    with pytest.raises(ValueError, match="tied"):
        engine.load_weights(tmp_path)
    assert torch.equal(before, tied.model.embed_tokens.weight) and not engine.adapters.base


async def test_the_built_in_engine_refuses_a_named_adapter(tiny):
    from engine.client import EngineHTTPError

    url, _, tok, _ = tiny
    async with EngineClient(url, lora_name="policy") as client:  # SGLang's way; here it would be ignored
        with pytest.raises(EngineHTTPError, match="lora_path"):
            await client.generate(chat_prompt(tok, "Hi"), PARAMS)


def test_an_engine_started_from_a_lora_checkpoint_merges_later_adapters_into_the_true_base(tiny, tmp_path):
    """A fresh engine on a LoRA checkpoint (what a resumed run's engine gets) serves base + adapter,
    and the next adapter replaces that one instead of landing on top of it (W0 + d1 + d2)."""
    from engine.config import EngineConfig
    from engine.serve_command import build_engine

    _, base, tok, _ = tiny
    first = apply_lora(
        copy.deepcopy(base),
        LoraSection(rank=4, alpha=8, target_modules=["q_proj", "down_proj"]),
        base=str(base.name_or_path),
    )
    second = _adapted(base, 7)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in first.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    first.eval()
    save_weights(first, tmp_path / "v1")
    tok.save_pretrained(tmp_path / "v1")  # a checkpoint's model directory holds its tokenizer
    save_weights(second, tmp_path / "v2")
    engine = build_engine(EngineConfig(model=str(tmp_path / "v1"), device="cpu", dtype="float32"))
    prompt = chat_prompt(tok, "What is 2 + 3?")
    ids = tok.encode(" The answer is 5.")
    served = forced_logprobs(engine.model, prompt, ids)
    assert max_abs_diff(forced_logprobs(first, prompt, ids), served) < 1e-4, "the checkpoint's adapter"
    engine.load_weights(tmp_path / "v2")
    served = forced_logprobs(engine.model, prompt, ids)
    assert max_abs_diff(forced_logprobs(second, prompt, ids), served) < 1e-4, "W0 + d2, not W0 + d1 + d2"


async def test_merged_weights_serve_as_the_adapted_model_and_leave_it_unchanged(tiny, tmp_path):
    """``save_weights(merged=True)``, what engines that load whole weights only are sent: a plain
    checkpoint (no adapter file, no PEFT names) that any engine serves as base + adapter, while the
    trained model keeps its frozen base and its adapters exactly."""
    _, base, tok, _ = tiny
    model = _adapted(base, 11)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    save_weights(model, tmp_path / "merged", merged=True)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "saving changed the model"
    from safetensors.torch import load_file

    (weights,) = (tmp_path / "merged").glob("*.safetensors")
    names = set(load_file(weights))
    assert not any("lora_" in n or "base_layer" in n for n in names) and names <= set(base.state_dict())

    prompt = chat_prompt(tok, "What is 2 + 3?")
    fresh = BatchEngine(copy.deepcopy(base), tok, seed=0)  # its own: the module's engine keeps its base
    with serve_in_thread(create_app(fresh)) as url:
        async with EngineClient(url) as client:
            await client.update_weights_from_disk(str(tmp_path / "merged"), 1)
        ids, served = await _logprobs(url, prompt, 1)
    assert not fresh.adapters.base, "served as whole weights, not as an adapter"
    assert max_abs_diff(forced_logprobs(model, prompt, ids), served) < 1e-4
    with base_only(model):
        assert max_abs_diff(forced_logprobs(model, prompt, ids), served) > 1e-2, "the adapter is in them"


class _WholeWeightsOnly:
    """An engine client whose servers answer an adapter directory as SGLang's route does: failed."""

    async def update_weights_from_disk(self, path: str, version: int, **_: Any) -> None:
        if (Path(path) / "adapter_config.json").exists():
            raise WeightUpdateFailed(f"{path}: no model weights found")


@pytest.mark.parametrize("merged", [False, True])
async def test_an_adapter_refused_by_an_engine_says_what_to_publish_instead(tiny, tmp_path, merged):
    from trainer.weight_sync import DiskWeightSync

    sync = DiskWeightSync(_WholeWeightsOnly(), tmp_path, merged=merged)  # type: ignore[arg-type]
    model = _adapted(tiny[1], 13)
    if merged:
        await sync.push(model, 1)  # whole weights: taken
        return
    with pytest.raises(WeightUpdateFailed, match=r"no model weights found .*model.lora.publish: merged"):
        await sync.push(model, 1)
