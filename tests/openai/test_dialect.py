"""How each engine is spoken to (``engine/openai/dialect.py``): each dialect found by its name
and by the owner ``/v1/models`` lists; llama.cpp's native ``/completion`` chunks read as text,
ids, finish reasons and cached prompt tokens; every sampling field sent in its spelling with the
shortest sampler chain; vLLM's and SGLang's OpenAI chunks and fields. The last tests ask a real
llama.cpp server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from wschat.protocol import FinishReason, TokenLogprobs
from wschat.server.engine import (
    EngineFailed,
    FeatureUnsupported,
    GenerationRequest,
    ResponseFormat,
    SamplingParams,
)
from wschat.server.engine.history import Conversation
from wschat.server.engine.openai import OpenAIEngine
from wschat.server.engine.openai.dialect import (
    AUTO,
    DIALECTS,
    LLAMA_CPP,
    SGLANG,
    VLLM,
    Delta,
    Dialect,
    LlamaCppDialect,
    SglangDialect,
    VllmDialect,
)
from wschat.server.settings import ENGINE_DIALECTS

from tests.openai.llama import LlamaServer
from tests.support import TIMEOUT, collect, raw_peer, running_server

LLAMA = LlamaCppDialect()
SGL = SglangDialect()
GREEDY = SamplingParams(max_new_tokens=8)
# every field llama.cpp's server reads into its sampler chain, none left to its defaults
LLAMA_CPP_SAMPLING_FIELDS = {
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "top_n_sigma",
    "dynatemp_range",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "xtc_probability",
    "mirostat",
    "min_keep",
    "n_probs",
    "seed",
    "stop",
    "samplers",
}


def native_chunk(**fields: Any) -> dict[str, Any]:
    return {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": -1, **fields}


def said(delta: Delta) -> tuple[str, list[int], str | None, int | None]:
    return delta.text, list(delta.ids), delta.finish, delta.cached_tokens


def test_the_dialect_is_told_by_the_owner_of_the_models() -> None:
    assert Dialect.detect({"data": [{"id": "m", "owned_by": "llamacpp"}]}).name == LLAMA_CPP
    assert Dialect.detect({"data": [{"id": "m", "owned_by": "vllm"}]}).name == VLLM
    assert Dialect.detect({"data": [{"id": "m", "owned_by": "sglang"}]}).name == SGLANG
    assert Dialect.detect({"data": [{"id": "m", "owned_by": "someone"}]}).name == VLLM
    assert Dialect.detect({"data": []}).name == VLLM
    assert Dialect.named(LLAMA_CPP).text_path == "/completion"
    assert Dialect.named(VLLM).text_path == "/v1/completions"
    assert Dialect.named(SGLANG).text_path == "/v1/completions"


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_each_dialect_is_found_by_its_name_and_by_its_owner(name: str) -> None:
    dialect = DIALECTS[name]
    assert type(Dialect.named(name)) is dialect and dialect.name == name
    models = {"data": [{"id": "m", "owned_by": dialect.owner}]}
    assert type(Dialect.choose(AUTO, models)) is dialect
    assert type(Dialect.choose(name, {"data": [{"id": "m", "owned_by": "other"}]})) is dialect
    assert len({d.owner for d in DIALECTS.values()}) == len(DIALECTS)


def test_the_engine_dialect_option_names_every_dialect() -> None:
    assert (AUTO, *DIALECTS) == ENGINE_DIALECTS


def test_a_name_that_is_no_dialect_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(ValueError, match=r"choose auto or vllm, llama\.cpp, sglang"):
        Dialect.named("tgi")


def test_a_native_chunk_gives_its_text_and_ids_and_no_finish() -> None:
    delta = LLAMA.text_delta(native_chunk(content=" Paris", tokens=[9079], tokens_predicted=1))
    assert said(delta) == (" Paris", [9079], None, None)


@pytest.mark.parametrize(
    ("stop_type", "finish"), [("limit", "length"), ("eos", "stop"), ("word", "stop")]
)
def test_the_last_native_chunk_gives_the_finish_reason_and_the_cached_prompt_tokens(
    stop_type: str, finish: str
) -> None:
    last = native_chunk(
        stop=True,
        stop_type=stop_type,
        tokens_cached=40,  # the slot's tokens after the reply: not what the cache gave
        timings={"cache_n": 31, "prompt_n": 2},
    )
    assert said(LLAMA.text_delta(last)) == ("", [], finish, 31)


def test_a_stop_word_keeps_its_token_id_without_its_text() -> None:
    # the token that completed the stop string: its text is withheld, its id is the reply's
    delta = LLAMA.text_delta(native_chunk(content="", tokens=[236777]))
    assert delta.text == "" and list(delta.ids) == [236777]


def test_the_text_body_is_native_with_ids_asked_back_and_no_probabilities() -> None:
    sampling = LLAMA.sampling(GREEDY, stop=["\n"], stop_token_ids=[106])
    body = LLAMA.text_body("gemma", [2, 105], 8, sampling)
    assert body["prompt"] == [2, 105] and body["n_predict"] == 8
    assert body["stream"] is True and body["return_tokens"] is True
    assert body["cache_prompt"] is True and body["n_probs"] == 0
    assert "logprobs" not in body and "max_tokens" not in body
    assert body["stop"] == ["\n"] and "stop_token_ids" not in body


def test_every_sampling_field_llama_cpp_reads_is_sent() -> None:
    sampled = SamplingParams(max_new_tokens=8, temperature=0.7, top_k=40, top_p=0.9, seed=3)
    for params in (GREEDY, sampled):
        fields = LLAMA.sampling(params, stop=[], stop_token_ids=[])
        assert set(fields) == LLAMA_CPP_SAMPLING_FIELDS
    assert fields["mirostat"] == 0 and fields["repeat_last_n"] == 64 and fields["seed"] == 3


@pytest.mark.parametrize(
    ("params", "chain", "top_k"),
    [
        (GREEDY, ["top_k"], 1),
        (SamplingParams(8, repetition_penalty=1.3), ["penalties", "top_k"], 1),
        (SamplingParams(8, temperature=0.8), ["temperature"], 0),
        (
            SamplingParams(8, temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1),
            ["penalties", "top_k", "temperature", "top_p"],
            50,
        ),
        (
            SamplingParams(8, temperature=0.8, top_p=0.95, min_p=0.05),
            ["temperature", "top_p", "min_p"],
            0,
        ),
    ],
)
def test_the_sampler_chain_holds_only_the_samplers_that_act(
    params: SamplingParams, chain: list[str], top_k: int
) -> None:
    fields = LLAMA.sampling(params, stop=[], stop_token_ids=[])
    assert fields["samplers"] == chain and fields["top_k"] == top_k
    assert fields["min_p"] == params.min_p


@pytest.mark.parametrize(("seed", "sent"), [(None, -1), (7, 7), (-1, (1 << 32) - 2)])
def test_a_seed_is_32_bits_and_none_is_random(seed: int | None, sent: int) -> None:
    params = SamplingParams(8, temperature=1.0, seed=seed)
    assert LLAMA.sampling(params, stop=[], stop_token_ids=[])["seed"] == sent


def test_vllm_chunks_give_text_ids_finish_and_the_usage_chunk_the_cached_tokens() -> None:
    vllm = VllmDialect()
    choice = {"index": 0, "text": " Paris", "token_ids": [9079], "finish_reason": None}
    assert said(vllm.text_delta({"choices": [choice]})) == (" Paris", [9079], None, None)
    last = {"choices": [{**choice, "text": "", "token_ids": [], "finish_reason": "length"}]}
    assert vllm.text_delta(last).finish == "length"
    usage = {"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 12}}}
    assert vllm.text_delta(usage).cached_tokens == 12
    body = vllm.text_body("m", [1], 4, vllm.sampling(GREEDY, stop=[], stop_token_ids=[1]))
    assert body["return_token_ids"] is True and body["max_tokens"] == 4
    assert body["top_k"] == -1 and body["stop_token_ids"] == [1]


@pytest.mark.parametrize("dialect", [VllmDialect(), SGL, LLAMA], ids=lambda d: d.name)
def test_only_vllm_bodies_carry_the_owners_scope_as_cache_salt(dialect: Dialect) -> None:
    sampling = dialect.sampling(GREEDY, stop=[], stop_token_ids=[])
    messages = [{"role": "user", "content": "hi"}]
    bodies = [
        dialect.text_body("m", [1], 4, sampling, "owner"),
        dialect.chat_body("m", messages, 4, sampling, "owner"),
    ]
    salted = dialect.name == VLLM
    assert [body.get("cache_salt") for body in bodies] == ["owner" if salted else None] * 2
    # no scope (no tokens: every client one owner): no salt, on every engine
    unscoped = [
        dialect.text_body("m", [1], 4, sampling),
        dialect.chat_body("m", messages, 4, sampling),
    ]
    assert not any("cache_salt" in body for body in unscoped)


def test_sglang_asks_for_ids_in_its_text_requests_with_vllms_fields_and_31_bit_seeds() -> None:
    params = SamplingParams(8, temperature=0.7, repetition_penalty=1.2, seed=-1)
    sampling = SGL.sampling(params, stop=["x"], stop_token_ids=[106])
    body = SGL.text_body("m", [2, 105], 8, sampling)
    assert body["prompt"] == [2, 105] and body["return_token_ids"] is True
    assert body["max_tokens"] == 8 and body["stream_options"] == {"include_usage": True}
    assert (body["top_k"], body["repetition_penalty"]) == (-1, 1.2)
    assert body["stop_token_ids"] == [106] and body["stop"] == ["x"]
    assert body["seed"] == (1 << 31) - 1
    assert all(0 <= SGL.seed(s) < 1 << 31 for s in (0, -(1 << 63), (1 << 64) - 1))
    # its chat chunks carry no ids: nothing asks for them
    chat = SGL.chat_body("m", [{"role": "user", "content": "hi"}], 8, sampling)
    assert "return_token_ids" not in chat and "logprobs" not in chat
    assert SGL.chat_call(chat).ids_from_text and not SGL.text_call(body).ids_from_text


def test_sglang_chunks_give_text_ids_finish_and_cached_tokens_when_it_reports_them() -> None:
    choice = {"index": 0, "text": "Paris", "token_ids": [9079], "finish_reason": None}
    first = {**choice, "matched_stop": None, "prompt_token_ids": [2, 105]}
    assert said(SGL.text_delta({"choices": [first]})) == ("Paris", [9079], None, None)
    end = {**choice, "text": "", "token_ids": [], "finish_reason": "stop", "matched_stop": 1}
    assert SGL.text_delta({"choices": [end]}).finish == "stop"
    reported = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 7}}
    assert SGL.text_delta({"choices": [], "usage": reported}).cached_tokens == 7
    # without --enable-cache-report the usage has no details: none were found
    plain = {"prompt_tokens": 9, "completion_tokens": 2, "reasoning_tokens": 0}
    assert SGL.text_delta({"choices": [], "usage": plain}).cached_tokens == 0
    chat = {"index": 0, "delta": {"role": "assistant", "content": "A red"}, "logprobs": None}
    assert said(SGL.chat_delta({"choices": [chat]})) == ("A red", [], None, None)


@pytest.mark.parametrize("dialect", [VllmDialect(), SGL])
def test_a_reply_the_engine_aborts_is_a_failure_not_a_stop(dialect: Dialect) -> None:
    aborted = {"index": 0, "text": "", "token_ids": [], "finish_reason": "abort"}
    with pytest.raises(EngineFailed, match="mid-reply"):
        dialect.text_delta({"choices": [aborted]})


def test_each_dialect_says_where_its_engine_tells_whether_the_model_reads_images() -> None:
    assert VllmDialect.vision_path is None and not VllmDialect().reads_images({})
    assert LLAMA.vision_path == "/props" and LLAMA.reads_images({"modalities": {"vision": True}})
    assert not LLAMA.reads_images({"modalities": {"vision": False}})
    assert SGL.vision_path == "/model_info" and SGL.reads_images({"has_image_understanding": True})
    assert not SGL.reads_images({"has_image_understanding": False, "is_generation": True})


# -- against llama.cpp's server ----------------------------------------------------------------


async def _native_tokens(url: str, body: dict[str, Any]) -> list[int]:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        response = await client.post(f"{url}/completion", json={**body, "stream": False})
        response.raise_for_status()
        return [int(i) for i in response.json()["tokens"]]


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("dialect", "text_fields"),
    [
        (
            VllmDialect(),
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True},
                }
            },
        ),
        # llguidance's options ride along: JSON as json.dumps writes it, no free whitespace
        (
            LLAMA,
            {
                "json_schema": SCHEMA
                | {
                    "x-guidance": {
                        "whitespace_flexible": False,
                        "item_separator": ", ",
                        "key_separator": ": ",
                        "lenient": False,
                    }
                }
            },
        ),
        (
            SGL,
            {
                "json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}, '
                '"required": ["a"]}'
            },
        ),
    ],
)
def test_a_response_format_goes_in_each_engines_own_field(
    dialect: Dialect, text_fields: dict[str, Any]
) -> None:
    strict = ResponseFormat(SCHEMA, strict=True)
    assert dialect.fields.constrained(strict, chat=False) == text_fields
    chat = dialect.fields.constrained(strict, chat=True)
    assert chat == {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True},
        }
    }
    assert dialect.fields.constrained(ResponseFormat(), chat=True) == {
        "response_format": {"type": "json_object"}
    }
    assert dialect.fields.constrained(None, chat=False) == {}


@pytest.mark.parametrize("dialect", [VllmDialect(), LLAMA, SGL])
def test_a_grammar_of_ours_is_sent_to_no_engine(dialect: Dialect) -> None:
    with pytest.raises(FeatureUnsupported) as refused:
        lark = ResponseFormat(lark='start: "x"')
        dialect.fields.check(SamplingParams(1, response_format=lark), dialect.name)
    assert refused.value.message == (
        f"the engine ({dialect.name}) is sent JSON schemas only, not a grammar"
    )
    dialect.fields.check(SamplingParams(1, response_format=ResponseFormat(SCHEMA)), dialect.name)


def test_logprobs_are_asked_by_id_and_read_back_most_probable_first() -> None:
    vllm = VllmDialect()
    assert vllm.fields.logprob_fields(2) == {"logprobs": 2, "return_tokens_as_token_ids": True}
    assert LLAMA.fields.logprob_fields(2) == {"n_probs": 2, "post_sampling_probs": False}
    assert vllm.fields.logprob_fields(None) == LLAMA.fields.logprob_fields(None) == {}
    logprobs: dict[str, Any] = {
        "tokens": ["token_id:7", "token_id:9"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": [
            {"token_id:3": -1.5, "token_id:7": -0.5},
            {"token_id:9": -0.25, "token_id:4": -2.0},
        ],
    }
    choice = {"text": "ab", "token_ids": [7, 9], "logprobs": logprobs}
    delta = vllm.text_delta({"choices": [choice]})
    assert list(delta.logprobs) == [
        (7, -0.5, ((7, -0.5), (3, -1.5))),
        (9, -0.25, ((9, -0.25), (4, -2.0))),
    ]
    native = native_chunk(
        content="a",
        tokens=[7],
        completion_probabilities=[
            {
                "id": 7,
                "token": "a",
                "bytes": [97],
                "logprob": -0.5,
                "top_logprobs": [{"id": 7, "logprob": -0.5}, {"id": 3, "logprob": -1.5}],
            }
        ],
    )
    assert list(LLAMA.text_delta(native).logprobs) == [(7, -0.5, ((7, -0.5), (3, -1.5)))]
    with pytest.raises(EngineFailed):
        vllm.text_delta({"choices": [{**choice, "logprobs": {**logprobs, "tokens": ["a", "b"]}}]})
    with pytest.raises(FeatureUnsupported) as refused:
        SGL.fields.check(SamplingParams(1, logprobs=2), SGL.name)
    assert refused.value.message == "the engine (sglang) gives no logprobs here"


async def test_llama_cpp_gives_each_tokens_logprobs_through_a_session(
    openai_engine: OpenAIEngine,
) -> None:
    async with running_server(openai_engine) as url, raw_peer(url) as (peer, _):
        params = {"logprobs": 2, "max_new_tokens": 8, "token_ids": True}
        await peer.send({"type": "prompt", "id": "p", "text": "Hello", "params": params})
        frames = [f for f in await peer.recv_until("done") if f["type"] == "token"]
    read = [TokenLogprobs.from_wire(frame["logprobs"]) for frame in frames]
    assert [i for part in read for i in part.ids] == [i for f in frames for i in f["ids"]]
    for part in read:
        assert part.top == 2 and all(v <= 0 for v in part.logprobs)
        for k in range(len(part.ids)):
            pair = part.top_logprobs[2 * k : 2 * k + 2]
            assert pair[0] >= pair[1]


async def test_llama_cpp_holds_a_reply_to_its_json_schema(openai_engine: OpenAIEngine) -> None:
    conversation = Conversation(openai_engine.prompt_format)
    ids = conversation.prompt_ids(conversation.tokenize_user("Name a colour."))
    # bounded: the base model left alone writes a number of 40 digits
    closed = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    strict = ResponseFormat(closed, strict=True)
    await openai_engine.prepare_reply(SamplingParams(1, response_format=strict))
    request = GenerationRequest(ids, SamplingParams(48, response_format=strict))
    text, finished = await collect(openai_engine.generate(request))
    assert finished.reason is FinishReason.STOP, text
    assert json.loads(text)["colour"] in ("red", "green", "blue")


@pytest.mark.parametrize("question", ["What is the capital of France?", "Name three colors."])
async def test_greedy_with_the_short_chain_gives_llama_cpps_own_greedy_tokens(
    openai_engine: OpenAIEngine, live_llama: LlamaServer, question: str
) -> None:
    conversation = Conversation(openai_engine.prompt_format)
    ids = conversation.prompt_ids(conversation.tokenize_user(question))
    ours = openai_engine.completion_body(GenerationRequest(ids, SamplingParams(32)))
    # llama.cpp's default chain with temperature 0: every sampler runs, the pick is the argmax
    plain = {"prompt": ids, "n_predict": 32, "temperature": 0, "return_tokens": True}
    # the same length either way; the whole prompt evaluated each time (a prompt half from the
    # cache is evaluated in other batches, whose rounding may flip a near tie)
    ours |= {"stop": [], "cache_prompt": False}
    plain["cache_prompt"] = False
    got = await _native_tokens(live_llama.url, ours)
    assert got and got == await _native_tokens(live_llama.url, plain)


async def test_a_reply_cut_at_its_token_limit_finishes_length_and_a_stop_string_stop(
    openai_engine: OpenAIEngine,
) -> None:
    conversation = Conversation(openai_engine.prompt_format)
    ids = conversation.prompt_ids(conversation.tokenize_user("What is the capital of France?"))
    cut = GenerationRequest(ids, SamplingParams(3), session_key="k")
    text, finished = await collect(openai_engine.generate(cut))
    assert finished.reason is FinishReason.LENGTH and len(finished.completion_ids) == 3
    last = openai_engine.tokenizer.decode(finished.completion_ids[-1:])
    stopped = GenerationRequest(ids, SamplingParams(16, stop=(last,)), session_key="k")
    _, finished = await collect(openai_engine.generate(stopped))
    assert finished.reason is FinishReason.STOP
    assert finished.text == text.removesuffix(last)
    # the same prompt again: the slot that ran it had it cached
    assert finished.usage is not None and finished.usage.cached_tokens > 0
