"""The SSM part of a hybrid cache under three interchangeable strategies.

Each store keeps, for every Mamba-2 layer of a batch of branches, what it needs to produce the
state ``h: (batch, H, P, N)`` and the conv window ``w: (batch, d_conv - 1, conv_dim)`` (the last
conv inputs) at the current position, and to go back to an earlier position ``p``:

    SnapshotStore   the current h, w, plus a full copy at every position that may be restored
                    (every snapshot handle, and every token since the latest snapshot)
    RecomputeStore  the current h, w, plus copies every ``interval`` tokens (checkpoints);
                    going back re-runs the whole model from the last checkpoint <= p
    ReplayStore     one checkpoint h_c, w_c per layer plus a log of the layer's inputs since it
                    (xBC, and the scan inputs x, dt, B, C); h at c + j is fold(h_c, log[:j]);
                    going back inside the log is a cursor move; conv windows come from the log

Stores never see the model's weights except through ``fold``, the layer's own scan. A store's
``rollback(p)`` returns the checkpoint position the cache must recompute from, or None.
"""

from __future__ import annotations

import torch

__all__ = ["SnapshotStore", "RecomputeStore", "ReplayStore", "STORES"]


def _window_after(window, xBC):
    """Conv window after appending xBC (batch, T, conv_dim) to window (batch, d_conv-1, conv_dim)."""
    keep = window.shape[1]
    return torch.cat([window, xBC.to(window.dtype)], dim=1)[:, -keep:] if keep else window


def _windows_per_token(window, xBC):
    """The conv window after each of the T new tokens: (batch, T, d_conv-1, conv_dim)."""
    keep = window.shape[1]
    full = torch.cat([window, xBC.to(window.dtype)], dim=1)
    return full.unfold(1, keep, 1)[:, 1:].transpose(2, 3) if keep else full[:, :0, None]


def _zero_state(mixer, batch, dtype, device):
    """The state before the first token: h (batch, H, P, N) fp32 zeros, w (batch, d_conv-1, conv_dim)."""
    c = mixer.cfg
    return (torch.zeros(batch, c.ssm_heads, c.ssm_head_dim, c.d_state, device=device),
            torch.zeros(batch, c.d_conv - 1, c.conv_dim, dtype=dtype, device=device))


def _nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _copy_bytes(copy):
    """Bytes of one kept copy {layer: (h, w)} (None: the zero state, kept for free)."""
    return sum(_nbytes(h, w) for h, w in (copy or {}).values())


class _CurrentStateStore:
    """Shared by snapshot and recompute: holds h, w at the current position per layer."""

    def __init__(self, mixers, batch, dtype, device):
        self.h, self.w = {}, {}
        for layer, mixer in mixers.items():
            self.h[layer], self.w[layer] = _zero_state(mixer, batch, dtype, device)

    def read(self, layer):
        return self.h[layer], self.w[layer]

    def window(self, layer):
        return self.w[layer]

    def state(self, layer):
        return self.h[layer]

    def outputs(self, layer, xBC, x, dt, B, C):
        return None  # outputs come from the scan over the current state

    def _copy(self, layers=None):
        return {l: (self.h[l].clone(), self.w[l].clone()) for l in (layers or self.h)}

    def _load(self, copy):
        for l, (h, w) in copy.items():
            self.h[l], self.w[l] = h.clone(), w.clone()

    def _zero(self):
        for l in self.h:
            self.h[l], self.w[l] = torch.zeros_like(self.h[l]), torch.zeros_like(self.w[l])

    def _gather(self, indices):
        for l in self.h:
            self.h[l], self.w[l] = self.h[l][indices], self.w[l][indices]

    def current_bytes(self):
        return {"ssm_state": _nbytes(*self.h.values()), "conv_state": _nbytes(*self.w.values())}


