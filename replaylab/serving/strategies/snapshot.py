"""Snapshot: the state is read and written every token; a verify keeps a copy of the state
after each token (the per-draft-snapshot path), and a rollback copies one back.

Buffers per recurrent layer: ``draft_state`` (slots, T_max, *state_shape) fp32, the state after
each token of the last step.
"""

from __future__ import annotations

import torch

from replaylab.serving.strategies.base import EngineStrategy, register

__all__ = ["EngineSnapshot"]


@register
class EngineSnapshot(EngineStrategy):
    name = "snapshot"
    store = "snapshot"
    rollback_graphable = True  # its rollback copies rows from buffers it does not write

    @classmethod
    def allocate(cls, pool, zeros, slots, capacity, max_verify, fused):
        pool.draft_state = zeros(slots, max_verify, *pool.spec.state_shape, dt=torch.float32)

    def keep_states(self, pool, states, bucket, T):
        if T > 1:
            pool.draft_state[:bucket, :T].copy_(states)

    def draft_states(self, pool, T):
        return pool.draft_state if T > 1 else None

    def rollback_pool(self, pool, index, kept):
        pool.conv[index] = pool.draft_conv[index, kept]
        pool.state[index] = pool.draft_state[index, kept]
