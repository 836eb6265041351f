"""``pqrl eval CHECKPOINT SUITE``: held-out pass@1 (greedy) and pass@k of a checkpoint, or with
``--model`` of any model (the cached base model, for comparison), each with a 95% interval over
tasks; infrastructure failures are counted apart (``agent_loop.evaluation``).

The engine (``--backend``: the built-in one, vLLM or SGLang; or a running one, ``--engine URL``)
and, for suites whose environment needs sandboxes, a private env server are started as ``pqrl
train`` starts them (``launcher.services``), watched, and stopped at the end. Progress goes to
stderr, the result table (or ``--json``) to stdout, one line per task to a JSONL file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.errors_cli import positive_int
from pqrl.errors import JobEnded, UsageError

__all__ = ["add_eval_arguments", "eval_command", "resolve_checkpoint"]

_UNSET = object()  # an episode flag not given: the run's setting (or the default) stands


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    from agent_loop.config import MAX_FAILED_INFRA, EpisodeConfig
    from launcher.engine_choice import add_backend_argument
    from launcher.model_io import add_template_arguments
    from pqrl.model_cache import DEFAULT_MODEL
    from pqrl.settings import add_arguments, fields_of

    p.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                   help="a checkpoint directory (RUN/checkpoints/step-N) or a run directory (its latest "
                        "checkpoint); leave out with --model")  # fmt: skip
    p.add_argument("suite", metavar="SUITE", help="the held-out tasks: a suite JSONL file")
    p.add_argument("--model", default=None,
                   help=f"evaluate this model instead: a Hugging Face model directory or {DEFAULT_MODEL!r} "
                        "(the cached base model)")  # fmt: skip
    p.add_argument("--k", type=positive_int, default=4,
                   help="pass@k: tries per task (default 4; 1: greedy only)")  # fmt: skip
    p.add_argument("--samples", type=positive_int, default=None,
                   help="sampled episodes per task, at least k (default k); more narrows pass@k")  # fmt: skip
    p.add_argument("--threshold", type=float, default=1.0, help="a reward at least this passes (default 1)")
    p.add_argument("--max-failed-infra", type=float, default=MAX_FAILED_INFRA,
                   help="report no pass rate when a larger share of the tasks failed on infrastructure "
                        f"(default {MAX_FAILED_INFRA:g})")  # fmt: skip
    p.add_argument("-o", "--output", default=None,
                   help="per-task outcomes, a JSON line each (default: eval-SUITENAME.jsonl)")  # fmt: skip
    p.add_argument("--engine-threads", type=positive_int, default=os.cpu_count() or 1,
                   help="CPU threads of the engine (default: every core)")  # fmt: skip
    p.add_argument("--engine", default=None, metavar="URL",
                   help="a running engine serving the model instead of one started here (CHECKPOINT or "
                        "--model still gives the tokenizer and the label)")  # fmt: skip
    add_backend_argument(p, starts=True)
    p.add_argument("--json", action="store_true", help="the result as one JSON object on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    # the episode's limits and sampling: the run's own (its config.yaml) unless given here
    add_arguments(p, EpisodeConfig)
    add_template_arguments(p)
    p.set_defaults(**{f.name: _UNSET for f in fields_of(EpisodeConfig)})


@dataclass(frozen=True)
class _Target:
    model: str  # what the engine serves: a model directory or the built-in name
    label: str  # what the table calls it
    run_dir: Path | None  # the run the checkpoint belongs to, when known


def resolve_checkpoint(path: str) -> tuple[Path, Path | None]:
    """The checkpoint ``path`` names (itself, or a run's or a checkpoint directory's latest) and its
    run directory when it lies in one; ``UsageError`` when it is neither."""
    from trainer.checkpoint import latest_checkpoint

    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{path}: no such directory", fix="give a checkpoint or a run directory")
    if any((p / "model" / f).is_file() for f in ("config.json", "adapter_config.json")):  # LoRA: an adapter
        ckpt = p
    else:
        found = next((d for d in (p / "checkpoints", p) if (d / "latest").is_file()), None)
        if found is None:
            if (p / "config.yaml").is_file():
                raise UsageError(f"{path}: the run has no checkpoint yet")
            raise UsageError(f"{path}: neither a checkpoint nor a run directory",
                             fix="give a model directory with --model")  # fmt: skip
        try:
            ckpt = latest_checkpoint(found)  # type: ignore[assignment]
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
    run_dir = ckpt.parent.parent
    return ckpt, run_dir if (run_dir / "config.yaml").is_file() else None


def _target(args: argparse.Namespace) -> _Target:
    from pqrl.model_cache import ModelNotAvailable, prepare_model

    if (args.checkpoint is None) == (args.model is None):
        raise UsageError("give a CHECKPOINT or --model MODEL (one of them)")
    if args.model is not None:
        try:
            path = prepare_model(args.model)
        except ModelNotAvailable as e:
            raise UsageError(str(e)) from None
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise UsageError(f"{args.model}: not a Hugging Face model directory (no config.json)")
        return _Target(args.model, args.model, None)
    ckpt, run_dir = resolve_checkpoint(args.checkpoint)
    return _Target(str(ckpt / "model"), str(ckpt), run_dir)


def _run_model(run_dir: Path | None) -> Any:
    """The run's ``model`` section (its template settings), or None without a run."""
    from launcher.jobconfig import ConfigInvalid, load_config

    if run_dir is None:
        return None
    try:
        return load_config(run_dir / "config.yaml").model
    except ConfigInvalid:
        return None


