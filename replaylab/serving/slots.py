"""The slot table: the host's view of every slot and the device tensors a step reads.

Per slot, on the host:

    live        whether the slot holds a decoding sequence
    pos         tokens held (KV rows in use); the next token's position
    log_len     replay: entries in the log since the checkpoint (0 under other strategies)
    head        replay: where the log's ring starts
    last        tokens of the last step that a rollback may drop

``prefilling`` holds the slots claimed by an unfinished ``begin_admit``. Before each step
``upload`` copies the per-slot numbers to the device in one copy from pinned host memory (a
ring of staging buffers, so the host may run ahead of the device): ``pos_d``, ``index_d`` (the
step's slots in its order) and ``src_row_d`` (the row of the step's tokens each slot takes;
``slots``, one past the last, for none) (slots,) int64, then ``meta`` (5, slots) int32, rows
``log_len_d`` (after this step's folds), ``head_d`` (after them), ``head_pre_d`` (before them),
``fold_len_d``, ``counts_d``: the tensors the kernels and graphs read. A rollback moves the cursor with
``serving.cursor.rollback_cursor``.

Glossary: L log length (replay's fold grid), T_max = max_verify, bucket: the captured batch
size (slots 0 .. bucket-1 run).
"""

from __future__ import annotations

import numpy as np
import torch

from replaylab.serving.cursor import held_after_fold, rollback_cursor

__all__ = ["SlotTable"]


