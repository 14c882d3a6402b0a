"""What a serving strategy owns: its pools' buffers, what a step keeps for a rollback, the
rollback itself, replay's folds, and what a prefix-cache seat restores.

``EngineStrategy`` is the interface and the default: a strategy that reads and writes the state
every token (the token-loop scan of the layer's ``RecurrentSpec``; with the kernels the
family's ``state_update``, ``pool.step``, where the pool has one, and on the fused path's
Mamba-2 layers ``kernels.decode.state_update``). ``DecodeEngine`` builds one per engine
(``engine.policy``) and calls, per step of T tokens over slots 0 .. bucket-1:

    plan_folds(slots) -> folds          before the step (host numbers move now)
    fold(bucket)                        in the step, when folds were planned
    before_forward(bucket, T, save)     in the step, before the layers run
    advance(pool, entries, bucket, T)   per recurrent layer, reference path -> y (bucket, T, ...)
    mamba_fused(pool, x, dt, B, C, counts, T)
                                        per Mamba-2 layer, fused path -> y (bucket, T, H, P)
    after_step(tokens, bucket, T)       after the step
    rollback(index, kept) / after_rollback(dropped)

and during a prefill ``prefill_scan`` per layer and ``prefill_chunk_done`` per chunk. A new
strategy is one module in ``replaylab/serving/strategies/`` with a subclass decorated with
``@register`` and one import line in that package's ``__init__``.

Glossary: S slots, T tokens per step, L log length, bucket: slots 0 .. bucket-1 run.
"""

from __future__ import annotations

from typing import ClassVar

import torch

__all__ = ["EngineStrategy", "REGISTRY", "register", "unregister", "strategy_class"]

REGISTRY: dict[str, type[EngineStrategy]] = {}


def register(cls):
    """Class decorator: serve ``cls`` under its ``name``. ``cls.store`` names the teaching
    strategy (``replaylab.strategies``) whose outputs it reproduces."""
    from replaylab.strategies import REGISTRY as TEACHING

    if cls.name in REGISTRY:
        raise ValueError(f"strategy {cls.name!r} is already registered")
    if cls.store not in TEACHING:
        raise ValueError(f"store: {cls.store!r} is not a teaching strategy {tuple(TEACHING)}")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name):
    """Serve ``name`` no more (for tests that register a strategy of their own)."""
    del REGISTRY[name]


