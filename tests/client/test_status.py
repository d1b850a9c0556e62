"""What the ``wschat`` command says about how a reply ended (``client/status.py``)."""

from __future__ import annotations

from wschat.client.status import length_notice
from wschat.protocol import Done, FinishReason, Limits, Timing, Usage

LIMITS = Limits(
    max_frame_bytes=1 << 20, max_image_bytes=1 << 20, context_tokens=100, max_new_tokens=50,
    max_image_pixels=1 << 20,
)  # fmt: skip


def cut(prompt_tokens: int, completion_tokens: int) -> Done:
    usage = Usage(prompt_tokens, completion_tokens, 0)
    return Done("p1", FinishReason.LENGTH, "text", usage, Timing(0.0, 1.0, 10.0, 20.0))


def test_length_notice_names_the_token_limit_and_the_option_that_raises_it() -> None:
    assert length_notice(cut(10, 32), LIMITS) == (
        "[reply cut at the 32-token limit: ask for up to 50 with --max-new-tokens]"
    )


def test_length_notice_at_the_servers_cap_names_the_servers_option() -> None:
    assert length_notice(cut(10, 50), LIMITS) == (
        "[reply cut at the server's 50-token cap: wschat-server --max-new-tokens sets it]"
    )


def test_length_notice_names_the_context_when_the_conversation_filled_it() -> None:
    assert length_notice(cut(90, 10), LIMITS) == (
        "[reply cut: the conversation filled the model's 100-token context]"
    )
