"""What a batched drafter reads, kept across rounds: every slot's tokens so far (its prompt,
then the tokens taken) in one host table, and the acceptance rule of a verify round.

A round then costs the host one indexed read of the going slots' rows and one indexed write
of the tokens they took, where rebuilding each request's context (a concatenation of its
prompt and its token list) and filling a fresh table costs a few tensor operations a request.

    table    (slots, width) int64 on the host (numpy): row s holds slot s's context, zeros past it
    lengths  (slots,) int64: the tokens each row holds

Glossary: G slots going in a round, k drafts, T = k + 1 tokens verified per slot.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["SlotContexts", "accepted"]


def accepted(drafts, predicted, n_drafts):
    """Drafts the target keeps per row: the leading drafts equal to its own tokens.

    drafts (G, k) proposed ids; predicted (G, >= k) the target's greedy ids at each verified
    position (predicted[:, j] follows draft j - 1); n_drafts (G,) how many of each row's drafts
    were verified (the rest are padding). Tensors on any device, or numpy arrays (the host's
    rounds: a numpy operation costs a fraction of a tensor operation's dispatch). Returns
    (G,) int64 of the same kind: the row keeps its first ``accepted`` drafts and then the
    target's next token, 1 + accepted tokens in all."""
    k = drafts.shape[1]
    if isinstance(drafts, np.ndarray):
        same = (drafts == predicted[:, :k]) & (np.arange(k) < n_drafts[:, None])
        return same.cumprod(1).sum(1)
    same = (drafts == predicted[:, :k]) & (
        torch.arange(k, device=drafts.device) < n_drafts[:, None]
    )
    return same.long().cumprod(1).sum(1)


class SlotContexts:
    """Each slot's context on the host (see the module docstring); ``width`` bounds a
    context's tokens (a slot's position, plus the tokens a round appends). The table starts
    ``initial`` columns wide and doubles, up to ``width``, when a context needs more: an
    engine of many long slots does not hold slots x width ids for short requests. The table
    is a numpy array (a round's few indexed reads and writes cost microseconds, not a tensor
    operation's dispatch each); ``rows`` hands drafters tensors of copies of its rows."""

    def __init__(self, slots, width, initial=1024):
        self.width = width
        self.table = np.zeros((slots, min(width, initial)), dtype=np.int64)
        self.lengths = np.zeros(slots, dtype=np.int64)

    def _room(self, n):
        """Columns for contexts of ``n`` tokens (n <= width): the table doubled until it holds
        them, its rows copied."""
        held = self.table.shape[1]
        if n > held:
            grown = np.zeros((self.table.shape[0], min(self.width, max(n, 2 * held))),
                             dtype=np.int64)  # fmt: skip
            grown[:, :held] = self.table
            self.table = grown

    def start(self, slot, prompt, tokens):
        """Slot ``slot``'s new tenant: ``prompt`` (T0,) ids then ``tokens`` (a list of ids)."""
        if prompt.is_floating_point() or any(type(t) is not int for t in tokens):
            raise TypeError("prompt, tokens: expected integer token ids")
        n, old = prompt.numel() + len(tokens), int(self.lengths[slot])
        if n > self.width:
            raise ValueError(
                f"slot {slot}: a context of {n} tokens exceeds the table's width {self.width}"
            )
        self._room(n)
        row = self.table[slot]
        row[: prompt.numel()] = prompt.flatten().cpu().numpy()
        row[prompt.numel() : n] = tokens
        if old > n:  # the previous tenant's tail: zeros past the context, as drafters expect
            row[n:old] = 0
        self.lengths[slot] = n

    def rows(self, slots, extra=0):
        """(contexts (G, width), lengths (G,)), int64 tensors, of ``slots`` (G,) (an int
        array or tensor): their rows, cut after the longest context plus ``extra`` zero
        columns (what drafters see)."""
        slots = np.asarray(slots)
        lengths = self.lengths[slots]
        width = min(int(lengths.max()) + extra, self.width) if len(slots) else 0
        self._room(width)
        return torch.from_numpy(self.table[slots, :width]), torch.from_numpy(lengths)

    def extend(self, slots, tokens, n_taken):
        """Append to each slot of ``slots`` (G,) the first ``n_taken[g]`` of ``tokens[g]``
        (tokens (G, T), n_taken (G,) ints with 0 <= n_taken <= T; arrays or tensors), all in
        one write."""
        slots, tokens, n_taken = np.asarray(slots), np.asarray(tokens), np.asarray(n_taken)
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"tokens: expected integer token ids, got dtype {tokens.dtype}")
        T = tokens.shape[1]
        ends = self.lengths[slots] + n_taken
        longest = int(ends.max()) if len(slots) else 0
        if longest > self.width:
            raise ValueError(f"tokens: a context would exceed the table's width {self.width}")
        self._room(longest)
        at = (ends - n_taken)[:, None] + np.arange(T)  # (G, T)
        taken = np.arange(T) < n_taken[:, None]
        self.table[np.broadcast_to(slots[:, None], (len(slots), T))[taken], at[taken]] = tokens[
            taken
        ]
        self.lengths[slots] = ends
