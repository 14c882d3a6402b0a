"""Replay: one checkpoint per layer plus a log of the layer's inputs since it.

Kept per recurrent layer: the checkpoint memory at position c (shared by forked branches: each
branch reads checkpoint row ``rows[b]``) and the log entries of the tokens since c (the fields
the layer's spec names, e.g. xBC, x, dt, B, C for Mamba-2). The state at c + j is
``spec.fold(checkpoint, log[:j])``; the conv window is the last d_conv - 1 logged conv inputs.
Going back inside the log is a cursor move. When the log reaches ``log_length`` entries it is
folded into a new checkpoint (up to the latest snapshot, which must stay reachable).

With kernels (default on a GPU), a short forward's outputs come straight from checkpoint + log
(``spec.kernels.step``: no state written) and folds run the fold kernel.
"""

from __future__ import annotations

import torch

from replaylab.recurrent import LayerState, nbytes, window_after
from replaylab.strategies.base import Rollback, StateStore, register

__all__ = ["ReplayStore"]


@register
class ReplayStore(StateStore):
    name = "replay"

    def __init__(self, specs, batch, dtype, device, config):
        super().__init__(specs, batch, dtype, device, config)
        self.L = config.log_length
        use = config.use_kernels
        self.use_kernels = self.device.type == "cuda" if use is None else use
        self.start = 0  # checkpoint position c
        self.checkpoint = {l: s.zero_state(batch, dtype, self.device) for l, s in specs.items()}
        self.log = {l: None for l in specs}  # field -> buffer (batch, capacity, ...) per layer
        self.n = {l: 0 for l in specs}  # entries in use; lower layers run ahead in a forward
        self.rows = torch.arange(batch, device=self.device)  # branch -> checkpoint row
        self.pin = None  # position the log must keep (the latest snapshot handle)

    def log_length(self):
        """Entries in the log (the same for every layer between forwards)."""
        return next(iter(self.n.values()), 0)

    def _kernels(self, layer):
        return self.specs[layer].kernels if self.use_kernels else None

    def _entries(self, layer, upto):
        return {k: v[:, :upto] for k, v in self.log[layer].items()}

    def _reserve(self, layer, entries):
        """Room for T more entries (buffers shaped like ``entries``, doubling when full)."""
        buf, n = self.log[layer], self.n[layer]
        T = next(iter(entries.values())).shape[1]
        if buf is not None and n + T <= next(iter(buf.values())).shape[1]:
            return
        cap = max(2 * (n + T), 2 * self.L, 16)
        grown = {k: v.new_empty((v.shape[0], cap, *v.shape[2:])) for k, v in entries.items()}
        if buf is not None:
            for k in grown:
                grown[k][:, :n] = buf[k][:, :n]
        self.log[layer] = grown

    def _append(self, layer, entries):
        self._reserve(layer, entries)
        n, T = self.n[layer], next(iter(entries.values())).shape[1]
        for k in self.specs[layer].log_fields:
            self.log[layer][k][:, n : n + T] = entries[k]
        self.n[layer] = n + T

    def _fold(self, layer, upto):
        """The state at c + upto: fold the first ``upto`` logged tokens into the checkpoint."""
        ckpt = self.checkpoint[layer].ssm
        if upto == 0:
            return ckpt[self.rows]
        self.folded_tokens += upto
        kernels = self._kernels(layer)
        if kernels is not None:
            return kernels.fold(ckpt, self.rows, self.log[layer], upto)
        return self.specs[layer].fold(ckpt[self.rows], self._entries(layer, upto))

    def _window(self, layer, upto):
        spec, w = self.specs[layer], self.checkpoint[layer].conv[self.rows]
        return window_after(w, self.log[layer][spec.conv_field][:, :upto]) if upto else w

    def state(self, layer):
        n = self.n[layer]
        return LayerState(self._fold(layer, n), self._window(layer, n))

    def advance(self, layer, position, inputs):
        spec, n = self.specs[layer], self.n[layer]
        entries = spec.prepare(self._window(layer, n), inputs)
        kernels = self._kernels(layer)
        if kernels is not None:
            self._reserve(layer, entries)
            y = kernels.step(self.checkpoint[layer].ssm, self.rows, self.log[layer], n, entries)
            if y is not None:
                self._append(layer, entries)
                return y
        y = spec.scan(self._fold(layer, n), entries).y
        self._append(layer, entries)
        return y

    def begin_forward(self, position):
        # a forward only appends to the logs (a grown buffer is a new tensor)
        return dict(self.n), dict(self.log)

    def abort_forward(self, mark):
        n, log = mark
        self.n, self.log = dict(n), dict(log)

    def after_forward(self, position):
        n = self.log_length()
        if n < self.L:
            return
        pinned = self.pin is not None and self.pin >= self.start  # keep the log from the pin on
        upto = min(n, self.pin - self.start) if pinned else n
        if upto:
            self._advance_checkpoint(upto)

    def _advance_checkpoint(self, upto):
        for layer in self.checkpoint:
            self.checkpoint[layer] = LayerState(self._fold(layer, upto), self._window(layer, upto))
            n, buf = self.n[layer], self.log[layer]
            for k in buf:  # keep the entries after the new checkpoint at the front
                buf[k][:, : n - upto] = buf[k][:, upto:n].clone()
            self.n[layer] = n - upto
        self.rows = torch.arange(self.rows.numel(), device=self.rows.device)
        self.start += upto

    def snapshot(self, handle_id, position):
        self.pin = position

    def rollback(self, position, handle_id=None):
        if position >= self.start:
            for layer in self.n:
                self.n[layer] = position - self.start
            return Rollback(None)
        # before the checkpoint: nothing kept covers it; rebuild from the start of the sequence
        for layer, spec in self.specs.items():
            self.checkpoint[layer] = spec.zero_state(self.rows.numel(), self.dtype, self.device)
            self.n[layer] = 0
        self.rows = torch.arange(self.rows.numel(), device=self.device)
        self.start, self.pin = 0, None
        return Rollback(0)

    def select(self, indices):
        self.batch = int(indices.numel())
        self.rows = self.rows[indices]
        for layer, buf in self.log.items():
            if buf is not None:
                self.log[layer] = {k: v[indices] for k, v in buf.items()}

    def nbytes(self):
        """Checkpoint rows in use, conv windows, and the log entries in use (capacity kept
        for appends is not counted)."""
        live = torch.unique(self.rows).numel()
        ck = sum(nbytes(s.ssm[:1]) * live for s in self.checkpoint.values())
        conv = sum(nbytes(s.conv[:1]) * live for s in self.checkpoint.values())
        logs = sum(
            nbytes(*self._entries(l, self.n[l]).values())
            for l in self.log
            if self.log[l] is not None
        )
        return {"ssm_state": ck, "conv_state": conv, "logs": logs}
