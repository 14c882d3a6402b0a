"""The store interface every strategy implements, and the registry of strategies.

A store keeps the memory of every recurrent layer of a batch of branches (a ``LayerState``
per layer, see ``replaylab.recurrent``) and whatever it needs to go back to an earlier position.
It sees a layer only through that layer's ``RecurrentSpec``: no store reads a weight.

The cache (``replaylab.cache.HybridCache``) calls, per forward of T tokens at position p:
    store.advance(layer, p, inputs) -> y    once per recurrent layer, bottom to top
    store.after_forward(p + T)              once, when every layer has advanced
    mark = store.begin_forward(p) ... store.abort_forward(mark)
                                            undo a forward that failed midway (the cache
                                            calls these; a failed forward changes nothing)
and for the branching API:
    snapshot(handle_id, p) / release(handle_id)      a position may be restored / no longer
    can_restore(p, handle_id) -> bool                checked before anything changes
    rollback(p, handle_id) -> Rollback               go back; ``rerun_from`` says where the
                                                     cache must re-run the model from (or None)
    select(indices)                                  branch i continues old branch indices[i]
    evictable() -> [EvictionItem] / evict(key)       what a byte budget may drop
    nbytes() -> {component: bytes}                   what is held, by component

A new strategy is one module here with a ``StateStore`` subclass decorated with ``@register``,
and one import line in ``replaylab/strategies/__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import torch

from replaylab.recurrent import LayerState, RecurrentSpec

__all__ = ["StateStore", "Rollback", "EvictionItem", "REGISTRY", "register", "store_class"]


class Rollback(NamedTuple):
    """What ``StateStore.rollback(p)`` leaves to the cache: None when the store now holds the
    state at p; else the position q < p whose state it holds, from which the cache re-runs the
    model over tokens [q, p)."""

    rerun_from: int | None


class EvictionItem(NamedTuple):
    """A kept copy a budget may drop: its ``key`` for ``evict``, the ``position`` it holds,
    its ``nbytes`` and when it was ``last_used`` (a counter, larger is more recent)."""

    key: Any
    position: int
    nbytes: int
    last_used: int


REGISTRY: dict[str, type[StateStore]] = {}


def register(cls):
    """Class decorator: make a ``StateStore`` available under its ``name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"strategy {cls.name!r} is already registered")
    REGISTRY[cls.name] = cls
    return cls


def store_class(name) -> type[StateStore]:
    """The store registered under ``name``, or a ValueError listing the names."""
    if name not in REGISTRY:
        raise ValueError(f"strategy: expected one of {sorted(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


class StateStore(ABC):
    """Base of the stores. ``specs``: layer index -> RecurrentSpec; ``config``: the cache's
    ``CacheConfig`` (each store reads the options that concern it)."""

    name: ClassVar[str]
    rerun_is_fallback: ClassVar[bool] = True  # False where re-running is the normal restore

    def __init__(self, specs: dict[int, RecurrentSpec], batch: int, dtype, device, config):
        self.specs, self.batch, self.dtype = specs, batch, dtype
        self.device = torch.device(device)
        self.folded_tokens = 0  # logged tokens folded into a state so far (replay's work)

    # --- the forward pass ----------------------------------------------------------------
    @abstractmethod
    def state(self, layer) -> LayerState:
        """The layer's memory at the current position (batch rows in branch order)."""

    @abstractmethod
    def advance(self, layer, position, inputs: dict):
        """Run T new tokens through ``layer`` from ``position`` and keep what the strategy
        keeps; returns the layer's scan outputs y (batch, T, ...)."""

    def after_forward(self, position):
        """Every layer has advanced to ``position``."""

    @abstractmethod
    def begin_forward(self, position):
        """A forward from ``position`` starts: return what ``abort_forward`` needs to undo it."""

    @abstractmethod
    def abort_forward(self, mark):
        """The forward begun with ``mark`` failed midway: put everything back as it was."""

    # --- branching -----------------------------------------------------------------------
    def snapshot(self, handle_id, position):
        """Keep what restoring ``position`` needs while ``handle_id`` lives."""

    def release(self, handle_id):
        """``handle_id`` is gone: what was kept for it alone may be dropped."""

    def can_restore(self, position, handle_id=None) -> bool:
        """Whether ``rollback(position, handle_id)`` can succeed (asked before anything
        changes)."""
        return True

    @abstractmethod
    def rollback(self, position, handle_id=None) -> Rollback:
        """Go back to ``position`` (<= the current one)."""

    @abstractmethod
    def select(self, indices):
        """Branch i continues old branch ``indices[i]`` (a long tensor)."""

    # --- memory --------------------------------------------------------------------------
    def evictable(self) -> list[EvictionItem]:
        """Copies a byte budget may drop (none by default)."""
        return []

    def evict(self, key):
        raise KeyError(f"{self.name}: nothing to evict under key {key!r}")

    @abstractmethod
    def nbytes(self) -> dict:
        """Bytes held, by component (``ssm_state``, ``conv_state`` and the strategy's own)."""
