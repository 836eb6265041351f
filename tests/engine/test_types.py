"""One ``SamplingParams`` on the wire: what the client sends is what the server validates and the batcher
samples with; SGLang's loose forms are accepted, unknown keys and bad values refused. And the flags of
``pqrl engine serve`` come from ``engine.config``."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig, ServeConfig, add_serve_arguments, serve_configs
from engine.sampling_params import SamplingParams
from engine.types import GenerateRequest
from pqrl.model_cache import DEFAULT_MODEL


def test_sampling_params_round_trip_through_json():
    params = SamplingParams(temperature=0.5, top_k=5, stop=["\n\n"], stop_token_ids=[2], sampling_seed=7)
    assert params.stop == ("\n\n",) and params.stop_token_ids == (2,)  # lists are stored as tuples
    body = GenerateRequest(input_ids=[1, 2], sampling_params=params, rid="r").model_dump(
        mode="json", exclude_unset=True, exclude_none=True
    )
    assert body["sampling_params"]["stop"] == ["\n\n"] and body["sampling_params"]["sampling_seed"] == 7
    again = GenerateRequest.model_validate(body).sampling_params
    assert isinstance(again, SamplingParams) and again == params
    assert dataclasses.replace(params, max_new_tokens=3).max_new_tokens == 3


def test_sglang_forms_are_accepted():
    req = GenerateRequest.model_validate(
        {"input_ids": [1], "sampling_params": {"stop": "END", "max_new_tokens": None, "stop_token_ids": None}}
    )
    assert req.sampling_params == SamplingParams(stop=("END",))
    assert GenerateRequest.model_validate({"text": "hi"}).sampling_params == SamplingParams()


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"frequency_penalty": 1.0}, "frequency_penalty"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
    ],
)
def test_bad_sampling_params_are_refused_by_name(bad, field):
    with pytest.raises(ValidationError, match=field):
        GenerateRequest.model_validate({"input_ids": [1], "sampling_params": bad})
    if field != "frequency_penalty":
        with pytest.raises(ValueError, match=field):
            SamplingParams(**bad)  # also when built in code


def test_serve_flags_come_from_the_settings_classes():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    flags = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    used = "--model --host --port --device --dtype --weight-version --seed --max-running-requests --api-key"
    assert flags >= {*used.split(), "--log-level", "--engine-arg", "--backend"}
    engine, serve = serve_configs(parser.parse_args([]))
    assert engine == EngineConfig() and serve == ServeConfig() and engine.model == DEFAULT_MODEL
    args = parser.parse_args(["--port", "30001", "--engine-arg=--tp-size=2", "--engine-arg=x", "--seed", "3"])
    engine, serve = serve_configs(args)
    assert serve.port == 30001 and serve.engine_args == ("--tp-size=2", "x") and engine.seed == 3
    with pytest.raises(ValueError, match="port"):
        serve_configs(parser.parse_args(["--port", "0"]))


def test_sglang_arg_is_the_old_name_of_engine_arg():
    """Scripts and code written for the old name keep working: both flags fill one list, in order."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    _, serve = serve_configs(parser.parse_args(["--sglang-arg=--a", "--engine-arg=--b", "--sglang-arg", "c"]))
    assert serve.engine_args == ("--a", "--b", "c")
    assert ServeConfig(sglang_args=("--x",)).engine_args == ("--x",)
    assert ServeConfig(engine_args=("--a",), sglang_args=["--b"]).engine_args == ("--a", "--b")
    assert dataclasses.replace(ServeConfig(sglang_args=("--x",)), port=1).engine_args == ("--x",)
