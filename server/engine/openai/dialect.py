"""How each OpenAI-compatible engine is spoken to: one class per engine, each in ``DIALECTS``.

The engines share OpenAI's API: a text prompt of token ids streams its reply from a completions
endpoint, a prompt with images from ``/v1/chat/completions``. A dialect holds one engine's
spellings: as class attributes where they are values (its name, the owner ``/v1/models`` lists,
where a prompt of ids goes, the fields that ask for the reply's token ids, "no top-k", the
seeds it keeps, where it says whether its model reads images, whether it salts its prefix
cache per owner) and as methods where a shape differs (llama.cpp's native chunks, its sampler
chain). Adding an engine is a class here and its entry in ``DIALECTS``; ``--engine-dialect``
names it, or ``/v1/models``' owner tells it.

Every sampling field is sent, always: anything left out is filled from the engine's own
defaults (llama.cpp's server: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05; vLLM and
SGLang: the model's ``generation_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..base import SamplingParams
from . import chunk_values as checked
from .errors import bad_answer
from .reply_fields import LlamaCppFields, RawLogprob, ReplyFields, SglangFields

VLLM = "vllm"
LLAMA_CPP = "llama.cpp"
SGLANG = "sglang"
AUTO = "auto"  # the dialect /v1/models' owner names
CHAT_PATH = "/v1/chat/completions"  # where a prompt with images goes, on every engine
_U32 = 1 << 32
_I64 = 1 << 63
# llama.cpp's repetition penalty looks back this many tokens (its default, sent as such)
LLAMA_CPP_PENALTY_WINDOW = 64
# The smallest temperature and repetition penalty sent (``divisor``). Engines divide float32
# logits by each, a repeated token's by both; under 1e-38 a value is 0 in float32 (llama.cpp
# refuses such a penalty), and one that divides a logit past float32's range makes the draw
# read infinities (llama.cpp draws at random from there). At 1e-15 each, logits up to 1e4
# stay finite, and the reply is the one their limit gives, as in process.
MIN_DIVISOR = 1e-15


@dataclass(frozen=True, slots=True)
class Delta:
    """What one streamed chunk adds to a reply: text, the ids of its tokens, the finish reason
    once the engine gives one (OpenAI's words: ``stop`` or ``length``), and the prompt tokens the
    engine found in its cache, where the chunk says."""

    text: str = ""
    ids: Sequence[int] = ()
    finish: str | None = None
    cached_tokens: int | None = None
    logprobs: Sequence[RawLogprob] = ()  # one per id, where they were asked for


@dataclass(frozen=True, slots=True)
class Call:
    """One streamed request: where it goes, its body, how each chunk of its reply is read, and
    whether a chunk's text that comes without ids is tokenized here (the chat API: an engine may
    give its text alone)."""

    path: str
    body: dict[str, Any]
    read: Callable[[dict[str, Any]], Delta]
    ids_from_text: bool = False


class Dialect:
    """The OpenAI API as vLLM extends it, which the other engines mostly follow: token-id
    prompts on ``/v1/completions``, ``return_token_ids``, a usage chunk with the cached prompt
    tokens. A subclass sets what its engine spells otherwise.

    Every value a chunk gives is checked as it is read (``chunk_values``): a wrong one is a bad
    answer (``errors.bad_answer``), never a number passed on to a frame."""

    name: ClassVar[str]
    # who ``/v1/models`` says owns the model
    owner: ClassVar[str]
    # where a text prompt of token ids streams its reply, from the server's root
    text_path: ClassVar[str] = "/v1/completions"
    # the fields that ask for the generated tokens' ids: in a text request, in a chat request
    text_ids: ClassVar[dict[str, Any]] = {"return_token_ids": True}
    chat_ids: ClassVar[dict[str, Any]] = {"return_token_ids": True}
    # top-k's "off" (0 is refused by older vLLM releases)
    top_k_off: ClassVar[int] = -1
    # a seed is sent as ``seed % seeds``: our seeds span -2^63 .. 2^64-1, each maps to one value
    seeds: ClassVar[int] = _I64
    # where the engine says whether its model reads images (``reads_images``); None: it does not
    vision_path: ClassVar[str | None] = None
    # whether a request's ``cache_salt`` keeps its cached prefixes to the requests of its salt
    # (``salt``); without one the engine's prefix cache is every client's
    salts_cache: ClassVar[bool] = False
    # how it is sent a response format and asked for logprobs (reply_fields.py)
    fields: ClassVar[ReplyFields] = ReplyFields()

    @staticmethod
    def detect(models: dict[str, Any]) -> Dialect:
        """From ``/v1/models``: the dialect whose owner it lists (llama.cpp's server says
        ``llamacpp``, vLLM ``vllm``, SGLang ``sglang``); any other is spoken to as vLLM is."""
        data = models.get("data") or [{}]
        owner = str(data[0].get("owned_by", ""))
        found = [dialect for dialect in DIALECTS.values() if dialect.owner == owner]
        return (found[0] if found else VllmDialect)()

    @staticmethod
    def named(name: str) -> Dialect:
        if name not in DIALECTS:
            raise ValueError(f"unknown engine dialect {name!r}: choose {AUTO} or {names()}")
        return DIALECTS[name]()

    @staticmethod
    def choose(name: str, models: dict[str, Any]) -> Dialect:
        """``name``'s dialect; for ``auto``, the one ``/v1/models`` tells."""
        return Dialect.detect(models) if name == AUTO else Dialect.named(name)

    def context_tokens(self, model: dict[str, Any]) -> int | None:
        """The context one request may use (``max_model_len`` in ``/v1/models``)."""
        return _positive(model.get("max_model_len"))

    def tokenize_body(self, text: str, model: str) -> dict[str, Any]:
        """A ``/tokenize`` request for ``text`` as text: no special tokens added or parsed."""
        return {"model": model, "prompt": text, "add_special_tokens": False}

    def reads_images(self, answer: dict[str, Any]) -> bool:
        """Whether ``vision_path``'s answer says the model reads images."""
        return False

    def sampling(
        self, params: SamplingParams, *, stop: Sequence[str], stop_token_ids: Sequence[int]
    ) -> dict[str, Any]:
        """Every sampling field, in this engine's spelling; greedy (temperature 0) means greedy
        on every engine because nothing is left to a default."""
        return {
            **_openai_sampling(params, stop),
            "top_k": params.top_k or self.top_k_off,
            "repetition_penalty": divisor(params.repetition_penalty),
            "stop_token_ids": list(stop_token_ids),
            "seed": None if params.seed is None else self.seed(params.seed),
        }

    def seed(self, seed: int) -> int:
        return seed % self.seeds

    def text_call(self, body: dict[str, Any]) -> Call:
        """A text request (``text_body``) and how its reply is read."""
        return Call(self.text_path, body, self.text_delta)

    def chat_call(self, body: dict[str, Any]) -> Call:
        """A chat request (``chat_body``) and how its reply is read."""
        return Call(CHAT_PATH, body, self.chat_delta, ids_from_text=True)

    def salt(self, scope: str) -> dict[str, Any]:
        """The field that keeps a request's cached prefixes to its owner's requests: ``scope``
        (``GenerationRequest.cache_scope``, a digest, never a token); none without a scope (no
        tokens: every client one owner) or where the engine reads none."""
        return {"cache_salt": scope} if self.salts_cache and scope else {}

    def text_body(
        self,
        model: str,
        prompt: list[int],
        max_tokens: int,
        sampling: dict[str, Any],
        scope: str = "",
    ) -> dict[str, Any]:
        """The streamed request for a prompt of token ids, its reply's ids asked back (the
        conversation keeps them, so the next prompt extends this one token for token), salted
        with its owner's ``scope``."""
        return _streamed(
            model, max_tokens, sampling, prompt=prompt, **self.text_ids, **self.salt(scope)
        )

    def chat_body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        max_tokens: int,
        sampling: dict[str, Any],
        scope: str = "",
    ) -> dict[str, Any]:
        """The same for the chat API: messages instead of ids, the same sampling fields."""
        fields = {**self.chat_ids_request(), **self.salt(scope)}
        return _streamed(model, max_tokens, sampling, messages=messages, **fields)

    def chat_ids_request(self) -> dict[str, Any]:
        return dict(self.chat_ids)

    def text_delta(self, chunk: dict[str, Any]) -> Delta:
        """One chunk of a text reply (``text_body``'s)."""
        return self._openai_delta(chunk, "text")

    def chat_delta(self, chunk: dict[str, Any]) -> Delta:
        """One chunk of a chat reply (``chat_body``'s)."""
        return self._openai_delta(chunk, "delta")

    def choice_ids(self, choice: dict[str, Any]) -> list[int]:
        return checked.ids(choice.get("token_ids"))

    def _openai_delta(self, chunk: dict[str, Any], text_key: str) -> Delta:
        texts: list[str] = []
        ids: list[int] = []
        logprobs: list[RawLogprob] = []
        finish = None
        for choice in checked.items(chunk.get("choices"), "choices"):
            if not isinstance(choice, dict):
                raise bad_answer(f"a choice that is a {type(choice).__name__}")
            if text_key == "delta":
                texts.append(
                    checked.text(checked.fields(choice.get("delta"), "delta").get("content"))
                )
            else:
                texts.append(checked.text(choice.get("text")))
                logprobs += self.fields.choice_logprobs(choice)
            ids += self.choice_ids(choice)
            finish = checked.finish(choice.get("finish_reason")) or finish
        cached = None
        if usage := chunk.get("usage"):
            details = checked.fields(
                checked.fields(usage, "usage").get("prompt_tokens_details"), "details"
            )
            cached = checked.count(details.get("cached_tokens") or 0, "cached_tokens")
        return Delta("".join(texts), ids, finish, cached, logprobs)


