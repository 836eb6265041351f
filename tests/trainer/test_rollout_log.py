"""The rollout log written by a real trainer loop (Redis, a tiny model, a GRPO step): every
trajectory read is in the step's Parquet file with why it was dropped, the trainer's own logprobs
on exactly the trained tokens, and the advantages the step used; old files go past keep_steps."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from pqrl.model_cache import load_tokenizer
from pqrl.store import TrajectoryStore
from tests.models import tiny_llama
from tests.rollout_cases import mixed_groups
from tests.trainer.one_thread import one_torch_thread  # noqa: F401 (autouse: torch on one thread)
from trainer.config import LoopConfig, StepConfig
from trainer.loop import TrainerLoop
from trainer.rollout_log import step_file


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


async def _run(redis_url, tmp_path, tok, *, stream: bool, steps: int = 1, keep_steps=None, epochs: int = 1):
    model = tiny_llama(len(tok))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = LoopConfig(
        step=StepConfig(temperature=1.0, max_staleness=1, ppo_epochs=epochs), groups_per_step=3,
        max_extra_reads=0, stream=stream, weights_dir=str(tmp_path / "w"),
        rollout_log_dir=str(tmp_path / "rollouts"), rollout_log_keep_steps=keep_steps,
    )  # fmt: skip
    async with TrajectoryStore(redis_url, "r") as store:
        await store.groups.create_consumer_group("trainer")
        await store.policy.publish("start", version=5)
        loop = TrainerLoop(model, optimizer, store, None, cfg, tokenizer=tok)
        metrics = []
        for s in range(steps):
            version = 5 + s
            for g in mixed_groups(tok, version=version, stale_version=version - 2):
                await store.groups.put([t.__class__(**{**_fields(t), "group_id": f"{t.group_id}{s}",
                                                       "id": f"{t.id}-s{s}"}) for t in g])  # fmt: skip
            metrics.append(await loop.step(timeout_s=30))
        loop.close()
    return metrics


def _fields(t):
    return {f: getattr(t, f) for f in t.__dataclass_fields__}


# one update: pi_prox is the training forward's; two epochs: the proximal pass before the first
@pytest.mark.parametrize(
    "stream,epochs", [(False, 1), (True, 1), (False, 2)], ids=["batch", "streaming", "epochs"]
)
async def test_every_trajectory_read_is_logged_with_why_and_the_trainers_numbers(
    redis_server, tmp_path, tok, stream, epochs
):
    (metrics,) = await _run(redis_server.url, tmp_path, tok, stream=stream, epochs=epochs)
    table = pq.read_table(step_file(tmp_path / "rollouts", 1))
    rows = {r["id"]: r for r in table.to_pylist()}
    assert len(rows) == 12 and {r["step"] for r in rows.values()} == {1}
    reasons = {i.removesuffix("-s0"): r["drop_reason"] for i, r in rows.items()}
    assert reasons == {
        "sig-0": None, "sig-1": None, "sig-2": None, "sig-3": None,
        "flat-0": "no_signal", "flat-1": "no_signal", "flat-2": "no_signal", "flat-3": "no_signal",
        "infra-0": None, "infra-1": None, "infra-2": "failed_infra", "infra-3": "stale",
    }  # fmt: skip
    assert metrics["rollout/trajectories_used"] == sum(r is None for r in reasons.values())
    failed = rows["infra-2-s0"]
    assert json.loads(failed["reward_info"])["error"].startswith("sandbox container exited 137")
    assert rows["infra-3-s0"]["staleness"] == 2 and failed["staleness"] is None
    error_turn = json.loads(rows["sig-1-s0"]["turns"])[0]
    assert error_turn["tool_calls"][0]["status"] == "error" and rows["sig-1-s0"]["tool_errors"] == 1
    for r in rows.values():
        mask, lp = np.array(r["loss_mask"]), r["trainer_logprobs"]
        if r["drop_reason"] is not None:
            assert lp is None and r["advantage"] is None, "a dropped trajectory was never scored"
            continue
        lp = np.array(lp, np.float32)
        trained = mask.astype(bool)
        trained[0] = False  # position 0 has no prefix to predict it
        assert np.isfinite(lp[trained]).all() and (lp[trained] < 0).all()
        assert np.isnan(lp[~trained]).all(), "the trainer scores trained tokens only"
    masked = np.array(rows["sig-2-s0"]["loss_mask"]) != np.array(rows["sig-2-s0"]["generated"])
    assert masked.any() and np.isnan(np.array(rows["sig-2-s0"]["trainer_logprobs"], np.float32)[masked]).all()
    sig = [rows[f"sig-{i}-s0"]["advantage"] for i in range(4)]
    assert abs(sum(sig)) < 1e-5 and sig[0] > 0 > sig[1], "GRPO: centred on the group's mean reward"
    vocab = json.loads((tmp_path / "rollouts" / "vocab.json").read_text())
    assert len(vocab) == len(tok) and "calculator" in "".join(vocab[t] for t in rows["sig-1-s0"]["tokens"])


async def test_the_log_keeps_its_last_steps_and_no_temporary_file(redis_server, tmp_path, tok):
    await _run(redis_server.url, tmp_path, tok, stream=False, steps=3, keep_steps=2)
    names = sorted(p.name for p in (tmp_path / "rollouts").iterdir())
    assert names == ["step-000002.parquet", "step-000003.parquet", "vocab.json"]


def test_a_resumed_run_drops_the_files_of_steps_its_checkpoint_lost(tmp_path):
    from trainer.rollout_log import RolloutLog, logged_steps

    for step in range(1, 6):
        step_file(tmp_path, step).write_bytes(b"")
    (tmp_path / ".step-000006.parquet.tmp").write_bytes(b"half")
    RolloutLog(tmp_path, resumed_at=3).close()
    assert logged_steps(tmp_path) == [1, 2, 3], "steps 4 and 5 are trained again, and logged again"
    assert not list(tmp_path.glob(".*.tmp")), "a killed writer's unfinished file goes"
