"""Reading a reply's calls as it streams (engine/tool_calls.py ``CallReader``) and whole
(engine/tools.py ``read_calls``): text goes out as it comes, a call is held back and handed out
once its object is whole, with the id the whole reply's reading gives it."""

from __future__ import annotations

import pytest
from wschat.protocol import ToolSpec
from wschat.server.engine import CallReader, CallsInvalid, ToolUse
from wschat.server.engine.tools import read_calls

TOOLS = ToolUse((ToolSpec("get_weather"), ToolSpec("now")))
TWO = (
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},'
    ' {"name": "now", "arguments": {}}]}'
)


def read(reader: CallReader, pieces: list[str]) -> list[tuple[str, list[str]]]:
    return [(shown, [c.name for c in calls]) for shown, calls in map(reader.feed, pieces)]


def test_a_text_reply_is_shown_as_it_comes_once_it_cannot_begin_a_call() -> None:
    reader = CallReader(TOOLS, "s")
    assert read(reader, [" ", "{", '"a": 1}', " more"]) == [
        ("", []),
        ("", []),
        (' {"a": 1}', []),
        (" more", []),
    ]
    assert reader.finish() == ("", [], False)


def test_each_call_is_handed_out_once_whole_with_the_whole_replys_id() -> None:
    reader = CallReader(TOOLS, "s")
    pieces = [TWO[:20], TWO[20:60], TWO[60:75], TWO[75:]]
    assert read(reader, pieces) == [("", []), ("", []), ("", ["get_weather"]), ("", ["now"])]
    assert reader.finish() == ("", [], True)
    assert tuple(reader.calls) == read_calls(TWO, TOOLS, "s")
    assert [c.id for c in reader.calls] == ["call_s0", "call_s1"]


def test_a_call_cut_short_is_never_shown_as_text() -> None:
    reader = CallReader(TOOLS, "s")
    assert read(reader, [TWO[:40]]) == [("", [])]
    assert reader.finish() == ("", [], False)


def test_the_calls_whole_before_a_cut_are_handed_out_and_the_cut_one_is_not() -> None:
    reader = CallReader(TOOLS, "s")
    assert read(reader, [TWO[:75], TWO[75:90]]) == [("", ["get_weather"]), ("", [])]
    assert reader.finish() == ("", [], False)
    assert [c.name for c in reader.calls] == ["get_weather"]


def test_without_tools_described_every_piece_is_text() -> None:
    for use in (None, ToolUse((ToolSpec("now"),), choice="none")):
        reader = CallReader(use, "s")
        assert reader.feed(TWO) == (TWO, [])
        assert read_calls(TWO, use, "s") is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"tool_calls": [{"name": "nope", "arguments": {}}]}', "names no offered tool"),
        ('{"tool_calls": [{"name": "now", "arguments": {}}', "not JSON"),
        ('{"tool_calls": []}', "not a list of calls"),
    ],
)
def test_a_reply_that_begins_a_call_it_does_not_make_is_refused(text: str, why: str) -> None:
    with pytest.raises(CallsInvalid, match=why):
        read_calls(text, TOOLS, "s")


def test_several_calls_with_parallel_calls_off_are_refused() -> None:
    with pytest.raises(CallsInvalid, match="parallel_tool_calls is false"):
        read_calls(TWO, ToolUse(TOOLS.tools, parallel=False), "s")


def test_a_reply_of_calls_is_full_once_another_would_reach_its_closing_reserve() -> None:
    one = ' {"name": "now", "arguments": {}}'
    each = ['{"tool_calls": [' + one, *[f",{one}"] * 9]
    # five tokens a call, 40 in all, the last 10 the reserve: the 6th ends at 30, a 7th would not
    # fit; the calls of one piece share its tokens
    for pieces in ([("".join(each), 50)], [(text, 5 * (n + 1)) for n, text in enumerate(each)]):
        reader = CallReader(TOOLS, "s")
        reader.limit(40)
        for text, produced in pieces:
            reader.feed(text, produced)
        assert reader.full and len(reader.calls) == 6
        assert reader.finish() == ("", [], False)


def test_a_reply_of_one_call_is_never_full() -> None:
    reader = CallReader(ToolUse(TOOLS.tools, parallel=False), "s")
    reader.limit(4)
    assert read(reader, [TWO[:75]]) == [("", ["get_weather"])]
    assert not reader.full
