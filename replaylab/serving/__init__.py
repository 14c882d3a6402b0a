"""The serving engine beside the teaching cache: preallocated pools (``pools``) and the engine
that decodes, verifies and rolls back every slot at its own position (``engine``)."""

from replaylab.serving.engine import STRATEGIES, DecodeEngine, EngineStats, unsupported_reason

__all__ = ["DecodeEngine", "EngineStats", "STRATEGIES", "unsupported_reason"]
