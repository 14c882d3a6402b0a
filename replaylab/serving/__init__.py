"""The serving engine beside the teaching cache: preallocated pools (``pools``) and the engine
that decodes, verifies and rolls back every slot at its own position (``engine``)."""

from replaylab.serving.engine import STRATEGIES, DecodeEngine, EngineStats

__all__ = ["DecodeEngine", "EngineStats", "STRATEGIES"]
