"""Images as data URIs in a chat request, on the tiny vision model: the image reaches the
prompt as a WebSocket prompt's does (the same reply), in the last message or an earlier one."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from openai.types.chat import ChatCompletionUserMessageParam

from tests.api.support import assistant, async_client, user
from tests.images import samples
from tests.support import raw_peer, running_server

if TYPE_CHECKING:
    from wschat.server.engine.local.hf import HFEngine


def with_image(text: str, data: bytes) -> ChatCompletionUserMessageParam:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }


async def test_an_image_part_gets_the_reply_a_websocket_prompt_with_it_gets(
    tiny_vision: HFEngine,
) -> None:
    image = samples.png(32, 24)
    async with running_server(tiny_vision) as url, async_client(url) as client:
        reply = await client.chat.completions.create(
            model="any", messages=[with_image("What is it?", image)], max_tokens=8
        )
        later = await client.chat.completions.create(
            model="any",
            messages=[
                with_image("What is it?", image),
                assistant(reply.choices[0].message.content or ""),
                user("Sure?"),
            ],
            max_tokens=8,
        )
        async with raw_peer(url) as (peer, _):
            params = {"max_new_tokens": 8}
            await peer.send(
                {
                    "type": "prompt",
                    "id": "a",
                    "text": "What is it?",
                    "images": [image],
                    "params": params,
                }
            )
            first = (await peer.recv_until("done"))[-1]
            await peer.send({"type": "prompt", "id": "b", "text": "Sure?", "params": params})
            second = (await peer.recv_until("done"))[-1]
    assert reply.choices[0].message.content == first["text"]
    assert later.choices[0].message.content == second["text"]
    assert reply.usage is not None and reply.usage.prompt_tokens == first["usage"]["prompt_tokens"]
