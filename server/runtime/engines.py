"""What ``--engine`` may name, one entry each in ``ENGINE_KINDS``: the extras it needs, the
checks made before it loads, and its builder; and the engine the settings name, built (local
engines: the model loaded in a thread of its own) or connected (an OpenAI-compatible server).

Everything that knows the kinds reads this table: the CLI's choices, its missing-extra line and
its checks, and ``make_engine``. Importing it imports no extra: each builder imports its engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..engine import Engine
from ..engine.embedded import EMBEDDED_ABOUT
from ..settings import UNBATCHED_CONCURRENT, Settings
from .extras import SERVER, missing_extras_message, modules_of
from .model_checks import device_problem, gguf_problem, model_problem
from .redaction import install_log_filters

log = logging.getLogger("wschat.serve")

# A check made before the engine loads: why it cannot, in one line; None when it may
Check = Callable[[Settings], str | None]
# The local engines': the device here, then the model
LOCAL_CHECKS: tuple[Check, ...] = (device_problem, model_problem)


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One ``--engine`` value: its name, the extras of pyproject.toml it needs, what builds it from
    the settings, whether it loads the model in this process (torch: ``--model`` a folder or a hub
    name, ``--device`` and ``--dtype`` apply) and the checks made before it loads."""

    name: str
    extras: tuple[str, ...]
    build: Callable[[Settings], Engine]
    local: bool = False
    checks: tuple[Check, ...] = ()

    @property
    def modules(self) -> tuple[str, ...]:
        """The modules its extras bring past the base install."""
        return modules_of(self.extras)

    def missing_extras(self, missing: list[str]) -> str:
        """The line that says what to install where ``missing`` cannot be imported."""
        return missing_extras_message(self.name, self.extras, missing)


def make_engine(settings: Settings) -> Engine:
    """The engine ``settings.engine`` names, built by its kind."""
    kind = ENGINE_KINDS.get(settings.engine)
    if kind is None:
        raise ValueError(f"unknown engine {settings.engine!r}: choose one of {tuple(ENGINE_KINDS)}")
    return kind.build(settings)


def _about_embedded(engine: Engine, settings: Settings) -> Engine:
    """The engine, with what its model can do said where it runs the embedded one
    (``EngineInfo.about``)."""
    if settings.model == "embedded":
        engine.info = dataclasses.replace(engine.info, about=EMBEDDED_ABOUT)
    return engine


# What makes a local engine of the loaded model, of its options and thread policy
LocalMaker = Callable[[Any, Any, Any], Engine]


def _local(make: LocalMaker) -> Callable[[Settings], Engine]:
    """A local kind's builder: the model loaded and the engine ``make`` makes of it, in a thread of
    its own that exits once it is done. OpenMP keeps a pool of workers per live thread that has run
    a parallel region, and while two such threads live each one's parallel regions run far slower;
    so no thread but the engine's may keep a pool."""

    def build(settings: Settings) -> Engine:
        made: list[Engine] = []
        failed: list[BaseException] = []

        def load() -> None:
            try:
                made.append(_load_local(settings, make))
            except BaseException as error:
                failed.append(error)

        loader = threading.Thread(target=load, name="wschat-load")
        loader.start()
        loader.join()
        if failed:
            raise failed[0]
        return _about_embedded(made[0], settings)

    return build


def _connect_openai(settings: Settings) -> Engine:
    """No model here: the gateway's tokenizer, and an engine that answers over HTTP."""
    from ..engine.embedded import default_cache_dir
    from ..engine.openai import OpenAIEngineConfig, connect

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
    from ..engine.embedded import EMBEDDED, default_cache_dir
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
    return _about_embedded(engine, settings)


def _load_local(settings: Settings, make: LocalMaker) -> Engine:
    from ..engine.local.loader import load_model
    from ..engine.local.options import LocalEngineOptions
    from ..engine.local.threads import ThreadPolicy

    threads = ThreadPolicy(settings.threads)
    log.info("CPU threads: %s", threads.reason)
    loaded = load_model(
        settings.model, cache_dir=settings.cache_dir, device=settings.device, dtype=settings.dtype
    )
    options = LocalEngineOptions(
        context_tokens=settings.context_tokens,
        max_images=settings.max_images,
        kv_budget_bytes=settings.kv_budget_mib << 20,
        shared_openings=settings.shared_openings,
        prompt_format=settings.prompt_format,
        width=settings.max_concurrent,  # None: auto (engine/local/batch_width.py)
        prefill_tokens=settings.prefill_chunk_tokens,
    )
    engine = make(loaded, options, threads)
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


def _batched(loaded: Any, options: Any, threads: Any) -> Engine:
    from ..engine.local.batched import BatchedEngine

    return BatchedEngine(loaded, options, threads=threads)


def _generate(loaded: Any, options: Any, threads: Any) -> Engine:
    from ..engine.local.hf import HFEngine

    return HFEngine(loaded, options, threads=threads)


# The one table of engine kinds (docs/architecture.md "A new engine"); a test keeps each kind's
# extras equal to pyproject.toml's and the CLI's --engine choices equal to its names.
ENGINE_KINDS: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind("batched", (SERVER,), _local(_batched), local=True, checks=LOCAL_CHECKS),
        EngineKind("generate", (SERVER,), _local(_generate), local=True, checks=LOCAL_CHECKS),
        EngineKind("openai", ("gateway",), _connect_openai),
        EngineKind("llamacpp", ("gateway", "llamacpp"), _start_llamacpp, checks=(gguf_problem,)),
    )
}
