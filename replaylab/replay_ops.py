"""Replay operations in plain PyTorch for layer families without a Triton kernel (Mamba-1,
Gated DeltaNet): the ``ReplayKernels`` interface served by the spec's own reference
``fold`` and ``outputs``.

Glossary (code name -> meaning, shape):
    checkpoint   (slots, *state_shape) fp32 checkpoint states
    rows         (batch,) the checkpoint slot each branch reads (forked branches share one)
    log          field -> buffer (batch, capacity, ...), of which the first n entries are in use
    entries      field -> (batch, T, ...), the new tokens' log entries

A replay store with ``use_kernels=True`` (the default on a GPU) then computes a short
forward's outputs from checkpoint + log by ``spec.outputs`` (Mamba-1: the closed form; Gated
DeltaNet: the backward query recursion), writing no state, and folds by ``spec.fold``.
"""

from __future__ import annotations

from replaylab.recurrent import ReplayKernels

__all__ = ["ReferenceReplayOps"]


class ReferenceReplayOps(ReplayKernels):
    """``ReplayKernels`` from a spec's ``fold`` and ``outputs``. Inputs longer than
    ``max_step_tokens`` (a prefill) return None from ``step``: the store folds and scans."""

    def __init__(self, spec, max_step_tokens=16):
        self.spec, self.max_step_tokens = spec, max_step_tokens

    @staticmethod
    def _used(log, n):
        return {k: v[:, :n] for k, v in log.items()}

    def fold(self, checkpoint, rows, log, upto):
        return self.spec.fold(checkpoint[rows], self._used(log, upto))

    def step(self, checkpoint, rows, log, n, entries):
        if next(iter(entries.values())).shape[1] > self.max_step_tokens:
            return None
        return self.spec.outputs(checkpoint[rows], self._used(log, n), entries)
