"""The durable rollout log: every trajectory a step consumed or dropped, one Parquet file per step.

``RUN_DIR/rollouts/step-000012.parquet`` holds one row per trajectory the trainer read in step 12:
its ids, reward and ``reward_info``, status, turns and tool calls, why it was dropped (``stale``,
``failed_infra``, ``truncated``, or its group's ``too_few_valid`` / ``no_signal``; null when it
trained), its per-token arrays, and where the step computed them the trainer's own per-token
logprob (``trainer_logprobs``, NaN on tokens it did not score) and the advantage. pandas, pyarrow
and DuckDB read the files directly (``read_parquet('rollouts/*.parquet')``).

Written on a thread of its own after the step's update, never inside it; one step in flight at a
time (the next step's submit waits for it), so memory stays bounded. Each file is written under a
temporary name and renamed, so a crash leaves every finished file whole. ``keep_steps`` bounds the
files kept. ``vocab.json`` (each token id's text) lets a reader show tokens without the tokenizer.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from pqrl.trajectory import Trajectory
from trainer.config import StepConfig
from trainer.screening import drop_reason, screen_group

__all__ = [
    "STEP_GLOB",
    "RolloutLog",
    "logged_steps",
    "note_advantages",
    "note_logprobs",
    "schema",
    "step_file",
]

log = logging.getLogger(__name__)

STEP_GLOB = "step-*.parquet"
# a group-level drop, by Screened.dropped, as the log names it
_GROUP_REASONS = {"groups_too_few_valid": "too_few_valid", "no_signal_groups": "no_signal"}


def step_file(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}.parquet"


def logged_steps(directory: str | Path) -> list[int]:
    """The steps with a finished file in ``directory``, in order (other names are ignored)."""
    stems = (p.stem.removeprefix("step-") for p in Path(directory).glob(STEP_GLOB))
    return sorted(int(s) for s in stems if s.isdigit())


def note_logprobs(batch: Any, members: Sequence[int], logp: Any) -> None:
    """Keeps the trainer's per-token logprobs of ``members`` (concatenated over their trained
    positions) in ``batch.record`` when the step records (``record_offpolicy`` calls it once per
    member: the proximal pass, or the training forward on policy)."""
    if batch.record is None or logp.numel() == 0:
        return
    # copied to the host on the log's thread (no device sync inside the step); cloned so that a
    # view never keeps a larger buffer alive
    chunks = logp.detach().clone().split([len(batch.positions[i]) for i in members])
    for i, chunk in zip(members, chunks, strict=True):
        entry = batch.record.setdefault(batch.trajs[i].id, {})
        entry["positions"], entry["logprobs"] = batch.positions[i], chunk


def note_advantages(batch: Any) -> None:
    """Keeps each trajectory's advantage (and PPO's per-token ones) in ``batch.record``."""
    if batch.record is None:
        return
    for i, t in enumerate(batch.trajs):
        entry = batch.record.setdefault(t.id, {})
        if batch.token_advantages:
            # a trajectory with no trained token gets no logprob pass, so its positions come here too
            entry.setdefault("positions", batch.positions[i])
            entry["token_advantages"] = batch.token_advantages[i].detach()
        else:
            entry["advantage"] = float(batch.advantages[i])


class RolloutLog:
    """Writes each step's trajectories to ``directory`` on a background thread."""

    def __init__(
        self, directory: str | Path, *, keep_steps: int | None = None, tokenizer: Any = None,
        resumed_at: int | None = None,
    ) -> None:  # fmt: skip
        """``resumed_at``: the step of the checkpoint the run resumes from; the files of later steps
        (trained, then lost with the crash) go, and their groups are logged again when retrained."""
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep_steps = keep_steps
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pqrl-rollout-log")
        self._pending: Future[Any] | None = None
        self.write_s: list[float] = []  # seconds per step file, for the bench
        self.bytes: list[int] = []  # bytes per step file
        self.rows: list[int] = []
        for tmp in self.dir.glob(".step-*.tmp"):  # a killed writer's unfinished file
            tmp.unlink(missing_ok=True)
        if resumed_at is not None:
            for lost in (s for s in logged_steps(self.dir) if s > resumed_at):
                step_file(self.dir, lost).unlink(missing_ok=True)
        if tokenizer is not None and not (self.dir / "vocab.json").exists():
            self._pending = self._pool.submit(_write_vocab, self.dir / "vocab.json", tokenizer)

    def submit(
        self, step: int, version: int, groups: Sequence[Sequence[Trajectory]], cfg: StepConfig,
        record: dict[str, dict[str, Any]] | None,
    ) -> None:  # fmt: skip
        """Queues step ``step``'s groups (read at policy ``version``); waits for the previous step's."""
        self.flush()
        self._pending = self._pool.submit(self._write, step, version, list(groups), cfg, record or {})

    def flush(self) -> None:
        """Waits for the queued write. A failed write is logged, never raised: it costs the log a
        step, not the run."""
        if self._pending is None:
            return
        try:
            self._pending.result()
        except Exception as e:  # noqa: BLE001 - disk full or the like: training goes on
            log.warning("rollout log: a step's file was not written: %s", e)
        self._pending = None

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)

    def _write(
        self, step: int, version: int, groups: list[Sequence[Trajectory]], cfg: StepConfig,
        record: dict[str, dict[str, Any]],
    ) -> None:  # fmt: skip
        import pyarrow.parquet as pq

        start = time.perf_counter()
        rows = [row for g in groups for row in _group_rows(step, version, g, cfg, record)]
        table = _table(rows)
        final = step_file(self.dir, step)
        tmp = final.with_name(f".{final.name}.tmp")
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as f:  # on disk before the rename: a power loss leaves no cut file
            os.fsync(f.fileno())
        os.replace(tmp, final)  # a reader sees the whole file or none
        self._trim(step)
        self.write_s.append(time.perf_counter() - start)
        self.bytes.append(final.stat().st_size)
        self.rows.append(len(rows))

    def _trim(self, step: int) -> None:
        if self.keep_steps is None:
            return
        for old in logged_steps(self.dir):
            if old <= step - self.keep_steps:
                step_file(self.dir, old).unlink(missing_ok=True)