class SnapshotStore(_CurrentStateStore):
    name = "snapshot"

    def __init__(self, mixers, batch, dtype, device, **_):
        super().__init__(mixers, batch, dtype, device)
        self.handles = {}     # handle id -> (position, {layer: (h, w)})
        self.per_token = {}   # position -> {layer: (h, w)} since the latest snapshot
        self.tracking_from = None
        self.evicted = {}     # handle id or ("token", position) -> position, for fallbacks
        self.last_used = {}   # key -> tick, for LRU eviction
        self.tick = 0

    def _touch(self, key):
        self.tick += 1
        self.last_used[key] = self.tick

    def wants_states(self, layer):
        return self.tracking_from is not None

    def write(self, layer, position, xBC, x, dt, B, C, result):
        if self.tracking_from is not None:
            windows = _windows_per_token(self.w[layer], xBC)
            for j in range(xBC.shape[1]):
                self.per_token.setdefault(position + j + 1, {})[layer] = (
                    result.states[:, j].clone(), windows[:, j].clone())
                self._touch(("token", position + j + 1))
        self.h[layer], self.w[layer] = result.state, _window_after(self.w[layer], xBC)

    def after_advance(self, position):
        pass

    def snapshot(self, handle, position):
        self.handles[handle] = (position, self._copy())
        self._touch(handle)
        self.per_token = {}
        self.tracking_from = position

    def release(self, handle):
        self.handles.pop(handle, None)
        self.evicted.pop(handle, None)
        if not self.handles:
            self.per_token, self.tracking_from = {}, None

    def can_restore(self, position, handle=None):
        return (handle in self.handles or handle in self.evicted or position in self._kept()
                or position in self.evicted.values())

    def _kept(self):
        """position -> copy, every state copy still held."""
        kept = {pos: copy for pos, copy in self.handles.values()}
        kept.update(self.per_token)
        return kept

    def rollback(self, position, handle=None):
        if handle in self.handles:
            self._load(self.handles[handle][1])
            self._touch(handle)
            start = None
        elif position in self._kept():
            self._load(self._kept()[position])
            start = None
        else:  # evicted: rebuild from the latest copy before it (or from the empty state)
            older = [p for p in self._kept() if p <= position]
            start = max(older, default=0)
            if older:
                self._load(self._kept()[start])
            else:
                self._zero()
        self.per_token = {p: s for p, s in self.per_token.items() if p <= position}
        return None if start is None or start == position else start

    def select(self, indices):
        self._gather(indices)
        self.handles, self.per_token, self.tracking_from, self.evicted = {}, {}, None, {}

    def evictable(self):
        """(key, position, bytes, last used) of every copy that could be dropped."""
        items = [(hid, pos, _copy_bytes(copy)) for hid, (pos, copy) in self.handles.items()]
        items += [(("token", pos), pos, _copy_bytes(copy)) for pos, copy in self.per_token.items()]
        return [(k, p, b, self.last_used.get(k, 0)) for k, p, b in items]

    def evict(self, key):
        if isinstance(key, tuple):
            self.per_token.pop(key[1])
            self.evicted[key] = key[1]
        else:
            self.evicted[key] = self.handles.pop(key)[0]

    def nbytes(self):
        snaps = sum(_copy_bytes(copy) for _, copy in self.handles.values())
        snaps += sum(_copy_bytes(copy) for copy in self.per_token.values())
        return {**self.current_bytes(), "snapshots": snaps}


class RecomputeStore(_CurrentStateStore):
    name = "recompute"

    def __init__(self, mixers, batch, dtype, device, interval=16, **_):
        super().__init__(mixers, batch, dtype, device)
        if interval < 1:
            raise ValueError(f"interval: expected >= 1, got {interval}")
        self.interval = interval
        self.checkpoints = {0: None}  # position -> {layer: (h, w)}; None: the zero state
        self.last_used = {}           # position -> when it was made or last restored from

    def wants_states(self, layer):
        return True

    def write(self, layer, position, xBC, x, dt, B, C, result):
        windows = _windows_per_token(self.w[layer], xBC)
        for j in range(xBC.shape[1]):
            p = position + j + 1
            if p % self.interval == 0:
                self.checkpoints.setdefault(p, {})[layer] = (result.states[:, j].clone(),
                                                             windows[:, j].clone())
                self.last_used[p] = max(self.last_used.values(), default=0) + 1
        self.h[layer], self.w[layer] = result.state, _window_after(self.w[layer], xBC)

    def after_advance(self, position):
        pass

    def snapshot(self, handle, position):
        # a handle is only a position; keep the latest checkpoint at or before it (and the
        # zero state at 0), drop older ones: earlier targets recompute from the start
        base = max(p for p in self.checkpoints if p <= position)
        self.checkpoints = {p: c for p, c in self.checkpoints.items() if p == 0 or p >= base}

    def release(self, handle):
        pass

    def can_restore(self, position, handle=None):
        return True

    def rollback(self, position, handle=None):
        start = max(p for p in self.checkpoints if p <= position)
        if self.checkpoints[start] is None:
            self._zero()
        else:
            self._load(self.checkpoints[start])
            self.last_used[start] = max(self.last_used.values(), default=0) + 1
        for p in [p for p in self.checkpoints if p > start]:
            del self.checkpoints[p]
        return start if start < position else None

    def select(self, indices):
        self._gather(indices)
        for copy in self.checkpoints.values():
            for l, (h, w) in (copy or {}).items():
                copy[l] = (h[indices], w[indices])

    def evictable(self):
        return [(p, p, _copy_bytes(c), self.last_used.get(p, p)) for p, c in self.checkpoints.items()
                if c is not None]

    def evict(self, key):
        del self.checkpoints[key]

    def nbytes(self):
        return {**self.current_bytes(),
                "checkpoints": sum(_copy_bytes(c) for c in self.checkpoints.values())}


