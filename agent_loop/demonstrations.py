"""Expert demonstrations for the supervised cold start, recorded through the real agent loop.

A 135M model rarely writes a well-formed ``<tool_call>`` on its own, so RL on calc gets no signal
until supervised fine-tuning teaches the format. The demonstrations come from ``run_episode`` itself,
driven by a scripted expert in place of the engine: the expert writes each assistant turn as text,
the real environment (in-process, ``LocalEnvClient``) parses nothing of it but runs the calls the
agent loop parsed and grades the episode, and the tokens and masks come from the same
``EpisodeBuilder`` path RL uses. So SFT trains on exactly the token layout RL will see later.

NOTE: the expert's tokens are the canonical tokenization of its text plus the stop token, marked
generated (loss mask 1) with behaviour logprob 0 and version 0: the trainer sees them as a policy
sample with probability one. Prompts, observations and the closing newline stay mask 0.

Deliberately left out: demonstrations for other suites (a ``Script`` is all one needs), several
calculator steps per task, and mistakes-and-recovery demonstrations.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from agent_loop.agent import EpisodeConfig, run_episode
from agent_loop.tool_parser import DEFAULT_PARSER, get_parser, tool_call_text
from engine.protocol import Engine, FinishReason, Generation, SamplingParams
from env_server.client import EnvClient, LocalEnvClient
from env_server.registry import spec
from env_server.sessions import SessionManager
from env_server.types import ToolCall
from loss_masking import ChatRenderer
from pqrl import codec
from pqrl.trajectory import Status, Trajectory
from tasks.calc import calc_suite
from tasks.storage import queued_task
from tasks.suite import Suite, load_suite

__all__ = [
    "DEFAULT_CALC_SEED",
    "ExpertEngine",
    "acalc_demonstrations",
    "asuite_demonstrations",
    "calc_demonstrations",
    "calc_expert",
    "read_demonstrations",
    "resolve_demonstrations",
    "tool_call_text",
    "worked_example_expert",
    "write_demonstrations",
]

# Demonstration tasks are drawn from this seed unless told otherwise; evaluations use other seeds.
DEFAULT_CALC_SEED = 1000

_INFRA_TRIES = 3  # runs of one demonstration whose session or sandbox failed (failed_infra)

# A script maps (turn index, text the expert has not seen yet) to the next assistant turn's text.
Script = Callable[[int, str], str]


class ExpertEngine(Engine):
    """A scripted policy implementing ``engine.protocol.Engine``, the interface ``run_episode`` calls.

    Each turn, the expert reads the tokens added since its previous turn (the prompt, then each
    observation), asks its script for the next assistant text, and returns that text's tokens plus
    the stop token, as an engine that sampled them with probability one would.

    Args:
        renderer: the chat renderer RL uses (its tokenizer encodes the expert's text).
        script: the expert's policy for one episode.
        stop_id: the token an engine stops at; the template's first closing token by default.
    """

    def __init__(self, renderer: ChatRenderer, script: Script, *, stop_id: int | None = None) -> None:
        self.renderer = renderer
        self.script = script
        self.stop_id = renderer.closing_ids[0] if stop_id is None else stop_id
        self.turn = 0
        self._seen = 0

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        rollout_id: str | None = None,
    ) -> Generation:
        params = sampling_params or SamplingParams()
        new_text = self.renderer.decode(input_ids[self._seen :])
        text = self.script(self.turn, new_text)
        output = [*self.renderer.encode(text), self.stop_id]
        if len(output) > params.max_new_tokens:
            raise ValueError(f"the expert's turn of {len(output)} tokens exceeds {params.max_new_tokens}")
        self.turn += 1
        self._seen = len(input_ids) + len(output)
        return Generation(
            output_ids=output,
            logprobs=[0.0] * len(output),
            versions=[0] * len(output),
            finish_reason=FinishReason(type="stop", matched=self.stop_id),
            text=text,
            prompt_tokens=len(input_ids),
            segments=1,
            server="expert",
        )

    def release(self, rollout_id: str) -> None:
        """Nothing to release: the expert keeps no per-request state on a server."""


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def calc_expert(expression: str, parser: str = DEFAULT_PARSER) -> Script:
    """The calc expert: calculator on the task's expression, then answer with what the tool printed,
    each call written in ``parser``'s format (the format the policy will be trained to write)."""
    fmt = get_parser(parser)

    def script(turn: int, new_text: str) -> str:
        if turn == 0:
            return fmt.render([{"name": "calculator", "arguments": {"expression": expression}}])
        # The observation delta ends with the tool's output and the template's glue around it.
        numbers = _NUMBER.findall(new_text)
        if turn != 1 or not numbers:
            raise RuntimeError(f"calc expert: no calculator result in turn {turn}'s input {new_text!r}")
        return fmt.render([{"name": "answer", "arguments": {"value": numbers[-1]}}])

    return script


async def _expert_episodes(
    suite: Suite,
    scripts: Sequence[Script],
    renderer: ChatRenderer,
    env: EnvClient | None,
    cfg: EpisodeConfig | None,
) -> list[Trajectory]:
    """The first ``len(scripts)`` tasks of ``suite``, each played by its script through the real
    agent loop and environment; each must earn 1 (else the expert and the environment disagree)."""
    own = env is None
    client = LocalEnvClient(SessionManager(pool_size=0)) if env is None else env
    out = []
    try:
        for k, script in enumerate(scripts):
            task = suite.tasks[k]
            for _ in range(_INFRA_TRIES):  # a sandbox that would not open is no verdict on the expert
                t = await run_episode(
                    queued_task(suite, k),
                    engine=ExpertEngine(renderer, script),
                    env=client,
                    renderer=renderer,
                    run_id="demonstrations",
                    group_id=f"demo-{task.id}",
                    cfg=cfg,
                )
                if t.status is not Status.FAILED_INFRA:
                    break
            if t.status is not Status.COMPLETED or t.reward != 1.0:
                raise RuntimeError(f"expert on {task.id}: reward {t.reward} ({t.status}), {t.reward_info}")
            out.append(t)
    finally:
        if own:
            await client.aclose()
    return out


async def acalc_demonstrations(
    n: int,
    seed: int,
    renderer: ChatRenderer,
    *,
    shots: int = 1,
    env: EnvClient | None = None,
    cfg: EpisodeConfig | None = None,
) -> list[Trajectory]:
    """``n`` expert calc episodes graded by the real environment (see ``calc_demonstrations``)."""
    suite = calc_suite(n, seed, shots=shots)
    parser = (cfg or EpisodeConfig()).tool_parser
    scripts = [calc_expert(task.expression, parser) for task in suite.tasks]  # type: ignore[union-attr]
    return await _expert_episodes(suite, scripts, renderer, env, cfg)


def worked_example_expert(calls: Sequence[ToolCall], parser: str = DEFAULT_PARSER) -> Script:
    """The expert of any environment: its worked example for the task (``worked_example``, the
    calls ``pqrl tasks validate --check`` runs), one call a turn, in ``parser``'s format."""
    fmt = get_parser(parser)

    def script(turn: int, new_text: str) -> str:
        if turn >= len(calls):
            raise RuntimeError(
                f"the worked example has {len(calls)} calls; the episode asked for turn {turn + 1}"
            )
        return fmt.render([{"name": calls[turn].name, "arguments": calls[turn].arguments}])

    return script


async def asuite_demonstrations(
    path: str | Path,
    n: int,
    renderer: ChatRenderer,
    *,
    env: EnvClient | None = None,
    cfg: EpisodeConfig | None = None,
) -> list[Trajectory]:
    """Expert episodes on the first ``n`` tasks of the suite file at ``path``: each task's worked
    example played through the real environment (in sandboxes, for one that needs them), in the
    token layout RL produces. The cold start for a suite a small model cannot call tools on yet."""
    suite = load_suite(path)
    cls = spec(suite.manifest.env_id).load()
    parser = (cfg or EpisodeConfig()).tool_parser
    scripts = []
    for task in suite.tasks[:n]:
        calls = cls.worked_example(task.model_dump())
        if not calls:
            raise ValueError(f"{path}: {suite.manifest.env_id} gives no worked example for task {task.id}")
        scripts.append(worked_example_expert(calls, parser))
    return await _expert_episodes(suite, scripts, renderer, env, cfg)


def calc_demonstrations(
    n: int,
    seed: int,
    renderer: ChatRenderer,
    *,
    shots: int = 1,
    cfg: EpisodeConfig | None = None,
) -> list[Trajectory]:
    """Expert Trajectories on ``calc_suite(n, seed, shots=shots)``, in the layout RL produces.

    Args:
        n: number of tasks (one demonstration each).
        seed: the suite's seed; keep it apart from the seeds of evaluation suites.
        renderer: the chat renderer of the model to be trained.
        shots: worked examples in the prompt, as in the RL suite (calc default 1).
        cfg: episode limits; the agent loop's defaults otherwise.

    Raises:
        RuntimeError: an expert episode did not complete with reward 1 (the environment disagrees
            with the expert: a bug on one side, never a demonstration to train on).
    """
    return asyncio.run(acalc_demonstrations(n, seed, renderer, shots=shots, cfg=cfg))


def write_demonstrations(path: str | Path, trajectories: Sequence[Trajectory]) -> Path:
    """Writes the records as one ``pqrl.codec`` blob (the format of the Redis stream)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(codec.encode_many(list(trajectories)))
    return path


def read_demonstrations(path: str | Path) -> list[Trajectory]:
    """The records of a file written by ``write_demonstrations``."""
    return codec.decode_many(Path(path).read_bytes())


def resolve_demonstrations(
    spec: str, renderer: ChatRenderer, tool_parser: str = DEFAULT_PARSER
) -> list[Trajectory]:
    """Demonstrations from a spec: ``calc:N`` or ``calc:N:SEED`` built in place, ``suite:PATH[:N]``
    (the worked examples of a suite file's first N tasks), else a file path.

    Built ones are rendered by ``renderer`` (the model's template and kwargs) with every call
    written in ``tool_parser``'s format: the format the RL job parses. ``calc:N`` uses
    ``DEFAULT_CALC_SEED``. Pass this to ``launcher.sft_command.sft_command`` as its loader.
    """
    if spec.startswith("suite:"):  # suite:PATH or suite:PATH:N (the first N tasks; all by default)
        path, _, n = spec[len("suite:") :].rpartition(":")
        path, n = (path, n) if n.isdigit() and path else (spec[len("suite:") :], "")
        # a worked example writes whole files (a gold patch, say): no turn limit of a sampled policy
        cfg = EpisodeConfig(
            max_new_tokens=8192, max_total_tokens=32768, max_turns=32, tool_parser=tool_parser
        )
        return asyncio.run(asuite_demonstrations(path, int(n) if n else 1 << 30, renderer, cfg=cfg))
    if spec.startswith("calc:"):
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[1:]):
            raise ValueError(f"demonstrations {spec!r}: expected calc:N or calc:N:SEED")
        seed = int(parts[2]) if len(parts) == 3 else DEFAULT_CALC_SEED
        return calc_demonstrations(int(parts[1]), seed, renderer, cfg=EpisodeConfig(tool_parser=tool_parser))
    return read_demonstrations(spec)
