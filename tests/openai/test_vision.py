"""Image turns for --engine openai, as request bodies: the conversation the session's chat keeps,
as ``/v1/chat/completions`` messages with the images as data URIs in their places. No vision
server runs here (the embedded GGUF reads text only), so these check the bodies built, and that
a text-only engine refuses images as the in-process ones do."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator

import pytest
from PIL import Image
from wschat.server.engine import (
    Chat,
    Generation,
    GenerationRequest,
    ImagesUnsupported,
    Message,
    SamplingParams,
    Turn,
)
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.formats import GemmaTurns, Transcript
from wschat.server.engine.history import Conversation
from wschat.server.engine.openai.client import EngineHttp
from wschat.server.engine.openai.dialect import LLAMA_CPP, VLLM, Dialect
from wschat.server.engine.openai.engine import CHAT_PATH, OpenAIEngine, vision_tokens
from wschat.server.engine.openai.tokenizer import (
    GatewayTokenizer,
    load_tokenizer,
)
from wschat.server.engine.openai.vision import (
    IMAGE_SIZE,
    TOKENS_PER_IMAGE,
    VisionError,
    chat_messages,
    data_uri,
    normalise,
)

from tests.openai.llama import LlamaServer
from tests.support import TIMEOUT


@pytest.fixture(scope="module")
def tokenizer() -> GatewayTokenizer:
    return load_tokenizer("embedded", default_cache_dir())


def gemma(tokenizer: GatewayTokenizer) -> GemmaTurns:
    ends = frozenset({tokenizer.token_id("<eos>"), tokenizer.token_id("<end_of_turn>")})
    return GemmaTurns(tokenizer, ends)


def engine(tokenizer: GatewayTokenizer, dialect: str, max_images: int) -> OpenAIEngine:
    """An engine that is never connected: it only builds bodies."""
    http = EngineHttp("http://127.0.0.1:9/v1", None)
    return OpenAIEngine(
        http,
        Dialect.named(dialect),
        "gemma-3-12b-it",
        tokenizer,
        gemma(tokenizer),
        8192,
        max_images,
    )


def picture(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> Image.Image:
    return Image.new("RGB", size, color)


def decoded(uri: str) -> Image.Image:
    head, data = uri.split(",", 1)
    assert head == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(data)))


@pytest.fixture
def two_turns(tokenizer: GatewayTokenizer) -> Iterator[tuple[list[int], list[Message]]]:
    """A session's second prompt: a system prompt, a first turn with a red image and its
    reply, then a turn with a green and a blue image; as ids and as messages."""
    conversation = Conversation(gemma(tokenizer))
    placeholder = engine(tokenizer, LLAMA_CPP, 4).image_placeholder_ids()
    red, green, blue = (normalise(picture(c)) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255)))
    conversation.set_system("Answer briefly.")
    reply = [*tokenizer.tokenize_text("A red square."), tokenizer.token_id("<end_of_turn>")]
    conversation.add_exchange(tokenizer.tokenize_text("What is this?"), [placeholder], [red], reply)
    user = tokenizer.tokenize_text("And these two?")
    ids = conversation.prompt_ids(user, [placeholder, placeholder])
    yield ids, conversation.messages(user, [green, blue])


def test_a_conversation_with_images_becomes_messages_with_data_uris_in_place(
    tokenizer: GatewayTokenizer, two_turns: tuple[list[int], list[Message]]
) -> None:
    _, gemma_messages = two_turns
    system_gap = vision_tokens(tokenizer, gemma(tokenizer))[1]
    messages = chat_messages(gemma_messages, tokenizer.decode, system_gap)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    first, reply, last = messages
    # the system prompt where Gemma 3's template puts it: the head of the first user turn
    assert [p["type"] for p in first["content"]] == ["text", "image_url", "text"]
    assert first["content"][0]["text"] == "Answer briefly.\n\n"
    assert first["content"][2]["text"] == "What is this?"
    assert reply["content"] == "A red square."
    assert [p["type"] for p in last["content"]] == ["image_url", "image_url", "text"]
    assert last["content"][2]["text"] == "And these two?"
    uris = [p["image_url"]["url"] for m in (first, last) for p in m["content"] if "image_url" in p]
    colors = [decoded(u).getpixel((0, 0)) for u in uris]
    assert colors == [(255, 0, 0), (0, 255, 0), (0, 0, 255)]  # each image in its place


async def test_an_image_turn_reaches_the_engine_as_messages_beside_its_prompt_ids(
    tokenizer: GatewayTokenizer,
) -> None:
    """The session's chat hands the engine the conversation as messages: the OpenAI engine
    sends those, never reading its own rendered ids back."""
    vision = engine(tokenizer, LLAMA_CPP, 4)
    requests: list[GenerationRequest] = []

    def generate(request: GenerationRequest) -> Generation:
        requests.append(request)
        return Generation(prompt_tokens=len(request.prompt_ids))

    vision.generate = generate  # type: ignore[method-assign]
    chat = Chat(vision, "session-1")
    await chat.set_system("Answer briefly.", min_turn_tokens=16)
    red = vision.prepare_image(picture((255, 0, 0)))
    turn = Turn("What is this?", SamplingParams(max_new_tokens=8), [red])
    chat.start(await chat.prepare(turn, max_user_tokens=100))
    (request,) = requests
    system, user = request.messages
    assert system == Message("system", tokenizer.tokenize_text("Answer briefly."))
    assert user == Message("user", tokenizer.tokenize_text("What is this?"), [red])
    body = vision.chat_body(request)
    assert [p["type"] for p in body["messages"][0]["content"]] == ["text", "image_url", "text"]
    assert len(request.prompt_ids) > TOKENS_PER_IMAGE  # the image's run counts in the context


@pytest.mark.parametrize("dialect", [LLAMA_CPP, VLLM])
def test_the_chat_body_carries_the_messages_and_every_sampling_field_of_the_text_body(
    tokenizer: GatewayTokenizer, two_turns: tuple[list[int], list[Message]], dialect: str
) -> None:
    ids, messages = two_turns
    images = [image for m in messages for image in m.images]
    vision = engine(tokenizer, dialect, 4)
    params = SamplingParams(max_new_tokens=32, temperature=0.7, top_k=40, seed=7)
    request = GenerationRequest(ids, params, images, "session-1", messages=messages)
    chat, text = vision.chat_body(request), vision.completion_body(request)
    assert "prompt" not in chat and chat["messages"][-1]["role"] == "user"
    fields = vision.dialect.sampling(params, stop=[], stop_token_ids=[]).keys()
    assert {k: chat[k] for k in fields} == {k: text[k] for k in fields}
    assert text["temperature"] == 0.7 and text["seed"] == 7 and text["top_p"] == 1.0
    assert {k: chat[k] for k in vision.dialect.chat_ids_request()} == (
        {"logprobs": True, "top_logprobs": 1}
        if dialect == LLAMA_CPP
        else {"return_token_ids": True}
    )
    assert chat["max_tokens"] == 32 and chat["stream"] is True


def test_an_image_takes_its_tokens_in_the_context_and_is_kept_at_the_input_size(
    tokenizer: GatewayTokenizer,
) -> None:
    vision = engine(tokenizer, LLAMA_CPP, 2)
    assert vision.info.images and vision.info.max_images == 2
    placeholder = vision.image_placeholder_ids()
    assert len(placeholder) == TOKENS_PER_IMAGE + 2
    assert placeholder[0] == tokenizer.token_id("<start_of_image>")
    assert placeholder[-1] == tokenizer.token_id("<end_of_image>")
    kept = vision.prepare_image(picture((1, 2, 3), (1200, 500)))
    assert kept.size == (IMAGE_SIZE, IMAGE_SIZE)
    assert decoded(data_uri(kept)).size == (IMAGE_SIZE, IMAGE_SIZE)


@pytest.mark.parametrize("dialect", [LLAMA_CPP, VLLM])
def test_an_engine_over_http_runs_on_its_host_and_names_its_kind(
    tokenizer: GatewayTokenizer, dialect: str
) -> None:
    """What /readyz, /v1/stats and /metrics show as ``device`` and ``dtype``."""
    info = engine(tokenizer, dialect, 0).info
    assert (info.runs_on, info.backend) == ("127.0.0.1", dialect)


def test_an_engine_without_images_refuses_them(tokenizer: GatewayTokenizer) -> None:
    text_only = engine(tokenizer, LLAMA_CPP, 0)
    assert not text_only.info.images and text_only.info.max_images == 0
    for call in (
        text_only.image_placeholder_ids,
        lambda: text_only.prepare_image(picture((0,) * 3)),
    ):
        with pytest.raises(ImagesUnsupported, match="does not read images"):
            call()


def test_images_need_gemma_turns(tokenizer: GatewayTokenizer) -> None:
    ends = frozenset({tokenizer.token_id("<eos>")})
    transcript = Transcript(tokenizer, ends, tokenizer.newline_ids())
    with pytest.raises(VisionError, match="gemma-turns"):
        vision_tokens(tokenizer, transcript)


def test_a_text_prompt_still_goes_to_completions_as_ids(tokenizer: GatewayTokenizer) -> None:
    vision = engine(tokenizer, LLAMA_CPP, 4)
    conversation = Conversation(vision.prompt_format)
    ids = conversation.prompt_ids(conversation.tokenize_user("Hello."))
    body = vision.completion_body(GenerationRequest(ids, SamplingParams(max_new_tokens=4)))
    assert body["prompt"] == ids and "messages" not in body


async def test_llama_cpp_takes_the_chat_body_and_streams_text_with_its_ids(
    live_llama: LlamaServer, connected_openai: OpenAIEngine
) -> None:
    """The chat body's fields as llama.cpp's server reads them (a text-only conversation: its
    model reads no images): a greedy reply of max_tokens tokens, each chunk with its token id."""
    base = connected_openai
    chat = OpenAIEngine(
        EngineHttp(live_llama.api_url, None),
        base.dialect,
        base.model,
        base.tokenizer,
        gemma(base.tokenizer),  # images need Gemma turns; the base model's default is not
        base.info.context_tokens,
        1,
    )
    conversation = Conversation(chat.prompt_format)
    user = conversation.tokenize_user("Name three colors.")
    ids, messages = conversation.prompt_ids(user), conversation.messages(user, [])
    body = chat.chat_body(GenerationRequest(ids, SamplingParams(6), messages=messages))
    texts: list[str] = []
    got: list[int] = []
    reasons: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            async for chunk in chat.http.stream(CHAT_PATH, body, "s1"):
                delta = chat.dialect.chat_delta(chunk)
                texts.append(delta.text)
                got += delta.ids
                reasons += [delta.finish] if delta.finish else []
    finally:
        await chat.aclose()
    assert reasons == ["length"] and len(got) == 6
    assert chat.tokenizer.decode(got) == "".join(texts)
