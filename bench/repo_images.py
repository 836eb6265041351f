"""A repository version's image from a real PyPI sdist that ships its tests, and its sandboxes.

Downloads the sdist on the host (``tasks.repo.project.fetch_sdist``), builds its recipe (plus one
dependency, installed on the host for the image's Python) cold and then cached, and measures the
image's size, a cold sandbox start (a new pool's first acquire) against warm ones, and the
project's own test suite run in the sandbox with no network. Prints one JSON line; append it to
bench/results/repo_images.log with the header lines it prints.

    python bench/repo_images.py [--project more-itertools==10.5.0] [--dependency pytest-timeout==2.3.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from bench.learning import short_commit  # noqa: E402
from env_server.pools import PoolSet  # noqa: E402
from sandboxes.hardening import SandboxSettings  # noqa: E402
from sandboxes.recipes import RepoRecipe, build_recipe, recipe_tag  # noqa: E402
from tasks.repo.project import fetch_sdist  # noqa: E402

WARM_RUNS = 5


def _size_mb(tag: str) -> float:
    out = subprocess.run(["docker", "image", "inspect", tag, "--format", "{{.Size}}"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return int(out.stdout) / 1e6


async def warm_acquire_s(pools: PoolSet, pool: Any, settings: SandboxSettings) -> float:
    """The median of WARM_RUNS acquires of ``settings`` once ``pool`` has a spare ready."""
    warm = []
    for _ in range(WARM_RUNS):
        deadline = time.monotonic() + 60
        while pool.idle < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        pool, sandbox = await pools.acquire(settings)
        warm.append(time.perf_counter() - t0)
        pools.release(pool, sandbox)
    return sorted(warm)[len(warm) // 2]


async def _sandboxes(tag: str) -> dict[str, object]:
    pools = PoolSet(CollectorRegistry(), pool_size=1, max_warm=2, run="bench-repo-images", docker_api=None)
    settings = SandboxSettings(image=tag)
    try:
        pool, sandbox = await pools.acquire(settings)
        cold = pools.cold_starts[tag]
        t0 = time.perf_counter()
        r = await sandbox.exec(
            "cp -a /repo/. /workspace && cd /workspace && python3 -m pytest -q -p no:cacheprovider tests"
            " 2>&1 | tail -1",
            timeout=600,
        )
        tests_s = time.perf_counter() - t0
        name = tag.split(":")[0].removeprefix("pqrl-repo-")
        meta = await sandbox.exec(
            f"python3 -c 'import importlib.metadata as m; print(m.version(\"{name}\"))'"
        )
        pools.release(pool, sandbox)
        warm = await warm_acquire_s(pools, pool, settings)
        return {"cold_start_s": round(cold, 3), "warm_start_s": round(warm, 4),
                "tests": r.stdout.decode().strip(), "tests_s": round(tests_s, 1),
                "metadata_version": (meta.stdout or meta.stderr).decode().strip()[-80:]}  # fmt: skip
    finally:
        await pools.close()
        if pools.docker_api is not None:
            await pools.docker_api.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", default="more-itertools==10.5.0")
    ap.add_argument("--dependency", default="pytest-timeout==2.3.1")
    args = ap.parse_args()
    print(f"# python bench/repo_images.py --project {args.project} --dependency {args.dependency}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# commit {short_commit(ROOT)}, load {load}, {os.cpu_count()} cores", flush=True)
    t0 = time.perf_counter()
    archive = fetch_sdist(args.project)  # pqrl's cache: downloaded once, no project code run
    download_s = time.perf_counter() - t0
    recipe = RepoRecipe(name=args.project.split("==")[0], source=str(archive),
                        requirements=(args.dependency,), install="editable")  # fmt: skip
    tag = recipe_tag(recipe)
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)  # a cold build
    t0 = time.perf_counter()
    build_recipe(recipe, progress=lambda m: print(f"# {m}", file=sys.stderr))
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_recipe(recipe, progress=lambda m: None)
    cached_s = time.perf_counter() - t0
    base = _size_mb(recipe.base_image)
    size = _size_mb(tag)
    result = {"project": args.project, "dependency": args.dependency,
              "sdist_download_s": round(download_s, 1), "build_cold_s": round(cold_s, 1),
              "build_cached_s": round(cached_s, 2), "image_mb": round(size, 1),
              "layer_mb": round(size - base, 1)}  # fmt: skip
    try:
        result |= asyncio.run(_sandboxes(tag))
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
