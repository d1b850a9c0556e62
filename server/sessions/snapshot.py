"""A session's state for a store outside this process: what a resume needs as plain data
(``export_state``, ``reply_checkpoint``), read back into a session (``import_state``), and as
bytes (``pack``, ``unpack``): msgpack, with the images of the engine's form (numpy arrays,
Pillow images) as extension types.

``unpack`` only rebuilds plain data and the two image forms (a dtype from a short list, a shape
that matches the bytes), so a store's bytes can never make it run code, and ``Bounds`` caps each
list, string and image before it is even built, so bytes made up to be huge are refused early;
what is left to check, ids and sizes against the engine, ``import_state`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
from wschat.protocol import BadFrame, GenerationParams, InvalidParams, parse_params
from wschat.protocol.fields import as_id

from .relay import KeptReply

if TYPE_CHECKING:
    from ..engine import Chat
    from ..settings import Settings
    from .images import CheckedImage
    from .session import Session

MIN_KEPT_IDS = 1 << 16  # prompt ids a restored session may have used, at the least
FORMAT_VERSION = 2  # 2: the state names its engine's model and tokenizer (a fingerprint)
_ARRAY = 1  # ext type: [dtype, shape, bytes]
_PIL = 2  # ext type: [mode, width, height, bytes]
_DTYPES = frozenset({"|u1", "<f4", "<f2", "<i4", "<i8", "<f8"})


class SnapshotError(ValueError):
    """Bytes that are not a snapshot this version reads."""


@dataclass(frozen=True, slots=True)
class Restored:
    """A session's state read back (``import_state``), but for its conversation, which is in the
    chat already."""

    defaults: GenerationParams
    staged: list[CheckedImage]
    used_ids: set[str]
    turn_ids: list[str | None]
    kept: KeptReply | None  # a reply that ended while no connection was attached


@dataclass(frozen=True, slots=True)
class Bounds:
    """The most a stored state holds of each kind, as a live session's would."""

    items: int  # in one list or map (a conversation's ids, the prompt ids it used)
    values: int  # in all its lists and maps together, each list or map counting one more
    text_bytes: int  # in one string (a system prompt is the longest: one frame)
    image_bytes: int  # in one image
    state_bytes: int  # a state and its reply's checkpoint together, packed

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        """A live session's limits: images within max_session_image_bytes, ids within the
        context, a reply that ended detached (its text twice, the record's and the done's, at
        up to 64 bytes a token)."""
        items = max(2 * settings.context_tokens, MIN_KEPT_IDS)
        state_bytes = settings.max_session_image_bytes + 16 * settings.context_tokens
        state_bytes += 128 * settings.max_new_tokens + (1 << 20)
        return cls(
            items=items,
            values=4 * items,  # the conversation's ids and the prompt ids, with room to spare
            text_bytes=settings.max_frame_bytes,  # a system prompt came in one frame
            image_bytes=settings.max_session_image_bytes,
            state_bytes=state_bytes,
        )


def _limits(bounds: Bounds | None) -> dict[str, Any]:
    if bounds is None:
        return {}
    left = bounds.values

    def counted(container: Any) -> Any:
        # msgpack builds values in C without a pause: counting as it goes stops bytes that hold
        # millions of small ones after the first ``values``, not once all are built
        nonlocal left
        left -= len(container) + 1
        if left < 0:
            raise SnapshotError(f"over {bounds.values} values")
        return container

    return {
        "max_array_len": bounds.items,
        "max_map_len": bounds.items,
        "max_str_len": bounds.text_bytes,
        "max_bin_len": bounds.image_bytes,
        "max_ext_len": bounds.image_bytes + 64,  # an image's ext: its bytes and a short header
        "list_hook": counted,
        "object_hook": counted,
    }


