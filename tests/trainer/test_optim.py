"""The trainer's AdamW: fused where torch has the kernel, the same update as torch's default path,
and a checkpoint of either path resumes in the other."""

from __future__ import annotations

import copy

import torch

from trainer.optim import adamw, fusable


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randint(0, 50, (4, 7), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt.step()


def _close(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


class _Shard(torch.Tensor):
    """Stands for FSDP2's DTensor: what ``fusable`` looks for is its ``full_tensor``."""

    def full_tensor(self) -> torch.Tensor:
        return self


def test_fusable_takes_plain_float_tensors_of_one_device_type_only():
    w = torch.zeros(3, requires_grad=True)
    assert fusable([w, torch.zeros(2, dtype=torch.bfloat16)])
    assert not fusable([])
    assert not fusable([w, torch.zeros(2, dtype=torch.int64)])
    assert not fusable([w, torch.zeros(2).as_subclass(_Shard)])
    assert not fusable([torch.zeros(2, device="meta")])


def test_adamw_is_fused_on_cpu_and_updates_as_the_default_path():
    fused_model, plain_model = _model(), _model()
    fused = adamw(fused_model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    assert fused.param_groups[0]["fused"] and not plain.param_groups[0]["fused"]
    _steps(fused_model, fused, 5)
    _steps(plain_model, plain, 5)
    assert _close(fused_model, _model()) > 1e-2, "the parameters moved"
    assert _close(fused_model, plain_model) < 1e-5


def test_a_default_path_checkpoint_resumes_fused():
    plain_model = _model()
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2)
    _steps(plain_model, plain, 3)
    resumed = _model()
    resumed.load_state_dict(plain_model.state_dict())
    fused = adamw(resumed.parameters(), lr=1e-2)
    fused.load_state_dict(copy.deepcopy(plain.state_dict()))  # as from disk: no shared moments
    assert fused.param_groups[0]["fused"], "the saved state switched the fused kernel off"
    _steps(plain_model, plain, 2, seed=2)
    _steps(resumed, fused, 2, seed=2)
    assert _close(resumed, plain_model) < 1e-5
