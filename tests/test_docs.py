"""The README stays short, and every link and measurement source in README.md and docs/ exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
RESULT = re.compile(r"bench/results/[\w./-]*\w")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(page: Path) -> str:
    return FENCE.sub("", page.read_text())


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", _prose(page), re.M)}


def broken_links(page: Path) -> list[str]:
    """Relative links whose file, or whose heading in a Markdown file, does not exist."""
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (fragment and dest.suffix == ".md" and fragment not in _anchors(dest)):
            broken.append(target)
    return broken


def missing_results(page: Path) -> list[str]:
    return sorted({p for p in RESULT.findall(page.read_text()) if not (ROOT / p).exists()})


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_keeps_the_two_commands():
    """The main job's command, and the test command that CI runs (.ci/run -> scripts/test.sh)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    commands = [line.split("#")[0].strip() for line in lines[lines.index("```bash") + 1 :][:2]]
    assert commands == [
        "bash scripts/setup.sh && .venv/bin/pqrl train examples/quickstart.yaml",
        "bash scripts/test.sh",
    ]
    assert "bash scripts/test.sh" in (ROOT / ".ci/run").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    assert not broken_links(page), f"{page.name}: links to missing files or headings"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_cited_results_exist(page: Path):
    assert not missing_results(page), f"{page.name} cites results that are not in bench/results/"


def test_the_checks_catch_broken_links_and_missing_results(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The `gate`, in short\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n[a](missing.md) [b](#top) [c](#nowhere)\n"
        "[d](other.md#the-gate-in-short) [e](other.md#gate)\n"
        "[f](https://example.com/x) `bench/results/nothing_here.log`, `bench/results/store_cpu.log`.\n"
        "```\n# not a heading\n[g](inside_a_fence.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md", "#nowhere", "other.md#gate"]
    assert missing_results(page) == ["bench/results/nothing_here.log"]
