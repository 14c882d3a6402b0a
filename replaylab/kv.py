"""The KV cache of one attention layer: addressable by position, so branching is cheap.

Glossary (code name -> meaning, shape):
    k, v       keys and values of new tokens          (batch, Hkv, t, Dh)
    segment    a span of positions stored once; ``rows[i]`` is the storage row that live
               branch i reads, so forked branches share a prefix without copying it
    open       the last segment, owned by one branch per row, where appends go

The operations a branching decoder needs, and what they cost here:
    append         write t new rows at the end of the open segment (amortised O(t))
    truncate_to    drop a suffix: only a length changes
    fork(n)        every branch becomes n branches sharing everything so far: no copy
    reorder(idx)   beam search: frozen segments remap their rows (no copy); the open
                   segment, the tokens since the last fork, is gathered

``attend`` is softmax attention of queries over KV rows, each query seeing the rows a mask
allows: the one attention product the models and the serving engine share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaylab.validation import branch_indices, check_tensor, fork_indices

__all__ = ["LayerKV", "attend", "causal_mask"]


def causal_mask(T, total, device):
    """(T, total) bool: the last T of ``total`` rows are the queries' own; each sees the rows
    up to its own."""
    return torch.ones(T, total, dtype=torch.bool, device=device).tril(total - T)


def attend(q, keys, values, visible):
    """Softmax attention: q (batch, heads, T, Dh) over keys, values (batch, Hkv, rows, Dh)
    (each KV head serves heads / Hkv query heads), scaled by Dh^-1/2; ``visible`` (bool,
    broadcast to (batch, heads, T, rows)) says which rows each query sees. Softmax in fp32.
    Returns (batch, T, heads * Dh)."""
    batch, heads, T, Dh = q.shape
    rep = heads // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    scores = (q @ keys.transpose(2, 3)) * Dh**-0.5
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ values
    return out.transpose(1, 2).reshape(batch, T, -1)


@dataclass
class _Segment:
    k: torch.Tensor  # (R, Hkv, capacity, Dh) storage rows
    v: torch.Tensor
    rows: torch.Tensor  # (batch,) long: storage row read by each live branch
    start: int  # position of the segment's first token
    length: int  # tokens used

    @property
    def end(self):
        return self.start + self.length


class LayerKV:
    """Keys and values of one attention layer for a batch of branches.

    >>> kv = LayerKV(batch=2, kv_heads=1, head_dim=4)
    >>> kv.append(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4)); kv.length
    3
    """

    def __init__(self, batch, kv_heads, head_dim, *, dtype=torch.float32, device="cpu", block=64):
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        self.dtype, self.device, self.block = dtype, torch.device(device), block
        self.frozen: list[_Segment] = []
        self.open = self._new_open(start=0, rows=batch)

    def _new_open(self, start, rows, capacity=0):
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        empty = torch.empty(shape, dtype=self.dtype, device=self.device)
        return _Segment(empty, empty.clone(), torch.arange(rows, device=self.device), start, 0)

    @property
    def length(self) -> int:
        """Number of positions held (the same for every branch)."""
        return self.open.end

    def append(self, k, v):
        """Append keys and values of t new tokens; k, v: (batch, Hkv, t, Dh)."""
        spec = (self.batch, self.kv_heads, "t", self.head_dim)
        dims = check_tensor("k", k, spec)
        check_tensor("v", v, spec, dims)
        seg, t = self.open, k.shape[2]
        need = seg.length + t
        if need > seg.k.shape[2]:
            capacity = max(need, 2 * seg.k.shape[2], self.block)
            grown = self._new_open(seg.start, self.batch, capacity)
            grown.k[:, :, : seg.length] = seg.k[:, :, : seg.length]
            grown.v[:, :, : seg.length] = seg.v[:, :, : seg.length]
            grown.length, seg = seg.length, grown
            self.open = seg
        seg.k[:, :, seg.length : need] = k.to(self.dtype)
        seg.v[:, :, seg.length : need] = v.to(self.dtype)
        seg.length = need

    def keys_values(self):
        """All keys and values, (batch, Hkv, length, Dh) each (gathered; a fresh tensor)."""
        segs = [s for s in (*self.frozen, self.open) if s.length]
        if not segs:
            shape = (self.batch, self.kv_heads, 0, self.head_dim)
            return (torch.empty(shape, dtype=self.dtype, device=self.device),) * 2
        ks = [s.k[s.rows, :, : s.length] for s in segs]
        vs = [s.v[s.rows, :, : s.length] for s in segs]
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)

    def truncate_to(self, position):
        """Keep positions ``[0, position)``; ``0 <= position <= length``."""
        if not 0 <= position <= self.length:
            raise ValueError(f"position: expected 0 <= position <= {self.length}, got {position}")
        if position >= self.open.start:
            self.open.length = position - self.open.start
            return
        while self.frozen and self.frozen[-1].start >= position:
            self.frozen.pop()
        if self.frozen:
            self.frozen[-1].length = position - self.frozen[-1].start
        self.open = self._new_open(position, self.batch)

    def fork(self, n):
        """Each branch becomes n consecutive branches sharing all positions so far (no copy)."""
        self._select(fork_indices(n, self.batch, self.device))

    def reorder(self, indices):
        """Branch i now continues old branch ``indices[i]`` (beam search); batch may change."""
        self._select(branch_indices(indices, self.batch, self.device))

    def _select(self, indices):
        if self.open.length:
            self.frozen.append(self.open)
        for seg in self.frozen:
            seg.rows = seg.rows[indices]
            live = torch.unique(seg.rows)
            if live.numel() < seg.k.shape[0]:  # free rows no branch reads any more
                seg.k, seg.v = seg.k[live], seg.v[live]
                seg.rows = torch.searchsorted(live, seg.rows)
        self.batch = int(indices.numel())
        self.open = self._new_open(self._frozen_end(), self.batch)

    def _frozen_end(self):
        return self.frozen[-1].end if self.frozen else self.open.start

    def nbytes(self) -> int:
        """Bytes allocated for keys and values (a shared prefix counts once)."""
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for s in (*self.frozen, self.open)
            for t in (s.k, s.v)
        }
        return sum(storages.values())
