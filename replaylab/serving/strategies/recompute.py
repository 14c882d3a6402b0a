"""Recompute: the state is read and written every token; a verify keeps one copy of the state
before it, and a rollback copies it back and re-runs the kept tokens through the model.

Buffers per recurrent layer: ``saved_state`` (slots, *state_shape) fp32 and ``saved_conv``
(slots, K, C), the state and window before the last verify; the engine's slot table keeps the
last step's tokens (``last_tokens`` (slots, T_max)) for the re-run.
"""

from __future__ import annotations

import torch

from replaylab.serving.strategies.base import EngineStrategy, register

__all__ = ["EngineRecompute"]


@register
class EngineRecompute(EngineStrategy):
    name = "recompute"
    store = "recompute"
    rollback_graphable = True  # its rollback copies rows from buffers it does not write

    @classmethod
    def allocate(cls, pool, zeros, slots, capacity, max_verify, fused):
        pool.saved_state = zeros(slots, *pool.spec.state_shape, dt=torch.float32)
        pool.saved_conv = zeros(slots, *pool.spec.conv_shape)

    def before_forward(self, bucket, T, save):
        if self.saves(save, T):
            for pool in self.engine.ssm.values():
                pool.saved_state[:bucket].copy_(pool.state[:bucket])
                pool.saved_conv[:bucket].copy_(pool.conv[:bucket])

    def saves(self, save, T):
        return save and T > 1

    def after_step(self, tokens, bucket, T):
        self.engine.table.last_tokens[:bucket, :T] = tokens

    def rollback_pool(self, pool, index, kept):
        pool.state[index] = pool.saved_state[index]
        pool.conv[index] = pool.saved_conv[index]

    def after_rollback(self, dropped):
        """Re-run each slot's kept tokens from the state saved before the verify (other slots
        get count 0 and stay as they are)."""
        e, table = self.engine, self.engine.table
        T = max(k for _, k in dropped)
        bucket = table.bucket([s for s, _ in dropped])
        positions = list(table.pos)
        for s, k in dropped:
            positions[s] -= k
        table.plan = None
        table.upload(dict(dropped), [], positions)
        e._run(table.last_tokens[:bucket, :T].clone(), bucket, False, save=False)
        e.stats.reruns += 1
        e.stats.rerun_tokens += sum(k for _, k in dropped)
