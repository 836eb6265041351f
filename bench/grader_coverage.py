"""How the coding grader judges the checks a forger would have to forge, task by task.

    python bench/grader_coverage.py | tee bench/results/grader_coverage.log

For each built-in task, the gold reference (tasks/coding/grader.py) knows which checks of its
FAIL_TO_PASS tests the unfixed repository does not reproduce: a submission that leaves the bug in
place passes only by forging those. Each is counted by how the host judges it:

- ``held``: an expected operand held on the host (tasks/coding/held.py), the kept one compared with
  the gold's value by content;
- ``literal``: an ``==`` against a dropped literal that is not True, False or None;
- ``guessable``: the polarity of ``assert X``, or an ``==`` / other comparison against True, False,
  None (held on the host, but one guess away);
- ``raises``: a ``pytest.raises`` site (the gold's exact class; guessable);
- ``container-truth``: the comparison's truth as the container reports it (a ``!=``, ``<`` or
  ``in`` between computed values);
- ``unstable``: values that vary between gold runs.

Only checks the unfixed code reached and recorded differently count (``base_fails``): one it never
reached may not depend on the bug at all. A task is ``protected`` when at least one of them is
``held`` or ``literal``: a forger that does not know the correct values scores 0 there. Prints
one line per task, then a JSON summary.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learning import short_commit  # noqa: E402
from sandboxes.docker import DockerSandbox  # noqa: E402
from sandboxes.docker_api import DockerAPI  # noqa: E402
from sandboxes.hardening import SandboxSettings  # noqa: E402
from tasks.coding.env import builtin_suite  # noqa: E402
from tasks.coding.grader import CodingGrader  # noqa: E402
from tasks.coding.probes import Site  # noqa: E402
from tasks.coding.verdict import Reference  # noqa: E402
from tasks.suite import CodingTask  # noqa: E402


def kinds(task: CodingTask, ref: Reference) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    fails = ref.base_fails
    for test in task.fail_to_pass:
        for i, (site_id, _) in enumerate(ref.gold.get(test, [])):
            if fails is not None and (test, i) not in fails:
                continue  # the unfixed code passes this check as it is
            site = ref.sites[site_id]
            if (test, i) in ref.unstable or test in ref.unstable_tests:
                out["unstable"] += 1
            elif site.kind == "raises":
                out["raises"] += 1
            elif site.held:
                out["held"] += 1
            elif site.strong and _literal(site):
                out["literal"] += 1
            elif site.strong:
                out["guessable"] += 1
            else:
                out["container-truth"] += 1
    return out


def _literal(site: Site) -> bool:
    """An ``==`` against a dropped literal that is not one guess away."""
    return (
        site.kind == "compare"
        and not site.negated
        and set(site.ops) <= {"=="}
        and any(not (v is None or isinstance(v, bool)) for _, v in site.literals)
    )


async def main() -> None:
    api = DockerAPI()

    async def make() -> DockerSandbox:
        return await DockerSandbox.create(api, SandboxSettings(memory_mb=512), run="bench-coverage")

    tasks = list(builtin_suite().tasks)
    grader = CodingGrader(make)
    refs = await asyncio.gather(*(grader.reference(t) for t in tasks))
    totals: collections.Counter[str] = collections.Counter()
    unprotected = []
    for task, ref in zip(tasks, refs, strict=True):
        counts = kinds(task, ref)
        protected = counts["held"] + counts["literal"] > 0
        if not protected:
            unprotected.append(task.id)
        totals.update(counts)
        print(task.id, "protected" if protected else "UNPROTECTED", dict(counts), flush=True)
    print(f"# commit {short_commit(ROOT)}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    summary = {"tasks": len(tasks), "protected": len(tasks) - len(unprotected), "unprotected": unprotected}
    print(json.dumps({**summary, "checks_by_kind": dict(totals)}))


if __name__ == "__main__":
    asyncio.run(main())
