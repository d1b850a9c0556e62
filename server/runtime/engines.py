"""The engine the settings name, built (local engines: the model loaded in a thread of its
own) or connected (an OpenAI-compatible server)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from ..engine import Engine
from ..engine.embedded import EMBEDDED_ABOUT
from ..settings import ENGINES, UNBATCHED_CONCURRENT, Settings
from .redaction import install_log_filters

log = logging.getLogger("wschat.serve")


def make_engine(settings: Settings) -> Engine:
    """The engine the settings name, with what its model can do said where it is the embedded
    one (``EngineInfo.about``)."""
    engine = _make_engine(settings)
    if settings.model == "embedded" and settings.engine != "openai":
        engine.info = dataclasses.replace(engine.info, about=EMBEDDED_ABOUT)
    return engine


def _make_engine(settings: Settings) -> Engine:
    """The engine ``settings.engine`` names: 'batched' (BatchedEngine) or 'generate' (HFEngine).

    Loading runs in a thread of its own that exits once it is done. OpenMP keeps a pool of
    workers per live thread that has run a parallel region, and while two such threads live
    each one's parallel regions run far slower; so no thread but the engine's may keep a pool.
    """
    if settings.engine not in ENGINES:
        raise ValueError(f"unknown engine {settings.engine!r}: choose one of {ENGINES}")
    if settings.engine == "openai":
        return _connect_openai(settings)
    if settings.engine == "llamacpp":
        return _start_llamacpp(settings)
    made: list[Engine] = []
    failed: list[BaseException] = []

    def build() -> None:
        try:
            made.append(_build_engine(settings))
        except BaseException as error:
            failed.append(error)

    loader = threading.Thread(target=build, name="wschat-load")
    loader.start()
    loader.join()
    if failed:
        raise failed[0]
    return made[0]


def _connect_openai(settings: Settings) -> Engine:
    """No model here: the gateway's tokenizer, and an engine that answers over HTTP."""
    from ..engine.openai import OpenAIEngineConfig, connect
    from ..engine.openai.tokenizer import default_cache_dir

    return connect(
        OpenAIEngineConfig(
            url=settings.engine_url,
            tokenizer=settings.tokenizer,
            cache_dir=settings.cache_dir or default_cache_dir(),
            model=settings.engine_model,
            api_key=settings.engine_api_key,
            prompt_format=settings.prompt_format,
            context_tokens=settings.context_tokens,
            images=settings.engine_images,
            dialect=settings.engine_dialect,
        )
    )


def _start_llamacpp(settings: Settings) -> Engine:
    """llama.cpp's server, started and supervised here, with the openai engine in front."""
    from ..engine.openai.tokenizer import EMBEDDED, default_cache_dir
    from .supervisor import LlamaCppConfig, LlamaCppServer, launch

    config = LlamaCppConfig(
        model=settings.model,
        cache_dir=settings.cache_dir or default_cache_dir(),
        threads=settings.threads,
        slots=settings.max_concurrent or UNBATCHED_CONCURRENT,
        slot_context=settings.context_tokens,
        idle_kv_mib=settings.kv_budget_mib,
    )
    tokenizer = None if settings.tokenizer == EMBEDDED else settings.tokenizer
    engine = launch(config, tokenizer=tokenizer, prompt_format=settings.prompt_format)
    if isinstance(engine.child, LlamaCppServer):  # the key it made for its child is a secret too
        install_log_filters([engine.child.api_key])
    return engine


def _build_engine(settings: Settings) -> Engine:
    from ..engine.local.loader import load_model
    from ..engine.local.threads import ThreadPolicy

    threads = ThreadPolicy(settings.threads)
    log.info("CPU threads: %s", threads.reason)
    loaded = load_model(
        settings.model, cache_dir=settings.cache_dir, device=settings.device, dtype=settings.dtype
    )
    common: dict[str, Any] = {
        "prompt_format": settings.prompt_format,
        "context_tokens": settings.context_tokens,
        "max_images": settings.max_images,
        "kv_budget_bytes": settings.kv_budget_mib << 20,
        "shared_openings": settings.shared_openings,
    }
    engine: Engine
    if settings.engine == "batched":
        from ..engine.local.batched import BatchedEngine

        engine = BatchedEngine(
            loaded,
            width=_batch_width(settings, loaded),
            prefill_tokens=settings.prefill_chunk_tokens,
            threads=threads,
            **common,
        )
    else:
        from ..engine.local.hf import HFEngine

        engine = HFEngine(loaded, threads=threads, **common)
    info = engine.info
    log.info(
        "engine %s: %s on %s (%s), %d generations at once, prompt format %s",
        info.name,
        info.model,
        info.runs_on,
        info.backend,
        info.batch_width or settings.max_concurrent or UNBATCHED_CONCURRENT,
        info.prompt_format,
    )
    return engine


def _batch_width(settings: Settings, loaded: Any) -> int:
    """``--max-concurrent`` when given; else the default for the device and the memory left
    (runtime/batch_width.py), from the loaded model's shape."""
    if settings.max_concurrent is not None:
        return settings.max_concurrent
    from ..engine.local.memory import free_bytes
    from .batch_width import KVShape, default_width

    text = getattr(loaded.model.config, "text_config", loaded.model.config)
    layers = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    context = min(settings.context_tokens, int(getattr(text, "max_position_embeddings", 8192)))
    shape = KVShape.of(
        layers,
        int(getattr(text, "sliding_window", None) or context),
        int(text.num_key_value_heads),
        int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads),
        loaded.dtype.itemsize,
    )
    reserved = settings.kv_budget_mib << 20  # the idle sessions' KV state, on the same device
    chosen = default_width(
        loaded.device, shape.row_bytes(context), free_bytes(loaded.device), reserved
    )
    log.info("batch width (--max-concurrent auto): %s", chosen.reason)
    return chosen.width
