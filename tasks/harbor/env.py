"""``harbor-v1``: a Harbor task in a sandbox of its own image, graded by its verifier script.

Reset copies the image's working directory (kept aside by the layer of tasks/harbor/image.py) into
``/workspace`` and gives the agent ``instruction.md`` and the shell tools of shell-v1: ``run``,
``read_file``, ``write_file``, ``submit``. Grading, as Harbor does it: after the agent, in the same
sandbox, the task's ``tests/`` are copied to ``/tests`` (never there before), ``test.sh`` runs with
the verifier's timeout, and the reward is the number it wrote to ``/logs/verifier/reward.txt``.
Grading ends the episode: once the tests were in the sandbox, the agent gets no further turn.
"""

from __future__ import annotations

import math
from typing import Any

from env_server import Message, RewardResult
from env_server.builtin import ShellEnv
from env_server.types import Observation, ToolCall
from sandboxes.hardening import SandboxSettings
from sandboxes.image import ImageBuildError
from sandboxes.protocol import SandboxError
from tasks.coding.env import _tar as tar_files
from tasks.harbor.image import HARBOR_ROOT, SEED_DIR, fitted
from tasks.harbor.task import TESTS_DIR, HarborTask

__all__ = ["HarborEnv", "parse_reward"]

_SOLVE = "/tmp/pqrl-solve.sh"

SYSTEM = """\
You are working in a Linux sandbox (no network); your working directory is /workspace. Tools:
- run: runs a shell command
- read_file / write_file: read or replace a whole file
- submit: call it when you are done; the task's hidden tests then check the result"""


def parse_reward(text: str) -> tuple[float, str]:
    """(reward, reason): the number in the reward file if it is one in [0, 1], else 0 and why."""
    value = text.strip()
    try:
        reward = float(value)
    except ValueError:
        return 0.0, f"the reward file holds {value[:80]!r}, not a number"
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        return 0.0, f"the reward file holds {value[:80]!r}, not a number in [0, 1]"
    return reward, ""


class HarborEnv(ShellEnv):
    """Task: a HarborTask dict. Reward: what its verifier (tests/test.sh) writes to the reward file."""

    task_model = HarborTask
    reward_names = ("verifier",)

    @classmethod
    def sandbox_settings_for(cls, task: dict[str, Any]) -> SandboxSettings:
        image = HarborTask.model_validate(task).image
        try:  # an imported task's image is fitted already; another is fitted on first use
            return SandboxSettings(image=fitted(image))
        except ImageBuildError as e:
            raise ValueError(f"image {image} cannot run as a Harbor sandbox: {str(e)[-300:]}") from None

    @classmethod
    def worked_example(cls, task: dict[str, Any]) -> list[ToolCall] | None:
        """The oracle: solution/solve.sh written into the sandbox, run, then submit."""
        t = HarborTask.model_validate(task)
        if t.solution is None:
            return None
        return [ToolCall(name="write_file", arguments={"path": _SOLVE, "content": t.solution}, id="w1"),
                ToolCall(name="run", arguments={"command": f"bash {_SOLVE}", "timeout": 300}, id="w2"),
                ToolCall(name="submit", arguments={}, id="w3")]  # fmt: skip

    async def reset(self, *, task: dict[str, Any], seed: int | None = None) -> Observation:
        self.task = HarborTask.model_validate(task)
        self.result: RewardResult | None = None
        seed_cmd = f"if [ -d {SEED_DIR} ]; then cp -a {SEED_DIR}/. /workspace/; fi"
        setup = await self.sandbox.exec(seed_cmd, timeout=120)
        if not setup.ok:
            # the task's to fix (its working directory does not fit /workspace, say), not the sandbox's
            raise ValueError(
                f"copying the image's working directory to /workspace failed: {setup.text()[-500:]}"
            )
        return self.observation(
            [Message(role="system", content=SYSTEM), Message(role="user", content=self.task.instruction)]
        )

    async def evaluate(self) -> RewardResult:
        if self.result is None:
            self.done = True  # the tests are in the sandbox from now on: no further turn
            self.result = await self._verify()
        return self.result

    async def _verify(self) -> RewardResult:
        t = self.task
        info: dict[str, Any] = {"task_id": t.id}
        # whatever the agent left at these paths is discarded: a fresh tree, then the tests
        dirs = " ".join(f"{HARBOR_ROOT}/{d}" for d in ("tests", "logs/verifier", "logs/agent"))
        fresh = f"rm -rf {HARBOR_ROOT} && mkdir -p {dirs}"
        made = await self.sandbox.exec(fresh, timeout=60)
        if not made.ok:
            return RewardResult(
                reward=0.0, info={**info, "reason": f"preparing {HARBOR_ROOT} failed: {made.text()[-300:]}"}
            )
        try:
            await self.sandbox.upload(tar_files(t.tests), f"{HARBOR_ROOT}/tests")
        except SandboxError:
            raise
        except Exception as e:  # the agent's doing (a full /tmp, say): it scores 0
            return RewardResult(reward=0.0, info={**info, "reason": f"copying the tests in failed: {e}"})
        run = await self.sandbox.exec(
            f"chmod -R a+rx {TESTS_DIR}/; if command -v bash >/dev/null; then bash {TESTS_DIR}/test.sh;"
            f" else sh {TESTS_DIR}/test.sh; fi",
            timeout=t.verifier_timeout_s,
            cwd="/workspace",
        )
        info.update(verifier_exit_code=run.exit_code, verifier_output=run.text()[-2000:])
        if run.timed_out:
            return RewardResult(
                reward=0.0, info={**info, "reason": f"the verifier ran past {t.verifier_timeout_s:g}s"}
            )
        reward_path = HARBOR_ROOT + t.reward_file  # /logs is a link to HARBOR_ROOT/logs
        try:
            text = (await self.sandbox.read_file(reward_path, max_bytes=4096)).decode("utf-8", "replace")
        except SandboxError:
            raise
        except Exception as e:  # no reward file (or not a regular file): the verifier gave no reward
            return RewardResult(reward=0.0, info={**info, "reason": f"no reward file {t.reward_file}: {e}"})
        reward, reason = parse_reward(text)
        return RewardResult(reward=reward, info={**info, **({"reason": reason} if reason else {})})
