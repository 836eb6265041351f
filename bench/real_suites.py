"""Repo suites generated from real PyPI projects' own tests (``pqrl tasks generate coding --from-sdist``).

Per project, from a cold start (a fresh pqrl cache: the sdist downloaded, no cached mutant outcome,
the project's images removed first): tasks kept / mutants tried, the environment and clean images'
build time cold and cached, the per-task image build, a cold and a warm sandbox start of a task
image, gold and empty grading time on a few tasks (repo-v1's grader in fresh sandboxes), and
``pqrl tasks validate --check`` over every task (gold must earn 1, the empty patch 0). Prints one
JSON line per project; the suites are written to a temporary folder (generated on demand, never in
the repository).

    python bench/real_suites.py [--projects more-itertools==10.5.0:40,toolz==0.12.1:25,boltons==24.0.0:45]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from bench.learning import short_commit  # noqa: E402
from bench.repo_images import warm_acquire_s  # noqa: E402
from env_server.pools import PoolSet  # noqa: E402
from sandboxes.docker import DockerSandbox  # noqa: E402
from sandboxes.docker_api import DockerAPI  # noqa: E402
from sandboxes.hardening import SandboxSettings  # noqa: E402
from tasks.repo.task import RepoTask  # noqa: E402

# NAME==VERSION:MAX_TASKS
PROJECTS = "boltons==24.0.0:50,inflection==0.5.1:20,more-itertools==10.5.0:35,toolz==0.12.1:10"
WORKERS = 3  # sandboxes running tests at once (the machine is shared: more gets a larger share)
GRADED = 4  # tasks whose gold and empty grading are timed one by one


def _say(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def _remove_images(name: str) -> None:
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"pqrl-repo-{name}*"],
                          capture_output=True, text=True).stdout.split()  # fmt: skip
    if tags:
        subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)


def _size(tag: str) -> int:
    out = subprocess.run(["docker", "image", "inspect", tag, "--format", "{{.Size}}"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return int(out.stdout)


async def _starts(image: str) -> dict[str, float]:
    pools = PoolSet(CollectorRegistry(), pool_size=1, max_warm=2, run="bench-real-suites", docker_api=None)
    settings = SandboxSettings(image=image, memory_mb=4096, workspace_mb=2048)
    try:
        pool, box = await pools.acquire(settings)
        cold = pools.cold_starts[image]
        pools.release(pool, box)
        warm = await warm_acquire_s(pools, pool, settings)
        return {"cold_start_s": round(cold, 3), "warm_start_s": round(warm, 4)}
    finally:
        await pools.close()
        if pools.docker_api is not None:
            await pools.docker_api.close()


async def _grades(tasks: list[RepoTask]) -> dict[str, object]:
    from tasks.repo.grading import grade_patch

    api = DockerAPI()
    gold, empty = [], []
    try:
        for task in tasks:
            settings = SandboxSettings(image=task.image, memory_mb=4096, workspace_mb=2048)
            make = lambda s=settings: DockerSandbox.create(api, s, run="bench-real-suites")  # noqa: E731
            for patch, into in ((task.patch or "", gold), ("", empty)):
                r = await grade_patch(task, patch.encode(), make, timeout=240)
                into.append((r.reward, r.info["grade_s"]))
    finally:
        await api.close()
    return {"grade_gold_s": round(sum(s for _, s in gold) / len(gold), 2),
            "grade_empty_s": round(sum(s for _, s in empty) / len(empty), 2),
            "graded_rewards": {"gold": [r for r, _ in gold], "empty": [r for r, _ in empty]}}  # fmt: skip


def _project(spec: str, max_tasks: int, out: Path) -> dict[str, object]:
    from tasks.check import check_suite
    from tasks.repo.generate import Options, _images, generate_tasks
    from tasks.repo.project import fetch_sdist, infer_requirements, load_project

    name = spec.split("==")[0]
    _remove_images(name)
    t0 = time.perf_counter()
    archive = fetch_sdist(spec)
    row: dict[str, object] = {"project": spec, "sdist_download_s": round(time.perf_counter() - t0, 1)}
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        project = load_project(archive, name, spec, Path(tmp, "tree"))
        reqs = tuple(infer_requirements(project))
        t0 = time.perf_counter()
        env_image, _ = _images(project, reqs, lambda m: None)
        row["env_clean_images_cold_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        _images(project, reqs, lambda m: None)
        row["env_clean_images_cached_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        result = generate_tasks(
            project, Options(max_tasks=max_tasks, requirements=reqs, workers=WORKERS), _say
        )
        row["generate_s"] = round(time.perf_counter() - t0, 1)
        keys = ("requirements", "baseline_tests", "test_files", "candidates", "tried", "kept", "mutant_s")
        row |= {k: result.stats[k] for k in (*keys, "files_per_mutant", "task_images_s")}
        # generation checks each task before keeping it: the time, and what it dropped and why
        row["generate_check_s"] = result.stats["check_s"]
        row["dropped_at_check"] = [d[:300] for d in result.stats["dropped"]]
        suite = result.suite
        (out / f"{name}.jsonl").write_text(suite.to_jsonl())
        t0 = time.perf_counter()
        again = generate_tasks(
            project, Options(max_tasks=max_tasks, requirements=reqs, workers=WORKERS), lambda m: None
        )
        row["rerun_s"] = round(time.perf_counter() - t0, 1)
        row["rerun_cached"] = f"{again.stats['cached']}/{again.stats['tried']}"
        row["rerun_same_suite"] = again.suite.to_jsonl() == suite.to_jsonl()
    tasks = [t for t in suite.tasks if isinstance(t, RepoTask)]
    row["env_image_mb"] = round(_size(env_image) / 1e6, 1)
    row["task_layer_mb"] = round((_size(tasks[0].image) - _size(env_image)) / 1e6, 2)
    row |= asyncio.run(_starts(tasks[0].image))
    row |= asyncio.run(_grades(tasks[:GRADED]))
    t0 = time.perf_counter()
    failures = asyncio.run(check_suite(suite, jobs=WORKERS, progress=lambda m: None))
    row["check_s"] = round(time.perf_counter() - t0, 1)
    row["check_gold_1"] = len(tasks) - sum("worked example" in f.reason for f in failures)
    row["check_empty_0"] = len(tasks) - sum("empty episode" in f.reason for f in failures)
    row["check_failures"] = [f"{f.task_id}: {f.reason[:200]}" for f in failures]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--projects", default=PROJECTS)
    args = ap.parse_args()
    cpu = subprocess.run("grep -o avx512_bf16 /proc/cpuinfo | head -1", shell=True, capture_output=True,
                         text=True).stdout.strip() or "no avx512_bf16"  # fmt: skip
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"# python bench/real_suites.py --projects {args.projects}")
    print(f"# commit {short_commit(ROOT)}; uptime: {uptime}; cpu: {cpu}, {os.cpu_count()} cores", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="bench-real-cache-") as cache,
        tempfile.TemporaryDirectory() as out,
    ):
        os.environ["PQRL_CACHE"] = cache  # cold: no sdist, no mutant outcome cached
        total = 0
        for item in args.projects.split(","):
            spec, _, most = item.partition(":")
            row = _project(spec, int(most or 40), Path(out))
            total += int(row["kept"])  # type: ignore[call-overload]
            print(json.dumps(row), flush=True)
    print(f"# {total} tasks in all", flush=True)


if __name__ == "__main__":
    main()
