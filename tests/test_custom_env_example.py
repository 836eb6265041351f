"""examples/custom_env installs as a plug-in: pqrl discovers it through its entry point and it
passes the conformance checker, without any change to pqrl."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_env"


def test_example_is_short():
    lines = sum(len(p.read_text().splitlines()) for p in [EXAMPLE / "pyproject.toml", *EXAMPLE.rglob("*.py")])
    assert lines < 60, f"the worked example should stay under 60 lines, has {lines}"


def test_installed_plugin_is_discovered_and_conforms(tmp_path):
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    source = shutil.copytree(EXAMPLE, tmp_path / "src")  # pip builds in place; keep the repo clean
    pip = subprocess.run(
        [*cmd, "--target", str(target), str(source)], capture_output=True, text=True, timeout=300
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    probe = (
        "import asyncio, sys\n"
        f"sys.path.insert(0, {str(target)!r})\n"
        "from env_server.registry import registry\n"
        "from env_server.conformance import check_environment\n"
        "from env_server.client import LocalEnvClient\n"
        "from env_server.types import ToolCall\n"
        "assert 'reverse-v1' in registry(), sorted(registry())\n"
        "async def main():\n"
        "    await check_environment('reverse-v1')\n"
        "    c = LocalEnvClient()\n"
        "    s = await c.create_session('reverse-v1', {'word': 'pqrl'})\n"
        "    await c.step(s.session_id, [ToolCall(name='submit', arguments={'answer': 'lrqp'})])\n"
        "    print((await c.evaluate(s.session_id)).reward)\n"
        "    await c.aclose()\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "1.0"
    listing = subprocess.run([str(Path(sys.executable).parent / "pqrl"), "env", "list"], capture_output=True,
                             text=True, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert "reverse-v1: letters, submit" in listing.stdout, listing.stderr
