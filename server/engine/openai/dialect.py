"""How each OpenAI-compatible engine spells what the API leaves open.

The engines share ``/v1/completions`` and its streaming, but differ in the fields beyond
OpenAI's: how to ask for the generated token ids, the repetition penalty's name, the range a seed
must fit, whether ``stop_token_ids`` is read, what "no top-k" is, and where the context length
is published. Anything left out is filled from the engine's own defaults (llama.cpp's server:
temperature 0.8, top-k 40, top-p 0.95, min-p 0.05; vLLM: the model's ``generation_config``), so
every sampling field is sent, always.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..base import SamplingParams

LLAMA_CPP = "llama.cpp"
VLLM = "vllm"
_U32 = 1 << 32
_I64 = 1 << 63


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str

    @staticmethod
    def detect(models: dict[str, Any]) -> Dialect:
        """From ``/v1/models``: llama.cpp's server says ``owned_by: llamacpp``; vLLM
        ``vllm``; others are spoken to as vLLM is (the richer, more common set)."""
        data = models.get("data") or [{}]
        owner = str(data[0].get("owned_by", ""))
        return Dialect(LLAMA_CPP if owner == "llamacpp" else VLLM)

    @property
    def is_llama_cpp(self) -> bool:
        return self.name == LLAMA_CPP

    def context_tokens(self, model: dict[str, Any]) -> int | None:
        """The context one request may use: vLLM's ``max_model_len``; llama.cpp's per-slot
        ``n_ctx`` (the server's ``n_ctx / parallel``)."""
        if self.is_llama_cpp:
            value = (model.get("meta") or {}).get("n_ctx")
        else:
            value = model.get("max_model_len")
        return int(value) if isinstance(value, int) and value > 0 else None

    def sampling(
        self,
        params: SamplingParams,
        *,
        stop: Sequence[str],
        stop_token_ids: Sequence[int],
    ) -> dict[str, Any]:
        """Every sampling field, in this engine's spelling; greedy (temperature 0) means greedy
        on every engine because nothing is left to a default."""
        body: dict[str, Any] = {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "min_p": 0.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop": list(stop),
        }
        if self.is_llama_cpp:
            body |= {
                "top_k": params.top_k,  # 0: off
                "repeat_penalty": params.repetition_penalty,
                "typical_p": 1.0,
                "dry_multiplier": 0.0,
                "xtc_probability": 0.0,
                "mirostat": 0,
                # llama.cpp's server has no stop_token_ids: its end-of-generation tokens stop it
                "seed": -1 if params.seed is None else self.seed(params.seed),
            }
        else:
            body |= {
                "top_k": params.top_k or -1,  # -1: off (0 is refused by older releases)
                "repetition_penalty": params.repetition_penalty,
                "stop_token_ids": list(stop_token_ids),
                "seed": None if params.seed is None else self.seed(params.seed),
            }
        return body

    def seed(self, seed: int) -> int:
        """Our seeds span -2^63 .. 2^64-1; llama.cpp reads 32 bits (and takes 2^32-1 for "pick
        one at random"), vLLM an int64: each seed maps to one value the engine keeps as is."""
        if self.is_llama_cpp:
            return seed % (_U32 - 1)
        return seed % _I64

    def ids_request(self) -> dict[str, Any]:
        """What makes each chunk carry the ids of its tokens (the conversation keeps them, so
        the next prompt extends this one token for token)."""
        if self.is_llama_cpp:
            return {"logprobs": 1}
        return {"return_token_ids": True}

    def chat_ids_request(self) -> dict[str, Any]:
        """The same for the chat API, whose ``logprobs`` is a flag: llama.cpp gives each token's
        id with its top-1 entry."""
        if self.is_llama_cpp:
            return {"logprobs": True, "top_logprobs": 1}
        return {"return_token_ids": True}

    def chunk_ids(self, choice: dict[str, Any]) -> list[int]:
        if self.is_llama_cpp:
            content = (choice.get("logprobs") or {}).get("content") or []
            return [int(entry["id"]) for entry in content if "id" in entry]
        return [int(i) for i in choice.get("token_ids") or []]
