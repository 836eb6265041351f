"""pqrl's synchronous GRPO step next to TRL's ``GRPOTrainer`` on the same work, in the same run.

Shape (the peer's): SmolLM2-135M-Instruct (pqrl's converted directory), 2 prompts x 8 completions of
at most 48 new tokens at T 0.7 (top_p 1, top_k off, stop at <|im_end|>), AdamW at lr 2e-5 (no
schedule), clip 0.2 / 0.28, beta 0 (no reference model), rewards 0/1 alternately inside each group
(every group trained), gradient checkpointing, 1 warm-up step + ``--steps`` timed, the median.
Both read the same prompts: the quickstart's calc tasks 0, 1, 2, ... (two worked examples, the
chat template), rendered by pqrl; step k takes tasks 2k and 2k+1 on both sides, and TRL is checked
to tokenize each prompt to exactly pqrl's ids.

    pqrl: bench/grpo_step.py's synchronous step of the variant ``model.dtype: auto`` runs here
          (bf16_matmul on a CPU that multiplies bfloat16 in hardware, else sharing): the built-in
          engine as its own process generates the 16 episodes over HTTP (prefix sharing on), then
          ``train_step`` (bfloat16 autocast, each group's prompt computed once), then the weight
          sync to the engine (checkpoint + reload); parts: generate / train / weight sync.
    TRL:  ``GRPOTrainer`` (bench/grpo_peer_trl.py, in a venv of its own) generates with
          transformers' ``generate`` on the training model itself (float32: TRL runs generation
          outside its autocast), scores, then one forward + backward of the 16 full sequences under
          bfloat16 autocast (``bf16=True``, where the CPU has it) and the AdamW step; no weight sync
          (one model). Parts: generate (``_generate_and_score_completions``) / the rest.

``--rounds`` repeats both, alternating which goes first; ``--threads`` (default: all cores) is the
thread count of each side (pqrl's engine and trainer both, which never run at once in a sync step).
The first run installs TRL_REQUIREMENTS into ``$PQRL_CACHE/venvs/trl-*`` (about 1 GB, a few minutes;
pqrl's .venv is not touched). Prints and appends to bench/results/grpo_peer_cpu.log a header
(command, commit, load, CPU) and a JSON line per side per round, then the medians and the ratio
pqrl/TRL of the step time. On a 2-core AVX512-BF16 machine a round at ``--steps 6`` took about 6
minutes (TRL's 7 steps of about 30 s, pqrl's of about 7 s, the engine's start), ``--rounds 2`` 13
minutes; TRL's process peaked near 9 GiB, so leave that much memory free.

    python bench/grpo_peer.py [--steps 6] [--rounds 1] [--first trl] [--threads N] [--log FILE]
                              [--min-available-gb 0.5] [--note TEXT]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before bench/, whose engine.py would shadow the engine package
from bench import grpo_step  # noqa: E402
from bench.learning import short_commit, tree_differs  # noqa: E402

TRL_REQUIREMENTS = ("torch==2.13.0", "trl==1.16.0", "transformers==5.25.0")  # torch pinned: the CPU build
TRL_RECIPE = 1  # bump when the install steps change
LOG = ROOT / "bench" / "results" / "grpo_peer_cpu.log"


def trl_venv() -> Path:
    """Where the TRL venv lives, keyed by its requirements, this Python and the recipe."""
    from pqrl.cache import cache_dir

    pyver = "{}.{}".format(*sys.version_info[:2])
    key = hashlib.sha256(f"{' '.join(TRL_REQUIREMENTS)} {pyver} {TRL_RECIPE}".encode()).hexdigest()[:16]
    trl = next(r for r in TRL_REQUIREMENTS if r.startswith("trl=="))
    return cache_dir("venvs") / f"trl-{trl.split('==')[1]}-py{pyver}-{key}"


def trl_python() -> Path:
    """The TRL venv's interpreter, installed first when missing (with a message: it takes minutes)."""
    venv = trl_venv()
    if not (venv / ".pqrl-complete").is_file():
        print(f"# installing {' '.join(TRL_REQUIREMENTS)} into {venv} (once; about 1 GB, a few minutes)",
              file=sys.stderr, flush=True)  # fmt: skip
        subprocess.run(["rm", "-rf", str(venv)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *TRL_REQUIREMENTS]
        if subprocess.run(pip).returncode != 0:
            raise SystemExit(f"could not install TRL into {venv}: see pip's output above")
        (venv / ".pqrl-complete").write_text(" ".join(TRL_REQUIREMENTS) + "\n")
    return venv / "bin" / "python"


async def _prompts(n: int) -> tuple[list[str], list[list[int]], str]:
    """The first ``n`` quickstart tasks' prompts as pqrl renders them (text and ids), and the model dir."""
    from agent_loop.agent import _new_builder
    from agent_loop.tool_parser import get_parser
    from env_server.client import LocalEnvClient
    from launcher.jobconfig import episode_config, load_config
    from loss_masking import ChatRenderer
    from pqrl.model_cache import load_tokenizer, prepare_model
    from tasks.storage import queued_task

    cfg = load_config(ROOT / "examples" / "quickstart.yaml")
    suite, env, episode = cfg.tasks.suites[0].build(), LocalEnvClient(), episode_config(cfg)
    tokenizer = load_tokenizer(cfg.model.name)
    renderer = ChatRenderer(tokenizer)
    texts, ids = [], []
    for k in range(n):
        q = queued_task(suite, k)
        opened = await env.create_session(q["env_id"], q["task"], seed=None, env_kwargs=q["env_kwargs"] or {})
        builder = _new_builder(renderer, opened.observation, episode, get_parser(episode.tool_parser))
        await env.close_session(opened.session_id)
        ids.append(list(builder.input_ids))
        texts.append(tokenizer.decode(ids[-1]))
    await env.aclose()
    return texts, ids, str(prepare_model(cfg.model.name))


def _gb(path: str, field: str) -> float:
    """A ``field:  N kB`` line of a /proc file, in GiB (0 when gone)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return 0.0
    return next((int(x.split()[1]) / 2**20 for x in text.splitlines() if x.startswith(field + ":")), 0.0)


def trl_side(python: Path, spec: dict[str, Any], min_available_gb: float) -> dict[str, Any]:
    """TRL's steps in its own process: the medians of the timed steps (the first is the warm-up) and
    the process's peak RSS. Stopped when the machine has less than ``min_available_gb`` left: on a
    shared machine the OOM killer would pick a process, perhaps another's."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f, tempfile.TemporaryFile("w+") as err:
        json.dump(spec, f)
        f.flush()
        env = os.environ | {"OMP_NUM_THREADS": str(spec["threads"]), "MKL_NUM_THREADS": str(spec["threads"]),
                            "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": ""}  # fmt: skip
        proc = subprocess.Popen([str(python), str(ROOT / "bench" / "grpo_peer_trl.py"), "--spec", f.name],
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, _gb(f"/proc/{proc.pid}/status", "VmRSS"))
            if _gb("/proc/meminfo", "MemAvailable") < min_available_gb:
                proc.kill()
                proc.wait()
                raise SystemExit(f"stopped TRL's process (resident {peak:.2f} GiB at most): the machine had "
                                 f"less than --min-available-gb {min_available_gb} GiB left")  # fmt: skip
            time.sleep(0.2)
        stdout = proc.stdout.read() if proc.stdout else ""
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"TRL's side failed (exit {proc.returncode}):\n{err.read()[-4000:]}")
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith('{"')]
    steps, info = lines[1:-1], lines[-1]  # the warm-up step left out
    versions = {k: info[k] for k in ("trl", "transformers", "torch")}
    return summary_trl(steps) | {"peak_rss_gib": round(peak, 2), "threads": info["threads"],
                                 "bf16_autocast": info["bf16"], "versions": versions,
                                 "gradient_checkpointing": info["checkpointing"]}  # fmt: skip


