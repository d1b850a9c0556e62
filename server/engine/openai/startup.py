"""Building an ``OpenAIEngine`` at start, in the loading thread (blocking calls): wait for the
engine to answer ``/v1/models``, pick the model and the dialect, check that the engine tokenizes
as the gateway's tokenizer does, choose the prompt format from the vocabulary, and ask the engine
whether it reads images.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..errors import GenerationFailure
from ..formats import (
    FormatHints,
    GemmaTurns,
    PromptFormat,
    Transcript,
    choose_format,
    looks_instruction_tuned,
)
from .client import EngineHttp
from .dialect import AUTO, Dialect
from .engine import NAME, OpenAIEngine, vision_tokens
from .tokenizer import GatewayTokenizer, TokenizerError, load_tokenizer
from .vision import VisionError

log = logging.getLogger("wschat.engine.openai")

# A probe with spaces, digits, accents, CJK, an emoji, code and markup-looking text: a tokenizer
# that differs from the engine's almost surely splits one of these differently.
PROBE = "Hello, world! 12345 café 日本語 😀 def f(x): return x  <start_of_turn>user\n\tEnd."
_WAIT_LOG_EVERY_S = 10.0
DETECTED_MAX_IMAGES = 4  # per prompt, for an engine that says it reads images (as in process)


@dataclass(frozen=True, slots=True)
class OpenAIEngineConfig:
    url: str
    tokenizer: str
    cache_dir: Path
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    prompt_format: str = "auto"
    context_tokens: int = 8192
    # images per prompt the engine's model reads: None asks the engine (where it says), 0: none
    images: int | None = None
    # how the engine is spoken to (dialect.DIALECTS); "auto": as /v1/models' owner says
    dialect: str = AUTO


def connect(
    config: OpenAIEngineConfig, *, http: EngineHttp | None = None, name: str = NAME
) -> OpenAIEngine:
    """Load the tokenizer, wait for the engine, check it tokenizes as we do; in the loading
    thread (blocking calls). ``http``: a client already made for ``config.url`` (one that a
    supervisor moves); ``name``: the engine's name in ``ready`` and ``/readyz``."""
    tokenizer = load_tokenizer(config.tokenizer, config.cache_dir)
    http = http or EngineHttp(config.url, config.api_key)
    models = _wait_for_engine(http)
    data = models.get("data") or []
    if not data:
        raise RuntimeError(f"{http.api_url}/models lists no model")
    entry = (
        next((m for m in data if m.get("id") == config.model), None) if config.model else data[0]
    )
    if entry is None:
        served = ", ".join(str(m.get("id")) for m in data)
        raise RuntimeError(f"the engine does not serve {config.model!r} (it serves {served})")
    model = str(entry["id"])
    dialect = Dialect.choose(config.dialect, models)
    check_tokenizer(http, dialect, model, tokenizer)
    engine_context = dialect.context_tokens(entry)
    context = min(config.context_tokens, engine_context or config.context_tokens)
    fmt = gateway_format(config.prompt_format, tokenizer, model)
    log.info(
        "engine %s: %s at %s (%s), context %d tokens (engine's %s), prompt format %s",
        name,
        model,
        http.api_url,
        dialect.name,
        context,
        engine_context or "unknown",
        fmt.name,
    )
    images = _max_images(config.images, http, dialect, tokenizer, fmt)
    return OpenAIEngine(http, dialect, model, tokenizer, fmt, context, images, name)


