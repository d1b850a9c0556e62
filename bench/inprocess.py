"""The model loaded in this process, the prompts as wschat renders them, and the ceilings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .ceiling import static_batch
from .incb import continuous_batching
from .stats import StreamTimes

# Gemma's turn markup, in wschat and in the ceilings alike: the base model does not end its
# replies in it, so every stream runs to the same length and tokens/s compare like for like.
PROMPT_FORMAT = "gemma-turns"


@dataclass(slots=True)
class InProcess:
    loaded: Any  # server.engine.local.loader.LoadedModel
    engine: Any  # an HFEngine over it: the tokenizer and turn markup the server uses

    @classmethod
    def load(cls) -> InProcess:
        from wschat.server.engine.local.hf import HFEngine
        from wschat.server.engine.local.loader import load_model
        from wschat.server.engine.local.options import LocalEngineOptions

        loaded = load_model("embedded")
        return cls(loaded, HFEngine(loaded, LocalEngineOptions(prompt_format=PROMPT_FORMAT)))

    @staticmethod
    def model_dir() -> str:
        from wschat.server.engine.local.embedded_model import embedded_model_dir

        return str(embedded_model_dir())

    def prompt_ids(self, text: str) -> list[int]:
        """The first turn of a session whose user says ``text``, id for id as the server has it."""
        from wschat.server.engine.history import Conversation

        conversation = Conversation(self.engine.prompt_format)
        return conversation.prompt_ids(conversation.tokenize_user(text))

    def ceiling_inputs(self, texts: list[str]) -> tuple[Any, list[list[int]], list[int], int]:
        """What a ceiling runs on for ``texts``: the model, the prompts, the end ids, the pad."""
        eos = sorted(self.engine.prompt_format.end_ids)
        pad = int(self.loaded.tokenizer.pad_token_id or 0)
        return self.loaded.model, [self.prompt_ids(t) for t in texts], eos, pad

    def static(self, texts: list[str], tokens: int) -> list[StreamTimes]:
        model, prompts, eos, pad = self.ceiling_inputs(texts)
        return static_batch(model, prompts, tokens, eos, pad)

    def continuous(self, texts: list[str], tokens: int) -> list[StreamTimes]:
        model, prompts, eos, pad = self.ceiling_inputs(texts)
        return continuous_batching(model, prompts, tokens, eos, pad)
