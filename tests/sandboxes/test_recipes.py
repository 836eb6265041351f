"""Repository images built for real (git, pip on the host, docker build), looked at from inside a
hardened sandbox with no network: the fix commit cannot be found, a host-installed requirement
imports, a recipe builds once, and a bad recipe is one line with no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pqrl.errors import UsageError
from sandboxes.recipes import RepoRecipe, build_recipe, recipe_tag
from tests.sandboxes.conftest import MakeSandbox

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENT = "iniconfig==2.0.0"  # one small pure-Python wheel from PyPI (the host reaches it)


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    r = subprocess.run(["git", *ident, "-C", str(repo), *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _dangling() -> set[str]:
    r = subprocess.run(["docker", "images", "-q", "-f", "dangling=true"], capture_output=True, text=True)
    return set(r.stdout.split())


@pytest.fixture
def built() -> Iterator[list[str]]:
    """Tags the test builds: removed at teardown, and no dangling image may be left."""
    tags: list[str] = []
    before = _dangling()
    yield tags
    for tag in set(tags):
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    assert _dangling() <= before, "the build left dangling images"


@pytest.fixture
def history(tmp_path: Path) -> dict[str, str]:
    """A repository whose second commit (also on a branch, a tag and a stash) is the fix."""
    repo = tmp_path / "project"
    (repo / "src" / "calc").mkdir(parents=True)
    (repo / "src" / "calc" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "1.2.3"\n')
    _git(repo.parent, "init", "-q", "-b", "main", "project")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    secret = f"FIXED_{uuid.uuid4().hex}"
    (repo / "src" / "calc" / "__init__.py").write_text(f"def add(a, b):\n    return a + b  # {secret}\n")
    _git(repo, "commit", "-qam", f"fix {secret}")
    fix = _git(repo, "rev-parse", "HEAD")
    fix_blob = _git(repo, "rev-parse", "HEAD:src/calc/__init__.py")
    _git(repo, "tag", "v-fix")
    _git(repo, "branch", "fix-branch")
    _git(repo, "remote", "add", "origin", "https://example.invalid/project.git")
    (repo / "src" / "calc" / "__init__.py").write_text(f"# stashed {secret}\n")
    _git(repo, "stash", "-q")
    _git(repo.parent, "clone", "-q", "--mirror", str(repo), "mirror.git")
    return {"repo": str(repo), "mirror": str(tmp_path / "mirror.git"), "base": base, "fix": fix,
            "fix_blob": fix_blob, "secret": secret}  # fmt: skip


async def _sh(sandbox, command: str) -> str:  # type: ignore[no-untyped-def]
    r = await sandbox.exec(command, timeout=30)
    return (r.stdout + r.stderr).decode()


@pytest.mark.parametrize("where", ["repo", "mirror"])
async def test_image_holds_the_base_commit_only(history, built, make_sandbox: MakeSandbox, where):
    recipe = RepoRecipe(name="calc", source=history[where], base_commit=history["base"][:10],
                        requirements=(REQUIREMENT,), install="editable")  # fmt: skip
    lines: list[str] = []
    tag = build_recipe(recipe, progress=lines.append)
    built.append(tag)
    assert any("docker build" in ln for ln in lines), lines
    sandbox = await make_sandbox(image=tag)
    # The agent's copy: the task copies /repo into the writable /workspace at reset.
    assert await _sh(sandbox, "cp -a /repo/. /workspace && echo copied") == "copied\n"
    for cwd in ("/repo", "/workspace"):
        log = await _sh(sandbox, f"cd {cwd} && git log --all --format=%H%n%P%n%s")
        commit, parents, subject = log.rstrip("\n").split("\n")  # one commit, and no parent
        assert parents == "" and subject == f"calc at {history['base']}"
        assert await _sh(sandbox, f"cd {cwd} && git reflog; git stash list; git remote -v") == ""
        refs = await _sh(sandbox, f"cd {cwd} && git for-each-ref --format='%(refname)'")
        assert refs.split() == ["refs/heads/main"], refs
        for obj in (history["fix"], history["fix_blob"], history["base"]):
            r = await sandbox.exec(f"cd {cwd} && git cat-file -e {obj}", timeout=30)
            assert r.exit_code != 0, f"{obj} is readable in {cwd}"
        dig = "git fsck --unreachable --dangling --lost-found --no-reflogs 2>&1; git count-objects -v"
        out = await _sh(sandbox, f"cd {cwd} && {dig}")
        assert "unreachable" not in out and "dangling" not in out, out
        # every object stored is one HEAD reaches: nothing else to inflate and read
        stored = await _sh(sandbox, f"cd {cwd} && find .git/objects -type f | wc -l")
        reachable = await _sh(sandbox, f"cd {cwd} && git rev-list --objects --all | wc -l")
        assert int(stored) == int(reachable), (stored, reachable)
        grep = (
            f"cd {cwd} && grep -ra {history['secret']} . ; git grep {history['secret']} $(git rev-list --all)"
        )
        assert await _sh(sandbox, grep) == ""
        assert await _sh(sandbox, f"cd {cwd} && git status --porcelain") == ""
    # The requirement, installed on the host, imports with no network; the project imports from
    # the agent's copy (editable), so the agent's edit is what the tests see.
    probe = (
        "import iniconfig, calc, importlib.metadata as m; print(iniconfig.__file__);"
        ' print(calc.__file__, calc.add(2, 2), m.version("calc"))'
    )
    out = await _sh(sandbox, f"cd /tmp && python3 -c '{probe}'")
    assert out.splitlines() == [
        "/usr/local/lib/python3.11/dist-packages/iniconfig/__init__.py",
        "/workspace/src/calc/__init__.py 0 1.2.3",
    ], out


def test_same_recipe_builds_once(history, built):
    recipe = RepoRecipe(name="calc", source=history["repo"], base_commit=history["base"])
    lines: list[str] = []
    tags: list[str] = []
    threads = [threading.Thread(target=lambda: tags.append(build_recipe(recipe, progress=lines.append)))
               for _ in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    built.extend(tags)
    assert len(set(tags)) == 1 and tags[0] == recipe_tag(recipe)
    assert sum("docker build" in ln for ln in lines) == 1, lines
    again: list[str] = []
    assert build_recipe(recipe, progress=again.append) == tags[0]
    assert not any("docker build" in ln for ln in again) and "is present" in again[-1]
    # The same files from the mirror are the same image; another commit or requirement is not.
    assert (
        recipe_tag(RepoRecipe(name="calc", source=history["mirror"], base_commit=history["base"])) == tags[0]
    )
    assert recipe_tag(RepoRecipe(name="calc", source=history["repo"], base_commit=history["fix"])) != tags[0]
    assert recipe_tag(RepoRecipe(name="calc", source=history["repo"], base_commit=history["base"],
                                 requirements=(REQUIREMENT,))) != tags[0]  # fmt: skip


async def test_directory_and_archive_sources_drop_their_history(history, built, tmp_path, make_sandbox):
    """A directory (a checkout at the fix) or an archive shipping its .git: no old history inside."""
    archive = tmp_path / "calc-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(history["repo"], arcname="calc-1.0")
    for source in (history["repo"], str(archive)):
        tag = build_recipe(RepoRecipe(name="calc-src", source=source), progress=lambda _: None)
        built.append(tag)
        sandbox = await make_sandbox(image=tag)
        out = await _sh(
            sandbox, "cd /repo && git log --all --oneline | wc -l; ls src/calc; git status --short"
        )
        assert out.split() == ["1", "__init__.py"], out
        r = await sandbox.exec(f"cd /repo && git cat-file -e {history['fix']}", timeout=30)
        assert r.exit_code != 0


def test_bad_recipes_are_one_line(history, tmp_path):
    _git(tmp_path, "init", "-q", "empty")  # a repository with no commit yet
    cases = [
        (RepoRecipe(name="calc", source=str(tmp_path / "empty"), base_commit="HEAD"),
         f"is not in {tmp_path / 'empty'}: it has no commits (commit first, or pass a plain folder)"),
        (RepoRecipe(name="calc", source=history["repo"], base_commit="0" * 40), "is not in"),
        (RepoRecipe(name="calc", source=history["repo"], base_commit="--all"), "is not a commit"),
        (RepoRecipe(name="calc", source=str(tmp_path / "nowhere")), "does not exist"),
        (RepoRecipe(name="calc", source=history["repo"], requirements=("pqrl-no-such-package-zz==9.9",)),
         "pqrl-no-such-package-zz"),
    ]  # fmt: skip
    for recipe, words in cases:
        with pytest.raises(UsageError) as e:
            build_recipe(recipe, progress=lambda _: None)
        assert words in e.value.line() and "\n" not in e.value.line(), e.value.line()
    with pytest.raises(UsageError, match="not a pip spec"):
        RepoRecipe(name="calc", source=history["repo"], requirements=("--index-url=http://x",))


def test_command_line_builds_and_fails_in_one_line(history, tmp_path, built):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"name": "calc", "source": history["repo"], "base_commit": history["base"]}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "calc", "source": history["repo"], "base_commit": "f" * 40}))
    cmd = [sys.executable, "-m", "launcher.cli", "sandbox", "build-recipe"]
    ok = subprocess.run([*cmd, str(good)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    built.append(ok.stdout.strip())
    assert ok.stdout.strip().startswith("pqrl-repo-calc:")
    no = subprocess.run([*cmd, str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert no.returncode == 2 and "Traceback" not in no.stderr, no.stderr
    assert len(no.stderr.strip().splitlines()) == 1 and f"commit {'f' * 40} is not in" in no.stderr


def test_a_tree_that_writes_through_a_link_is_refused(tmp_path, built):
    """A crafted commit holding ``a -> /some/dir`` and ``a/file``: nothing is written outside."""
    repo, outside = tmp_path / "evil", tmp_path / "outside"
    outside.mkdir()
    _git(tmp_path, "init", "-q", "evil")
    hostile = f"pqrl-owned-{uuid.uuid4().hex}"

    def blob(data: str) -> str:
        r = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input=data,
                           capture_output=True, text=True, check=True)  # fmt: skip
        return r.stdout.strip()

    def mktree(lines: str) -> str:
        r = subprocess.run(["git", "-C", str(repo), "mktree"], input=lines, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    sub = mktree(f"100644 blob {blob('owned')}\t{hostile}\n")
    tree = mktree(f"120000 blob {blob(str(outside))}\ta\n040000 tree {sub}\ta\n")
    commit = _git(repo, "commit-tree", tree, "-m", "evil")
    with pytest.raises(UsageError, match="through a link") as e:
        build_recipe(RepoRecipe(name="evil", source=str(repo), base_commit=commit), progress=lambda _: None)
    assert "\n" not in e.value.line()
    assert list(outside.iterdir()) == [], "the build wrote outside its staging folder"


async def test_the_sources_own_git_config_runs_nothing(history, built, tmp_path, make_sandbox):
    """A smudge filter in the source's config (and .gitattributes asking for it) never runs."""
    repo, marker = Path(history["repo"]), tmp_path / "filter-ran"
    (repo / ".gitattributes").write_text("* filter=evil\n")
    _git(repo, "add", ".gitattributes")
    _git(repo, "commit", "-qm", "attributes")
    _git(repo, "config", "filter.evil.smudge", f"touch {marker}; sed s/a/EVIL/")
    _git(repo, "config", "core.fsmonitor", f"touch {marker}; true")
    commit = _git(repo, "rev-parse", "HEAD")
    tag = build_recipe(RepoRecipe(name="calc", source=str(repo), base_commit=commit), progress=lambda _: None)
    built.append(tag)
    assert not marker.exists(), "a command from the source's git config ran on the host"
    sandbox = await make_sandbox(image=tag)
    r = await sandbox.exec("cat /repo/src/calc/__init__.py; cd /repo && git status --porcelain", timeout=30)
    assert b"EVIL" not in r.stdout and r.stdout.startswith(b"def add(a, b):"), r.stdout