def _group_rows(
    step: int, version: int, group: Sequence[Trajectory], cfg: StepConfig, record: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    group_drop = screen_group(group, version, cfg).dropped
    out = []
    for t in group:
        reason = drop_reason(t, version, cfg)
        if reason is None and group_drop is not None:
            reason = _GROUP_REASONS.get(group_drop, group_drop)
        out.append(_row(step, version, t, reason, record.get(t.id, {})))
    return out


def _row(step: int, version: int, t: Trajectory, reason: str | None, rec: dict[str, Any]) -> dict[str, Any]:
    gen = t.generated.astype(bool)
    calls = [c for u in t.turns for c in u.tool_calls]
    trainer_lp, token_adv, advantage = None, None, rec.get("advantage")
    if "logprobs" in rec:
        trainer_lp = _spread(t.num_tokens, rec["positions"], rec["logprobs"])
    if "token_advantages" in rec:  # PPO: per token; the row's advantage is their mean
        token_adv = _spread(t.num_tokens, rec["positions"], rec["token_advantages"])
        advantage = float(np.nanmean(token_adv)) if np.isfinite(token_adv).any() else None
    return {
        "step": step, "policy_version": version, "id": t.id, "run_id": t.run_id, "group_id": t.group_id,
        "task_id": t.task_id, "env": t.env, "status": t.status.value, "reward": t.reward,
        "reward_info": json.dumps(t.reward_info, default=str), "used": reason is None, "drop_reason": reason,
        "advantage": advantage,
        "staleness": int(version - t.versions[gen].min()) if gen.any() else None,
        "truncated": t.truncation is not None or t.status.value == "truncated",
        "truncation": None if (cut := t.truncation) is None else json.dumps(
            {"kind": cut.kind.value, "at_token": cut.at_token, "detail": cut.detail}
        ),
        "prompt_len": t.prompt_len, "num_tokens": t.num_tokens, "num_generated": t.num_generated,
        "num_turns": len(t.turns), "tool_calls": len(calls),
        "tool_errors": sum(c.status is not None and c.status.value != "ok" for c in calls),
        "turns": json.dumps([_turn(u) for u in t.turns], default=str),
        "timings": json.dumps(t.timings),
        "tokens": t.tokens, "loss_mask": t.loss_mask, "generated": t.generated,
        "behavior_logprobs": t.behavior_logprobs, "versions": t.versions,
        "trainer_logprobs": trainer_lp, "token_advantages": token_adv,
    }  # fmt: skip


def _spread(n: int, positions: np.ndarray, values: Any) -> np.ndarray:
    """Per-position values (a tensor or an array) as a length-``n`` array, NaN elsewhere."""
    if hasattr(values, "cpu"):
        values = values.float().cpu().numpy()
    out = np.full(n, np.nan, np.float32)
    out[positions] = values
    return out


def _turn(u: Any) -> dict[str, Any]:
    return {
        "start": u.start, "end": u.end, "finish_reason": u.finish_reason,
        "tool_calls": [
            {"name": c.name, "arguments": c.arguments, "status": None if c.status is None else c.status.value,
             "id": c.id, "error": c.error}
            for c in u.tool_calls
        ],
    }  # fmt: skip


def _write_vocab(path: Path, tokenizer: Any) -> None:
    """Each token id's text, decoded alone (a piece of a multi-byte character shows as U+FFFD)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(texts))
    os.replace(tmp, path)


_ARRAYS = {"tokens": "int32", "loss_mask": "uint8", "generated": "uint8", "behavior_logprobs": "float32",
           "versions": "int32", "trainer_logprobs": "float32", "token_advantages": "float32"}  # fmt: skip


@functools.cache
def schema() -> Any:
    """The table's schema (pyarrow is imported on first use: importing this module does not)."""
    import pyarrow as pa

    js = pa.string()  # JSON text: nested shapes vary by environment
    scalars = [
        ("step", pa.int32()), ("policy_version", pa.int32()), ("id", pa.string()), ("run_id", pa.string()),
        ("group_id", pa.string()), ("task_id", pa.string()), ("env", pa.string()), ("status", pa.string()),
        ("reward", pa.float64()), ("reward_info", js), ("used", pa.bool_()), ("drop_reason", pa.string()),
        ("advantage", pa.float64()), ("staleness", pa.int32()), ("truncated", pa.bool_()),
        ("truncation", js), ("prompt_len", pa.int32()), ("num_tokens", pa.int32()),
        ("num_generated", pa.int32()), ("num_turns", pa.int32()), ("tool_calls", pa.int32()),
        ("tool_errors", pa.int32()), ("turns", js), ("timings", js),
    ]  # fmt: skip
    return pa.schema(scalars + [(k, pa.list_(pa.from_numpy_dtype(np.dtype(v)))) for k, v in _ARRAYS.items()])


def _table(rows: list[dict[str, Any]]) -> Any:
    """The rows as a table, the token arrays column by column (one concatenation each, no Python
    loop over tokens)."""
    import pyarrow as pa

    sch = schema()
    columns = []
    for f in sch:
        values = [r[f.name] for r in rows]
        if f.name not in _ARRAYS:
            columns.append(pa.array(values, f.type))
            continue
        dtype = np.dtype(_ARRAYS[f.name])
        lens = np.array([0 if v is None else len(v) for v in values], np.int32)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        flat = np.concatenate([np.asarray(v, dtype) for v in values if v is not None] or [np.empty(0, dtype)])
        mask = pa.array([v is None for v in values]) if any(v is None for v in values) else None
        columns.append(pa.ListArray.from_arrays(offsets, pa.array(flat), type=f.type, mask=mask))
    return pa.Table.from_arrays(columns, schema=sch)