class ReplayStore:
    name = "replay"
    LOG_FIELDS = ("xBC", "x", "dt", "B", "C")

    def __init__(self, mixers, batch, dtype, device, interval=16, use_kernels=None, **_):
        if interval < 1:
            raise ValueError(f"interval: expected >= 1, got {interval}")
        self.mixers, self.L = mixers, interval
        # Triton kernels on a GPU; on CPU only when asked (they run through the interpreter)
        self.use_kernels = torch.device(device).type == "cuda" if use_kernels is None else use_kernels
        self.start = 0                      # checkpoint position c
        self.folded_tokens = 0              # logged tokens folded so far (work done on reads)
        self.ckpt = {l: _zero_state(m, batch, dtype, device) for l, m in mixers.items()}
        self.buf = {l: None for l in mixers}  # log buffers (batch, capacity, ...) per field
        self.n = {l: 0 for l in mixers}       # entries in use; lower layers run ahead in a forward
        self.rows = torch.arange(batch, device=device)  # branch -> checkpoint row (shared)
        self.pin = None  # position the log must keep (the latest snapshot handle)

    def log_length(self):
        return next(iter(self.n.values()), 0)

    def _log(self, layer, upto):
        return {k: v[:, :upto] for k, v in self.buf[layer].items()}

    def _reserve(self, layer, T, like):
        """Room for T more entries (buffers shaped like ``like``, doubling when full)."""
        buf, n = self.buf[layer], self.n[layer]
        if buf is not None and n + T <= next(iter(buf.values())).shape[1]:
            return
        cap = max(2 * (n + T), 2 * self.L, 16)
        grown = {k: v.new_empty((v.shape[0], cap) + v.shape[2:]) for k, v in like.items()}
        if buf is not None:
            for k in grown:
                grown[k][:, :n] = buf[k][:, :n]
        self.buf[layer] = grown

    def wants_states(self, layer):
        return False

    def _params(self, layer):
        mixer = self.mixers[layer]
        return (-torch.exp(mixer.A_log.detach().float()), mixer.dt_bias.detach().float(),
                (mixer.cfg.time_step_min, float("inf")))

    def _fold_state(self, layer, upto):
        """h at checkpoint + upto: fold the first ``upto`` logged tokens into h_c."""
        h = self.ckpt[layer][0]
        if upto == 0:
            return h[self.rows]
        self.folded_tokens += upto
        buf = self.buf[layer]
        if not self.use_kernels:
            return self.mixers[layer].scan(buf["x"][:, :upto], buf["dt"][:, :upto],
                                           buf["B"][:, :upto], buf["C"][:, :upto],
                                           h[self.rows]).state
        from replaylab.kernels.replay import fold
        batch = self.rows.numel()
        A, bias, limit = self._params(layer)
        out = torch.empty((batch,) + h.shape[1:], device=h.device)
        return fold(h, self.rows.to(torch.int32), out,
                    torch.arange(batch, dtype=torch.int32, device=h.device),
                    buf["x"], buf["dt"], buf["B"],
                    torch.full((batch,), upto, dtype=torch.int32, device=h.device), A, bias,
                    True, limit)

    def window(self, layer):
        w = self.ckpt[layer][1][self.rows]
        n = self.n[layer]
        return _window_after(w, self.buf[layer]["xBC"][:, :n]) if n else w

    def state(self, layer):
        return self._fold_state(layer, self.n[layer])

    def read(self, layer):
        return self.state(layer), self.window(layer)

    def outputs(self, layer, xBC, x, dt, B, C):
        """y (batch, T, H, P) of new tokens straight from checkpoint + log with the Triton
        replay_step (no state written), appending them to the log; None where it does not
        apply (no kernels, or a long prefill, which the reference scan handles)."""
        T = x.shape[1]
        if not self.use_kernels or T > 16:
            return None
        from replaylab.kernels.replay import replay_step
        self._reserve(layer, T, dict(xBC=xBC, x=x, dt=dt, B=B, C=C))
        buf, n, batch = self.buf[layer], self.n[layer], self.rows.numel()
        A, bias, limit = self._params(layer)
        log_len = torch.full((batch,), n, dtype=torch.int32, device=x.device)
        y = replay_step(self.ckpt[layer][0], self.rows.to(torch.int32), buf["x"], buf["dt"],
                        buf["B"], buf["C"], log_len, x, dt, B, C, A,
                        self.mixers[layer].D.detach().float(), bias, True, limit,
                        append=True, check=False)
        buf["xBC"][:, n:n + T] = xBC
        self.n[layer] = n + T
        return y

    def write(self, layer, position, xBC, x, dt, B, C, result):
        new = dict(xBC=xBC, x=x, dt=dt, B=B, C=C)
        T = x.shape[1]
        self._reserve(layer, T, new)
        n = self.n[layer]
        for k, v in new.items():
            self.buf[layer][k][:, n:n + T] = v
        self.n[layer] = n + T

    def after_advance(self, position):
        n = self.log_length()
        if n < self.L:
            return
        pinned = self.pin is not None and self.pin >= self.start  # keep the log from the pin on
        upto = min(n, self.pin - self.start) if pinned else n
        if upto:
            self._advance_checkpoint(upto)

    def _advance_checkpoint(self, upto):
        for layer in self.ckpt:
            h = self._fold_state(layer, upto)
            w = _window_after(self.ckpt[layer][1][self.rows], self.buf[layer]["xBC"][:, :upto])
            self.ckpt[layer] = (h, w)
            n, buf = self.n[layer], self.buf[layer]
            for k in buf:  # keep the entries after the new checkpoint at the front
                buf[k][:, :n - upto] = buf[k][:, upto:n].clone()
            self.n[layer] = n - upto
        self.rows = torch.arange(self.rows.numel(), device=self.rows.device)
        self.start += upto

    def snapshot(self, handle, position):
        self.pin = position

    def release(self, handle):
        pass

    def can_restore(self, position, handle=None):
        return True

    def rollback(self, position, handle=None):
        if position >= self.start:
            for layer in self.n:
                self.n[layer] = position - self.start
            return None
        # before the checkpoint: nothing kept covers it; rebuild from the start of the sequence
        for layer in self.ckpt:
            h, w = self.ckpt[layer]
            self.ckpt[layer] = (torch.zeros_like(h), torch.zeros_like(w))
            self.n[layer] = 0
        self.start, self.pin = 0, None
        return 0

    def select(self, indices):
        self.rows = self.rows[indices]
        for layer, buf in self.buf.items():
            if buf is not None:
                self.buf[layer] = {k: v[indices] for k, v in buf.items()}

    def evictable(self):
        return []  # the checkpoint and the log are the live state: nothing can be dropped

    def nbytes(self):
        """Checkpoint rows in use, conv windows, and the log entries in use (capacity kept
        for appends is not counted)."""
        live = torch.unique(self.rows).numel()
        ck = sum(_nbytes(h[:1]) * live for h, _ in self.ckpt.values())
        conv = sum(_nbytes(w[:1]) * live for _, w in self.ckpt.values())
        logs = sum(_nbytes(*self._log(l, self.n[l]).values()) for l in self.buf
                   if self.buf[l] is not None)
        return {"ssm_state": ck, "conv_state": conv, "logs": logs}


STORES = {s.name: s for s in (SnapshotStore, RecomputeStore, ReplayStore)}