def _episode(args: argparse.Namespace, run_dir: Path | None) -> Any:
    """The run's episode settings (so the evaluation samples as training did), the flags given over them."""
    from agent_loop.config import EpisodeConfig
    from launcher.jobconfig import ConfigInvalid, episode_config, load_config
    from pqrl.settings import fields_of

    base = EpisodeConfig()
    if run_dir is not None:
        with contextlib.suppress(ConfigInvalid):  # a config of another version: the defaults stand
            base = episode_config(load_config(run_dir / "config.yaml"))
    given = {
        f.name: getattr(args, f.name) for f in fields_of(EpisodeConfig) if getattr(args, f.name) is not _UNSET
    }
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    cfg = replace(base, **given)
    return cfg if cfg.seed is not None else replace(cfg, seed=0)  # the same samples every time


def _checked(args: argparse.Namespace) -> Any:
    """The suite, after the numbers are checked."""
    from tasks.suite import SuiteInvalid, load_suite

    if args.samples is not None and args.samples < args.k:
        raise UsageError(f"need samples >= k, got k={args.k}, samples={args.samples}")
    if not 0 <= args.max_failed_infra <= 1:
        raise UsageError(f"--max-failed-infra must be between 0 and 1, got {args.max_failed_infra}")
    try:
        return load_suite(args.suite)
    except SuiteInvalid as e:
        first = e.problems[0] if e.problems else "invalid"
        raise UsageError(f"{args.suite}: {len(e.problems)} problem(s), the first: {first}",
                         fix=f"pqrl tasks validate {args.suite} lists them all") from None  # fmt: skip


def eval_command(args: argparse.Namespace) -> int:
    """Exit 0 with a result; 1 (``JobEnded``) when no pass rate can be reported; 2 on bad input (the
    command line's handler prints a failure as its one line)."""
    from launcher.children import Children
    from launcher.engine_choice import started_engine
    from launcher.services import env_server_process, needing_sandbox

    suite = _checked(args)
    target = _target(args)
    cfg = _episode(args, target.run_dir)
    output = Path(args.output or f"eval-{suite.manifest.name}.jsonl")
    logs = Path(tempfile.mkdtemp(prefix="pqrl-eval-"))  # the services' logs, kept if anything fails
    children = Children(quiet=args.quiet, command="pqrl eval")
    with contextlib.ExitStack() as stack:
        threads = args.engine_threads
        url = args.engine or stack.enter_context(
            started_engine(target.model, args.backend, logs / "engine.log", children, threads=threads)
        )
        env_url = token = None
        if needing_sandbox([suite.manifest.env_id]):
            token, pool = secrets.token_urlsafe(24), min(8, len(suite.tasks))
            server = env_server_process(logs / "env_server.log", token, pool, run=f"eval-{os.getpid()}",
                                        children=children)  # fmt: skip
            env_url = stack.enter_context(server)
        result = asyncio.run(_evaluate(suite, url, env_url, token, target, cfg, args, children))
        if (died := children.death()) is not None:  # the cause of the failures, not their symptom
            raise died
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps(t.record(args.k, args.threshold)) + "\n" for t in result.tasks))
    shutil.rmtree(logs, ignore_errors=True)
    if "eval/pass@1" in result.refused:  # one line: pass@k, from the same episodes, has none either
        raise JobEnded(f"no pass rate: {result.refused['eval/pass@1']}", fix=f"per-task outcomes in {output}")
    for name, why in result.refused.items():
        print(f"pqrl eval: no {name.removeprefix('eval/')} reported: {why}", file=sys.stderr)
    report = _report(result, target, suite, args, output)
    print(json.dumps(report) if args.json else _table(report))
    return 0


