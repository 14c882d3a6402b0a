"""Batched drafters for ``DecodeEngine.speculate_batch``: one object proposes the k drafts of
every sequence still going in a round, as tensor operations over the batch, where a list of
per-sequence drafters (``decoding.SyntheticDrafter``, ``decoding.PromptLookupDrafter``) costs a
Python call and a check per sequence and round.

A batched drafter has ``propose_batch(contexts, lengths, rows, k, vocab_size)``:

    contexts  (G, width) int64 on the host: row g holds its sequence's tokens so far
              (prompt, then the tokens taken), zeros past ``lengths[g]``
    lengths   (G,) int64: tokens held per row (at least one)
    rows      (G,) int64: which of speculate_batch's S sequences each row is
    returns   (G, k) integer ids in [0, vocab_size)

Glossary: G sequences still going in the round, S sequences of the call, k drafts.
"""

from __future__ import annotations

import torch

__all__ = ["BatchSyntheticDrafter", "BatchPromptLookupDrafter"]


class BatchSyntheticDrafter:
    """``decoding.SyntheticDrafter`` for a whole batch: sequence i proposes
    ``references[i]``'s next k ids after its context (0 past the reference's end), each
    replaced by id + 1 with probability 1 - ``acceptance``, one random draw for the round.
    ``references``: S tensors (n_i,), each the sequence's prompt then its greedy tokens."""

    def __init__(self, references, acceptance, seed=0):
        if not 0 <= acceptance <= 1:
            raise ValueError(f"acceptance: expected 0 <= acceptance <= 1, got {acceptance}")
        if not isinstance(references, (list, tuple)) or not references:
            raise ValueError(
                "references: expected a list of one reference (n,) per sequence, got "
                f"{type(references).__name__}"
            )
        width = max(r.numel() for r in references)
        self.reference = torch.zeros(len(references), width, dtype=torch.long)
        for i, r in enumerate(references):
            self.reference[i, : r.numel()] = r.flatten().cpu()
        self.acceptance = acceptance
        self.generator = torch.Generator().manual_seed(seed)

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        if len(rows) and int(rows.max()) >= self.reference.shape[0]:
            raise ValueError(
                f"rows: sequence {int(rows.max())} has no reference (this drafter holds "
                f"{self.reference.shape[0]}); expected one reference per sequence"
            )
        at = lengths[:, None] + torch.arange(k)  # (G, k) positions after each context
        inside = at < self.reference.shape[1]
        true = self.reference[rows[:, None], at.clamp(max=self.reference.shape[1] - 1)]
        true = true.masked_fill(~inside, 0)
        wrong = torch.rand(true.shape, generator=self.generator) >= self.acceptance
        return torch.where(wrong, (true + 1) % vocab_size, true)


class BatchPromptLookupDrafter:
    """``decoding.PromptLookupDrafter`` for a whole batch, the same drafts row for row: the k
    tokens that followed the latest earlier occurrence of the context's last n-gram (n from
    ``max_ngram`` down to 1, the follow padded with its last token), or the last token k times
    when none is found."""

    def __init__(self, max_ngram=3):
        self.max_ngram = max_ngram

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        G, width = contexts.shape
        last = lengths - 1
        follow = last.clone()  # where each row's follow starts (last: no match yet)
        found = torch.zeros(G, dtype=torch.bool)
        for n in range(min(self.max_ngram, width - 1), 0, -1):
            tail = contexts.gather(1, (lengths[:, None] - n + torch.arange(n)).clamp(min=0))
            windows = contexts.unfold(1, n, 1)  # (G, width - n + 1, n): window at each start
            starts = torch.arange(windows.shape[1])
            hit = (windows == tail[:, None]).all(-1) & (starts <= (lengths - n - 1)[:, None])
            hit &= (lengths > n)[:, None] & ~found[:, None]
            latest = torch.where(hit, starts, -1).amax(1)
            now = latest >= 0
            follow = torch.where(now, latest + n, follow)
            found |= now
        at = torch.minimum(follow[:, None] + torch.arange(k), last[:, None])
        return contexts.gather(1, at)
