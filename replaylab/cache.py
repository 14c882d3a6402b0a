"""A hybrid cache: a KV cache per attention layer and an SSM part under a strategy, behind one
API that a branching decoder uses without knowing the strategy.

    handle = cache.snapshot()        remember the current position
    cache.restore(handle)            go back to it (or ``restore(position)``)
    cache.truncate_to(position)      drop a suffix (rejected drafts)
    cache.fork(n)                    each branch becomes n branches sharing the prefix
    cache.reorder(indices)           branch i continues old branch indices[i] (beam search)
    cache.nbytes()                   bytes held, by component

The model advances the cache as it processes tokens (``HybridLM.forward``). Restores under the
recompute strategy (and replay restores before its checkpoint) re-run the model; the time they
take is added to ``cache.stats``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from replaylab.kv import LayerKV
from replaylab.strategies import STORES
from replaylab.validation import branch_indices, fork_indices

__all__ = ["Handle", "HybridCache", "CacheStats"]

_cache_ids = itertools.count()


@dataclass(frozen=True)
class Handle:
    """What ``snapshot()`` returns: a position in one cache, valid while its branches exist."""
    cache_id: int
    position: int
    layout: int
    id: int


@dataclass
class CacheStats:
    restores: int = 0
    restore_seconds: float = 0.0
    recomputed_tokens: int = 0
    peak_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    fallback_restores: int = 0      # restores of an evicted copy, rebuilt by re-running the model
    over_budget: int = 0            # times nothing evictable was left while over the budget
    peak_by_component: dict = field(default_factory=dict)   # largest bytes seen per component


EVICTION_POLICIES = ("lru", "cost")


def choose_victim(items, policy):
    """The key to evict from ``items`` [(key, position, bytes, last_used)]: least recently used
    ("lru"), or cheapest to rebuild ("cost": fewest tokens to re-run from the next older copy)."""
    if policy == "lru":
        return min(items, key=lambda it: it[3])[0]
    positions = sorted(it[1] for it in items)

    def rebuild(it):
        older = [p for p in positions if p < it[1]]
        return (it[1] - (older[-1] if older else 0), it[3])
    return min(items, key=rebuild)[0]


class HybridCache:
    """Cache of a ``HybridLM`` for ``batch`` branches under ``strategy`` ("snapshot",
    "recompute" or "replay"); ``interval`` is the checkpoint interval (recompute) or the log
    length L (replay). ``use_kernels``: replay folds with the Triton kernel (default: on a GPU;
    ``True`` on CPU runs it through Triton's interpreter). ``budget_bytes`` caps what the cache
    holds (KV, states, snapshots, checkpoints, logs): past it, kept copies are evicted by
    ``eviction`` ("lru" or "cost"); restoring an evicted copy re-runs the model from an older
    one (``stats.fallback_restores``, ``stats.recomputed_tokens``)."""

    def __init__(self, model, batch=1, strategy="replay", *, interval=16, dtype=None,
                 use_kernels=None, budget_bytes=None, eviction="lru"):
        if strategy not in STORES:
            raise ValueError(f"strategy: expected one of {sorted(STORES)}, got {strategy!r}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction: expected one of {EVICTION_POLICIES}, got {eviction!r}")
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"budget_bytes: expected a positive number of bytes, got {budget_bytes}")
        self.budget_bytes, self.eviction = budget_bytes, eviction
        cfg = model.cfg
        param = next(model.parameters())
        self.model, self.batch, self.strategy = model, batch, strategy
        self.dtype, self.device = dtype or param.dtype, param.device
        self.id, self.layout, self._handles = next(_cache_ids), 0, itertools.count()
        self.kv = {l: LayerKV(batch, cfg.kv_heads, cfg.head_dim, dtype=self.dtype,
                              device=self.device) for l in cfg.attn_layers}
        mixers = {l: model.model.layers[l].mixer for l in cfg.ssm_layers}
        self.ssm = STORES[strategy](mixers, batch, self.dtype, self.device, interval=interval,
                                    use_kernels=use_kernels)
        self.tokens = torch.zeros(batch, 0, dtype=torch.long, device=self.device)
        self.live_handles: dict[int, int] = {}  # handle id -> position
        self.stats = CacheStats()
        self._pending = None

    @property
    def position(self) -> int:
        return self.tokens.shape[1]

    # --- called by the model -------------------------------------------------------------
    def begin(self, input_ids):
        self._pending = input_ids

    def kv_append(self, layer, k, v):
        self.kv[layer].append(k, v)
        return self.kv[layer].keys_values()

    def ssm_read(self, layer):
        """(state (batch, H, P, N), conv window (batch, d_conv-1, conv_dim)) at the position."""
        return self.ssm.read(layer)

    def ssm_window(self, layer):
        return self.ssm.window(layer)

    def ssm_state(self, layer):
        return self.ssm.state(layer)

    def ssm_outputs(self, layer, **inputs):
        """The store's own outputs for new tokens (replay with kernels), or None."""
        return self.ssm.outputs(layer, **inputs)

    def ssm_wants_states(self, layer):
        return self.ssm.wants_states(layer)

    def ssm_write(self, layer, **inputs):
        self.ssm.write(layer, self.position, **inputs)

    def end(self):
        self.tokens = torch.cat([self.tokens, self._pending.to(self.device)], dim=1)
        self._pending = None
        self.ssm.after_advance(self.position)
        self._account()

    def set_budget(self, budget_bytes):
        """Set (or, with None, lift) the byte budget; evicts at once if over it."""
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"budget_bytes: expected a positive number of bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._account()

    def _account(self):
        """Track the peaks, then evict kept copies while over the budget."""
        held = self.nbytes()
        self.stats.peak_bytes = max(self.stats.peak_bytes, sum(held.values()))
        for name, nbytes in held.items():
            self.stats.peak_by_component[name] = max(self.stats.peak_by_component.get(name, 0), nbytes)
        while self.budget_bytes is not None and self.total_bytes() > self.budget_bytes:
            items = self.ssm.evictable()
            if not items:
                self.stats.over_budget += 1
                return
            key = choose_victim(items, self.eviction)
            self.stats.evicted_bytes += next(it[2] for it in items if it[0] == key)
            self.ssm.evict(key)
            self.stats.evictions += 1

    # --- the branching API ---------------------------------------------------------------
    def snapshot(self) -> Handle:
        handle = Handle(self.id, self.position, self.layout, next(self._handles))
        self.ssm.snapshot(handle.id, handle.position)
        self.live_handles[handle.id] = handle.position
        self._account()
        return handle

    def release(self, handle: Handle):
        """Forget a handle: the memory kept for it may be freed."""
        self.live_handles.pop(handle.id, None)
        self.ssm.release(handle.id)

    def restore(self, target):
        """Go back to a ``Handle`` or to a position ``0 <= p <= position``."""
        if isinstance(target, Handle):
            if target.cache_id != self.id:
                raise ValueError(f"handle: taken from cache {target.cache_id}, not this cache "
                                 f"({self.id})")
            if target.layout != self.layout or target.id not in self.live_handles:
                raise ValueError(f"handle: position {target.position} was released, rolled back "
                                 f"past, or its branches were forked/reordered since (layout "
                                 f"{target.layout}, now {self.layout})")
            self._rollback(target.position, target.id)
        else:
            self._rollback(int(target), None)

    def truncate_to(self, position):
        """Keep positions ``[0, position)``: the state becomes that after token position-1."""
        self._rollback(int(position), None)

    def _rollback(self, position, handle_id):
        if not 0 <= position <= self.position:
            raise ValueError(f"position: expected 0 <= position <= {self.position}, got {position}")
        if position == self.position and handle_id is None:
            return  # nothing to drop
        if not self.ssm.can_restore(position, handle_id):
            raise ValueError(f"position {position}: no state kept for it under the "
                             f"{self.strategy} strategy (snapshot it first, or it was evicted)")
        t0 = time.perf_counter()
        start = self.ssm.rollback(position, handle_id)
        for hid, pos in list(self.live_handles.items()):  # their positions are being rewritten
            if pos > position:
                self.release(Handle(self.id, pos, self.layout, hid))
        tokens = self.tokens
        redo_from = position if start is None else start
        for kv in self.kv.values():
            kv.truncate_to(redo_from)
        self.tokens = tokens[:, :redo_from]
        if start is not None:
            with torch.no_grad():
                self.model(tokens[:, start:position], self)
            self.stats.recomputed_tokens += position - start
        # snapshot and replay re-run the model only when what they kept no longer covers p
        self.stats.fallback_restores += int(start is not None and self.strategy != "recompute")
        self.stats.restores += 1
        self.stats.restore_seconds += time.perf_counter() - t0

    def fork(self, n):
        """Each branch becomes ``n`` consecutive branches sharing everything so far."""
        self._select(fork_indices(n, self.batch, self.device))

    def reorder(self, indices):
        """Branch i continues old branch ``indices[i]``; the batch may shrink or grow."""
        self._select(branch_indices(indices, self.batch, self.device))

    def _select(self, indices):
        for kv in self.kv.values():
            kv.reorder(indices)
        self.ssm.select(indices)
        self.tokens = self.tokens[indices]
        self.batch = int(indices.numel())
        self.layout += 1
        self.live_handles.clear()

    # --- memory --------------------------------------------------------------------------
    def nbytes(self) -> dict:
        """Bytes held by component: kv, conv_state, ssm_state, and snapshots / checkpoints /
        logs as the strategy keeps them."""
        return {"kv": sum(kv.nbytes() for kv in self.kv.values()), **self.ssm.nbytes()}

    def total_bytes(self) -> int:
        return sum(self.nbytes().values())