async def _evaluate(
    suite: Any, url: str, env_url: str | None, token: str | None, target: _Target, cfg: Any,
    args: argparse.Namespace, children: Any,
) -> Any:  # fmt: skip
    from agent_loop.evaluation import evaluate
    from env_server.client import HttpEnvClient, LocalEnvClient
    from launcher.engine_choice import connect_engines
    from launcher.model_io import renderer_from_args

    engine = None
    env = HttpEnvClient([env_url], token=token) if env_url else LocalEnvClient()
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:  # a line redrawn on a terminal, else one per tenth
        if not args.quiet and (done % max(1, total // (20 if tty else 10)) == 0 or done == total):
            start, end = ("\r", "\n" if done == total else "") if tty else ("", "\n")
            print(f"{start}pqrl eval: {done}/{total} episodes", end=end, file=sys.stderr, flush=True)

    try:
        engine = await connect_engines(url, args.backend, children)
        renderer = renderer_from_args(args, target.model, _run_model(target.run_dir))
        return await evaluate(suite, engine=engine, env=env, renderer=renderer, cfg=cfg, k=args.k,
                              samples=args.samples, pass_threshold=args.threshold,
                              max_failed_infra=args.max_failed_infra, progress=progress)  # fmt: skip
    finally:
        if engine is not None:
            await engine.aclose()
        await env.aclose()


def _report(
    result: Any, target: _Target, suite: Any, args: argparse.Namespace, output: Path
) -> dict[str, Any]:
    m = result.metrics
    out: dict[str, Any] = {
        "model": target.label,
        "suite": suite.id,
        "tasks": int(m["eval/tasks"]),
        "tasks_run": int(m["eval/tasks_run"]),
        "failed_infra": int(m["eval/failed_infra"]),
        "episodes": sum(1 + len(t.samples) for t in result.tasks),
        "k": args.k,
        "pass@1": m["eval/pass@1"],
        "pass@1_ci95": [m["eval/pass@1_low"], m["eval/pass@1_high"]],
        "pass@1_interval": "wilson",
    }
    if args.k > 1:
        out |= {"samples": max(args.samples or args.k, args.k), "tasks_run@k": int(m["eval/tasks_run@k"])}
        if "eval/pass@k" in m:
            name = f"pass@{args.k}"
            out |= {name: m["eval/pass@k"], f"{name}_ci95": [m["eval/pass@k_low"], m["eval/pass@k_high"]],
                    f"{name}_interval": "bootstrap"}  # fmt: skip
    refused = {k.removeprefix("eval/").replace("@k", f"@{args.k}"): v for k, v in result.refused.items()}
    return out | ({"refused": refused} if refused else {}) | {"outcomes": str(output)}


def _table(r: dict[str, Any]) -> str:
    def rate(name: str, how: str, over: str) -> str:
        if name not in r:
            return f"{name:<10}none: {r['refused'][name]}"
        lo, hi = r[f"{name}_ci95"]
        return f"{name:<10}{r[name]:.3f}   95% CI [{lo:.3f}, {hi:.3f}] ({how})   over {over}"

    lines = [f"{'model':<10}{r['model']}", f"{'suite':<10}{r['suite']} ({r['tasks']} tasks)",
             rate("pass@1", "Wilson", f"{r['tasks_run']} of {r['tasks']} tasks (greedy)")]  # fmt: skip
    if r["k"] > 1:
        over = f"{r['tasks_run@k']} of {r['tasks']} tasks ({r['samples']} samples each)"
        lines.append(rate(f"pass@{r['k']}", "bootstrap over tasks", over))
    lines += [f"{'infra':<10}{r['failed_infra']} of {r['episodes']} episodes failed on infrastructure",
              f"{'outcomes':<10}{r['outcomes']}"]  # fmt: skip
    return "\n".join(lines)
