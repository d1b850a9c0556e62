"""A reply's logprobs in OpenAI's shapes, from its ``token`` frames' (``TokenLogprobs``):

    chat:         {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
                   "refusal": null}
    completions:  {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}

A streamed chunk carries its frame's tokens, a whole body every frame's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wschat.protocol import TokenLogprobs


def chat_logprobs(parts: Sequence[TokenLogprobs]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for part in parts:
        k = part.top
        for i, (token, data, logprob) in enumerate(
            zip(part.tokens, part.token_bytes, part.logprobs, strict=True)
        ):
            top = [
                _entry(part.top_tokens[j], part.top_bytes[j], part.top_logprobs[j])
                for j in range(i * k, (i + 1) * k)
            ]
            content.append({**_entry(token, data, logprob), "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_logprobs(parts: Sequence[TokenLogprobs], offset: int = 0) -> dict[str, Any]:
    """``offset``: where the first token's text starts in the reply (a chunk after others)."""
    tokens: list[str] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    offsets: list[int] = []
    for part in parts:
        k = part.top
        for i, (token, logprob) in enumerate(zip(part.tokens, part.logprobs, strict=True)):
            tokens.append(token)
            values.append(logprob)
            tops.append(
                dict(
                    zip(
                        part.top_tokens[i * k : (i + 1) * k],
                        part.top_logprobs[i * k : (i + 1) * k],
                        strict=True,
                    )
                )
            )
            offsets.append(offset)
            offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _entry(token: str, data: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(data)}
