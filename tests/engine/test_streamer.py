"""``TokenStreamer`` with the Gemma tokenizer: each token's text at once, never half a character."""

from __future__ import annotations

from typing import Any

import torch
from wschat.server.engine.base import TokenPiece
from wschat.server.engine.local.loader import LoadedModel
from wschat.server.engine.local.streamer import TokenStreamer

# Characters the Gemma vocabulary spells as UTF-8 byte-fallback tokens (<0xF0>, <0x93>, ...),
# between characters it has whole tokens for.
FRAKTUR_U = "\U0001d518"
TEXT = f"Hi 𓀀 and ꙮ, {FRAKTUR_U} été 日本語 🙂"
BYTE_FALLBACK = ("𓀀", "ꙮ", FRAKTUR_U)


def stream(
    loaded: LoadedModel, ids: list[int], stops: tuple[str, ...] = (), **options: Any
) -> list[TokenPiece]:
    pieces: list[TokenPiece] = []
    streamer = TokenStreamer(loaded.tokenizer.backend_tokenizer, pieces.append, stops, **options)
    streamer.put(torch.tensor([[2, 105]]))  # the prompt: not streamed
    for token_id in ids:
        streamer.put(torch.tensor([token_id]))
    streamer.end()
    return pieces


def test_multibyte_characters_split_over_tokens_are_emitted_whole(
    tiny_text_loaded: LoadedModel,
) -> None:
    tokenizer = tiny_text_loaded.tokenizer
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    for char in BYTE_FALLBACK:
        assert len(tokenizer(char, add_special_tokens=False)["input_ids"]) >= 3
    pieces = stream(tiny_text_loaded, ids)
    assert "".join(p.text for p in pieces) == TEXT
    assert all("\ufffd" not in p.text for p in pieces)
    for char in BYTE_FALLBACK:  # its byte tokens come out together, as one piece
        assert any(char in p.text and len(p.ids) >= 3 for p in pieces)
    assert [i for p in pieces for i in p.ids] == ids


def test_each_whole_token_is_emitted_at_once_without_waiting_for_a_space(
    tiny_text_loaded: LoadedModel,
) -> None:
    ids = tiny_text_loaded.tokenizer("日本語🙂été", add_special_tokens=False)["input_ids"]
    pieces = stream(tiny_text_loaded, ids)
    assert [p.ids for p in pieces] == [(i,) for i in ids]


def test_stop_string_across_tokens_is_cut_from_the_text(tiny_text_loaded: LoadedModel) -> None:
    ids = tiny_text_loaded.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    pieces = stream(tiny_text_loaded, ids, stops=(f"ꙮ, {FRAKTUR_U}",))
    assert "".join(p.text for p in pieces) == "Hi 𓀀 and "


def test_the_token_that_ends_the_turn_keeps_its_id_but_is_never_text(
    tiny_text_loaded: LoadedModel,
) -> None:
    tokenizer = tiny_text_loaded.tokenizer
    newline = tokenizer.convert_tokens_to_ids("\n")
    ids = [*tokenizer(" Paris.", add_special_tokens=False)["input_ids"], newline]
    pieces = stream(tiny_text_loaded, ids, end_ids=frozenset({newline}))
    assert "".join(p.text for p in pieces) == " Paris."
    assert [i for p in pieces for i in p.ids] == ids


def test_the_space_after_a_transcript_label_is_not_shown(tiny_text_loaded: LoadedModel) -> None:
    ids = tiny_text_loaded.tokenizer(" Paris is  big", add_special_tokens=False)["input_ids"]
    pieces = stream(tiny_text_loaded, ids, strip_leading_space=True)
    assert "".join(p.text for p in pieces) == "Paris is  big"
    assert [i for p in pieces for i in p.ids] == ids
