"""One GRPO step on real SmolLM2 samples: the update moves the policy toward rewarded answers,
stale / failed / signal-free samples are dropped and counted, micro-batching changes nothing.
On a tiny random model: packing, fused logprobs and checkpointing give the same update, epochs x
minibatches make that many optimizer steps, the KL and off-policy metrics mean what they say."""

from __future__ import annotations

import copy
import dataclasses
import types

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from launcher.demo import DemoConfig, sample_group
from pqrl.model_cache import load_model, load_tokenizer
from pqrl.trajectory import Status, Trajectory
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer.config import AlgorithmConfig, StepConfig
from trainer.logprobs import token_logprobs
from trainer.losses import entropy_from_logits
from trainer.step import train_step
from trainer.tied_embedding import rows_into_grad, tied_input_embedding


@pytest.fixture(scope="module")
def model_and_group():
    torch.manual_seed(0)
    model, tok = load_model(dtype=torch.float32).eval(), load_tokenizer()
    cfg = DemoConfig(group_size=4, max_new_tokens=12, temperature=1.0)
    group = sample_group(model, tok, {"id": "t1", "question": "What is 3 + 4?", "answer": "7"}, cfg, "r")
    group = [dataclasses.replace(t, reward=float(i < 2)) for i, t in enumerate(group)]  # 2 right, 2 wrong
    return model, group


def _response_logp(model, group) -> torch.Tensor:
    with torch.no_grad():
        out = []
        for t in group:
            tokens = torch.tensor(t.tokens[None, :], dtype=torch.long)
            logp = token_logprobs(model, tokens, torch.ones_like(tokens), 1.0)[0]
            out.append(float((logp * torch.tensor(t.loss_mask, dtype=torch.float32)).sum()))
        return torch.tensor(out)


def test_a_step_moves_the_policy_toward_the_rewarded_answers(model_and_group):
    base, group = model_and_group
    model = copy.deepcopy(base)
    before = _response_logp(model, group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    metrics = train_step(model, optimizer, [group], version=0, cfg=_cfg())
    delta = _response_logp(model, group) - before
    assert delta[:2].mean() > delta[2:].mean(), f"rewarded answers did not gain: {delta.tolist()}"
    assert metrics["rollout/trajectories_used"] == 4
    # behaviour logprobs came from the same weights: the two parts of q != p are near zero
    assert abs(metrics["offpolicy/mismatch_kl"]) < 1e-2
    assert metrics["offpolicy/tis_weight_mean"] == pytest.approx(1.0, abs=0.02)
    assert metrics["losses/clipfrac"] == 0.0 and metrics["losses/grad_norm"] > 0


def test_stale_failed_and_signal_free_samples_are_dropped_and_counted(model_and_group):
    base, group = model_and_group
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    params = [p.detach().clone() for p in model.parameters()]
    failed = [dataclasses.replace(group[0], status=Status.FAILED_INFRA), *group[1:]]
    same = [dataclasses.replace(t, reward=1.0) for t in group]
    m = train_step(model, optimizer, [group], version=5, cfg=_cfg(max_staleness=1))
    assert m["dropped/stale"] == 4 and m["offpolicy/staleness_5"] == 4 and m["rollout/trajectories_used"] == 0
    assert m["dropped/groups_too_few_valid"] == 1
    m = train_step(model, optimizer, [same], version=0, cfg=_cfg())
    assert m["dropped/no_signal_groups"] == 1
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True)), "nothing to learn"
    m = train_step(model, optimizer, [failed], version=0, cfg=_cfg())
    assert m["dropped/failed_infra"] == 1 and m["rollout/trajectories_used"] == 3


def test_micro_batches_give_the_same_update_as_one_batch(model_and_group):
    base, group = model_and_group
    updated = []
    for budget in (100_000, 40):  # one micro-batch, or one trajectory per micro-batch
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        m = train_step(model, optimizer, [group], version=0, cfg=_cfg(micro_batch_tokens=budget))
        updated.append((m["perf/micro_batches"], [p.detach() for p in model.parameters()]))
    (n1, one), (n4, many) = updated
    assert n1 == 1 and n4 == 4
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(one, many, strict=True))


# ---- the compute path on a tiny random model: same numbers whichever way it is computed ----

