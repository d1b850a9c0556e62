"""Every rule of the params list (protocol/params.py; PROTOCOL.md "params")."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from wschat.protocol import (
    GenerationParams,
    InvalidParams,
    Prompt,
    decode_client_frame,
    encode,
    parse_params,
)

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, GenerationParams()),
        ({"max_new_tokens": 1}, GenerationParams(max_new_tokens=1)),
        ({"max_new_tokens": 10**6}, GenerationParams(max_new_tokens=10**6)),  # session caps it
        ({"temperature": 0}, GenerationParams(temperature=0.0)),
        ({"temperature": 2}, GenerationParams(temperature=2.0)),
        ({"temperature": 0.7}, GenerationParams(temperature=0.7)),
        ({"top_p": 1}, GenerationParams(top_p=1.0)),
        ({"top_p": 5e-324}, GenerationParams(top_p=5e-324)),
        ({"top_k": 0}, GenerationParams(top_k=0)),
        ({"top_k": 2**40}, GenerationParams(top_k=2**40)),
        ({"min_p": 0}, GenerationParams(min_p=0.0)),
        ({"min_p": 1}, GenerationParams(min_p=1.0)),
        ({"min_p": 0.05}, GenerationParams(min_p=0.05)),
        ({"repetition_penalty": 2}, GenerationParams(repetition_penalty=2.0)),
        ({"repetition_penalty": 0.01}, GenerationParams(repetition_penalty=0.01)),
        ({"stop": []}, GenerationParams(stop=())),
        ({"stop": ["a", "b", "c", "d"]}, GenerationParams(stop=("a", "b", "c", "d"))),
        ({"stop": ["\U0001f600" * 64]}, GenerationParams(stop=("\U0001f600" * 64,))),
        ({"seed": -(2**63)}, GenerationParams(seed=-(2**63))),
        ({"seed": 2**64 - 1}, GenerationParams(seed=2**64 - 1)),
        ({"token_ids": False}, GenerationParams(token_ids=False)),
        ({"temperature": None, "stop": None}, GenerationParams()),
    ],
)
def test_valid_params_are_accepted_exactly(params: dict[str, Any], expected: Any) -> None:
    parsed = parse_params(params)
    assert parsed == expected
    for name, value in params.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert type(getattr(parsed, name)) is type(getattr(expected, name))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temp": 1}, "unknown parameter 'temp'"),
        ({"Temperature": 1}, "unknown parameter 'Temperature'"),
        ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
        ({"max_new_tokens": -5}, "max_new_tokens must be at least 1"),
        ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
        ({"max_new_tokens": 5.0}, "max_new_tokens must be an integer"),
        ({"max_new_tokens": "5"}, "max_new_tokens must be an integer"),
        ({"temperature": -0.001}, "temperature must be in [0, 2]"),
        ({"temperature": 2.0001}, "temperature must be in [0, 2]"),
        ({"temperature": NAN}, "temperature must be a finite number"),
        ({"temperature": INF}, "temperature must be a finite number"),
        ({"temperature": -INF}, "temperature must be a finite number"),
        ({"temperature": True}, "temperature must be a finite number"),
        ({"temperature": "1"}, "temperature must be a finite number"),
        ({"temperature": [1]}, "temperature must be a finite number"),
        ({"top_p": 0}, "top_p must be in (0, 1]"),
        ({"top_p": -0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.0000001}, "top_p must be in (0, 1]"),
        ({"top_p": NAN}, "top_p must be a finite number"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_k": 1.0}, "top_k must be an integer"),
        ({"top_k": False}, "top_k must be an integer"),
        ({"min_p": -0.001}, "min_p must be in [0, 1]"),
        ({"min_p": 1.0000001}, "min_p must be in [0, 1]"),
        ({"min_p": NAN}, "min_p must be a finite number"),
        ({"repetition_penalty": 0}, "repetition_penalty must be in (0, 2]"),
        ({"repetition_penalty": 2.5}, "repetition_penalty must be in (0, 2]"),
        ({"repetition_penalty": INF}, "repetition_penalty must be a finite number"),
        ({"stop": "END"}, "stop must be a list of strings"),
        ({"stop": ("a",)}, "stop must be a list of strings"),
        ({"stop": ["a"] * 5}, "stop takes at most 4 strings"),
        ({"stop": [""]}, "each stop string must be 1 to 64 characters"),
        ({"stop": ["x" * 65]}, "each stop string must be 1 to 64 characters"),
        ({"stop": [1]}, "stop must be a string"),
        ({"stop": [b"a"]}, "stop must be a string"),
        ({"stop": [None]}, "stop must be a string"),
        ({"seed": 2**64}, "seed must fit in 64 bits"),
        ({"seed": -(2**63) - 1}, "seed must fit in 64 bits"),
        ({"seed": 1.0}, "seed must be an integer"),
        ({"seed": True}, "seed must be an integer"),
        ({"token_ids": 1}, "token_ids must be a boolean"),
        ({"token_ids": "true"}, "token_ids must be a boolean"),
    ],
)
def test_each_broken_rule_is_invalid_params_with_its_message(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidParams) as raised:
        parse_params(params)
    assert raised.value.message == message


@pytest.mark.parametrize("value", [[], [("temperature", 1)], "x", None, 1, b"{}"])
def test_params_that_are_not_a_map_are_invalid_params(value: Any) -> None:
    with pytest.raises(InvalidParams, match="params must be a map"):
        parse_params(value)


def test_params_errors_through_the_decoder_are_invalid_params_naming_the_prompt() -> None:
    raw = msgpack.packb({"type": "prompt", "id": "q", "text": "x", "params": {"top_p": 0}})
    with pytest.raises(InvalidParams) as raised:
        decode_client_frame(raw)
    assert raised.value.id == "q"


def test_float32_param_is_widened_and_float32_nan_refused() -> None:
    value = {"type": "prompt", "id": "q", "text": "x", "params": {"temperature": 0.25}}
    prompt = decode_client_frame(msgpack.packb(value, use_single_float=True))
    assert isinstance(prompt, Prompt) and prompt.params == GenerationParams(temperature=0.25)
    value["params"] = {"temperature": NAN}
    with pytest.raises(InvalidParams, match="temperature must be a finite number"):
        decode_client_frame(msgpack.packb(value, use_single_float=True))


def test_merged_over_takes_unset_fields_from_the_base() -> None:
    base = GenerationParams(temperature=1.0, top_k=5, stop=("x",))
    top = GenerationParams(temperature=0.0, seed=3)
    assert top.merged_over(base) == GenerationParams(temperature=0.0, top_k=5, stop=("x",), seed=3)


def test_params_to_wire_leaves_out_unset_fields_and_round_trips() -> None:
    params = GenerationParams(temperature=0.5, stop=("a",), token_ids=True)
    assert params.to_wire() == {"temperature": 0.5, "stop": ["a"], "token_ids": True}
    decoded = decode_client_frame(encode(Prompt("p", "x", params=params)))
    assert isinstance(decoded, Prompt) and decoded.params == params
