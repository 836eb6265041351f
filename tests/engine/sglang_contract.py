"""What both halves of pqrl's SGLang contract check share: the SGLang release pinned in
pyproject.toml, as installed, and the requests pqrl's own client sends.

SGLang needs a GPU stack, so ``scripts/setup.sh`` installs only its own files (``--no-deps``, plus
msgspec) under ``$PQRL_CACHE/sglang-<pin>``; ``test_sglang_source`` reads them with ``ast``,
``test_sglang_imports`` imports them in a subprocess. pqrl's side comes from pqrl's code: the
requests are what ``EngineClient`` sends to a recording transport (``sent``), the response fields
are pqrl's response models. Every kind of check also runs on a broken input and must fail there, so
a checker that cannot fail is caught.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tomllib
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.client import EngineClient
from engine.types import PauseRequest, SamplingParams
from pqrl.cache import cache_dir

ROOT = Path(__file__).resolve().parents[2]
URL = "http://sglang.test"
# meta_info fields only the built-in engine reports; pqrl must not need them from SGLang
PQRL_ONLY_META = {"output_token_weight_versions"}


# -- the installed SGLang ------------------------------------------------------------------------


def pinned_version() -> str:
    """The release of pyproject.toml's ``sglang`` extra (scripts/setup.sh reads the same pin)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [r for r in project["optional-dependencies"]["sglang"] if r.startswith("sglang==")]
    return pin.removeprefix("sglang==")


@pytest.fixture(scope="module")
def home() -> Path:
    """The folder holding the pinned SGLang's ``sglang`` package; fails (not skips) without it."""
    version = pinned_version()
    home = cache_dir() / f"sglang-{version}"
    if not (home / ".pqrl-complete").is_file():
        pytest.fail(
            f"SGLang {version} is not installed in {home}: run `bash scripts/setup.sh`", pytrace=False
        )
    metadata = (home / f"sglang-{version}.dist-info" / "METADATA").read_text()
    assert f"\nVersion: {version}\n" in metadata, f"{home} holds another SGLang release than {version}"
    return home


@pytest.fixture(scope="module")
def srt(home: Path) -> Path:
    return home / "sglang" / "srt"


# -- what pqrl sends: EngineClient against a recording transport ---------------------------------


@dataclasses.dataclass(frozen=True)
class Sent:
    method: str
    path: str
    body: Any  # the parsed JSON body, None without one


def answer(request: httpx.Request) -> httpx.Response:
    """A minimal SGLang-shaped answer; only the requests matter here."""
    path = request.url.path
    if path == "/generate":
        body = json.loads(request.content)
        n = body["sampling_params"]["max_new_tokens"]
        meta = {"finish_reason": {"type": "length", "length": n}, "weight_version": "7"}
        meta["output_token_logprobs"] = [[-0.5, 5, None]] * n
        return httpx.Response(200, json={"text": "", "output_ids": [5] * n, "meta_info": meta})
    if path == "/model_info":
        return httpx.Response(200, json={"weight_version": "7"})
    if path in ("/health", "/abort_request"):
        return httpx.Response(200)
    if path == "/flush_cache":
        return httpx.Response(200, text="Cache flushed.\n")
    return httpx.Response(200, json={"success": True, "message": "ok"})


EVERY_SAMPLING_FIELD = SamplingParams(
    temperature=0.7,
    top_p=0.9,
    top_k=50,
    max_new_tokens=3,
    stop=("</tool>",),
    stop_token_ids=(2,),
    ignore_eos=True,
    skip_special_tokens=False,
    no_stop_trim=True,
    sampling_seed=11,
)


async def drive(client: EngineClient) -> None:
    """Every call pqrl makes on an SGLang server, through pqrl's own client."""
    await client.health()
    await client.load_lora_adapter("policy", "/ckpt/v3")
    client.lora_name = "policy"  # a LoRA policy's generations name its adapter
    await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2), rid="r2")
    client.lora_name = None
    await client.unload_lora_adapter("policy")
    for params in (None, SamplingParams(temperature=0, max_new_tokens=2), EVERY_SAMPLING_FIELD):
        await client.generate([1, 2, 3], params, rid="r1")
    await client.abort("r1")
    for mode in typing.get_args(PauseRequest.model_fields["mode"].annotation):
        await client.pause_generation(mode)
    await client.continue_generation()
    await client.flush_cache()
    await client.update_weights_from_disk("/ckpt/v3", 3)
    await client.init_weights_update_group("10.0.0.1", 29500, backend="nccl")
    await client.update_weights_from_distributed(
        ["w"], ["torch.bfloat16"], [[2, 2]], "weight_update_group", 3
    )
    await client.destroy_weights_update_group()
    assert await client.get_weight_version() == {URL: 7}


@pytest.fixture(scope="module")
def sent() -> list[Sent]:
    recorded: list[Sent] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        recorded.append(Sent(request.method, request.url.path, body))
        return answer(request)

    async def run() -> None:
        async with EngineClient(URL, transport=httpx.MockTransport(record)) as client:
            await drive(client)

    asyncio.run(run())
    return recorded


def missing(wanted: Iterable[str], produced: set[str], where: str) -> list[str]:
    return [f"{where} does not produce {k!r}" for k in sorted(set(wanted) - produced)]
