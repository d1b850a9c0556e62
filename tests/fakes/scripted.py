"""``ScriptedEngine``: a fake with the real engine's interface, for fast session tests and the
load test. Each reply is a script of token texts produced by a worker thread with a per-token
delay; it honours cancel at every step and can be told to raise or to stall.

Tokens are whole "words": ``tokenize_text`` gives one id per character so prompt sizes are real.
A reply that asks for logprobs gets made-up ones of the right shape (``scripted_logprob``); a
response format is taken as prepared, except a schema with the key ``x-refused``, refused as the
grammar library would refuse it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wschat.protocol import FinishReason
from wschat.server.engine.base import (
    EngineInfo,
    Finished,
    Generation,
    GenerationRequest,
    Logprob,
    LoopBridge,
    SamplingParams,
    TokenChoice,
    TokenPiece,
)
from wschat.server.engine.errors import ImagesUnsupported, SchemaRefused
from wschat.server.engine.formats import GemmaTurns, PromptFormat
from wschat.server.engine.grammar import ResponseFormat
from wschat.server.engine.tokenizing import TextTokenizer

_MARKUP = {"<bos>": 2, "<eos>": 1, "<start_of_turn>": 105, "<end_of_turn>": 106}
_MARKUP_RE = re.compile("(" + "|".join(re.escape(token) for token in _MARKUP) + ")")


@dataclass
class Script:
    tokens: list[str]
    delay_s: float = 0.0
    fail_after: int | None = None  # raise after this many tokens
    stall_after: int | None = None  # stop making progress after this many tokens
    end_with_eos: bool = True
    logprobs: int | None = None  # the request's: made-up entries of this many alternatives


# the key of a schema the scripted engine refuses, and the reason it gives
REFUSED_KEY = "x-refused"
REFUSED_REASON = "a keyword the scripted grammar does not implement"


def scripted_logprob(token_id: int, text: str, top: int) -> Logprob:
    """A made-up logprob entry: the token at -0.5, then ``top`` others at -1, -2, ..."""
    chosen = TokenChoice(token_id, text, text.encode(), -0.5)
    others = tuple(TokenChoice(2000 + k, f"t{k}", f"t{k}".encode(), -1.0 - k) for k in range(top))
    return Logprob(chosen, others)


def default_script(request: GenerationRequest) -> Script:
    n = request.params.max_new_tokens
    return Script([f" w{i}" for i in range(min(n, 8))], end_with_eos=n > 8)


class ScriptedEngine:
    name = "scripted"

    def __init__(
        self,
        script: Callable[[GenerationRequest], Script] = default_script,
        *,
        context_tokens: int = 4096,
        images: bool = False,
        max_images: int = 4,
    ) -> None:
        self.script = script
        self.info = EngineInfo(
            self.name,
            "scripted",
            "cpu",
            "none",
            context_tokens,
            images,
            max_images if images else 0,
            prompt_format=GemmaTurns.name,
        )
        self.prompt_format: PromptFormat = GemmaTurns(self, frozenset({1, 106}))
        self.text_tokenizer = TextTokenizer()
        self.requests: list[GenerationRequest] = []
        self.prepared: list[ResponseFormat] = []
        self.forgotten: list[str] = []
        self.threads: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()  # threads remove themselves as they end
        self._release_stall = threading.Event()

    def prepare_image(self, image: object) -> object:
        """Kept as checked (upright RGB, at its upload size)."""
        self.image_placeholder_ids()
        return image

    def kv_usage(self) -> None:
        return None  # it keeps no KV state

    def worker_threads(self) -> None:
        return None

    def tokenize_text(self, text: str) -> list[int]:
        return [300 + (ord(c) % 1000) for c in text]

    def token_id(self, token: str) -> int:
        return _MARKUP[token]

    def tokenize_markup(self, text: str) -> list[int]:
        ids: list[int] = []
        for n, piece in enumerate(_MARKUP_RE.split(text)):
            ids += [_MARKUP[piece]] if n % 2 else self.tokenize_text(piece)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 300) if i >= 300 else "" for i in ids)

    def image_placeholder_ids(self) -> list[int]:
        if not self.info.images:
            raise ImagesUnsupported("the scripted model reads no images")
        return [255999, *([262144] * 4), 256000]

    def forget(self, session_key: str) -> None:
        self.forgotten.append(session_key)

    async def prepare_reply(self, params: SamplingParams) -> None:
        response_format = params.response_format
        if response_format is None:
            return
        if REFUSED_KEY in (response_format.schema or {}):
            raise SchemaRefused.because(REFUSED_REASON)
        self.prepared.append(response_format)

    def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        generation = Generation(prompt_tokens=len(request.prompt_ids))
        bridge = LoopBridge(asyncio.get_running_loop(), generation)
        thread = threading.Thread(
            target=self._run,
            args=(self._script(request), generation, bridge),
            name="wschat-generate-scripted",
            daemon=True,
        )
        with self._threads_lock:
            self.threads.add(thread)
        thread.start()
        return generation

    def unstall(self) -> None:
        self._release_stall.set()

    async def reachable(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._release_stall.set()
        with self._threads_lock:
            running = list(self.threads)
        for thread in running:
            await asyncio.to_thread(thread.join, 10)

    def _script(self, request: GenerationRequest) -> Script:
        script = self.script(request)
        if request.params.logprobs is None:
            return script
        return dataclasses.replace(script, logprobs=request.params.logprobs)

    def _run(self, script: Script, generation: Generation, bridge: LoopBridge) -> None:
        finished = Finished(FinishReason.ERROR, error=RuntimeError("ended early"))
        produced: list[int] = []
        try:
            reason = FinishReason.LENGTH
            for i, text in enumerate(script.tokens):
                if generation.cancel_flag.is_set():
                    reason = FinishReason.CANCELLED
                    break
                if script.fail_after is not None and i >= script.fail_after:
                    raise RuntimeError("scripted failure")
                if script.stall_after is not None and i >= script.stall_after:
                    self._release_stall.wait(60)
                if script.delay_s:
                    time.sleep(script.delay_s)
                produced.append(1000 + i)
                top = script.logprobs
                logprobs = () if top is None else (scripted_logprob(1000 + i, text, top),)
                bridge.put(TokenPiece(text, (1000 + i,), logprobs))
            else:
                if script.end_with_eos:
                    produced.append(106)
                    reason = FinishReason.STOP
            if generation.cancel_flag.is_set():
                reason = FinishReason.CANCELLED
            finished = Finished(reason, tuple(produced))
        except BaseException as error:
            finished = Finished(FinishReason.ERROR, tuple(produced), error)
        finally:
            bridge.put(finished)
            with self._threads_lock:
                self.threads.discard(threading.current_thread())