VOCAB = 64


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def _tiny_group(model, lengths, *, group="g", stale_upto=0, behavior_shift=0.0) -> list[Trajectory]:
    """Random tokens, the last two thirds generated by ``model`` (its own logprobs as behaviour);
    generated tokens before ``stale_upto`` come from version 0 with logprobs ``behavior_shift`` lower,
    the others from version 1."""
    rng = np.random.default_rng(len(lengths) + sum(lengths))
    out = []
    for i, n in enumerate(lengths):
        tokens = rng.integers(0, VOCAB, n)
        prompt = n // 3
        gen = (np.arange(n) >= prompt).astype(np.uint8)
        with torch.no_grad():
            ids = torch.tensor(tokens[None])
            logp = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0].numpy()
        stale = gen.astype(bool) & (np.arange(n) < stale_upto)
        behav = np.where(gen, logp - behavior_shift * stale, 0.0)
        versions = np.where(gen, np.where(stale, 0, 1), -1)
        out.append(Trajectory(id=f"{group}{i}", run_id="r", task_id="t", group_id=group, env="e",
                              tokens=tokens, generated=gen, loss_mask=gen, behavior_logprobs=behav,
                              versions=versions, prompt_len=prompt, reward=float(i % 2)))  # fmt: skip
    return out


class _Snapshots:
    """A scheduler that records the parameters after every optimizer step."""

    def __init__(self, model):
        self.model, self.params = model, []

    def step(self):
        self.params.append(torch.cat([p.detach().flatten() for p in self.model.parameters()]))


ALGORITHM = {f.name for f in dataclasses.fields(AlgorithmConfig)}


def _cfg(**kw):
    """The step's settings as a job at T 1 with staleness bound 1 would give them, changed by ``kw``
    (``AlgorithmConfig`` fields go into ``algorithm``)."""
    algorithm = AlgorithmConfig(**{k: kw.pop(k) for k in list(kw) if k in ALGORITHM})
    return StepConfig(**({"temperature": 1.0, "max_staleness": 1} | kw), algorithm=algorithm)


