"""The offline sandbox base image (built by scripts/setup.sh) against the real Docker engine."""

from __future__ import annotations

import dataclasses
import subprocess

from sandboxes.image import BASE_RECIPE, image_exists


def test_recipe_hash_is_stable_and_tracks_content():
    assert BASE_RECIPE.digest == dataclasses.replace(BASE_RECIPE).digest
    more = dataclasses.replace(BASE_RECIPE, packages=(*BASE_RECIPE.packages, "curl"))
    assert more.digest != BASE_RECIPE.digest and more.tag.startswith("pqrl-sandbox-base:")


def test_base_image_runs_python_git_pytest_unprivileged_and_offline():
    assert image_exists(BASE_RECIPE.tag), "run scripts/setup.sh (pqrl sandbox build-image)"
    script = (
        "id -u; python3 -c 'import sys; print(sys.version_info[0])'; git --version | cut -d' ' -f1; "
        "python3 -m pytest --version >/dev/null && echo pytest; pwd; "
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)' 2>/dev/null "
        "|| echo offline; "
        "touch /etc/x 2>/dev/null || echo read-only"
    )
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL",
         "--security-opt", "no-new-privileges", "--tmpfs", "/tmp:size=64m",
         "--tmpfs", "/workspace:size=64m,uid=1000,gid=1000", BASE_RECIPE.tag, "sh", "-c", script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1000", "3", "git", "pytest", "/workspace", "offline", "read-only"]
