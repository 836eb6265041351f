"""Experiment trackers (``train.report_to``): each logged step's metrics, the run manifest as the
run's config, and a table of a few sampled episodes per step, mirrored to W&B.

W&B runs offline (``mode="offline"``, files under RUN_DIR/wandb; ``wandb sync`` uploads them later),
so a job never needs a network or an account. The rollout log is written in the background, so a
step's episodes are tabled once its Parquet file is finished, at a later step or at close.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pqrl.errors import UsageError

__all__ = ["TRACKERS", "Trackers", "episode_rows", "require"]

log = logging.getLogger(__name__)

TRACKERS = ("wandb",)
# the columns of the episode table: the rollout log's scalars a reader scans first
EPISODE_COLUMNS = ("step", "task_id", "env", "status", "reward", "used", "drop_reason", "num_turns",
                   "num_generated", "turns")  # fmt: skip


def episode_rows(parquet: Path, *, per_step: int) -> list[list[Any]]:
    """Up to ``per_step`` episodes of one rollout-log file, spread over its groups (first of each)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet, columns=list(EPISODE_COLUMNS)).to_pylist()
    picked = rows[:: max(1, len(rows) // per_step)][:per_step] if per_step > 0 else []
    return [[r[c] for c in EPISODE_COLUMNS] for r in picked]


def require(report_to: Sequence[str]) -> None:
    """Start-up check: every named tracker's package imports (UsageError naming the extra)."""
    for name in report_to:
        if name not in TRACKERS:
            raise UsageError(
                f"train.report_to: unknown tracker {name!r}", fix=f"one of {', '.join(TRACKERS)}"
            )
        try:
            __import__(name)
        except ImportError:
            raise UsageError(
                f"train.report_to names {name} but the {name} package is not installed",
                fix=f"pip install 'pqrl[{name}]', or leave {name} out of train.report_to",
            ) from None


class Trackers:
    """The configured trackers of one run; ``log`` after each metrics line, ``close`` at the end."""

    def __init__(
        self,
        run_dir: str | Path,
        report_to: Sequence[str],
        *,
        name: str,
        config: dict[str, Any],
        rollout_dir: str | Path | None = None,
        episodes_per_step: int = 4,
    ) -> None:
        self.dir, self.rollout_dir = Path(run_dir), rollout_dir and Path(rollout_dir)
        self.per_step, self._tabled, self._last = episodes_per_step, -1, 0
        self._wandb: Any = None
        require(report_to)
        if "wandb" in report_to:
            import wandb

            (self.dir / "wandb").mkdir(parents=True, exist_ok=True)
            self._wandb = wandb.init(
                mode="offline", dir=str(self.dir), project="pqrl", name=name, config=config,
                # no host metadata, git or code: the command line can hold a Redis password, and
                # the manifest (secrets redacted) is already the run's record of how it was made
                settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True,
                                        disable_git=True, disable_code=True),
            )  # fmt: skip

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Logs ``metrics`` at ``step``; never raises: a tracker's failure must not end training."""
        if self._wandb is None:
            return
        if self._tabled < 0:  # a resumed run tables from here on, not every step the log kept
            self._tabled = step - 1
        self._last = max(self._last, step)
        try:
            self._wandb.log(dict(metrics) | self._episode_tables(), step=self._last)
        except Exception as e:  # noqa: BLE001 - metrics.jsonl and TensorBoard still have the step
            log.warning("the experiment tracker could not log step %d: %r", step, e)

    def _episode_tables(self) -> dict[str, Any]:
        """One table of the episodes of every rollout-log step not yet tabled (its file finished)."""
        if self.rollout_dir is None or self.per_step <= 0:
            return {}
        import wandb

        from trainer.rollout_log import logged_steps, step_file

        rows = []
        for s in logged_steps(self.rollout_dir):
            if s > self._tabled:
                try:  # the log's retention may remove an old step's file while it is read here
                    rows += episode_rows(step_file(self.rollout_dir, s), per_step=self.per_step)
                except Exception as e:  # noqa: BLE001 - a table row less, never a failed step
                    log.warning("no episode table for step %d: %r", s, e)
                self._tabled = s
        return {"rollout/episodes": wandb.Table(columns=list(EPISODE_COLUMNS), data=rows)} if rows else {}

    def close(self) -> None:
        """Finishes the runs (idempotent); never raises: training is done by now, and its summary,
        curves and status must still be written."""
        if self._wandb is None:
            return
        run, self._wandb = self._wandb, None
        try:
            if tables := self._episode_tables():  # the steps whose files finished after the last log
                run.log(tables, step=self._last)
            run.finish()
        except Exception as e:  # noqa: BLE001 - the offline run may be cut short; the job is not
            log.warning("the experiment tracker could not finish its run: %r", e)
        finally:
            import wandb

            wandb.teardown()  # its wandb-core service would otherwise live as long as this process
