"""A page of another origin calls the OpenAI-compatible API from Chromium (web/openai_api/cors.py):
from an ``--allowed-origin`` its ``fetch`` (bearer token, JSON body: a preflight first) reads the
whole stream; from an origin not listed the browser rejects the ``fetch`` and nothing runs."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fakes.scripted import Script, ScriptedEngine
from tests.support import TIMEOUT, running_server

from .conftest import NewPage, http_base

pytestmark = pytest.mark.browser

TOKEN = "sekrit"
WORDS = [" Hello", " from", " another", " origin"]

# What the page runs: the API's stream read to its end, or the name of the error fetch threw.
STREAM = """async ([base, token]) => {
  try {
    const response = await fetch(base + "/v1/chat/completions", {
      method: "POST",
      headers: {"Authorization": "Bearer " + token, "Content-Type": "application/json"},
      body: JSON.stringify({model: "any", messages: [{role: "user", content: "Hi"}], stream: true}),
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      text += decoder.decode(value, {stream: true});
    }
    return {status: response.status, text};
  } catch (error) {
    return {error: error.name};
  }
}"""


class _Page(BaseHTTPRequestHandler):
    """An empty page: what matters is the origin it is served from."""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>another origin</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def page_origin() -> Iterator[str]:
    """A static server on another loopback port; yields its origin; stopped on leaving."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


def streamed_text(events: str) -> str:
    """The reply's text from a chat stream's ``data:`` lines."""
    text = ""
    for line in events.splitlines():
        data = line.removeprefix("data: ")
        if line.startswith("data: ") and data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                text += choice["delta"].get("content", "")
    return text


async def test_a_page_of_an_allowed_origin_reads_a_streamed_reply(new_page: NewPage) -> None:
    engine = ScriptedEngine(lambda _: Script(WORDS))
    with page_origin() as origin:
        async with running_server(engine, allowed_origins=(origin,), tokens=(TOKEN,)) as url:
            page = await new_page()
            await page.goto(origin + "/")
            result = await page.evaluate(STREAM, [http_base(url), TOKEN])
    assert result.get("status") == 200, result
    assert result["text"].endswith("data: [DONE]\n\n")
    assert streamed_text(result["text"]) == "".join(WORDS)


async def test_a_page_of_an_origin_not_listed_is_refused_and_nothing_runs(
    new_page: NewPage,
) -> None:
    engine = ScriptedEngine(lambda _: Script(WORDS))
    with page_origin() as listed, page_origin() as other:
        async with running_server(engine, allowed_origins=(listed,), tokens=(TOKEN,)) as url:
            page = await new_page()
            await page.goto(other + "/")
            result = await page.evaluate(STREAM, [http_base(url), TOKEN])
    assert result == {"error": "TypeError"}
    assert engine.requests == []
