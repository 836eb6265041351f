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


def test_dockerfile_build_is_tagged_by_content_and_rebuilt_only_on_change(tmp_path):
    from sandboxes.image import build_image_from_dockerfile, context_digest

    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_RECIPE.tag}\nCOPY hello.txt /opt/hello.txt\n")
    (tmp_path / "hello.txt").write_text("v1\n")
    tag1 = build_image_from_dockerfile(
        tmp_path / "Dockerfile", name="pqrl-test-derived", progress=lambda m: None
    )
    try:
        messages: list[str] = []
        assert (
            build_image_from_dockerfile(
                tmp_path / "Dockerfile", name="pqrl-test-derived", progress=messages.append
            )
            == tag1
        )
        assert "is present" in messages[0], "an unchanged recipe must not rebuild"
        out = subprocess.run(["docker", "run", "--rm", "--network", "none", tag1, "cat", "/opt/hello.txt"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.stdout == "v1\n"
        (tmp_path / "hello.txt").write_text("v2\n")
        assert context_digest(tmp_path / "Dockerfile", tmp_path) != tag1.split(":")[1]
    finally:
        subprocess.run(["docker", "rmi", "-f", tag1, "pqrl-test-derived:latest"], capture_output=True)
