"""The session layer: a session's rules with no I/O (``core``), the ``Session`` that drives them,
what sessions share (the ``Hub``, the factory of every session: the store, generation slots,
quotas, gates), one generation run from queue to ``done``, and where an exception becomes an
``error`` frame. Imports the protocol and the engine interface only.

What the doors (web/) and the process (runtime/) may use is exported here, and they import the
layer through this face alone (tests/test_interfaces.py): a session's inputs, the hub, what a door
needs to serve one and what the server counts.
"""

from .error_boundary import Outbox, Send, error_frame, expected
from .events import RunDone, RunEvent, RunStarted, TokensSent
from .generation import GenerationRun
from .hooks import EngineKeys
from .hub import Door, Hub
from .inputs import Complete, Converse, ReplySaid, ResultsSaid, Said, TakenOver, UserSaid
from .quotas import FrameRate, PendingHandshakes, PendingPlace
from .relay import CatchUp
from .session import Session
from .states import SessionState
from .stats import APIS, OPENAI_API, RESPONSES_API, RESPONSES_SOCKET, WEBSOCKET

__all__ = [
    "APIS",
    "OPENAI_API",
    "RESPONSES_API",
    "RESPONSES_SOCKET",
    "WEBSOCKET",
    "CatchUp",
    "Complete",
    "Converse",
    "Door",
    "EngineKeys",
    "FrameRate",
    "GenerationRun",
    "Hub",
    "Outbox",
    "PendingHandshakes",
    "PendingPlace",
    "ReplySaid",
    "ResultsSaid",
    "RunDone",
    "RunEvent",
    "RunStarted",
    "Said",
    "Send",
    "Session",
    "SessionState",
    "TakenOver",
    "TokensSent",
    "UserSaid",
    "error_frame",
    "expected",
]