class VllmDialect(Dialect):
    """vLLM: the OpenAI API as ``Dialect`` speaks it. Its prefix cache is salted per owner
    (``cache_salt``, on both endpoints since 2025; an owner's scope, a 64-character hex
    digest, is within every release's limits: newer ones take at most 128 characters, none of
    ``@ / \\``)."""

    name: ClassVar[str] = VLLM
    owner: ClassVar[str] = "vllm"
    salts_cache: ClassVar[bool] = True


class SglangDialect(Dialect):
    """SGLang's server: vLLM's fields under vLLM's names (``return_token_ids`` and each chunk's
    ``token_ids``, ``top_k`` -1, ``repetition_penalty``, ``stop_token_ids``, ``max_model_len``,
    ``/tokenize`` with ``add_special_tokens``). Its chat chunks carry no ids (their text is
    tokenized here); ``/model_info`` says whether its model reads images; some releases keep a
    seed as a signed 32-bit integer. The usage chunk gives cached prompt tokens only when it runs
    with ``--enable-cache-report``. No salt is sent: its ``cache_salt`` field is accepted by
    releases that never applied it to the prefix cache (it took effect in 2026), so a salt
    sent could not be relied on."""

    name: ClassVar[str] = SGLANG
    owner: ClassVar[str] = "sglang"
    fields: ClassVar[ReplyFields] = SglangFields()
    chat_ids: ClassVar[dict[str, Any]] = {}
    seeds: ClassVar[int] = 1 << 31
    vision_path: ClassVar[str | None] = "/model_info"

    def reads_images(self, answer: dict[str, Any]) -> bool:
        return answer.get("has_image_understanding") is True