def test_a_directory_with_a_fifo_and_a_GIT_folder(tmp_path, built):
    """A fifo is skipped (reading it would block the build), a ``.GIT`` history left out."""
    src = tmp_path / "tree"
    (src / "pkg" / ".GIT").mkdir(parents=True)
    (src / "pkg" / ".GIT" / "HEAD").write_text("ref: refs/heads/secret\n")
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    os.mkfifo(src / "pkg" / "pipe")
    tag = build_recipe(RepoRecipe(name="fifo", source=str(src)), progress=lambda _: None)
    built.append(tag)
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", tag, "-c",
                        "cd /repo && find pkg | sort && git ls-files"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.stdout.split() == ["pkg", "pkg/mod.py", "pkg/mod.py"], r.stdout + r.stderr


async def test_a_released_copy_of_the_project_does_not_shadow_the_agents(tmp_path, built, make_sandbox):
    """A requirement that is (or pulls in) the project itself: the editable copy wins, as after
    ``pip install -e .``, with the project's own version."""
    src = tmp_path / "iniconfig-dev"
    (src / "src" / "iniconfig").mkdir(parents=True)
    (src / "src" / "iniconfig" / "__init__.py").write_text("WHO = 'the agent'\n")
    (src / "pyproject.toml").write_text('[project]\nname = "iniconfig"\nversion = "0.0.1.dev0"\n')
    recipe = RepoRecipe(name="ini", source=str(src), requirements=(REQUIREMENT,), install="editable")
    tag = build_recipe(recipe, progress=lambda _: None)
    built.append(tag)
    sandbox = await make_sandbox(image=tag)
    probe = 'import iniconfig, importlib.metadata as m; print(iniconfig.WHO, m.version("iniconfig"))'
    out = await _sh(sandbox, f"cp -a /repo/. /workspace && cd /tmp && python3 -c '{probe}'")
    assert out == "the agent 0.0.1.dev0\n", out