def summary_trl(steps: list[dict[str, float]]) -> dict[str, Any]:
    """Medians of TRL's timed steps: the whole step, generation, the rest (train), tokens per step."""
    return {
        "step_s": round(statistics.median(s["step_s"] for s in steps), 2),
        "generate_s": round(statistics.median(s["generate_s"] for s in steps), 2),
        "train_s": round(statistics.median(s["step_s"] - s["generate_s"] for s in steps), 2),
        "generated_tokens_per_step": round(statistics.mean(s["completion_tokens"] for s in steps), 1),
        "steps": len(steps),
    }


def pqrl_side(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """bench/grpo_step.py's synchronous steps of ``variant``, both processes at ``--threads``."""
    ns = argparse.Namespace(steps=args.steps, engine_threads=args.threads, trainer_threads=args.threads,
                            weights_dir=args.weights_dir, sync_only=True)  # fmt: skip
    r = asyncio.run(grpo_step._variant(ns, variant, ROOT))
    # this process's peak so far: the first pqrl round's is the trainer's (TRL runs in a child)
    r["trainer_peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    keys = ("cpu_autocast", "gradient_checkpointing", "generate_s", "train_s", "weight_sync_s",
            "generated_tokens_per_step", "mismatch_kl", "engine_prefill_tokens",
            "trainer_peak_rss_gib")  # fmt: skip
    return {"variant": variant, "step_s": r["sync_step_s"], "steps": args.steps} | {k: r.get(k) for k in keys}


def cpu_line() -> str:
    """The CPU's model, its cores and whether it multiplies bfloat16 in hardware."""
    info = Path("/proc/cpuinfo").read_text()
    model = next((x.split(":", 1)[1].strip() for x in info.splitlines() if x.startswith("model name")), "?")
    flags = sorted(set(info.split()) & {"avx512_bf16", "amx_bf16", "avx512f", "amx_tile"})
    return f"{model}, {os.cpu_count()} cores, {' '.join(flags) or 'no bf16 flags'}"


def main() -> None:
    from launcher.precision import cpu_bfloat16

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="timed steps after one warm-up step, each side")
    ap.add_argument("--rounds", type=int, default=1, help="runs of both sides, alternating which goes first")
    ap.add_argument("--first", choices=("trl", "pqrl"), default="trl", help="the side that starts round 0")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--weights-dir", default=grpo_step._default_weights_parent())
    ap.add_argument("--min-available-gb", type=float, default=0.5,
                    help="stop TRL's process when the machine has less memory left")  # fmt: skip
    ap.add_argument("--log", type=Path, default=LOG, help="appended to; '-' for none")
    ap.add_argument("--note", default="", help="said in the log's header (e.g. 'under load, not a claim')")
    args = ap.parse_args()
    python = trl_python()
    bf16 = cpu_bfloat16("auto")  # model.dtype: auto; TRL's bf16 autocast likewise where it runs in hardware
    variant = "bf16_matmul" if bf16 else "sharing"
    texts, ids, model = asyncio.run(_prompts(grpo_step.GROUPS * (args.steps + 1)))
    spec = {"model": model, "prompts": texts, "prompt_ids": ids, "steps": args.steps + 1,
            "threads": args.threads, "bf16": bf16, "prompts_per_step": grpo_step.GROUPS,
            "generations": grpo_step.G, "max_new_tokens": 48}  # fmt: skip
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    commit = short_commit(ROOT) + (" + uncommitted changes" if tree_differs(ROOT) else "")
    header = (f"## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC python bench/grpo_peer.py "
              f"{shlex.join(sys.argv[1:])}  (commit {commit}; "
              f"{cpu_line()}; load before {load}{'; ' + args.note if args.note else ''})")  # fmt: skip
    print(header, flush=True)
    lines, trl, pq = [header], [], []
    for r in range(args.rounds):
        order = ("trl", "pqrl") if args.first == "trl" else ("pqrl", "trl")
        for side in order if r % 2 == 0 else order[::-1]:
            res = trl_side(python, spec, args.min_available_gb) if side == "trl" else pqrl_side(args, variant)
            (trl if side == "trl" else pq).append(res)
            lines.append(json.dumps({"round": r, "side": side} | res))
            print(lines[-1], flush=True)
    trl_s = round(statistics.median(x["step_s"] for x in trl), 2)
    pq_s = round(statistics.median(x["step_s"] for x in pq), 2)
    lines.append(json.dumps({
        "pqrl_step_s": pq_s, "trl_step_s": trl_s, "ratio_pqrl_over_trl": round(pq_s / trl_s, 3),
        "ratio_by_round": [round(p["step_s"] / t["step_s"], 3) for p, t in zip(pq, trl, strict=True)],
        "rounds": args.rounds, "steps": args.steps, "threads": args.threads,
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }))  # fmt: skip
    print(lines[-1], flush=True)
    if str(args.log) != "-":
        with open(args.log, "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
