"""Replay: outputs come from checkpoint + log (no state write); a rollback is a cursor move.

Folds sit on a fixed grid: the checkpoint is always at a multiple of L. A slot whose log holds
L entries or more at the start of a step folds its oldest L into the checkpoint. With a ring of
L rows (the engine's default ``log_capacity``) a step never crosses the grid: a slot takes at
most ``room(slot)`` tokens in one step (the tokens left before its next fold). With more rows
(up to 2L) a verify may pass the grid; its rows past it are computed from a scratch checkpoint
after the first L entries (``_past_the_grid``), and the next step folds those L. The token at
position p is always computed from the checkpoint at L * floor(p / L) and the entries after
it, however the tokens were grouped into steps.

Buffers per recurrent layer: ``state`` holds the checkpoint; ``log[field]`` (slots, capacity,
...) the entries since it, a ring (entry i of slot s at row (head[s] + i) % capacity); with
the kernels and capacity > L, ``grid_state`` the scratch checkpoint. With ``use_kernels``
each family's pool runs ``replay`` and ``fold`` through its Triton kernels for the whole
bucket; without, the spec's ``outputs`` (one call per distinct log length) and ``fold``.

Glossary: L log length, head ring start, log_len entries since the checkpoint, c a fold
position (a multiple of L), b a prefix cache's block size.
"""

from __future__ import annotations

import torch

from replaylab.recurrent import prepared_chunk, window_after
from replaylab.serving.strategies.base import EngineStrategy, register

__all__ = ["EngineReplay"]


