"""The serving engine's strategies, one module each, and their registry.

    snapshot    replaylab.serving.strategies.snapshot.EngineSnapshot
    recompute   replaylab.serving.strategies.recompute.EngineRecompute
    replay      replaylab.serving.strategies.replay.EngineReplay

Each serves the teaching strategy of ``replaylab.strategies`` named by its ``store`` (the same
outputs) over the engine's pools; registration checks that store exists. ``STRATEGIES`` lists
the names in the teaching registry's order; ``strategy_class(name)`` returns one. The
interface is ``replaylab.serving.strategies.base.EngineStrategy``.
"""

from replaylab.serving.strategies.base import (
    REGISTRY,
    EngineStrategy,
    register,
    strategy_class,
    unregister,
)

# isort: off
# registration order is the teaching registry's (``replaylab.strategies.STRATEGY_NAMES``)
from replaylab.serving.strategies.snapshot import EngineSnapshot
from replaylab.serving.strategies.recompute import EngineRecompute
from replaylab.serving.strategies.replay import EngineReplay
# isort: on

STRATEGIES: tuple[str, ...] = tuple(REGISTRY)

__all__ = [
    "STRATEGIES",
    "REGISTRY",
    "EngineStrategy",
    "EngineSnapshot",
    "EngineRecompute",
    "EngineReplay",
    "register",
    "unregister",
    "strategy_class",
]