def _run(base, groups, version=1, ref_model=None, calls=None, **cfg):
    model = copy.deepcopy(base)
    if calls is not None:  # counts runs of the first layer's MLP (hooks do not fire in a recompute)
        mlp = model.model.layers[0].mlp
        forward = mlp.forward
        mlp.forward = lambda x: calls.append(1) or forward(x)
    snaps = _Snapshots(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    metrics = train_step(model, optimizer, groups, version, _cfg(**cfg), scheduler=snaps, ref_model=ref_model)
    return metrics, snaps.params


def test_packing_and_fused_logprobs_change_nothing_but_the_layout(tiny):
    groups = [_tiny_group(tiny, [9, 17, 12, 20]), _tiny_group(tiny, [15, 10, 11], group="h")]
    runs = {
        (packing, fused): _run(
            tiny, groups, packing=packing, fused_logprobs=fused, micro_batch_tokens=40, logprob_chunk_tokens=7
        )  # fmt: skip
        for packing in (True, False)
        for fused in (True, False)
    }
    (m0, p0), *others = runs.values()
    assert (
        m0["perf/micro_batches"] > 1
        and (p0[0] - torch.cat([p.flatten() for p in tiny.parameters()])).abs().max() > 1e-3
    )
    for m, p in others:
        assert torch.allclose(p[0], p0[0], atol=1e-6)
        for k in ("losses/pg_loss", "policy/entropy", "losses/grad_norm", "offpolicy/tis_weight_mean"):
            assert m[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k


def test_epochs_times_minibatches_optimizer_steps_and_the_first_equals_the_on_policy_step(tiny):
    groups = [_tiny_group(tiny, [9, 17, 12, 20, 14, 11])]
    m1, one = _run(tiny, groups)
    m, steps = _run(tiny, groups, ppo_epochs=2, minibatches=3)
    assert len(one) == 1 and m1["perf/optimizer_steps"] == 1
    assert len(steps) == 6 and m["perf/optimizer_steps"] == 6
    m, steps = _run(tiny, groups, ppo_epochs=2)
    # the separate proximal pass gives the first update the on-policy shortcut gives
    assert torch.allclose(steps[0], one[0], atol=1e-6)
    # the second epoch trains against the same pi_prox, now one step behind: ratios move, some clip
    assert not torch.allclose(steps[1], steps[0]) and m["losses/clipfrac"] > 0
    assert m1["losses/clipfrac"] == 0.0


def test_kl_to_a_reference_is_zero_for_the_same_model_and_pulls_toward_a_different_one(tiny):
    groups = [_tiny_group(tiny, [9, 17, 12, 20])]
    _, plain = _run(tiny, groups)
    m, same = _run(tiny, groups, ref_model=copy.deepcopy(tiny), kl_coef=0.5)
    assert m["losses/kl_ref"] == 0.0 and torch.allclose(same[0], plain[0], atol=1e-7)
    other = copy.deepcopy(tiny)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    m, pulled = _run(tiny, groups, ref_model=other, kl_coef=0.5, kl_estimator="k2")
    assert m["losses/kl_ref"] > 1e-4 and not torch.allclose(pulled[0], plain[0], atol=1e-5)


def test_gradient_checkpointing_gives_the_same_update(tiny):
    groups = [_tiny_group(tiny, [9, 17, 12, 20])]
    plain_calls, ckpt_calls = [], []
    _, plain = _run(tiny, groups, calls=plain_calls)
    _, ckpt = _run(tiny, groups, calls=ckpt_calls, gradient_checkpointing=True)
    assert len(plain_calls) == 1 and len(ckpt_calls) == 2  # the backward recomputed the layer
    assert torch.allclose(ckpt[0], plain[0], atol=1e-6)


def test_importance_weight_metrics_split_engine_mismatch_from_staleness(tiny):
    # the first 8 tokens of each trajectory are prompt (4-6) or stale (version 0), sampled by a policy
    # e^1 less likely than the current one: their weight exceeds the cap C = 2 and is clipped
    group = _tiny_group(tiny, [15, 18, 12, 21], stale_upto=8, behavior_shift=1.0)
    m, _ = _run(tiny, [group], version=1)
    gen = np.concatenate([t.loss_mask[1:] for t in group]).astype(bool)
    stale = np.concatenate([(t.versions[1:] == 0) for t in group])[gen]
    assert m["offpolicy/stale_token_frac"] == pytest.approx(stale.mean())
    assert m["offpolicy/staleness_mean"] == pytest.approx(stale.mean())  # stale tokens are 1 version old
    assert m["offpolicy/stale_tis_weight_mean"] == pytest.approx(2.0)
    assert m["offpolicy/stale_kl"] == pytest.approx(-1.0, abs=1e-5)
    assert m["offpolicy/tis_weight_clipped_frac"] == pytest.approx(stale.mean())
    assert abs(m["offpolicy/mismatch_kl"]) < 1e-5 and m[
        "offpolicy/mismatch_tis_weight_mean"
    ] == pytest.approx(1.0)
    assert m["offpolicy/tis_weight_mean"] == pytest.approx(2.0 * stale.mean() + (1 - stale.mean()), rel=1e-5)


def test_entropy_metric_is_the_masked_mean_entropy_of_the_policy(tiny):
    group = _tiny_group(tiny, [9, 17, 12, 20])
    m, _ = _run(tiny, [group])
    with torch.no_grad():
        ents = []
        for t in group:
            logits = tiny(input_ids=torch.tensor(t.tokens[None])).logits[0, :-1]
            ents.append(entropy_from_logits(logits)[t.loss_mask[1:].astype(bool)])
    assert m["policy/entropy"] == pytest.approx(float(torch.cat(ents).mean()), rel=1e-5)
    assert m["perf/tokens_per_s"] > 0


def test_a_trajectory_without_trained_tokens_alone_in_its_micro_batch_is_harmless(tiny):
    group = _tiny_group(tiny, [9, 17, 12, 20])
    group[1] = dataclasses.replace(group[1], loss_mask=np.zeros(17, dtype=np.uint8))  # e.g. an invalid turn
    m, params = _run(tiny, [group], micro_batch_tokens=10)
    assert m["perf/micro_batches"] == 4 and m["perf/tokens"] == sum(int(t.loss_mask.sum()) for t in group)
    assert all(np.isfinite(v) for v in m.values()) and torch.isfinite(params[0]).all()


def test_cpu_autocast_computes_in_bfloat16_and_updates_close_to_float32(tiny):
    groups = [_tiny_group(tiny, [9, 17, 12, 20])]
    seen: dict[bool, set[torch.dtype]] = {False: set(), True: set()}
    updates = {}
    for on in (False, True):
        model = copy.deepcopy(tiny)
        model.model.layers[0].mlp.down_proj.register_forward_hook(
            lambda m, i, o, on=on: seen[on].add(o.dtype)
        )
        snaps = _Snapshots(model)
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.5), groups, 1, _cfg(cpu_autocast=on),
                   scheduler=snaps)  # fmt: skip
        updates[on] = snaps.params[0] - torch.cat([p.detach().flatten() for p in tiny.parameters()])
        assert all(p.dtype == torch.float32 for p in model.parameters()), "the weights stay float32"
    assert seen == {False: {torch.float32}, True: {torch.bfloat16}}
    cos = torch.nn.functional.cosine_similarity(updates[True], updates[False], dim=0)
    assert cos > 0.99, f"bfloat16 matmuls give nearly the same update: {cos}"
    assert (updates[True] - updates[False]).abs().max() > 1e-5, "but not exactly the same"


