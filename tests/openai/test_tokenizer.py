"""The gateway's tokenizer (``engine/openai/tokenizer.py``) from a GGUF file that ``--tokenizer``
(or ``--engine llamacpp``'s ``--model``) names."""

from __future__ import annotations

from pathlib import Path

import pytest
from wschat.server.engine.embedded import default_cache_dir
from wschat.server.engine.openai.startup import PROBE
from wschat.server.engine.openai.tokenizer import (
    TokenizerError,
    gguf_path,
    load_tokenizer,
)


def test_a_gguf_file_gives_its_own_tokenizer_built_once(tmp_path: Path) -> None:
    embedded = load_tokenizer("embedded", default_cache_dir())
    from_file = load_tokenizer(str(gguf_path(default_cache_dir())), tmp_path)
    assert from_file.tokenize_text(PROBE) == embedded.tokenize_text(PROBE)
    built = list((tmp_path / "tokenizers").iterdir())
    assert len(built) == 1 and built[0].suffix == ".json"
    again = load_tokenizer(str(gguf_path(default_cache_dir())), tmp_path)
    assert again.name == str(built[0])  # read from the cache, not built again


def test_a_gguf_without_a_vocabulary_is_a_tokenizer_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(16))  # a header: no tensors, no fields
    with pytest.raises(TokenizerError, match="no tokenizer can be built from"):
        load_tokenizer(str(empty), tmp_path)