class LlamaCppDialect(Dialect):
    """llama.cpp's server. A text prompt goes to its native ``/completion``, which streams each
    token's id (``return_tokens``) and computes no probabilities; its chat API gives ids only
    with each token's top-1 log-probability. Its sampler chain is named in full (``samplers``):
    the shortest one that gives our tokens, where the default chain would run every sampler over
    the whole vocabulary. It reads 32-bit seeds, 2^32-1 meaning "pick one at random". It has
    no salt: a prompt reuses the cache of whichever slot it lands on (``cache_prompt``), and
    only turning that off keeps clients' prefixes apart."""

    name: ClassVar[str] = LLAMA_CPP
    owner: ClassVar[str] = "llamacpp"
    fields: ClassVar[ReplyFields] = LlamaCppFields()
    text_path: ClassVar[str] = "/completion"
    text_ids: ClassVar[dict[str, Any]] = {"return_tokens": True}
    # the chat API's ``logprobs`` is a flag: each token's id comes with its top-1 entry
    chat_ids: ClassVar[dict[str, Any]] = {"logprobs": True, "top_logprobs": 1}
    top_k_off: ClassVar[int] = 0
    seeds: ClassVar[int] = _U32 - 1
    vision_path: ClassVar[str | None] = "/props"

    def context_tokens(self, model: dict[str, Any]) -> int | None:
        """llama.cpp's per-slot ``n_ctx`` (the server's ``n_ctx / parallel``)."""
        return _positive((model.get("meta") or {}).get("n_ctx"))

    def tokenize_body(self, text: str, model: str) -> dict[str, Any]:
        return {"content": text, "add_special": False, "parse_special": False}

    def reads_images(self, answer: dict[str, Any]) -> bool:
        """``/props``' ``modalities.vision``."""
        return bool(checked.fields(answer.get("modalities"), "modalities").get("vision"))

    def sampling(
        self, params: SamplingParams, *, stop: Sequence[str], stop_token_ids: Sequence[int]
    ) -> dict[str, Any]:
        # llama.cpp's server has no stop_token_ids: its end-of-generation tokens stop it
        greedy = params.temperature == 0
        return {
            **_openai_sampling(params, stop),
            "samplers": self.samplers(params),
            "top_k": 1 if greedy else params.top_k or self.top_k_off,
            "repeat_penalty": divisor(params.repetition_penalty),
            "repeat_last_n": LLAMA_CPP_PENALTY_WINDOW,
            "typical_p": 1.0,
            "top_n_sigma": -1.0,
            "dynatemp_range": 0.0,
            "dry_multiplier": 0.0,
            "xtc_probability": 0.0,
            "mirostat": 0,
            "min_keep": 1,
            "n_probs": 0,
            "seed": -1 if params.seed is None else self.seed(params.seed),
        }

    @staticmethod
    def samplers(params: SamplingParams) -> list[str]:
        """The chain, in the in-process engines' order (repetition penalty, then temperature,
        top-k, top-p and min-p; top-k before the temperature is the same set, found on unscaled
        logits), each sampler only when its setting does something. Greedy is top-k of 1: the
        temperature sampler at 0 keeps the vocabulary and the final draw then takes the
        softmax of all of it."""
        chain = ["penalties"] if params.repetition_penalty != 1.0 else []
        if params.temperature == 0:
            return [*chain, "top_k"]
        if params.top_k > 0:
            chain.append("top_k")
        chain.append("temperature")
        if params.top_p < 1.0:
            chain.append("top_p")
        if params.min_p > 0.0:
            chain.append("min_p")
        return chain

    def text_body(
        self,
        model: str,
        prompt: list[int],
        max_tokens: int,
        sampling: dict[str, Any],
        scope: str = "",
    ) -> dict[str, Any]:
        return {
            "prompt": prompt,
            "n_predict": max_tokens,
            "stream": True,
            "cache_prompt": True,
            **sampling,
            **self.text_ids,
            **self.salt(scope),
        }

    def text_delta(self, chunk: dict[str, Any]) -> Delta:
        """A native chunk: ``content`` and ``tokens``; the last has ``stop: true``, why it
        stopped (``stop_type``: ``limit`` is the length, ``eos`` and ``word`` a stop) and the
        prompt tokens taken from the slot's cache (``timings.cache_n``)."""
        text, ids = checked.text(chunk.get("content")), checked.ids(chunk.get("tokens"))
        logprobs = self.fields.chunk_logprobs(chunk)
        if not chunk.get("stop"):
            return Delta(text, ids, logprobs=logprobs)
        finish = "length" if chunk.get("stop_type") == "limit" else "stop"
        cached = checked.fields(chunk.get("timings"), "timings").get("cache_n")
        count = None if cached is None else checked.count(cached, "cache_n")
        return Delta(text, ids, finish, count, logprobs)

    def choice_ids(self, choice: dict[str, Any]) -> list[int]:
        content = checked.items(
            checked.fields(choice.get("logprobs"), "logprobs").get("content"), "content"
        )
        entries = [checked.fields(entry, "logprob") for entry in content]
        return checked.ids([entry["id"] for entry in entries if "id" in entry])


# every dialect, by the name --engine-dialect gives it
DIALECTS: dict[str, type[Dialect]] = {
    dialect.name: dialect for dialect in (VllmDialect, LlamaCppDialect, SglangDialect)
}


def names() -> str:
    return ", ".join(DIALECTS)


def _openai_sampling(params: SamplingParams, stop: Sequence[str]) -> dict[str, Any]:
    """The fields every engine reads under OpenAI's names."""
    return {
        "temperature": divisor(params.temperature) if params.temperature else 0.0,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": list(stop),
    }


def divisor(value: float) -> float:
    """A temperature or repetition penalty (greater than 0) as the engine is sent it: at least
    ``MIN_DIVISOR``."""
    return max(value, MIN_DIVISOR)


def _streamed(
    model: str, max_tokens: int, sampling: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    """An OpenAI API request whose reply streams, with a last chunk of usage."""
    return {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
        **fields,
    }


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value > 0 else None
