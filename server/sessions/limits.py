"""``PromptLimits``: what a prompt is held to before any model work, whichever door it came by
(README "Security and limits"): its text's bytes, its ``max_new_tokens`` against the server's
longest reply, the sampling it runs with, its params over the session's defaults over the
server's, and the tools it offers (a named ``tool_choice`` one of them) and the results it hands
back (one per call that awaits one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wschat.protocol import GenerationParams, InvalidParams, TooLarge, ToolResult

from ..engine import FunctionCall, ResponseFormat, SamplingParams, ToolUse
from ..settings import Settings

# PROTOCOL.md "configure": the context a system prompt must leave for the user's text and reply
MIN_TURN_TOKENS = 32


@dataclass(frozen=True, slots=True)
class PromptLimits:
    max_new_tokens: int  # the longest reply a prompt may ask for
    default_max_new_tokens: int  # the reply's budget where nothing else set one
    max_prompt_bytes: int  # one text, in UTF-8 bytes
    max_prompt_tokens: int  # one user turn's text, in tokens (the chat counts them)

    @classmethod
    def of(cls, settings: Settings) -> PromptLimits:
        return cls(
            settings.max_new_tokens,
            settings.default_max_new_tokens,
            settings.max_prompt_bytes,
            settings.max_prompt_tokens,
        )

    def check_text(self, text: str, frame_id: str | None = None, what: str = "prompt text") -> None:
        """``TooLarge`` for a text over ``max_prompt_bytes`` (``what``: how the message names
        it)."""
        if len(text.encode()) > self.max_prompt_bytes:
            raise TooLarge(f"{what} is over {self.max_prompt_bytes} bytes", id=frame_id)

    def check_params(self, params: GenerationParams, frame_id: str | None = None) -> None:
        """PROTOCOL.md "params": ``max_new_tokens`` over the server's limit is refused, never
        clamped (protocol/params.py checks the rest as it decodes)."""
        limit = self.max_new_tokens
        if params.max_new_tokens is not None and params.max_new_tokens > limit:
            raise InvalidParams(f"max_new_tokens must be at most {limit}", id=frame_id)

    def merged(
        self, params: GenerationParams | None, defaults: GenerationParams, frame_id: str
    ) -> GenerationParams:
        """A prompt's params (checked) over the session's defaults."""
        if params is None:
            return defaults
        self.check_params(params, frame_id)
        return params.merged_over(defaults)

    def sampling(self, p: GenerationParams) -> SamplingParams:
        """What the engine runs with: ``p``, the server's defaults filling what it leaves."""
        return SamplingParams(
            max_new_tokens=p.max_new_tokens or self.default_max_new_tokens,
            temperature=0.0 if p.temperature is None else p.temperature,
            top_p=1.0 if p.top_p is None else p.top_p,
            top_k=p.top_k or 0,
            min_p=p.min_p or 0.0,
            repetition_penalty=p.repetition_penalty or 1.0,
            stop=p.stop or (),
            seed=p.seed,
            response_format=ResponseFormat.of(p.response_format),
            logprobs=p.logprobs,
        )

    def tools(self, p: GenerationParams, frame_id: str) -> ToolUse | None:
        """The tools a prompt's merged params offer, and how it may use them (PROTOCOL.md
        "Tool calls"): a named ``tool_choice`` must name one of them, and ``required`` needs
        some."""
        choice = p.tool_choice
        if choice is not None and choice.mode == "named":
            if not any(tool.name == choice.name for tool in p.tools or ()):
                raise InvalidParams(
                    f"tool_choice names {choice.name!r}, which tools does not offer", id=frame_id
                )
        elif choice is not None and choice.mode == "required" and not p.tools:
            raise InvalidParams("tool_choice required needs tools", id=frame_id)
        return ToolUse.of(p.tools, choice, p.parallel_tool_calls)

    def check_results(
        self, calls: Sequence[FunctionCall], results: Sequence[ToolResult], frame_id: str
    ) -> None:
        """One result per call that awaits one (PROTOCOL.md "Tool calls"), each a text within
        a prompt's size."""
        if not calls:
            raise InvalidParams("no tool calls await results", id=frame_id)
        check_answers(calls, results, frame_id)
        for result in results:
            self.check_text(result.content, frame_id, "a tool result")


def check_answers(
    calls: Sequence[FunctionCall], results: Sequence[ToolResult], frame_id: str | None = None
) -> None:
    """``InvalidParams`` unless ``results`` answer ``calls`` one each (in any order)."""
    awaited = {call.id for call in calls}
    answered = [result.call_id for result in results]
    for call_id in answered:
        if call_id not in awaited:
            raise InvalidParams(f"no tool call {call_id!r} awaits a result", id=frame_id)
    if len(set(answered)) != len(answered):
        raise InvalidParams("each tool call takes one result", id=frame_id)
    missing = [call.id for call in calls if call.id not in set(answered)]
    if missing:
        raise InvalidParams(f"tool call {missing[0]!r} has no result", id=frame_id)
