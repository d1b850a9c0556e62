"""Server settings: one frozen dataclass, filled from the CLI and ``WSCHAT_*`` variables.

Each field says what it means once, in its ``option(...)``: ``wschat-server --help``
(runtime/cli.py) prints it, and the README's options table is written from it
(``python -m tests.runtime.readme_options --write``; a test keeps the two equal). Code is in
backticks there; the help prints an option as ``--name`` and another value as ``'value'``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

# What --dtype may name (engine/local/precision.py: what each is, and what auto picks)
DTYPES = (
    "auto",
    "float32",
    "bfloat16",
    "float16",
    "fp16-weights",
    "bf16-packed",
    "fp16-int8head",
    "bf16-int8head",
    "fp16-int8",
    "bf16-int8",
    "fp32",
    "bf16",
    "fp16",
)
# What --session-store may name besides "memory" (sessions/hub.py opens it)
STORE_SCHEMES = ("redis://", "rediss://", "unix://")
# What --engine-dialect may name: auto, or a dialect of engine/openai/dialect.py (a test keeps
# the two in step)
ENGINE_DIALECTS = ("auto", "vllm", "llama.cpp", "sglang")
# When --grammar-vocabulary builds structured output's view of the vocabulary
GRAMMAR_AT_FIRST_USE, GRAMMAR_AT_START = "first-use", "start"
GRAMMAR_VOCABULARY = (GRAMMAR_AT_FIRST_USE, GRAMMAR_AT_START)
# The batched engine's width under --max-concurrent auto where memory is no limit
# (engine/local/batch_width.py: the rule and the memory; `python -m bench --only widths`
# measures the CPU's, bench/gpu.py the GPU's). Wider is better while a step over more rows costs
# far less than several narrower steps: rows past the width wait for whole replies. On a GPU a
# decode step reads every weight once whatever the rows, so memory sets the width long before
# speed does. (engine/local/batch_width.py repeats it: the settings import no engine.)
PREFERRED = {"cpu": 32, "cuda": 64}
# Generations at once under --max-concurrent auto for an engine that does not batch
# ("generate": a thread each; "openai": requests in flight to its server)
UNBATCHED_CONCURRENT = 8

_T = TypeVar("_T")


def option(default: _T, meaning: str, *, secret: bool = False) -> _T:
    """A setting: its default and what it means (the one description of it); a secret is left
    out of the repr, so that no log line shows it."""
    return field(default=default, metadata={"help": meaning}, repr=not secret)


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8000, "port to listen on (0 picks a free one)")
    model: str = option(
        "embedded",
        "`embedded` (Gemma 3 270M shipped as a Python package), a local model folder, or a hub "
        "name on machines that have its weights; `--engine llamacpp`: `embedded` or a .gguf file",
    )
    cache_dir: Path | None = option(
        None,
        "where the embedded model is converted and cached, and the int8 head's compiled "
        "kernel (under inductor/) (default: $XDG_CACHE_HOME/wschat or ~/.cache/wschat)",
    )
    device: str = option(
        "auto", "`auto` (cuda when available, else cpu), `cpu`, `cuda` or `cuda:N`"
    )
    dtype: str = option(
        "auto",
        "how the weights and the arithmetic are held: `auto` (the default) picks per device and "
        "logs why: on a CPU with AMX `bf16-int8` (bf16 weights reordered once for oneDNN, an "
        "int8 copy of each for steps of one or two rows, the output head in int8 through a "
        "kernel compiled at the first start), on AVX512 CPUs without AMX `fp16-int8` (fp16 "
        "weights packed for fbgemm, float32 arithmetic, the int8 copies and head), on AVX2 "
        "CPUs `fp16-int8head` (no int8 copies), on a GPU `bfloat16`; or `bf16-int8head`, "
        "`bf16-packed`, "
        "`fp16-weights` (the head as the rest), `float32`, `bfloat16`, `float16`",
    )
    # a kind of runtime/engines.py ENGINE_KINDS, each described here (a test checks); batched ahead
    # of generate from 4 concurrent streams on (bench/ measures both)
    engine: str = option(
        "batched",
        "`batched`: the replies of all sessions decode together, one forward pass a step; "
        "`generate`: one `model.generate` per reply in its own thread; `openai`: replies come "
        "from an OpenAI-compatible server at `--engine-url` (vLLM, llama.cpp's server, SGLang; "
        "docs/deploy.md); `llamacpp`: from llama.cpp's server (xllamacpp) on the `--model` "
        "GGUF, which wschat starts on a loopback port, restarts if it dies and stops with "
        "itself: `--threads` threads, `--max-concurrent` slots of `--context-tokens` each",
    )
    engine_url: str = option(
        "http://127.0.0.1:8080/v1",
        "`--engine openai`: the engine's OpenAI API base, http://HOST:PORT/v1",
    )
    engine_dialect: str = option(
        "auto",
        "`--engine openai`: how the engine is spoken to, `vllm`, `llama.cpp` or `sglang` "
        "(`auto`: as the owner that `/v1/models` lists says, any other owner as vLLM); name it "
        "when a proxy in front of the engine lists an owner of its own",
    )
    engine_model: str | None = option(
        None, "`--engine openai`: the model to ask for (default: the first the engine lists)"
    )
    engine_api_key: str | None = option(
        None,
        "`--engine openai`: the engine's API key, sent as a bearer token and never logged "
        "(prefer WSCHAT_ENGINE_API_KEY: a command line is visible to every local user)",
        secret=True,
    )
    engine_images: int | None = option(
        None,
        "`--engine openai`: images per prompt the engine's model reads, sent through its chat "
        "API (default: as the engine says where it does, llama.cpp's server and SGLang; else "
        "none)",
    )
    tokenizer: str = option(
        "embedded",
        "`--engine openai`: the tokenizer prompts are rendered with, `embedded` (the embedded "
        "model's), a tokenizer.json (or its folder) or a Gemma .gguf file; checked against the "
        "engine's at start (`--engine llamacpp`: the `--model` GGUF's own by default)",
    )
    # server/engine/formats.py renders each
    prompt_format: str = option(
        "auto",
        "how a conversation is rendered for the model: `auto` (the tokenizer's chat template "
        "if it has one; Gemma turns for an instruction-tuned Gemma; else `transcript`, a plain "
        "User:/Assistant: transcript for pretrained base models such as the embedded one), "
        "`chat-template`, `gemma-turns` or `transcript`",
    )
    # None is auto: engine/local/batch_width.py says what and why
    max_concurrent: int | None = option(
        None,
        "generations running at once across all sessions (the batched engine's batch width; "
        "more wait in the queue, first come first served): a number, or `auto` (the default): "
        f"{PREFERRED['cpu']} on a CPU, {PREFERRED['cuda']} on a GPU, fewer where the memory "
        "left after the model cannot hold that many rows of KV cache at `--context-tokens`; "
        f"{UNBATCHED_CONCURRENT} for the other engines (`--engine llamacpp`: its slots)",
    )
    prefill_chunk_tokens: int = option(
        512, "prompt tokens the batched engine prefills per pass, so decoding rows never wait long"
    )
    # None is auto: engine/threads.py says why
    threads: int | None = option(
        None,
        "CPU threads torch uses to generate: a number, or `auto` (the default): one per usable "
        "core while the cores are free, one fewer for each core other processes keep busy "
        "(`--engine llamacpp`: llama.cpp's threads, by the same rule as its server starts, "
        "fixed while it runs)",
    )
    max_queue: int = option(64, "prompts waiting for a slot before new ones get `overloaded`")
    max_new_tokens: int = option(
        1024,
        "the cap: the most tokens a prompt may ask for as its reply length (`wschat ask "
        "--max-new-tokens N`); more is refused. A prompt that asks for none gets "
        "`--default-max-new-tokens`",
    )
    default_max_new_tokens: int = option(
        256,
        "the reply length when a prompt names none (`wschat ask` without `--max-new-tokens`): "
        "what cuts most replies; at most `--max-new-tokens`",
    )
    context_tokens: int = option(8192, "the context window used (capped by the model's own)")
    kv_budget_mib: int = option(
        1024,
        "MiB of KV cache kept for idle sessions' next turns, text and image turns together "
        "(Gemma 3 270M in bf16 holds 3 KiB a token plus up to 7.5 MiB for its sliding layers: "
        "a 1,000-token conversation takes 10.4 MiB; a session also keeps its sliding layers as "
        "each turn past the window started, up to 7.5 MiB a turn, and once for the turns "
        "within it, so an edit or a regenerate past the window reuses the turns before it); "
        "beyond it those go first, then whole sessions, least recently used first each time; "
        "`--engine llamacpp`: llama.cpp's prompt cache in RAM",
    )
    shared_openings: int = option(
        4,
        "conversation openings whose KV cache new sessions share (the prompt format's fixed "
        "start and a system prompt: what every conversation with that system prompt begins "
        "with, so its first prompt prefills only what follows), one per system prompt in use, "
        "counted in `--kv-budget-mib` (0: none; local engines); one with a system prompt is "
        "shared only by sessions of the same bearer token, and past the limit the token that "
        "holds the most gives up its least recently used (the one without a system prompt "
        "goes last)",
    )
    grammar_vocabulary: str = option(
        GRAMMAR_AT_FIRST_USE,
        "when structured output (`response_format`) reads the model's vocabulary into its "
        "grammar library: at the first response format a client sends (`first-use`), or while "
        "the model loads (`start`); seconds, once, most of it holding the interpreter, so the "
        "first structured reply's neighbours wait that long (local engines)",
    )
    max_frame_bytes: int = option(12 * 1024 * 1024, "largest frame accepted")
    max_image_bytes: int = option(10 * 1024 * 1024, "largest image accepted")
    max_image_pixels: int = option(25_000_000, "most pixels in one image")
    max_images: int = option(4, "most images in one prompt")
    max_session_image_bytes: int = option(
        32 * 1024 * 1024,
        "bytes the images one session keeps may hold, its conversation's and the staged ones "
        "together (at the model's input size: 2.4 MB each for Gemma 3)",
    )
    max_image_checks: int = option(
        2,
        "images decoded and checked at once, server-wide (WebSocket and HTTP API alike); more "
        "wait their turn. One holds up to 18 bytes a pixel of its upload for a moment (450 MB "
        "at `--max-image-pixels` 25,000,000)",
    )
    max_prompt_bytes: int = option(256 * 1024, "largest prompt text, in UTF-8 bytes")
    max_prompt_tokens: int = option(8192, "largest prompt text, in tokens")
    max_messages: int = option(
        2048,
        "most messages in one OpenAI-compatible chat request, and most content parts in all "
        "of them together (more: 400 before any is read)",
    )
    responses_kept: int = option(
        1000,
        "Responses API: most responses kept (`store`, its default) for `GET /v1/responses/{id}` "
        "and `previous_response_id`, every owner's together; past it, the owner (bearer token) "
        "that holds the most gives up its least recently used",
    )
    responses_kept_mib: int = option(
        256,
        "Responses API: MiB the kept responses may hold, each counted with its whole "
        "conversation (texts, token ids, images); past it, as past `--responses-kept`",
    )
    responses_kept_s: float = option(
        3600.0, "Responses API: how long a kept response is kept after it ended"
    )
    frames_per_second: int = option(50, "client frames per second before a connection is closed")
    max_connections: int = option(
        1000,
        "chat connections in total; a `/v1/stats` socket and an OpenAI-compatible API request, "
        "from its head to its response's end, count as one each (past it: close 1013, HTTP 429)",
    )
    max_connections_per_client: int = option(
        100,
        "chat connections, `/v1/stats` sockets and API requests in flight from one client "
        "address (an IPv6 address counts as its /64)",
    )
    idle_timeout_s: float = option(
        600.0, "close a connection with no frames and no generation this long"
    )
    ping_interval_s: float = option(20.0, "WebSocket keepalive ping interval (0: off)")
    stall_timeout_s: float = option(120.0, "cancel a generation that makes no progress this long")
    send_timeout_s: float = option(
        30.0,
        "drop a connection whose send buffer stays full this long (the peer stopped reading; its "
        "generation is cancelled)",
    )
    handshake_timeout_s: float = option(
        10.0,
        "drop a connection whose HTTP request head (a WebSocket handshake included) has not "
        "come whole by then",
    )
    body_timeout_s: float = option(
        30.0,
        "answer 408 and close a connection whose HTTP request body has not come whole this long "
        "after its head (a 12 MiB body needs 3.4 Mbit/s)",
    )
    max_pending_handshakes: int = option(
        256,
        "connections still sending their HTTP request (its head, or a body that did not come "
        "with it), at once; one address may take them all, but when all are taken a newcomer "
        "from an address holding fewer than its share, and fewer than the address holding the "
        "most, takes the place of that address's oldest (dropped); any other is dropped at once",
    )
    max_pending_handshakes_per_client: int = option(
        16,
        "an address's share of `--max-pending-handshakes` (an IPv6 address counts as its /64)",
    )
    shutdown_grace_s: float = option(
        10.0, "on SIGTERM, how long running replies may take to finish"
    )
    resume_window_s: float = option(120.0, "how long a dropped session can be resumed")
    resume_grace_s: float = option(
        15.0,
        "a connection dropped mid-reply without a close frame (or that missed its pings): how "
        "long the reply goes on, its frames kept, for a resume (`?resume=TOKEN&last=N`) to get "
        "every token it missed once (it keeps its connection's place in the caps meanwhile); a "
        "clean close, `cancel`, `reset` and shutdown still cancel at once, as does a drop before "
        "the reply's first token; 0: cancelled at once (PROTOCOL.md section 10)",
    )
    max_replays: int = option(
        2,
        "replays of a reply to resumed connections (`?last=N`: what a client missed) written at "
        "once, server-wide; more wait their turn. One holds a copy of its reply until the peer "
        "has taken it (the send buffer drained) or the connection ends (`--send-timeout-s`)",
    )
    session_store: str = option(
        "memory",
        "where a dropped session is kept for `?resume=`: `memory` (this process), or a Redis "
        "URL (`redis://HOST:PORT/DB`, `rediss://...`, `unix:///PATH`; needs "
        '`pip install -e ".[redis]"`) from which any replica resumes it; '
        "WSCHAT_SESSION_STORE keeps a password off the command line (docs/deploy.md)",
        secret=True,
    )
    session_lease_s: float = option(
        6.0,
        "with Redis: how long a connected session stays held by its replica without a renewal "
        "(renewed every third of it); a resume of a session whose replica died waits for it to "
        "lapse, up to a second more, rather than starting a new session",
    )
    tokens: tuple[str, ...] = option(
        (),
        "accept this bearer token (repeatable; env WSCHAT_TOKENS, comma-separated); without "
        "any, no auth is required",
    )
    allowed_origins: tuple[str, ...] = option(
        (),
        "allow browser connections from this Origin (repeatable), the OpenAI-compatible API's "
        "included (CORS); without any, only same-host origins and non-browser clients",
    )
    # access.host_allowed applies it
    allowed_hosts: tuple[str, ...] = option(
        (),
        "a Host name requests may use when no token is set (repeatable; `*`: any); localhost "
        "names, 127.0.0.1, [::1], `--host` and the address a connection reached are always "
        "allowed, so a DNS-rebinding page cannot reach the server",
    )
    forwarded_allow_ips: tuple[str, ...] = option(
        (),
        "proxies (addresses or networks, repeatable or comma-separated; `*`: any) whose "
        "X-Forwarded-For gives the client address; without any, it is never read",
    )
    log_level: str = option("info", "how much the server logs")
