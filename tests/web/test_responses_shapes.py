"""A response's events as made once, as JSON text (web/responses/shapes.py): a text delta from
its message's template and the opening's response object encoded once are, byte for byte, what
encoding each event's fields would give, whatever the text and the lane."""

from __future__ import annotations

import json
from typing import Any

import pytest
from wschat.server.settings import Settings
from wschat.server.web.responses.request import create_body
from wschat.server.web.responses.shapes import Event, ResponseShape, encoded

AWKWARD = [
    " w0",
    'a "quote"',
    "back\\slash",
    "line\nbreak\t",
    "é ü",
    "\u2028",
    "😀",
    "\x00\x1f",
    "",
]


def shape(stream_id: str | None) -> ResponseShape:
    body = create_body({"model": "any", "input": "Hi"}, Settings())
    return ResponseShape("resp_1", "any", body, stream_id)


def fields(event: Event) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(event.data)
    assert data["type"] == event.kind
    return data


@pytest.mark.parametrize("stream_id", [None, "lane.1"])
def test_a_text_delta_is_what_encoding_its_fields_gives(stream_id: str | None) -> None:
    made = shape(stream_id)
    opening = made.opening()
    lane = {} if stream_id is None else {"stream_id": stream_id}
    where = {"item_id": made.item_id, "output_index": 0, "content_index": 0}
    events = [event for text in AWKWARD for event in made.delta(text)]
    assert [e.kind for e in events[:2]] == [
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = events[2:]
    assert [e.data for e in deltas] == [
        encoded(
            {
                "type": "response.output_text.delta",
                **where,
                "delta": text,
                "logprobs": [],
                "sequence_number": 4 + i,
                **lane,
            }
        )
        for i, text in enumerate(AWKWARD)
    ]
    assert [fields(e)["delta"] for e in deltas] == AWKWARD
    assert [fields(e)["sequence_number"] for e in [*opening, *events]] == list(range(13))


@pytest.mark.parametrize("stream_id", [None, "lane.1"])
def test_the_opening_carries_the_response_as_encoding_its_fields_gives(
    stream_id: str | None,
) -> None:
    made = shape(stream_id)
    response = made.object()
    lane = {} if stream_id is None else {"stream_id": stream_id}
    assert made.opening() == [
        Event(kind, encoded({"type": kind, "response": response, "sequence_number": i, **lane}))
        for i, kind in enumerate(["response.created", "response.in_progress"])
    ]
