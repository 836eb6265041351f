"""A call's bad arguments are that call's error, never the sandbox's: real containers.

A path too deep, too long or not encodable, a file that is not a regular file, an archive that is
not one: each fails the one call with an exception that is not a ``SandboxError`` (so a tool
reports it to the model and the episode goes on), with a bounded message, and the sandbox serves
the next call. Only a dead or unresponsive agent is the infrastructure's failure.
"""

from __future__ import annotations

import io
import pickle
import tarfile

import pytest

from env_server.builtin import ShellEnv
from env_server.types import ToolCall, ToolStatus
from sandboxes.protocol import SandboxCallFailed, SandboxError
from tests.sandboxes.probing import assert_responsive

pytestmark = pytest.mark.timeout(120)

DEEP = "/tmp/" + "a/" * 1500 + "f"  # 1,500 components, 3 KB: once past the recursion limit
TOO_DEEP = "/tmp/" + "ab/" * 1500 + "f"  # 4.5 KB: past PATH_MAX
SURROGATE = "/workspace/\ud800"
HUGE = "/workspace/" + "x" * (2 << 20)  # 2 MB, echoed by an error it would overflow the reply bound
BAD_PATHS = {
    "surrogate": SURROGATE,
    "huge": HUGE,
    "too deep": TOO_DEEP,
    "nul": "/workspace/a\0b",
    "empty": "",
    "missing": "/workspace/no/such/file",
    "a directory": "/workspace",
    "a device": "/dev/zero",
    "read-only": "/usr/bin/pqrl-nope",
}
MESSAGE_BOUND = 600


async def _assert_call_error(call, sandbox) -> str:
    """``call`` fails as the call's error (not the sandbox's), briefly, and the sandbox goes on."""
    with pytest.raises(Exception) as info:
        await call
    assert not isinstance(info.value, SandboxError), f"{type(info.value).__name__}: {info.value}"[:300]
    message = str(info.value)
    assert len(message) <= MESSAGE_BOUND, len(message)
    message.encode("utf-8")  # a tool message must be sendable
    assert sandbox.alive
    await assert_responsive(sandbox)
    return message


async def test_a_path_of_1500_components_is_created_without_recursion(sandbox):
    await sandbox.write_file(DEEP, b"deep")
    assert await sandbox.read_file(DEEP) == b"deep"
    await sandbox.write_file("/workspace/p//q/../r/s", b"dots")  # as os.makedirs: p, p/q, p/r
    assert await sandbox.read_file("/workspace/p/r/s") == b"dots"
    await assert_responsive(sandbox)


async def test_a_lone_surrogate_in_a_path_is_the_calls_error(sandbox):
    message = await _assert_call_error(sandbox.write_file(SURROGATE, b"x"), sandbox)
    assert "UTF-8" in message


async def test_a_2mb_path_is_the_calls_error_and_does_not_flood(sandbox):
    message = await _assert_call_error(sandbox.write_file(HUGE, b"x"), sandbox)
    assert "bytes long" in message
    await sandbox.write_file("/workspace/after", b"ok")
    assert await sandbox.read_file("/workspace/after") == b"ok"


@pytest.mark.parametrize("op", ["write_file", "read_file", "upload", "download"])
async def test_every_file_operation_answers_bad_paths_as_call_errors(sandbox, op):
    empty_tar = io.BytesIO()
    tarfile.open(fileobj=empty_tar, mode="w").close()
    calls = {
        "write_file": lambda p: sandbox.write_file(p, b"x"),
        "read_file": lambda p: sandbox.read_file(p),
        "upload": lambda p: sandbox.upload(empty_tar.getvalue(), p),
        "download": lambda p: sandbox.download(p),
    }
    skip = {
        "write_file": {"missing"},
        "upload": {"missing", "a directory"},
        "download": {"a directory", "a device"},
    }
    for name, path in BAD_PATHS.items():
        if name not in skip.get(op, set()):
            await _assert_call_error(calls[op](path), sandbox)


async def test_an_error_the_host_has_no_type_for_is_the_calls_error(sandbox):
    """An archive that is not one (tarfile.ReadError), a tree deeper than the archiver recurses."""
    with pytest.raises(SandboxCallFailed, match="ReadError"):
        await sandbox.upload(b"not a tar archive", "/workspace")
    await assert_responsive(sandbox)
    made = await sandbox.exec("d=/tmp/t; for i in $(seq 1200); do d=$d/d; done; mkdir -p $d", timeout=30)
    assert made.ok, made
    await _assert_call_error(sandbox.download("/tmp/t"), sandbox)


async def test_exec_with_a_bad_cwd_or_argv_answers_briefly(sandbox):
    for kwargs in ({"cwd": HUGE}, {"cwd": "/workspace/\0"}, {"env": {"A": "\0"}}):
        result = await sandbox.exec("true", **kwargs)
        assert result.exit_code == 127 and len(result.stderr) <= MESSAGE_BOUND, result
    result = await sandbox.exec(["/nonexistent/" + "y" * (2 << 20)])
    assert result.exit_code == 127 and len(result.stderr) <= MESSAGE_BOUND, result.stderr[:200]
    await assert_responsive(sandbox)


async def test_the_shell_tools_answer_bad_paths_and_the_episode_goes_on(sandbox):
    env = ShellEnv()
    env.sandbox = sandbox
    await env.reset(task={"prompt": "p"})
    for name, path in BAD_PATHS.items():
        for tool, args in (("write_file", {"path": path, "content": "x"}), ("read_file", {"path": path})):
            if (tool, name) in (("write_file", "missing"),):
                continue
            result = await env.step([ToolCall(id="c", name=tool, arguments=args)])
            (message,) = result.messages
            assert message.status is ToolStatus.ERROR, (tool, name, message.content[:200])
            assert len(message.content) <= 1100 and not result.done
            message.model_dump_json()
    result = await env.step([ToolCall(id="c", name="run", arguments={"command": "echo alive"})])
    assert result.messages[0].status is ToolStatus.OK and "alive" in result.messages[0].content


async def test_every_error_answered_for_a_call_is_a_sandbox_call_failure_of_its_builtin_type(sandbox):
    """A missing file is a FileNotFoundError (what callers catch) and a SandboxCallFailed (what
    tells the env server a reset's setup call failed, not its own code), named by the call and its
    path, and it pickles as itself."""
    with pytest.raises(FileNotFoundError) as missing:
        await sandbox.read_file("/workspace/no/such/file")
    with pytest.raises(ValueError) as nul:
        await sandbox.write_file("/workspace/a\0b", b"x")
    for raised in (missing.value, nul.value):
        assert isinstance(raised, SandboxCallFailed) and not isinstance(raised, SandboxError)
        again = pickle.loads(pickle.dumps(raised))
        assert type(again) is type(raised) and str(again) == str(raised)
    assert str(missing.value).startswith("read_file '/workspace/no/such/file' in sandbox: FileNotFoundError")
    assert type(missing.value).__name__ == "FileNotFoundError"  # the model's tool message is unchanged
    await assert_responsive(sandbox)
