"""Every command that takes an engine URL builds the client its kind needs, and a kind named wrongly
ends it with one line: ``pqrl eval --engine``, ``pqrl rollout``, ``pqrl tasks filter --engine`` and a
job with ``services.engines``, against the real built-in engine and a server answering as vLLM does
(``tests/engine/test_backends.py``). No vLLM is started."""

from __future__ import annotations

import json
import time

import pytest

from engine.client import EngineClient
from engine.vllm_client import VLLMClient
from launcher import engine_choice
from launcher.children import Children
from launcher.cli import main
from launcher.engine_choice import connect_engines
from launcher.jobconfig import TrainConfig
from launcher.rollout_side import Job
from pqrl.errors import UsageError
from pqrl.redis_server import free_port
from tasks.generators import Generate, generate_suite
from tests.engine.test_backends import VLLM, answering


async def test_the_client_follows_what_the_engine_answers(served):
    url, _ = served
    with answering(VLLM) as vllm:
        for urls, backend, cls in ((url, "auto", EngineClient), ([url], "builtin", EngineClient),
                                   (vllm, "auto", VLLMClient), ([vllm], "vllm", VLLMClient)):  # fmt: skip
            client = await connect_engines(urls, backend, Children(quiet=True))
            assert type(client) is cls, (urls, backend)
            await client.aclose()


def test_rollout_and_filter_with_the_wrong_backend_end_with_one_line(served, tmp_path, capsys, monkeypatch):
    url, _ = served
    suite = tmp_path / "calc.jsonl"
    suite.write_text(generate_suite(Generate("calc", n=1, seed=3)).to_jsonl())
    with answering(VLLM) as vllm:
        code = main(["rollout", "--run", "r", "--redis-url", "redis://127.0.0.1:1/0", "--engine", vllm,
                     "--backend", "builtin", "--groups-per-step", "1", "--quiet"])  # fmt: skip
        err = capsys.readouterr().err
        assert code == UsageError.exit_code and err.count("\n") == 1, err
        assert err.startswith("pqrl rollout: ") and "answers as a vLLM server" in err
    down = f"http://127.0.0.1:{free_port()}"  # auto waits for an answer; a named kind is taken at its word
    monkeypatch.setattr(engine_choice, "WAIT_S", 3.0)
    t0 = time.monotonic()
    code = main(["rollout", "--run", "r", "--redis-url", "redis://127.0.0.1:1/0", "--engine", down,
                 "--groups-per-step", "1", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == UsageError.exit_code and "no answer, so which engine it is" in err, err
    assert time.monotonic() - t0 >= 3.0  # it waited for the engine to come up before giving up
    code = main(["rollout", "--run", "r", "--redis-url", "redis://127.0.0.1:1/0", "--engine", "localhost:1",
                 "--groups-per-step", "1", "--backend", "vllm", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == UsageError.exit_code and "localhost:1: not an engine URL" in err, err
    code = main(["tasks", "filter", str(suite), "-o", str(tmp_path / "out.jsonl"), "--engine", url,
                 "--backend", "vllm", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == UsageError.exit_code and "answers as an SGLang-API server" in err and "vllm" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_eval_against_a_running_engine_detects_it_or_refuses_a_wrong_name(served, tmp_path, capsys):
    """The engine at --engine serves the episodes (nothing is started); --backend vllm there is refused."""
    url, _ = served
    suite = tmp_path / "calc.jsonl"
    suite.write_text(generate_suite(Generate("calc", n=1, seed=3, name="calc")).to_jsonl())
    out = str(tmp_path / "o.jsonl")
    base = ["eval", "--model", "smollm2-135m-instruct", str(suite), "--engine", url, "--k", "1",
            "--max-new-tokens", "8", "--max-turns", "1", "-o", out, "--json"]  # fmt: skip
    assert main([*base, "--backend", "vllm"]) == UsageError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("pqrl eval: ") and "not as a vLLM server" in err
    assert not (tmp_path / "o.jsonl").exists()
    assert main([*base, "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"] == 1 and report["episodes"] == 1
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 1


async def test_a_job_whose_engines_are_not_of_the_kind_named_stops_at_start(redis_server):
    with answering(VLLM) as vllm:
        cfg = TrainConfig.model_validate({
            "run": "kinds", "tasks": {"suites": [{"generate": "calc", "n": 2}]},
            "services": {"redis_url": redis_server.url, "engines": [vllm], "engine": "builtin"},
        })  # fmt: skip
        services = {"redis_url": redis_server.url, "engines": [vllm], "env_servers": [], "env_token": None}
        with pytest.raises(UsageError, match="answers as a vLLM server, not as an SGLang-API server") as e:
            async with Job(cfg, services, role="all", quiet=True, fresh=True):
                pass
        assert (e.value.fix or "").startswith("services.engine: vllm")
        cfg = cfg.model_copy(update={"services": cfg.services.model_copy(update={"engine": "vllm"})})
        async with Job(cfg, services, role="all", quiet=True, fresh=True) as job:
            assert type(job.engine) is VLLMClient
