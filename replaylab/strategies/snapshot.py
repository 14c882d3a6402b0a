"""Snapshot: keep a full copy of every layer's memory at each position that may be restored.

Kept: the memory at every live snapshot handle, and after every token since the latest
snapshot (a speculative round may keep any prefix of its drafts). Restore is a copy. A byte
budget may evict copies; restoring an evicted one rebuilds it by re-running the model from the
latest older copy (``Rollback.rerun_from``).
"""

from __future__ import annotations

from replaylab.strategies.base import EvictionItem, Rollback, register
from replaylab.strategies.current import CurrentStateStore, copy_nbytes

__all__ = ["SnapshotStore"]


@register
class SnapshotStore(CurrentStateStore):
    name = "snapshot"

    def __init__(self, specs, batch, dtype, device, config):
        super().__init__(specs, batch, dtype, device, config)
        self.handles = {}  # handle id -> (position, {layer: LayerState})
        self.per_token = {}  # position -> {layer: LayerState} since the latest snapshot
        self.tracking_from = None
        self.evicted = {}  # handle id or ("token", position) -> position, for fallbacks
        self.last_used = {}  # key -> tick, for LRU eviction
        self.tick = 0

    def _touch(self, key):
        self.tick += 1
        self.last_used[key] = self.tick

    def wants_states(self, position, T):
        return self.tracking_from is not None

    def keep(self, layer, position, states):
        for p, kept in states.items():
            self.per_token.setdefault(p, {})[layer] = kept
            self._touch(("token", p))

    def after_forward(self, position):
        # positions since the snapshot stay restorable even when no layer keeps a state
        # (a model without recurrent layers): their copies are empty. With recurrent layers
        # ``keep`` holds them, and an empty copy for a position whose copy was evicted would
        # restore nothing (a silent wrong state), so none is made
        if self.tracking_from is not None and not self.specs:
            for p in range(self.tracking_from + 1, position + 1):
                self.per_token.setdefault(p, {})

    def drop_after(self, position):
        self.per_token = {p: s for p, s in self.per_token.items() if p <= position}

    def snapshot(self, handle_id, position):
        self.handles[handle_id] = (position, {l: s.clone() for l, s in self.current.items()})
        self._touch(handle_id)
        self.per_token = {}
        self.tracking_from = position

    def release(self, handle_id):
        self.handles.pop(handle_id, None)
        self.evicted.pop(handle_id, None)
        if not self.handles:
            self.per_token, self.tracking_from = {}, None

    def _kept(self):
        """position -> copy, every copy still held."""
        kept = {pos: copy for pos, copy in self.handles.values()}
        kept.update(self.per_token)
        return kept

    def can_restore(self, position, handle_id=None):
        return (
            position == 0  # the empty state needs no copy
            or handle_id in self.handles
            or handle_id in self.evicted
            or position in self._kept()
            or position in self.evicted.values()
        )

    def rollback(self, position, handle_id=None):
        kept = self._kept()
        if handle_id in self.handles:
            self._load(self.handles[handle_id][1])
            self._touch(handle_id)
            start = None
        elif position in kept:
            self._load(kept[position])
            start = None
        else:  # evicted, or 0: rebuild from the latest copy before it (or the empty state)
            older = [p for p in kept if p <= position]
            start = max(older, default=0)
            if older:
                self._load(kept[start])
            else:
                self._zero()
        self.per_token = {p: s for p, s in self.per_token.items() if p <= position}
        return Rollback(None if start is None or start == position else start)

    def select(self, indices):
        self._gather(indices)
        self.handles, self.per_token, self.tracking_from, self.evicted = {}, {}, None, {}

    def evictable(self):
        items = [(hid, pos, copy_nbytes(copy)) for hid, (pos, copy) in self.handles.items()]
        items += [(("token", pos), pos, copy_nbytes(copy)) for pos, copy in self.per_token.items()]
        return [EvictionItem(k, p, b, self.last_used.get(k, 0)) for k, p, b in items]

    def evict(self, key):
        if isinstance(key, tuple):
            self.per_token.pop(key[1])
            self.evicted[key] = key[1]
        else:
            self.evicted[key] = self.handles.pop(key)[0]

    def nbytes(self):
        snaps = sum(copy_nbytes(copy) for _, copy in self.handles.values())
        snaps += sum(copy_nbytes(copy) for copy in self.per_token.values())
        return {**self.current_bytes(), "snapshots": snaps}
