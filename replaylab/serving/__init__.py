"""The serving engine beside the teaching cache: preallocated pools (``pools``), the engine
that decodes, verifies and rolls back every slot at its own position (``engine``), the
per-slot rollback cursor (``cursor``), a prompt admitted a chunk at a time between other
slots' steps (``admission``), requests (``request``), continuous batching under one byte
budget (``scheduler``) and a prefix cache of KV and recurrent state over the slots
(``prefix``)."""

from replaylab.serving.admission import Admission
from replaylab.serving.cursor import rollback_cursor
from replaylab.serving.engine import (
    STRATEGIES,
    DecodeEngine,
    EngineStats,
    fused_reason,
    unsupported_reason,
)
from replaylab.serving.prefix import EnginePrefixCache, allowed_block_sizes
from replaylab.serving.request import Request
from replaylab.serving.scheduler import Scheduler, admissible, request_bytes, slot_bytes

__all__ = [
    "Admission",
    "DecodeEngine",
    "EnginePrefixCache",
    "allowed_block_sizes",
    "EngineStats",
    "STRATEGIES",
    "Request",
    "Scheduler",
    "admissible",
    "request_bytes",
    "slot_bytes",
    "rollback_cursor",
    "fused_reason",
    "unsupported_reason",
]
