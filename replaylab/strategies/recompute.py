"""Recompute: keep the memory every ``checkpoint_interval`` tokens; going back to p re-runs the
whole model from the last checkpoint <= p (a recurrent layer's input depends on every layer
below it, so no layer can be re-run alone)."""

from __future__ import annotations

from replaylab.strategies.base import EvictionItem, Rollback, register
from replaylab.strategies.current import CurrentStateStore, copy_nbytes

__all__ = ["RecomputeStore"]


@register
class RecomputeStore(CurrentStateStore):
    name = "recompute"
    rerun_is_fallback = False

    def __init__(self, specs, batch, dtype, device, config):
        super().__init__(specs, batch, dtype, device, config)
        self.interval = config.checkpoint_interval
        self.checkpoints = {0: None}  # position -> {layer: LayerState}; None: the zero state
        self.last_used = {}  # position -> when it was made or last restored from

    def wants_states(self, position, T):
        return (position + T) // self.interval > position // self.interval

    def keep(self, layer, position, states):
        for p, kept in states.items():
            if p % self.interval == 0:
                self.checkpoints.setdefault(p, {})[layer] = kept
                self.last_used[p] = max(self.last_used.values(), default=0) + 1

    def drop_after(self, position):
        for p in [p for p in self.checkpoints if p > position]:
            del self.checkpoints[p]
            self.last_used.pop(p, None)

    def snapshot(self, handle_id, position):
        # a handle is only a position; keep the latest checkpoint at or before it (and the
        # zero state at 0), drop older ones: earlier targets recompute from the start
        base = max(p for p in self.checkpoints if p <= position)
        self.checkpoints = {p: c for p, c in self.checkpoints.items() if p == 0 or p >= base}

    def rollback(self, position, handle_id=None):
        start = max(p for p in self.checkpoints if p <= position)
        if self.checkpoints[start] is None:
            self._zero()
        else:
            self._load(self.checkpoints[start])
            self.last_used[start] = max(self.last_used.values(), default=0) + 1
        for p in [p for p in self.checkpoints if p > start]:
            del self.checkpoints[p]
        return Rollback(start if start < position else None)

    def select(self, indices):
        self._gather(indices)
        for copy in self.checkpoints.values():
            for layer, kept in (copy or {}).items():
                copy[layer] = kept.index(indices)

    def evictable(self):
        return [
            EvictionItem(p, p, copy_nbytes(c), self.last_used.get(p, p))
            for p, c in self.checkpoints.items()
            if c is not None
        ]

    def evict(self, key):
        del self.checkpoints[key]

    def nbytes(self):
        return {
            **self.current_bytes(),
            "checkpoints": sum(copy_nbytes(c) for c in self.checkpoints.values()),
        }
