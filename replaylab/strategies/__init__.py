"""The state strategies, one module each, and the registry every other module reads names from.

    snapshot    replaylab.strategies.snapshot.SnapshotStore
    recompute   replaylab.strategies.recompute.RecomputeStore
    replay      replaylab.strategies.replay.ReplayStore

``STRATEGY_NAMES`` lists them in that order; ``store_class(name)`` returns one. The interface is
``replaylab.strategies.base.StateStore``.
"""

from replaylab.strategies.base import (
    REGISTRY,
    EvictionItem,
    Rollback,
    StateStore,
    register,
    store_class,
)

# isort: off
# registration order is the order of STRATEGY_NAMES: most memory first
from replaylab.strategies.snapshot import SnapshotStore
from replaylab.strategies.recompute import RecomputeStore
from replaylab.strategies.replay import ReplayStore
# isort: on

STRATEGY_NAMES: tuple[str, ...] = tuple(REGISTRY)

__all__ = [
    "STRATEGY_NAMES",
    "REGISTRY",
    "StateStore",
    "Rollback",
    "EvictionItem",
    "register",
    "store_class",
    "SnapshotStore",
    "RecomputeStore",
    "ReplayStore",
]