def pack(state: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb({"v": FORMAT_VERSION, "state": state}, default=_encode_image)
    return data


def unpack(data: bytes, bounds: Bounds | None = None) -> dict[str, Any]:
    try:
        outer = msgpack.unpackb(
            data, ext_hook=_decode_image, strict_map_key=True, **_limits(bounds)
        )
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as e:
        raise SnapshotError(f"not a session snapshot: {e}") from e
    if not isinstance(outer, dict) or outer.get("v") != FORMAT_VERSION:
        raise SnapshotError("a session snapshot of another version")
    state = outer.get("state")
    if not isinstance(state, dict):
        raise SnapshotError("a session snapshot without its state")
    return state


def _encode_image(obj: Any) -> msgpack.ExtType:
    if hasattr(obj, "__array_interface__") and hasattr(obj, "dtype"):  # numpy, no import
        dtype = obj.dtype.str
        if dtype not in _DTYPES:
            raise TypeError(f"an array of {dtype} is not kept in a snapshot")
        body = [dtype, list(obj.shape), obj.tobytes(order="C")]
        return msgpack.ExtType(_ARRAY, msgpack.packb(body))
    if hasattr(obj, "mode") and hasattr(obj, "tobytes") and hasattr(obj, "size"):  # Pillow
        width, height = obj.size
        return msgpack.ExtType(_PIL, msgpack.packb([obj.mode, width, height, obj.tobytes()]))
    raise TypeError(f"{type(obj).__name__} is not kept in a snapshot")


def _decode_image(code: int, data: bytes) -> Any:
    body = msgpack.unpackb(data)
    if code == _ARRAY:
        import numpy as np

        dtype, shape, raw = body
        if dtype not in _DTYPES or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise SnapshotError("an array in a snapshot with a bad dtype or shape")
        array = np.frombuffer(raw, dtype=np.dtype(dtype))
        count = 1
        for n in shape:
            count *= n
        if array.size != count:
            raise SnapshotError("an array in a snapshot whose bytes do not fill its shape")
        return array.reshape(shape).copy()
    if code == _PIL:
        from PIL import Image

        mode, width, height, raw = body
        if mode not in ("RGB", "RGBA", "L"):
            raise SnapshotError(f"an image in a snapshot in mode {mode!r}")
        return Image.frombytes(mode, (width, height), raw)
    raise SnapshotError(f"an unknown extension type {code} in a snapshot")


def export_state(session: Session) -> dict[str, Any]:
    """What a resume needs, as plain data (images in the engine's form): the conversation, the
    defaults, the staged images as checked, every id used, the running turn as it was prompted
    (its reply's tokens are checkpointed on their own: ``reply_checkpoint``), and a reply that
    ended with no connection attached (``Relay.export``: its frames and its done, for the
    resume's catch-up). A running turn joins the conversation when it ends, the next boundary;
    should this process die first, ``import_state`` keeps it as a cancelled exchange."""
    core, run, running = session.core, session.run, session.chat.export_running()
    return {
        "running": {"id": run.id, "turn": running} if run and running else None,
        "defaults": core.defaults.to_wire(),
        "chat": core.chat.export_state(),
        "staged": [
            {"image": c.image, "width": c.width, "height": c.height, "format": c.format}
            for c in core.staged
        ],
        "ids": sorted(core.used_ids),
        "last_prompt": core.last_prompt,
        "turn_ids": list(core.turn_ids),
        "engine": session.engine.info.fingerprint,  # whose token ids these are
        "relay": session.relay.export(),
    }


def reply_checkpoint(session: Session) -> dict[str, Any] | None:
    """The running reply so far (its prompt's id, the tokens generated): with the running turn
    of ``export_state``, what a crash leaves of it."""
    run = session.run
    if run is None or run.generation is None:
        return None
    return {"id": run.id, "ids": list(run.sent.ids)}


def import_state(
    session: Session, state: dict[str, Any], partial: dict[str, Any] | None = None
) -> None:
    """An exported state, into a new ``session``; ``ValueError`` when it is not one (checked
    before the session is changed). A turn that was running in it (its process died mid-reply)
    is kept as a cancelled exchange whose reply is ``partial``'s tokens (a ``reply_checkpoint``;
    none when it is another turn's)."""
    from .images import CheckedImage  # Pillow loads only for a session that kept images

    if state.get("engine") != session.engine.info.fingerprint:
        raise ValueError("a state kept by an engine with another model or tokenizer")
    try:
        defaults = parse_params(state["defaults"])
        staged = [
            CheckedImage(c["image"], int(c["width"]), int(c["height"]), str(c["format"]))
            for c in state["staged"]
        ]
        # the bounds a live session has: ids as a prompt frame's, images as staged ones
        ids = {as_id(i) for i in state["ids"]}
        last_prompt = state.get("last_prompt")
        if last_prompt is not None:
            last_prompt = as_id(last_prompt, "last_prompt")
        turn_ids = _turn_ids(state.get("turn_ids"))
        chat_state = state["chat"]
        running = state.get("running")
        running_id = as_id(running["id"]) if running else None
        kept = KeptReply.read(state["relay"]) if state.get("relay") is not None else None
    except (KeyError, TypeError, BadFrame, InvalidParams) as e:
        raise ValueError(f"not an exported session: {e!r}") from e
    if kept is not None and kept.reply not in ids:
        raise ValueError("not an exported session: its kept reply's id was never used")
    if len(staged) > session.max_images:
        raise ValueError(f"not an exported session: over {session.max_images} staged images")
    chat = session.chat
    chat.import_state(chat_state)
    held = chat.turns
    if turn_ids is None or len(turn_ids) != held:
        # a state stored before each exchange's id was kept: only the last one's is known
        turn_ids = [*[None] * (held - 1), last_prompt] if held else []
    if running:
        _keep_cancelled(chat, running, partial)
        del turn_ids[chat.turns - 1 :]  # a regenerate's replaced the last exchange
        turn_ids.append(running_id)
    session.restore(Restored(defaults, staged, ids, turn_ids, kept))


def _keep_cancelled(chat: Chat, running: dict[str, Any], partial: dict[str, Any] | None) -> None:
    reply = partial["ids"] if partial and partial.get("id") == running.get("id") else []
    try:
        chat.add_cancelled(running["turn"], reply)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not an exported session: its running turn: {e!r}") from e


def _turn_ids(stored: Any) -> list[str | None] | None:
    """An exported state's ids of its exchanges (None: a state stored before they were kept)."""
    if stored is None:
        return None
    if not isinstance(stored, list):
        raise TypeError("turn_ids is not a list")
    return [None if i is None else as_id(i, "turn_ids") for i in stored]