class SlotTable:
    """``slots`` slots of a ``DecodeEngine``; ``logged``: the strategy keeps a log whose length
    moves with each step and rollback (replay); ``capacity``: the log ring's rows per slot
    (L .. 2L, default L), the most entries a step may leave in a slot's log."""

    def __init__(self, slots, max_verify, L, logged, device, capacity=None):
        self.size, self.L, self.logged = slots, L, logged
        self.capacity = L if capacity is None else capacity
        self.live = [False] * slots
        self.prefilling = set()
        self.pos, self.log_len, self.head, self.last = ([0] * slots for _ in range(4))
        dev = dict(device=device)
        self._split = 3 * slots * 8  # bytes of the int64 rows; the int32 rows follow
        nbytes = self._split + 5 * slots * 4
        self.uploaded = torch.zeros(nbytes, dtype=torch.uint8, **dev)
        wide = self.uploaded[: self._split].view(torch.int64).view(3, slots)
        self.pos_d, self.index_d, self.src_row_d = wide
        self.meta = self.uploaded[self._split :].view(torch.int32).view(5, slots)
        self.log_len_d, self.head_d, self.head_pre_d, self.fold_len_d, self.counts_d = self.meta
        pinned = torch.device(device).type == "cuda"
        self._stages = [  # staging ring: (host bytes, their numpy view, copy-done event)
            (host, host.numpy(), torch.cuda.Event() if pinned else None)
            for host in (
                torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(4)
            )
        ]
        self._next = 0
        self.rows_d = torch.arange(slots, dtype=torch.int32, **dev)
        self.steps_d = torch.arange(max_verify, **dev)
        self.last_tokens = torch.zeros(slots, max_verify, dtype=torch.long, **dev)  # recompute
        self.plan = None  # replay: slot -> ring head before this step's fold (reference path)
        self.buckets = sorted({min(2**i, slots) for i in range(slots.bit_length() + 1)})

    # --- who is where ----------------------------------------------------------------------
    @property
    def slots(self):
        """The live slots, in order."""
        return [s for s, on in enumerate(self.live) if on]

    @property
    def batch(self):
        return sum(self.live)

    @property
    def n_free(self) -> int:
        return self.size - self.batch - len(self.prefilling)

    def free(self):
        """The free slots (neither live nor prefilling), lowest first."""
        return [s for s, on in enumerate(self.live) if not on and s not in self.prefilling]

    def bucket(self, slots):
        """The smallest captured batch size that holds every slot of ``slots``."""
        return next(b for b in self.buckets if b > max(slots))

    def room(self, slot, max_verify):
        """Replay's limit: at most the ring's rows left after the step's fold (a log of L
        entries or more folds its oldest L first); with capacity L, the tokens left before
        the slot's next fold."""
        return min(max_verify, self.capacity - held_after_fold(self.log_len[slot], self.L))

    # --- admission and retirement -------------------------------------------------------
    def reset(self, slot):
        self.pos[slot] = self.log_len[slot] = self.head[slot] = self.last[slot] = 0

    def go_live(self, slot, T0):
        self.live[slot], self.pos[slot], self.last[slot] = True, T0, 0

    def retire(self, slot):
        self.live[slot] = False
        self.reset(slot)

    def rewind(self, slot, n):
        """Replay: the slot gives back its last ``n`` tokens, whichever steps took them (a
        cursor move; the caller checked that its checkpoint sits at or before the new
        position). No step may be rolled back afterwards."""
        if not self.logged or not 0 <= n <= self.log_len[slot]:
            raise ValueError(
                f"rewind: slot {slot} holds {self.log_len[slot]} log entries since its "
                f"checkpoint, cannot give back {n} tokens"
            )
        self.pos[slot] -= n
        self.log_len[slot] -= n
        self.last[slot] = 0

    # --- steps and rollbacks ------------------------------------------------------------
    def forget_last(self):
        """No slot may roll back the last step any more."""
        self.last = [0] * self.size

    def commit(self, step_counts):
        """A step ran: slot s took ``step_counts[s]`` tokens."""
        self.forget_last()
        for s, c in step_counts.items():
            self.pos[s] += c
            self.last[s] = c
            if self.logged:
                self.log_len[s] += c

    def rollback(self, dropped):
        """Slot s keeps k tokens of its last step for each (s, k) of ``dropped``."""
        slots = [s for s, _ in dropped]
        pos, log_len, last = rollback_cursor(
            [self.pos[s] for s in slots],
            [self.log_len[s] for s in slots] if self.logged else None,
            [self.last[s] for s in slots],
            [k for _, k in dropped],
        )
        for i, s in enumerate(slots):
            self.pos[s], self.last[s] = pos[i], last[i]
            if self.logged:  # a cursor move
                self.log_len[s] = log_len[i]

    def plan_folds(self, slots):
        """Replay's fold grid: the slots whose log holds at least L entries fold their oldest L
        (host lengths move now; the kernels read the old head from ``head_pre_d``)."""
        folds = [s for s in slots if self.log_len[s] >= self.L]
        self.plan = {s: self.head[s] for s in folds}  # slot -> ring head before the fold
        for s in folds:
            self.head[s] = (self.head[s] + self.L) % self.capacity
            self.log_len[s] -= self.L
        return folds

    def fold_chunk(self, slot, T):
        """The log length and head after a prefill chunk of T tokens; returns the folds."""
        total = self.log_len[slot] + T
        folds = total // self.L
        self.log_len[slot] = total - folds * self.L
        self.head[slot] = (self.head[slot] + folds * self.L) % self.capacity
        return folds

    def upload(self, step_counts, folds, positions=None, rows=None):
        """Copy the host's per-slot numbers to the device tensors the step reads. ``rows``:
        the slot of each row of the step's tokens (default: row s is slot s, for every slot)."""
        n = self.size
        host, array, done = self._stages[self._next]
        self._next = (self._next + 1) % len(self._stages)
        if done is not None:
            done.synchronize()  # the copy that last read this buffer has run
        rows = range(n) if rows is None else rows
        wide = array[: self._split].view(np.int64).reshape(3, n)
        wide[0] = self.pos if positions is None else positions
        wide[1, : len(rows)] = rows
        wide[2] = n  # one past the last row of the step's tokens: zeros (``ModelRunner.place``)
        wide[2, list(rows)] = np.arange(len(rows))
        meta = array[self._split :].view(np.int32).reshape(5, n)
        meta[0], meta[1], meta[2] = self.log_len, self.head, self.head
        for s, h in (self.plan or {}).items():
            meta[2, s] = h  # the head before this step's fold
        meta[3] = 0
        meta[3, list(folds)] = self.L
        meta[4] = 0
        meta[4, list(step_counts)] = list(step_counts.values())
        self.uploaded.copy_(host, non_blocking=True)
        if done is not None:
            done.record()