def _max_images(
    requested: int | None,
    http: EngineHttp,
    dialect: Dialect,
    tokenizer: GatewayTokenizer,
    fmt: PromptFormat,
) -> int:
    """Images per prompt: as configured (refusing to start if they cannot be placed), else
    what the engine says at its dialect's ``vision_path`` (llama.cpp's ``/props``, SGLang's
    ``/model_info``; vLLM says nothing)."""
    if requested is not None:
        if requested > 0:
            vision_tokens(tokenizer, fmt)  # a VisionError stops the start with its reason
        return max(0, requested)
    if dialect.vision_path is None:
        return 0
    try:
        if not dialect.reads_images(http.get_json(dialect.vision_path, root=True)):
            return 0
    except (httpx.HTTPError, GenerationFailure) as error:
        log.info("no %s on the engine (%s): no images", dialect.vision_path, error)
        return 0
    try:
        vision_tokens(tokenizer, fmt)
    except VisionError as error:
        log.warning("the engine reads images, but they cannot be sent: %s", error)
        return 0
    return DETECTED_MAX_IMAGES


def _wait_for_engine(http: EngineHttp) -> dict[str, Any]:
    """``/v1/models``, once the engine answers. A start with the engine down waits (readyz says
    loading meanwhile); it gives up once the main thread has ended (the server is exiting)."""
    started = last_log = time.monotonic()
    while True:
        try:
            models: dict[str, Any] = http.get_json("/models")
            return models
        except httpx.HTTPStatusError as error:
            if error.response.status_code in (401, 403):
                raise RuntimeError(f"the engine refused our API key ({error})") from None
            problem = str(error)
        except httpx.HTTPError as error:
            problem = str(error) or type(error).__name__
        if not threading.main_thread().is_alive():
            raise RuntimeError("the server stopped while waiting for the engine")
        if time.monotonic() - last_log >= _WAIT_LOG_EVERY_S:
            last_log = time.monotonic()
            log.info(
                "waiting for the engine at %s (%.0f s): %s",
                http.api_url,
                last_log - started,
                problem,
            )
        time.sleep(0.5)


def check_tokenizer(
    http: EngineHttp, dialect: Dialect, model: str, tokenizer: GatewayTokenizer
) -> None:
    """Refuse to start when the engine tokenizes the probe otherwise than we do: every prompt
    would then mean something else to the model."""
    ours = tokenizer.tokenize_text(PROBE)
    try:
        answer = http.post_json("/tokenize", dialect.tokenize_body(PROBE, model), root=True)
    except httpx.HTTPStatusError as error:
        log.warning("cannot check the tokenizer against the engine's: %s", error)
        return
    theirs = [int(i) for i in answer.get("tokens", [])]
    if theirs != ours:
        raise TokenizerError(
            f"the tokenizer {tokenizer.name!r} does not match the engine's for {model!r}: "
            f"a probe text gives {_head(ours)} here and {_head(theirs)} there; pass the "
            "model's own tokenizer.json with --tokenizer"
        )


def _head(ids: Sequence[int]) -> str:
    return f"{len(ids)} ids {list(ids[:8])}{'...' if len(ids) > 8 else ''}"


def gateway_format(requested: str, tokenizer: GatewayTokenizer, model: str) -> PromptFormat:
    """The prompt format (engine/formats.py) from the vocabulary and the model's name; the
    chat template needs transformers' renderer, which the gateway does not carry."""
    vocab = tokenizer.vocab()
    hints = FormatHints(
        has_chat_template=False,
        has_gemma_turns="<start_of_turn>" in vocab and "<end_of_turn>" in vocab,
        instruction_tuned=looks_instruction_tuned(model.rsplit("/", 1)[-1]),
    )
    name = choose_format(requested, hints)
    eos = frozenset(vocab[t] for t in ("<eos>", "<end_of_turn>") if t in vocab)
    if name == "chat-template":
        raise ValueError("--engine openai renders 'gemma-turns' or 'transcript', not templates")
    if name == "gemma-turns":
        if not hints.has_gemma_turns:
            raise ValueError("the vocabulary has no Gemma turn markers: pick another format")
        return GemmaTurns(tokenizer, eos)
    bos = "<bos>" if "<bos>" in vocab else None
    return Transcript(tokenizer, eos, tokenizer.newline_ids(), bos=bos)
