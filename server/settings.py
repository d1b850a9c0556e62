"""Server settings: one frozen dataclass, filled from the CLI and ``WSCHAT_*`` variables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# What --engine may name (runtime/engines.py builds each).
ENGINES = ("batched", "generate", "openai", "llamacpp")
# What --dtype may name (engine/local/precision.py: what each is, and what auto picks)
DTYPES = (
    "auto",
    "float32",
    "bfloat16",
    "float16",
    "fp16-weights",
    "bf16-packed",
    "fp32",
    "bf16",
    "fp16",
)
# What --session-store may name besides "memory" (sessions/store.py opens it)
STORE_SCHEMES = ("redis://", "rediss://", "unix://")
# Generations at once under --max-concurrent auto for an engine that does not batch
# ("generate": a thread each; "openai": requests in flight to its server)
UNBATCHED_CONCURRENT = 8


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "embedded"
    cache_dir: Path | None = None
    device: str = "auto"
    dtype: str = "auto"
    # "batched": every session's generation decodes in one forward per step (bench/ measures it
    # ahead of "generate", one model.generate thread per reply, from 4 concurrent streams on)
    engine: str = "batched"
    # --engine openai: the OpenAI-compatible server that generates (its API base, ".../v1"),
    # the model it serves (None: the first it lists), its API key (never logged) and the
    # tokenizer the gateway renders prompts with ("embedded", or a tokenizer.json or its folder)
    engine_url: str = "http://127.0.0.1:8080/v1"
    engine_model: str | None = None
    engine_api_key: str | None = field(default=None, repr=False)
    # images per prompt the engine's model reads (None: as the engine says, where it does)
    engine_images: int | None = None
    tokenizer: str = "embedded"
    # how a conversation becomes prompt ids (server/engine/formats.py); "auto" picks per model
    prompt_format: str = "auto"
    # generations decoding at once across sessions (the batched engine's batch width); more wait
    # in a queue of max_queue. None (auto): the batched engine's width for its device, never
    # more rows than the memory left holds (runtime/batch_width.py says what and why); the other
    # engines take UNBATCHED_CONCURRENT
    max_concurrent: int | None = None
    # prompt tokens the batched engine prefills per pass, so decoding rows never wait long
    prefill_chunk_tokens: int = 512
    # CPU threads torch uses in the engine's worker; None: auto (every usable core while the
    # cores are free, fewer while other processes keep some busy: engine/threads.py says why)
    threads: int | None = None
    max_queue: int = 64
    max_new_tokens: int = 1024
    default_max_new_tokens: int = 256
    context_tokens: int = 8192
    # KV state kept for idle sessions' next turns, in MiB, both engines' paths together
    kv_budget_mib: int = 1024
    max_frame_bytes: int = 12 * 1024 * 1024
    max_image_bytes: int = 10 * 1024 * 1024
    max_image_pixels: int = 25_000_000
    max_images: int = 4
    # bytes the images of one session may hold (kept at the model's input size: 2.4 MB each for
    # Gemma 3), its conversation's and the staged ones together
    max_session_image_bytes: int = 32 * 1024 * 1024
    max_prompt_bytes: int = 256 * 1024
    max_prompt_tokens: int = 8192
    frames_per_second: int = 50
    max_connections: int = 1000
    max_connections_per_client: int = 100
    idle_timeout_s: float = 600.0
    ping_interval_s: float = 20.0
    stall_timeout_s: float = 120.0
    # a connection whose send buffer stays full this long (the peer stopped reading) is dropped
    send_timeout_s: float = 30.0
    # an HTTP request (a handshake included) must arrive whole within this, and at most
    # max_pending_handshakes may be arriving at once (max_connections_per_client per address)
    handshake_timeout_s: float = 10.0
    max_pending_handshakes: int = 256
    shutdown_grace_s: float = 10.0
    resume_window_s: float = 120.0
    # a connection that drops mid-reply without a close frame keeps its reply generating this
    # long, its frames kept for a resume (PROTOCOL.md section 10); 0: cancelled at once
    resume_grace_s: float = 15.0
    # where detached sessions are kept: "memory" (this process) or a Redis URL (redis://,
    # rediss://, unix://), which any replica can resume from; may hold a password
    session_store: str = field(default="memory", repr=False)
    # a replica renews its hold on each connected session's stored state this often (a third)
    session_lease_s: float = 6.0
    tokens: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    # Host names a request may name when no token is set (DNS rebinding); the local names and
    # the address a connection reached are always allowed (access.host_allowed)
    allowed_hosts: tuple[str, ...] = ()
    # peers whose X-Forwarded-For is believed (proxies in front); none by default
    forwarded_allow_ips: tuple[str, ...] = ()
    log_level: str = "info"