def strategy_class(name) -> type[EngineStrategy]:
    """The strategy served under ``name``; ValueError listing the names otherwise."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"strategy: expected one of {tuple(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


class EngineStrategy:
    """A strategy of ``engine`` (a ``DecodeEngine``); see the module docstring."""

    name: ClassVar[str]
    store: ClassVar[str]  # the teaching StateStore of the same outputs
    logged: ClassVar[bool] = False  # the slot table's log length moves with steps (replay)
    # whether ``rollback`` is device work reading no host value, the same for a slot given
    # twice (copies from buffers it does not write): under CUDA graphs it is then captured
    # once per bucket, its pairs padded with repeats of the first (the built-in ones are)
    rollback_graphable: ClassVar[bool] = False

    def __init__(self, engine):
        self.engine = engine

    # --- pools -------------------------------------------------------------------------
    @classmethod
    def replays_with_kernels(cls, kernels) -> bool:
        """Whether a pool built with ``kernels`` runs replay through its Triton kernels."""
        return False

    @classmethod
    def graphable(cls, use_kernels) -> bool:
        """Whether a step reads no host value, so a CUDA graph can hold it."""
        return True

    @classmethod
    def allocate(cls, pool, zeros, slots, capacity, max_verify, fused):
        """Add the strategy's buffers to ``pool`` (``zeros(*shape, dt=dtype)``)."""

    def room(self, slot):
        """The most tokens ``slot`` may take in its next step."""
        return self.engine.max_verify

    # --- a step ------------------------------------------------------------------------
    def plan_folds(self, slots):
        return []

    def fold(self, bucket):
        """Fold the planned slots' L entries into their checkpoints."""

    def before_forward(self, bucket, T, save):
        """Keep what a rollback of this step needs, before the layers run."""

    def saves(self, save, T) -> bool:
        """Whether ``before_forward`` copies anything (a CUDA graph per answer)."""
        return False

    def advance(self, pool, entries, bucket, T):
        """Recurrent layer ``pool``'s reference step for slots 0 .. bucket-1: the token loop
        (T steps equal T one-token steps bitwise), or the family's Triton step where the pool
        has one (``step_kernel``); each slot keeps its state after its count of tokens.
        ``entries``: the spec's fields (bucket, T, ...). Returns y."""
        table = self.engine.table
        if pool.step_kernel:  # the family's Triton step: the bucket in one launch
            return pool.step(entries, bucket, self.draft_states(pool, T), table.counts_d[:bucket])
        counts = table.counts_d[:bucket].long()
        rows = torch.arange(bucket, device=self.engine.device)
        result = pool.spec.scan(pool.state[:bucket], entries, return_states=True)
        self.keep_states(pool, result.states, bucket, T)
        states = torch.cat([pool.state[:bucket, None], result.states], 1)
        pool.state[:bucket] = states[rows, counts]
        return result.y

    def keep_states(self, pool, states, bucket, T):
        """The states after each token (bucket, T, *state_shape), for a rollback, from the
        token loop. A strategy that keeps them overrides ``draft_states`` too: the kernels
        write into that buffer and never call this."""

    def draft_states(self, pool, T):
        """The kernels' buffer for the state after each token (None: not kept)."""
        return None

    def mamba_fused(self, pool, x, dt, B, C, counts, T):
        """A Mamba-2 layer's fused state update over slots 0 .. bucket-1: x (bucket, T, H, P),
        dt (bucket, T, H), B, C (bucket, T, G, N); returns y (bucket, T, H, P)."""
        from replaylab.kernels.decode import state_update

        return state_update(
            pool.state,
            x,
            dt,
            B,
            C,
            pool.A,
            pool.D,
            pool.dt_bias,
            pool.dt_limit,
            drafts=self.draft_states(pool, T),
            counts=counts,
            **pool.launch.get("state_update", {}),
        )

    def after_step(self, tokens, bucket, T):
        """The step ran with ``tokens`` (bucket, T)."""

    # --- rollback ----------------------------------------------------------------------
    def rollback(self, index, kept):
        """Slots ``index`` go back to after their token ``kept`` (both (n,) on the device).
        With ``rollback_graphable`` this runs inside a CUDA graph capture, once per bucket."""
        for pool in self.engine.ssm.values():
            self.rollback_pool(pool, index, kept)

    def rollback_pool(self, pool, index, kept):
        pool.conv[index] = pool.draft_conv[index, kept]

    def after_rollback(self, dropped):
        """The cursor moved back for each (slot, kept tokens) of ``dropped``."""

    # --- prefill -----------------------------------------------------------------------
    def prefill_logged(self):
        """Where a prefill records its log entries (None: no log)."""
        return None

    def prefill_scan(self, pool, layer, slot, entries, carried, logged):
        """A prefill chunk through ``pool`` for ``slot`` from its state -> y."""
        return pool.scan_prompt_into(pool.state[slot : slot + 1], entries)

    def prefill_chunk_done(self, slot, T):
        """Every layer took a prefill chunk of T tokens."""

    # --- a prefix cache's seat ----------------------------------------------------------
    def block_step(self):
        """Block sizes a prefix cache serves are the multiples of this."""
        return 1

    def block_rule(self):
        e = self.engine
        return f"1 .. max_len - 1 = {e.max_len - 1}"

    def seat_point(self, upto, r):
        """Where the seated state sits for a usable prefix ``upto`` resumed from ``r``."""
        return r

    def seat_layer(self, pool, layer, path, block, ssm, conv, r, c, upto, j, slot):
        """(state, conv window, the state a prefill carries from ``upto``) of a seat (here
        ``ssm`` itself: ``prefill_scan`` reads the pool's state, not the carried one)."""
        return ssm, conv, ssm

    def seat_cursor(self, slot, upto, c):
        """The slot's host numbers after a seat at ``upto``."""

    def node_log(self, node, g, end, block, plan, record):
        """What a prefix node keeps of its tokens (replay: their ``node_fields``)."""
