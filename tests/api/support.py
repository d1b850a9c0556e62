"""What the API tests share: SDK clients on a running server, and a WebSocket reply to compare."""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletionAssistantMessageParam, ChatCompletionUserMessageParam

from tests.support import TIMEOUT, http_base, raw_peer


def async_client(url: str, token: str = "unused") -> openai.AsyncOpenAI:
    """The official SDK's async client on the server whose chat ``url`` is given."""
    return openai.AsyncOpenAI(
        base_url=f"{http_base(url)}/v1", api_key=token, timeout=TIMEOUT, max_retries=0
    )


def sync_client(url: str, token: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{http_base(url)}/v1", api_key=token, timeout=TIMEOUT, max_retries=0
    )


async def websocket_replies(url: str, texts: list[str], **params: Any) -> list[dict[str, Any]]:
    """The ``done`` of each prompt of ``texts``, sent in turn on one WebSocket session."""
    dones = []
    async with raw_peer(url) as (peer, _):
        for n, text in enumerate(texts):
            frame: dict[str, Any] = {"type": "prompt", "id": f"p{n}", "text": text}
            if params:
                frame["params"] = params
            await peer.send(frame)
            dones.append((await peer.recv_until("done"))[-1])
    return dones


def user(text: str) -> ChatCompletionUserMessageParam:
    return {"role": "user", "content": text}


def assistant(text: str) -> ChatCompletionAssistantMessageParam:
    return {"role": "assistant", "content": text}
