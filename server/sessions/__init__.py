"""The session layer: a connection, its session and what sessions share (the hub, the
store, generation slots, quotas), one generation run from queue to ``done``, and where an
exception becomes an ``error`` frame. Imports the protocol and the engine interface only."""
