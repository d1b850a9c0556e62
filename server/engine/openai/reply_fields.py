"""What a reply is held to and what comes back with it, in each engine's spelling: a response
format, and each token's logprobs. A dialect (dialect.py) names its ``ReplyFields``.

A response format goes as OpenAI's ``response_format`` where the endpoint reads it (vLLM's both,
every chat API), else in the engine's own field: llama.cpp's native ``/completion`` takes the
schema as ``json_schema``, SGLang's completions as a ``json_schema`` string. The engine compiles
and enforces it; a grammar of ours (Lark) no engine is sent. Logprobs are asked of a text
request where the engine gives each token's id and its alternatives' ids: vLLM's ``logprobs``
with ``return_tokens_as_token_ids``, llama.cpp's ``n_probs``; SGLang is asked for none (refused),
and a prompt with images (the chat API) gets none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..base import SamplingParams
from ..errors import FeatureUnsupported
from ..grammar import JSON_OPTIONS, ResponseFormat
from . import chunk_values as checked
from .errors import bad_answer

# a token's id and logprob, and its alternatives' (id, logprob), most probable first
RawLogprob = tuple[int, float, tuple[tuple[int, float], ...]]
TOKEN_ID = "token_id:"  # how vLLM names a token by its id (``return_tokens_as_token_ids``)


class ReplyFields:
    """vLLM's: OpenAI's ``response_format`` on both endpoints, logprobs by ``token_id:N``."""

    gives_logprobs = True

    def check(self, params: SamplingParams, engine: str) -> None:
        """``FeatureUnsupported`` for what the engine is not asked for: a grammar of ours,
        logprobs where it gives none."""
        response_format = params.response_format
        if response_format is not None and response_format.lark is not None:
            raise FeatureUnsupported(
                f"the engine ({engine}) is sent JSON schemas only, not a grammar"
            )
        if params.logprobs is not None and not self.gives_logprobs:
            raise FeatureUnsupported(f"the engine ({engine}) gives no logprobs here")

    def constrained(self, response_format: ResponseFormat | None, *, chat: bool) -> dict[str, Any]:
        """The fields that hold the reply to ``response_format`` (none without one): a text
        request's (``chat`` False) or a chat request's."""
        if response_format is None:
            return {}
        if chat:
            return {"response_format": openai_response_format(response_format)}
        return self.text_format(response_format)

    def text_format(self, response_format: ResponseFormat) -> dict[str, Any]:
        return {"response_format": openai_response_format(response_format)}

    def logprob_fields(self, top: int | None) -> dict[str, Any]:
        """A text request's fields that ask for each token's logprob and ``top`` alternatives
        by id (none: not asked)."""
        if top is None:
            return {}
        return {"logprobs": top, "return_tokens_as_token_ids": True}

    def choice_logprobs(self, choice: dict[str, Any]) -> list[RawLogprob]:
        """A text choice's ``logprobs``: ``token_logprobs`` and ``top_logprobs`` (maps of
        ``token_id:N`` to a logprob, the chosen one may be among them), the ids from ``tokens``."""
        found = choice.get("logprobs")
        if found is None:
            return []
        found = checked.fields(found, "logprobs")
        names = checked.items(found.get("tokens"), "tokens")
        values = checked.items(found.get("token_logprobs"), "token_logprobs")
        tops = checked.items(found.get("top_logprobs"), "top_logprobs")
        if len(names) != len(values) or (tops and len(tops) != len(names)):
            raise bad_answer("logprobs whose lists disagree")
        out: list[RawLogprob] = []
        for k, (name, value) in enumerate(zip(names, values, strict=True)):
            best = checked.fields(tops[k], "top_logprobs") if tops else {}
            pairs = ((named_id(n), logprob_of(v)) for n, v in best.items())
            out.append((named_id(name), logprob_of(value), tuple(sorted(pairs, key=_probable))))
        return out

    def chunk_logprobs(self, chunk: dict[str, Any]) -> list[RawLogprob]:
        """A native chunk's logprobs (an engine whose text request is not OpenAI's)."""
        return []


class LlamaCppFields(ReplyFields):
    """llama.cpp's native ``/completion``: the schema itself, and ``n_probs``."""

    def text_format(self, response_format: ResponseFormat) -> dict[str, Any]:
        """The schema with llguidance's JSON options (``x-guidance``): a llama.cpp built with
        llguidance (xllamacpp's) compiles ``json_schema`` with it, and by default allows any
        whitespace between values, which a small model fills its budget with; JSON as
        json.dumps writes it, as in process (grammar.py). A build without it ignores the key."""
        options = {**JSON_OPTIONS, "lenient": not response_format.strict}
        return {"json_schema": {**schema_of(response_format), "x-guidance": options}}

    def logprob_fields(self, top: int | None) -> dict[str, Any]:
        """Each token's probabilities before sampling, as logprobs."""
        return {} if top is None else {"n_probs": top, "post_sampling_probs": False}

    def chunk_logprobs(self, chunk: dict[str, Any]) -> list[RawLogprob]:
        """``completion_probabilities``: each token's ``id`` and ``logprob``, and its
        ``top_logprobs`` entries' (most probable first)."""
        out: list[RawLogprob] = []
        for entry in checked.items(chunk.get("completion_probabilities"), "probabilities"):
            entry = checked.fields(entry, "probabilities")
            tops = [
                checked.fields(t, "top") for t in checked.items(entry.get("top_logprobs"), "top")
            ]
            alternatives = tuple(
                (token_id(t.get("id")), logprob_of(t.get("logprob"))) for t in tops
            )
            out.append((token_id(entry.get("id")), logprob_of(entry.get("logprob")), alternatives))
        return out


class SglangFields(ReplyFields):
    """SGLang's completions: the schema as a JSON string; logprobs name tokens by text, so no
    ids are asked of it here."""

    gives_logprobs = False

    def text_format(self, response_format: ResponseFormat) -> dict[str, Any]:
        return {"json_schema": json.dumps(schema_of(response_format))}


def schema_of(response_format: ResponseFormat) -> Mapping[str, Any]:
    """The format's schema; ``json_object``'s: any object."""
    return response_format.schema or {"type": "object"}


def openai_response_format(response_format: ResponseFormat) -> dict[str, Any]:
    """The format in OpenAI's shape (``json_object``, or ``json_schema`` under a fixed name)."""
    if response_format.schema is None:
        return {"type": "json_object"}
    spec = {"name": "reply", "schema": response_format.schema, "strict": response_format.strict}
    return {"type": "json_schema", "json_schema": spec}


def named_id(name: Any) -> int:
    """vLLM's ``token_id:N``."""
    if not isinstance(name, str) or not name.startswith(TOKEN_ID):
        raise bad_answer(f"a logprob's token {checked.short(name)}, not {TOKEN_ID}N")
    try:
        return token_id(int(name.removeprefix(TOKEN_ID)))
    except ValueError:
        raise bad_answer(f"a logprob's token {checked.short(name)}, not {TOKEN_ID}N") from None


def token_id(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= checked.MAX_COUNT:
        raise bad_answer(f"a token id {checked.short(value)}")
    return value


def logprob_of(value: Any) -> float:
    """A logprob: a finite number at most 0 (a little over, from rounding, is 0)."""
    if type(value) not in (int, float) or not math.isfinite(value) or value > 1e-3:
        raise bad_answer(f"a logprob {checked.short(value)}")
    return min(float(value), 0.0)


def _probable(pair: tuple[int, float]) -> float:
    """The most probable first."""
    return -pair[1]