def test_gradients_are_freed_once_applied(tiny):
    # a trainer waiting for its next groups holds no model's worth of spent gradients
    model = copy.deepcopy(tiny)
    before = [p.detach().clone() for p in model.parameters()]
    train_step(
        model, torch.optim.SGD(model.parameters(), lr=0.5), [_tiny_group(tiny, [9, 17, 12, 20])], 1, _cfg()
    )
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_a_tied_embedding_adds_its_gradient_rows_in_place_and_the_update_is_unchanged(monkeypatch):
    # autograd's sum of a tied weight's two gradients made a [V, H] temporary at the end of backward
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    tied = LlamaForCausalLM(cfg).eval()
    assert tied_input_embedding(tied) is tied.get_input_embeddings()
    group = _tiny_group(tied, [9, 17, 12, 20])
    group[1] = dataclasses.replace(group[1], loss_mask=np.zeros(17, dtype=np.uint8))  # no head gradient
    updates, backward_ops = [], []
    for rows in (True, False):
        if not rows:
            monkeypatch.setattr("trainer.tied_embedding.tied_input_embedding", lambda model: None)
        model = copy.deepcopy(tied)
        snaps = _Snapshots(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for micro_batch_tokens in (100, 10):  # one micro-batch, then one per trajectory
                cfg = _cfg(micro_batch_tokens=micro_batch_tokens)
                train_step(model, optimizer, [group], 1, cfg, scheduler=snaps)
        backward_ops.append(
            {e.name for e in prof.events()} & {"aten::embedding_dense_backward", "aten::index_add_"}
        )
        assert "forward" not in vars(model.get_input_embeddings()), "the lookup is restored"
        assert all(p.grad is None for p in model.parameters())
        updates.append(torch.stack(snaps.params))
    assert backward_ops == [{"aten::index_add_"}, {"aten::embedding_dense_backward"}]
    assert (updates[0][-1] - torch.cat([p.detach().flatten() for p in tied.parameters()])).abs().max() > 1e-4
    assert torch.allclose(updates[0], updates[1], atol=1e-6)


def test_embedding_rows_go_into_the_grad_without_a_head_gradient_and_skip_padding_and_frozen_weights():
    emb = torch.nn.Embedding(6, 3, padding_idx=0)
    model = types.SimpleNamespace(get_input_embeddings=lambda: emb, get_output_embeddings=lambda: emb)
    with rows_into_grad(model):
        out = emb(torch.tensor([[1, 2, 2, 0]]))
    (out * torch.arange(4.0)[:, None]).sum().backward()
    assert torch.equal(emb.weight.grad[:, 0], torch.tensor([0.0, 0.0, 3.0, 0.0, 0.0, 0.0]))
    emb.weight.grad = None
    emb(torch.tensor([[1, 2, 2, 0]])).sum().backward()  # restored: the plain lookup
    assert torch.equal(emb.weight.grad[:, 0], torch.tensor([0.0, 1.0, 2.0, 0.0, 0.0, 0.0]))
    emb.weight.grad = None
    emb.weight.requires_grad_(False)  # frozen, what follows it trained: no gradient appears for it
    scale = torch.ones(3, requires_grad=True)
    with rows_into_grad(model):
        (emb(torch.tensor([[1, 2]])) * scale).sum().backward()
    assert emb.weight.grad is None and scale.grad is not None


def test_each_decoder_layer_and_part_backward_checks_the_heap_on_cpu_only(tiny, monkeypatch):
    # trainer.layers: a trim near the peak at the start of every layer's and part's backward, no hooks after
    import trainer.layers

    calls = []
    monkeypatch.setattr(trainer.layers, "trim_near_peak", lambda: calls.append(1))
    model = copy.deepcopy(tiny)
    groups = [_tiny_group(tiny, [9, 17, 12, 20])]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_step(model, optimizer, groups, 1, _cfg(ppo_epochs=2, micro_batch_tokens=32))
    passes, updates = 2 * 2, 2  # two epochs of two micro-batches (58 tokens, at most 32 a pass)
    points = [m for layer in model.model.layers for m in (layer, *layer.children())]  # attention, MLP, norms
    assert len(points) == 2 * 5 and len(calls) == passes * len(points) + updates  # + one per optimizer step
    assert all(not m._backward_pre_hooks for m in points)
    with trainer.layers.trims_before_layer_backward(model, torch.device("meta")):
        assert all(not layer._backward_pre_hooks for layer in model.model.layers)
    assert trainer.layers.decoder_layers(model) == list(model.model.layers)


def test_the_training_forward_keeps_no_cast_copy_of_the_weights(tiny):
    # the autocast cache would hold a bfloat16 copy of every weight until the forward's end
    model = copy.deepcopy(tiny)
    seen = set()
    model.model.layers[0].mlp.register_forward_hook(
        lambda m, i, o: seen.add((torch.is_grad_enabled(), torch.is_autocast_cache_enabled()))
    )
    groups = [_tiny_group(tiny, [9, 17, 12, 20])]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    train_step(model, optimizer, groups, 1, _cfg(cpu_autocast=True, ppo_epochs=2))
    assert seen == {(True, False), (False, True)}  # training forwards uncached; the proximal pass cached
