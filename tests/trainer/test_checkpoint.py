"""Checkpoints: a round trip restores optimizer, scheduler and RNG; ``latest`` only ever names a
complete checkpoint; old ones are pruned."""

from __future__ import annotations

import torch

from trainer.checkpoint import CheckpointState, latest_checkpoint, load_checkpoint, save_checkpoint


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def save_pretrained(self, path) -> None:  # the Hugging Face model interface the checkpoint uses
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "weights.pt")


def _trained() -> tuple[_Tiny, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = _Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    for _ in range(3):
        model.lin(torch.randn(2, 4)).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def test_round_trip_restores_optimizer_scheduler_and_rng(tmp_path):
    model, opt, sched = _trained()
    state = CheckpointState(step=3, policy_version=2, sampler_position=17, trained_groups=["a", "b"],
                            unacked_entries=["1-0"])  # fmt: skip
    path = save_checkpoint(tmp_path, state, model=model, optimizer=opt, scheduler=sched)
    expected_draw = torch.rand(3)
    assert latest_checkpoint(tmp_path) == path

    torch.manual_seed(123)  # scramble the RNG: load must restore it
    model2 = _Tiny()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: min(1.0, (s + 1) / 4))
    loaded = load_checkpoint(path, optimizer=opt2, scheduler=sched2)
    assert loaded == state
    assert torch.equal(torch.rand(3), expected_draw)
    assert sched2.last_epoch == sched.last_epoch and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    for a, b in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_latest_names_only_complete_checkpoints_and_old_ones_are_pruned(tmp_path):
    model, opt, sched = _trained()
    assert latest_checkpoint(tmp_path) is None
    for step in range(1, 5):
        save_checkpoint(tmp_path, CheckpointState(step=step), model=model, optimizer=opt, keep=2)
    (tmp_path / ".step-000005.tmp-999").mkdir()  # what a process killed mid-write leaves
    assert latest_checkpoint(tmp_path).name == "step-000004"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000003", "step-000004"]