@register
class EngineReplay(EngineStrategy):
    name = "replay"
    store = "replay"
    logged = True
    rollback_graphable = True  # its rollback copies rows from buffers it does not write

    @classmethod
    def replays_with_kernels(cls, kernels):
        return bool(kernels)

    @classmethod
    def graphable(cls, use_kernels):
        return bool(use_kernels)  # else the slots are grouped by log length on the host

    @classmethod
    def allocate(cls, pool, zeros, slots, capacity, max_verify, fused):
        pool.allocate_log(zeros, slots, capacity, fused)

    def __init__(self, engine):
        super().__init__(engine)
        self._one_slot_fold = {}  # n -> (row 0, n entries): fold_entries' int32 arguments
        if engine.capacity > engine.L:  # a verify may pass the grid: a folded checkpoint
            for pool in engine.ssm.values():  # for its rows past it (``_past_the_grid``)
                if pool.kernels:
                    pool.grid_state = torch.zeros_like(pool.state)

    def room(self, slot):
        return self.engine.table.room(slot, self.engine.max_verify)

    # --- a step ------------------------------------------------------------------------
    def plan_folds(self, slots):
        folds = self.engine.table.plan_folds(slots)
        self.engine.stats.folds += len(folds)
        self.engine.stats.folded_tokens += self.engine.L * len(folds)
        return folds

    def fold(self, bucket):
        """Fold L entries of each slot that ``fold_len_d`` names into its checkpoint."""
        e, table = self.engine, self.engine.table
        for pool in e.ssm.values():
            if pool.kernels:  # every slot of the bucket in one launch; fold_len 0: untouched
                log = {k: v[:bucket] for k, v in pool.log.items()}
                pool.fold(
                    pool.state, table.rows_d[:bucket], log, table.fold_len_d[:bucket],
                    table.head_pre_d[:bucket],
                )  # fmt: skip
                continue
            for s, head in table.plan.items():
                rows = (head + torch.arange(e.L, device=e.device)) % table.capacity
                log = {k: v[s : s + 1, rows] for k, v in pool.log.items()}
                pool.state[s : s + 1] = pool.spec.fold(pool.state[s : s + 1], log)

    def advance(self, pool, entries, bucket, T):
        """y from checkpoint + log (the kernels for the whole bucket, or the spec's outputs
        per log length); appends each slot's counted tokens to its ring."""
        table = self.engine.table
        if pool.kernels:
            meta = (table.log_len_d, table.head_d, table.counts_d)
            y = pool.replay(entries, table.rows_d[:bucket], *(m[:bucket] for m in meta))
            others = [f for f in pool.log if f not in pool.kernel_fields]  # Mamba-2: xBC
            self._append_log(pool, entries, others, bucket, T)
            return self._past_the_grid(pool, entries, y, bucket, T)
        return self._replay_outputs(pool, bucket, T, entries)

    def _past_the_grid(self, pool, entries, y, bucket, T):
        """``y`` (bucket, T, ...) with its rows past the fold grid computed as a decode step
        there computes them: from the checkpoint after the slot's first L entries (folded
        into ``pool.grid_state`` by decode's fold, as the next step folds them into the
        checkpoint) and the entries after them, which are rewritten in the ring (Gated
        DeltaNet's u depends on the state). Read from the old checkpoint and more than L
        entries, they would round differently. Device tensors only (a CUDA graph holds it);
        the reference path's ``spec.outputs`` folds first already. Cost, with a ring of more
        than L rows: a fold and a replay launch more per layer and step (the Mamba-1 and
        Gated DeltaNet folds copy every slot's state out of place, even those that fold
        nothing)."""
        table, L = self.engine.table, self.engine.L
        if table.capacity == L:  # no step passes the grid
            return y
        log_len = table.log_len_d[:bucket].long()  # <= L: the step's fold ran
        counts = table.counts_d[:bucket].long()
        first = (L - log_len).clamp(0, T)  # the first row past the grid
        past = (counts - first).clamp(min=0)  # rows past it (0: the slot stays before it)
        rows, head = table.rows_d[:bucket], table.head_d[:bucket]
        log = {k: v[:bucket] for k, v in pool.log.items()}
        fold_len = torch.where(past > 0, L, 0).to(torch.int32)
        pool.fold(pool.state, rows, log, fold_len, head, out=pool.grid_state)
        steps = table.steps_d[:T]
        shift = (first[:, None] + steps).clamp(max=T - 1)  # row j <- row first + j
        later = {k: _rows(t, shift) for k, t in entries.items()}
        y_past = pool.replay(
            later, rows, torch.zeros_like(fold_len), (head + L) % table.capacity,
            past.to(torch.int32), state=pool.grid_state,
        )  # fmt: skip
        back = (steps - first[:, None]).clamp(min=0)  # row t <- row t - first
        keep = (steps >= first[:, None]) & (steps < counts[:, None])
        return torch.where(_expand(keep, y), _rows(y_past, back), y)

    def _replay_outputs(self, pool, bucket, T, entries):
        """y of the new tokens from checkpoint + log (``spec.outputs``: no state written), one
        call per distinct log length among the slots; appends each slot's counted tokens."""
        e, table = self.engine, self.engine.table
        y, held = None, table.log_len[:bucket]
        for n in sorted(set(held)):
            group = [s for s in range(bucket) if held[s] == n]
            rows = torch.tensor(group, device=e.device)
            heads = torch.tensor([table.head[s] for s in group], device=e.device)
            old = (heads[:, None] + torch.arange(n, device=e.device)) % table.capacity
            log = {k: v[rows[:, None], old] for k, v in pool.log.items()}  # (group, n, ...)
            mine = {k: v[rows] for k, v in entries.items()}
            out = pool.spec.outputs(pool.state[rows], log, mine)
            if y is None:
                y = out.new_empty((bucket, *out.shape[1:]))
            y[rows] = out
        self._append_log(pool, entries, list(pool.log), bucket, T)
        return y

    def _append_log(self, pool, entries, fields, bucket, T):
        """Append ``fields`` of each slot's counted tokens (``entries``: field -> (bucket, T,
        ...)) to its ring after its log_len entries, with no host read (a CUDA graph can hold
        it): a padding token rewrites its slot's last counted token (the same value to the
        same row), and a slot left out of the step (count 0) rewrites a row with what it
        holds."""
        if not fields:
            return
        table = self.engine.table
        counts = table.counts_d[:bucket, None].long()
        kept = torch.minimum(table.steps_d[:T], (counts - 1).clamp(min=0))  # (bucket, T)
        rows = (
            table.head_d[:bucket, None] + table.log_len_d[:bucket, None] + kept
        ) % table.capacity
        slots = table.rows_d[:bucket, None].long()
        for k in fields:
            buf, new = pool.log[k], entries[k]
            value = _rows(new, kept).to(buf.dtype)
            held = (counts > 0).view(bucket, 1, *(1,) * (new.dim() - 2))
            buf[slots, rows] = torch.where(held, value, buf[slots, rows])

    def mamba_fused(self, pool, x, dt, B, C, counts, T):
        """``kernels.mamba2``, each verify row as a single step."""
        table, bucket = self.engine.table, x.shape[0]
        new = dict(x=x, dt=dt, B=B, C=C)
        y = pool.replay(
            new, table.rows_d[:bucket], table.log_len_d[:bucket], table.head_d[:bucket], counts
        )
        return self._past_the_grid(pool, new, y, bucket, T)

    # --- prefill -----------------------------------------------------------------------
    def prefill_logged(self):
        return {l: [] for l in self.engine.ssm}

    def prefill_scan(self, pool, layer, slot, entries, carried, logged):
        """Scan from the chunks' carried state and log the entries (appended to
        ``logged[layer]`` when given); the checkpoint moves to the fold grid (``_prefill_log``)."""
        before = carried[layer]
        result, entries = pool.logged_scan(before, entries)  # GDN kernels: u in the same pass
        carried[layer] = result.state
        self._prefill_log(pool, slot, entries, result.state)
        if logged is not None:
            logged[layer].append(
                {
                    k: entries[k].to(pool.log[k].dtype) if k in pool.log else entries[k]
                    for k in pool.node_fields
                }  # fmt: skip
            )
        return result.y

    def _prefill_log(self, pool, slot, entries, scanned):
        """Move the slot's checkpoint to the last fold position the chunk reaches and keep the
        entries past it in the ring. A chunk that ends on the fold grid takes the scan's state
        there (``scanned``, (1, *state_shape)): the pass that computed the outputs wrote the
        checkpoint, and the ring is empty. Otherwise the ring's entries and the chunk's are
        folded up to the grid with the fold decode uses (one launch where the pool's fold
        chains, ``pool.fold_chains(L)``, else L at a time) and the rest stay in the ring."""
        e, table, L = self.engine, self.engine.table, self.engine.L
        n, head = table.log_len[slot], table.head[slot]
        T = next(iter(entries.values())).shape[1]
        if (n + T) % L == 0:
            pool.state[slot : slot + 1] = scanned
            return
        log = {k: entries[k].to(buf.dtype) for k, buf in pool.log.items()}  # (1, T, ...)
        if n:  # the ring's entries first (a chunk that starts on the grid has none)
            held = _ring_rows(head, 0, n, table.capacity, e.device)
            log = {k: torch.cat([buf[slot, held], log[k][0]])[None] for k, buf in pool.log.items()}
        total = next(iter(log.values())).shape[1]
        folded = total // L * L
        if folded:
            one = slice(slot, slot + 1)
            grid = {k: t[:, :folded] for k, t in log.items()}
            pool.state[one] = self.fold_grid(pool, pool.state[one], grid)
        if folded < total:  # the entries past the last fold stay in the ring
            rows = _ring_rows(head, folded, total, table.capacity, e.device)
            for k, buf in pool.log.items():
                buf[slot, rows] = log[k][0, folded:]

    def prefill_chunk_done(self, slot, T):
        folds = self.engine.table.fold_chunk(slot, T)
        self.engine.stats.folds += folds
        self.engine.stats.folded_tokens += folds * self.engine.L

    def fold_grid(self, pool, state, entries):
        """``state`` (1, *state_shape) after ``entries`` (1, G·L, ...) folded L at a time, as
        decode folds them: in one launch where the pool's fold chains
        (``pool.fold_chains(L)``), else one fold per L."""
        L = self.engine.L
        n = next(iter(entries.values())).shape[1]
        step = n if pool.kernels and pool.fold_chains(L) else L
        for at in range(0, n, step):
            state = self.fold_entries(
                pool, state, {k: t[:, at : at + step] for k, t in entries.items()}
            )
        return state

    def fold_entries(self, pool, state, entries):
        """fold(state (1, *state_shape), entries (1, n, ...)) with the fold decode steps use
        (the pool's kernels under ``use_kernels``, else the spec's); n is L, or G·L where the
        pool's fold chains."""
        if not pool.kernels:
            return pool.spec.fold(state, entries)
        n = next(iter(entries.values())).shape[1]
        if n not in self._one_slot_fold:
            zero = torch.zeros(1, dtype=torch.int32, device=self.engine.device)
            self._one_slot_fold[n] = zero, torch.full_like(zero, n)
        zero, count = self._one_slot_fold[n]
        out = torch.empty_like(state)
        log = {k: t.contiguous() for k, t in entries.items()}
        pool.fold(state, zero, log, count, zero, out=out)
        return out

    # --- a prefix cache's seat ----------------------------------------------------------
    def block_step(self):
        return self.engine.L

    def block_rule(self):
        e = self.engine
        return (
            f"multiples of the engine's log_length L={e.L} below max_len={e.max_len} (a "
            f"block's end must be a fold position)"
        )

    def seat_point(self, upto, r):
        return upto // self.engine.L * self.engine.L

    def seat_layer(self, pool, layer, path, block, ssm, conv, r, c, upto, j, slot):
        """Derive the block's log entries [g, upto) from the node's inputs and the window at g
        (``conv``), fold [g, c) onto the decode grid, put [c, upto) in the ring, rebuild the
        window after ``upto``; carry the state at ``upto`` (read by the prefill's scan, never
        written: it may be the tree's own tensor)."""
        if not j:
            return ssm, conv, ssm
        held = path[r // block].log[layer]  # {field: (1, len, ...)}: the block's node_fields
        log, scanned = self.node_entries(pool, conv, ssm, {k: t[:, :j] for k, t in held.items()})
        if c > r:  # onto the decode grid, with decode's fold
            ssm = self.fold_grid(pool, ssm, {k: t[:, : c - r] for k, t in log.items()})
        ring = {k: t[:, c - r : upto - r] for k, t in log.items()}
        if upto > c:
            for k, buf in pool.log.items():
                buf[slot, : upto - c] = ring[k][0]
        conv = window_after(conv, held[pool.spec.conv_field][:, :j], view=True)  # _seat copies
        if scanned is not None:  # the scan that derived the log reached upto
            carried = scanned
        else:
            carried = pool.spec.fold(ssm, ring) if upto > c else ssm
        return ssm, conv, carried

    @staticmethod
    def seat_layer_by_scan(pool, held, ssm, conv, j, chunk):
        """(state, conv window) after the block's first j entries, scanned from ``ssm`` (1,
        *state_shape) and ``conv`` (1, *conv_shape) at the block's start a ``chunk`` at a time
        as the prefill scans them (``recurrent.prepared_chunk``, then the pool's
        ``logged_scan``): the cold prefill's bits at the end, where j is a multiple of
        the chunk and of L (the checkpoint, with an empty ring). ``held``: the node's
        ``node_fields`` {field: (1, n >= j, ...)}."""
        for a in range(0, j, chunk):
            inputs = {k: t[:, a : a + chunk] for k, t in held.items()}
            entries, conv = prepared_chunk(pool.spec, conv, inputs, pool.prepare)
            result, _ = pool.logged_scan(ssm, entries)
            ssm = result.state
        return ssm, conv

    @staticmethod
    def node_entries(pool, window, state, held):
        """(the log's entries {field: (1, n, ...)} in its dtypes, the state after them or
        None) from a node's ``held`` fields (1, n, ...): derived by the pool's ``prepare``
        from the window before them where the node keeps the spec's inputs
        (``RecurrentPool.node_fields``), and values of the kernels' own (Gated DeltaNet's u)
        by ``logged_scan`` from ``state`` (1, *state_shape), the state before them, as the
        prefill logged them (then the state after them is that scan's); else the held ones."""
        after = None
        if pool.spec.input_fields:
            held = pool.prepare(window, held)
            if not set(pool.log) <= set(held):
                result, held = pool.logged_scan(state, held)
                after = result.state
        return {k: held[k].to(buf.dtype) for k, buf in pool.log.items()}, after

    def seat_cursor(self, slot, upto, c):
        table = self.engine.table
        table.log_len[slot], table.head[slot] = upto - c, 0

    def node_log(self, node, g, end, block, plan, record):
        """The node's entries: those before the resumed position from the tree's node the slot
        was seated from, the rest recorded by the prefill."""
        R = plan.resumed
        node.log = {}
        for layer, pool in self.engine.ssm.items():
            parts = []
            if g < R:  # seated from the tree's node of this block (its log is held)
                parts.append(
                    {k: t[:, : R - g] for k, t in plan.path[g // block].log[layer].items()}
                )
            if end > R:
                new = record["entries"][layer]
                parts.append({k: t[:, max(g, R) - R : end - R] for k, t in new.items()})
            node.log[layer] = {  # a copy of its own (a lone part is a view)
                k: torch.cat([p[k] for p in parts], 1) if len(parts) > 1 else parts[0][k].clone()
                for k in pool.node_fields
            }


def _expand(index, t):
    """``index`` (batch, T) viewed to broadcast over ``t`` (batch, T, ...)."""
    return index.view(*index.shape, *(1,) * (t.dim() - 2)).expand_as(t)


def _rows(t, index):
    """t (batch, T, ...) with row j of sequence b taken from row index[b, j]."""
    return t.gather(1, _expand(index, t))


def _ring_rows(head, start, stop, capacity, device):
    """The ring rows of a slot's entries start .. stop - 1 after its ``head``: a slice where
    they do not wrap past ``capacity`` (no index tensor to build), else (stop - start,) int64
    row indices."""
    first = (head + start) % capacity
    if first + stop - start <= capacity:
        return slice(first, first + stop - start)
    return (head + torch.arange(start, stop, device=device)) % capacity
