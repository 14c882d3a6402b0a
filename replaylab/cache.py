"""A hybrid cache: a KV cache per attention layer and the recurrent layers' memory under a
strategy, behind one API that a branching decoder uses without knowing the strategy.

    handle = cache.snapshot()        remember the current position
    cache.restore(handle)            go back to it (or ``restore(position)``)
    cache.truncate_to(position)      drop a suffix (rejected drafts)
    cache.fork(n)                    each branch becomes n branches sharing the prefix
    cache.reorder(indices)           branch i continues old branch indices[i] (beam search)
    cache.nbytes()                   bytes held, by component

The cache is built from a ``CacheSpec`` (the layers' memory: a ``RecurrentSpec`` per recurrent
layer, KV shapes per attention layer) and a ``CacheConfig`` (strategy and its options); it holds
no model. A forward pass advances it (``HybridLM.forward``):

    cache.begin(input_ids)                   T new tokens
    cache.layer(l).advance(**inputs) -> y    each recurrent layer, bottom to top
    cache.layer(l).append(k, v) -> (K, V)    each attention layer
    cache.end()

Restores that the strategy cannot serve from what it kept (recompute always; snapshot and
replay when a copy was evicted or lies before the checkpoint) re-run tokens through the
``CacheSpec.rerun`` callback; the time they take is added to ``cache.stats``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from replaylab.kv import LayerKV
from replaylab.recurrent import LayerState, RecurrentSpec
from replaylab.strategies import EvictionItem, store_class
from replaylab.validation import (
    as_flag,
    as_int,
    as_real,
    branch_indices,
    fork_indices,
)

__all__ = [
    "CacheConfig",
    "CacheSpec",
    "CacheStats",
    "Handle",
    "HybridCache",
    "as_config",
    "EVICTION_POLICIES",
    "choose_victim",
]

_cache_ids = itertools.count()
EVICTION_POLICIES = ("lru", "cost")


@dataclass(frozen=True)
class CacheConfig:
    """How a cache keeps the recurrent memory.

    strategy             a name from ``replaylab.strategies.STRATEGY_NAMES``
    checkpoint_interval  recompute: a checkpoint every this many tokens
    log_length           replay: the log length L at which the log is folded into the checkpoint
    use_kernels          replay: Triton kernels (None: on a GPU; True on CPU runs the interpreter)
    budget_bytes         cap on what the cache holds (KV, states, copies, logs); past it, kept
                         copies are evicted by ``eviction`` ("lru" or "cost")
    dtype                dtype of KV, conv windows and logs (None: the model's)
    """

    strategy: str = "replay"
    checkpoint_interval: int = 16
    log_length: int = 16
    use_kernels: bool | None = None
    budget_bytes: int | None = None
    eviction: str = "lru"
    dtype: torch.dtype | None = None

    def __post_init__(self):
        store_class(self.strategy)  # raises with the list of names
        for name in ("checkpoint_interval", "log_length"):
            as_int(name, getattr(self, name), low=1)
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction: expected one of {EVICTION_POLICIES}, got {self.eviction!r}"
            )
        _check_budget(self.budget_bytes)
        as_flag("use_kernels", self.use_kernels, none_ok=True)
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise TypeError(
                f"dtype: expected a torch.dtype (e.g. torch.float16) or None, got "
                f"{type(self.dtype).__name__} {self.dtype!r}"
            )
        if self.dtype is not None and not self.dtype.is_floating_point:
            raise ValueError(
                f"dtype: expected a floating-point dtype for the state, got {self.dtype}"
            )

    def replace(self, **changes) -> CacheConfig:
        return replace(self, **changes)

    def build(self, model, batch=1) -> HybridCache:
        """A cache for ``batch`` branches of ``model`` (or of a ``CacheSpec``)."""
        return HybridCache(model, batch, self)


def as_config(cache="replay", **changes) -> CacheConfig:
    """A ``CacheConfig`` from a strategy name or a config, with ``changes`` applied."""
    config = cache if isinstance(cache, CacheConfig) else CacheConfig(cache)
    return config.replace(**changes) if changes else config


def _check_budget(budget_bytes):
    if budget_bytes is not None:  # inf: no cap
        as_real("budget_bytes", budget_bytes, above=0, unit=" of bytes", finite=False)


@dataclass(frozen=True)
class CacheSpec:
    """The memory layout a cache is built from (``HybridLM.cache_spec()`` makes one).

    recurrent   layer index -> ``RecurrentSpec``
    attention   layer index -> (kv_heads, head_dim)
    dtype, device
    rerun       ``rerun(tokens (batch, T), cache)``: run T tokens through the model with this
                cache, advancing it by T (the model's forward, logits discarded). Called from
                inside ``restore`` / ``truncate_to`` once the stores and KV stand at an earlier
                position; it must only advance the cache (no snapshot, restore, fork or reorder:
                it is re-entered mid-rollback).
    """

    recurrent: dict[int, RecurrentSpec]
    attention: dict[int, tuple[int, int]]
    dtype: torch.dtype
    device: torch.device
    rerun: Callable

    def __post_init__(self):
        if not callable(self.rerun):
            raise TypeError(f"rerun: expected a callable rerun(tokens, cache), got {self.rerun!r}")

    def layout(self) -> dict:
        """What must agree between a cache and the model that advances it: each layer's kind
        and memory shapes."""
        out = {
            l: (s.family, tuple(s.state_shape), tuple(s.conv_shape))
            for l, s in self.recurrent.items()
        }
        out.update({l: ("attention", tuple(shape)) for l, shape in self.attention.items()})
        return dict(sorted(out.items()))


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
    folded_tokens: int = 0  # logged tokens folded into a state (replay)
    peak_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    fallback_restores: int = 0  # restores of an evicted copy, rebuilt by re-running the model
    over_budget: int = 0  # times nothing evictable was left while over the budget
    peak_by_component: dict = field(default_factory=dict)  # largest bytes seen per component


def choose_victim(items: list[EvictionItem], policy):
    """The key to evict: least recently used ("lru"), or cheapest to rebuild ("cost": fewest
    tokens to re-run from the next older copy)."""
    if policy == "lru":
        return min(items, key=lambda it: it.last_used).key
    positions = sorted(it.position for it in items)

    def rebuild(it):
        older = [p for p in positions if p < it.position]
        return (it.position - (older[-1] if older else 0), it.last_used)

    return min(items, key=rebuild).key


class _Layer:
    """``cache.layer(l)``: where layer l's mixer meets the cache during a forward."""

    __slots__ = ("cache", "index")

    def __init__(self, cache, index):
        self.cache, self.index = cache, index

    def advance(self, **inputs):
        """Recurrent layer: T new tokens' inputs (as the layer's spec names them) -> y."""
        return self.cache.ssm.advance(self.index, self.cache.position, inputs)

    def append(self, k, v):
        """Attention layer: append k, v (batch, Hkv, T, Dh); all keys and values so far."""
        kv = self.cache.kv[self.index]
        kv.append(k, v)
        return kv.keys_values()


class HybridCache:
    """Cache of ``batch`` branches of a model (anything with ``cache_spec()``, or a
    ``CacheSpec``) under ``strategy``: a name or a ``CacheConfig``; keyword ``options`` are
    ``CacheConfig`` fields. Restoring an evicted copy re-runs the model from an older one
    (``stats.fallback_restores``, ``stats.recomputed_tokens``).

    Every public method checks its arguments before it changes anything, and a forward that
    fails midway leaves the cache as it was (``abort``). What raises what:
        TypeError    an argument of the wrong kind: a position, ``n``, ``batch`` or an index
                     that is not an integer (floats, strings, bools), a boolean mask as
                     indices, a handle that is not a ``Handle``, token ids that are not an
                     integer tensor
        ValueError   a value out of range: a position outside [0, position], an index outside
                     [0, batch), n < 1, batch < 1, token ids outside the vocabulary, a handle of
                     another cache or one released, rolled back past or taken before a
                     fork/reorder, a position no kept state covers (snapshot), a model whose
                     layers, dtype or device differ from the cache's
        RuntimeError a rollback called from inside a forward, or a forward begun twice
    """

    def __init__(self, model, batch=1, strategy="replay", **options):
        config = as_config(strategy, **options)
        if not isinstance(model, CacheSpec) and not callable(getattr(model, "cache_spec", None)):
            raise TypeError(  # any model with a cache_spec (a new layer family's too)
                f"model: expected a replaylab HybridLM (or a model with a cache_spec, or a "
                f"CacheSpec), got {type(model).__name__}"
            )
        spec = model if isinstance(model, CacheSpec) else model.cache_spec()
        batch = as_int("batch", batch, low=1)
        self.config, self.spec = config, spec
        self.batch, self.strategy = batch, config.strategy
        self.budget_bytes, self.eviction = config.budget_bytes, config.eviction
        self.dtype, self.device = config.dtype or spec.dtype, spec.device
        self.id, self.layout, self._handles = next(_cache_ids), 0, itertools.count()
        self.kv = {
            l: LayerKV(batch, heads, dim, dtype=self.dtype, device=self.device)
            for l, (heads, dim) in spec.attention.items()
        }
        store = store_class(config.strategy)
        self.ssm = store(spec.recurrent, batch, self.dtype, self.device, config)
        self.tokens = torch.zeros(batch, 0, dtype=torch.long, device=self.device)
        self.live_handles: dict[int, int] = {}  # handle id -> position
        self.stats = CacheStats()
        self._pending = self._undo = None

    @property
    def position(self) -> int:
        return self.tokens.shape[1]

    # --- called by the model -------------------------------------------------------------
    def check_layout(self, spec: CacheSpec):
        """Raise ValueError unless a model with ``spec`` may advance this cache (the same
        layers with the same memory shapes, the same dtype and device)."""
        mine, theirs = self.spec.layout(), spec.layout()
        if mine != theirs:
            diff = {
                l: (mine.get(l), theirs.get(l))
                for l in sorted(set(mine) | set(theirs))
                if mine.get(l) != theirs.get(l)
            }
            raise ValueError(
                f"model: this cache was built for other layers; layer -> (cache, model): {diff}"
            )
        if spec.dtype != self.dtype or torch.device(spec.device) != torch.device(self.device):
            raise ValueError(
                f"model: the cache holds {self.dtype} on {self.device}, the model computes in "
                f"{spec.dtype} on {spec.device}"
            )

    def begin(self, input_ids):
        """A forward of ``input_ids`` (batch, T) starts; ``end`` or ``abort`` closes it."""
        if self._pending is not None:
            raise RuntimeError("cache: a forward is already in progress (begin without end)")
        self._undo = self.ssm.begin_forward(self.position)
        self._pending = input_ids

    def layer(self, index) -> _Layer:
        return _Layer(self, index)

    def end(self):
        """The forward begun with ``begin`` is complete: record its tokens."""
        self.tokens = torch.cat([self.tokens, self._pending.to(self.device)], dim=1)
        self._pending = self._undo = None
        self.ssm.after_forward(self.position)
        self._account()

    def abort(self):
        """The forward in progress failed: put the cache back exactly as it was at ``begin``."""
        if self._pending is None:
            return
        self.ssm.abort_forward(self._undo)
        for kv in self.kv.values():
            if kv.length > self.position:
                kv.truncate_to(self.position)
        self._pending = self._undo = None

    def state(self, layer) -> LayerState:
        """Recurrent layer's memory at the current position: ``ssm`` (batch, *state_shape),
        ``conv`` (batch, d_conv - 1, conv_channels)."""
        return self.ssm.state(layer)

    def set_budget(self, budget_bytes):
        """Set (or, with None, lift) the byte budget; evicts at once if over it."""
        _check_budget(budget_bytes)
        self.budget_bytes = budget_bytes
        self._account()

    def _account(self):
        """Track the peaks, then evict kept copies while over the budget."""
        held = self.nbytes()
        self.stats.folded_tokens = self.ssm.folded_tokens
        self.stats.peak_bytes = max(self.stats.peak_bytes, sum(held.values()))
        for name, nbytes in held.items():
            peak = self.stats.peak_by_component.get(name, 0)
            self.stats.peak_by_component[name] = max(peak, nbytes)
        while self.budget_bytes is not None and self.total_bytes() > self.budget_bytes:
            items = self.ssm.evictable()
            if not items:
                self.stats.over_budget += 1
                return
            key = choose_victim(items, self.eviction)
            self.stats.evicted_bytes += next(it.nbytes for it in items if it.key == key)
            self.ssm.evict(key)
            self.stats.evictions += 1

    # --- the branching API ---------------------------------------------------------------
    def _idle(self, what):
        if self._pending is not None:
            raise RuntimeError(f"cache: cannot {what} during a forward")

    def _own_handle(self, handle):
        if not isinstance(handle, Handle):
            raise TypeError(
                f"handle: expected a Handle from snapshot(), got {type(handle).__name__} {handle!r}"
            )
        if handle.cache_id != self.id:
            raise ValueError(
                f"handle: taken from cache {handle.cache_id}, not this cache ({self.id})"
            )

    def snapshot(self) -> Handle:
        """A handle to the current position, valid until released, rolled back past, or the
        branches are forked or reordered."""
        self._idle("snapshot")
        handle = Handle(self.id, self.position, self.layout, next(self._handles))
        self.ssm.snapshot(handle.id, handle.position)
        self.live_handles[handle.id] = handle.position
        self._account()
        return handle

    def release(self, handle: Handle):
        """Forget a handle: the memory kept for it may be freed. Releasing a handle that is no
        longer live (released, rolled back past, taken before a fork) does nothing."""
        self._own_handle(handle)
        if handle.layout == self.layout and handle.id in self.live_handles:
            self.live_handles.pop(handle.id)
            self.ssm.release(handle.id)

    def restore(self, target):
        """Go back to a ``Handle`` or to a position ``0 <= p <= position``."""
        if not isinstance(target, Handle):
            self._rollback(as_int("position", target, 0, self.position), None)
            return
        self._own_handle(target)
        if target.layout != self.layout or target.id not in self.live_handles:
            raise ValueError(
                f"handle: position {target.position} was released, rolled back past, or its "
                f"branches were forked/reordered since (layout {target.layout}, now "
                f"{self.layout})"
            )
        self._rollback(target.position, target.id)

    def truncate_to(self, position):
        """Keep positions ``[0, position)``: the state becomes that after token position-1."""
        self._rollback(as_int("position", position, 0, self.position), None)

    def _rollback(self, position, handle_id):
        self._idle("roll back")
        if position == self.position and handle_id is None:
            return  # nothing to drop
        if not self.ssm.can_restore(position, handle_id):
            raise ValueError(
                f"position {position}: no state kept for it under the {self.strategy} strategy "
                f"(snapshot it first, or it was evicted)"
            )
        t0 = time.perf_counter()
        start = self.ssm.rollback(position, handle_id).rerun_from
        for hid, pos in list(self.live_handles.items()):  # their positions are being rewritten
            if pos > position:
                self.live_handles.pop(hid)
                self.ssm.release(hid)
        tokens = self.tokens
        redo_from = position if start is None else start
        for kv in self.kv.values():
            kv.truncate_to(redo_from)
        self.tokens = tokens[:, :redo_from]
        if start is not None and start < position:
            with torch.no_grad():
                self.spec.rerun(tokens[:, start:position], self)
            self.stats.recomputed_tokens += position - start
        # for most stores re-running the model means what they kept no longer covers p
        self.stats.fallback_restores += int(start is not None and self.ssm.rerun_is_fallback)
        self.stats.restores += 1
        self.stats.restore_seconds += time.perf_counter() - t0

    def fork(self, n):
        """Each branch becomes ``n`` consecutive branches sharing everything so far."""
        self._idle("fork")
        self._select(fork_indices(n, self.batch, self.device))

    def reorder(self, indices):
        """Branch i continues old branch ``indices[i]`` (a list or integer tensor); the batch
        may shrink or grow."""
        self._idle("reorder")
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
