"""Speculation rounds on the device: ``DecodeEngine.speculate_batch(..., on_device=True)``.

The host's round (``serving.speculation``) reads each verify's greedy tokens back before it
can accept, roll back and draft again, so every round the device waits for the host and the
host for the device. Here every part of a round is a tensor operation on the engine's device:
the host only enqueues rounds, and reads the batch's progress one round late to know when
to stop, so it prepares round r + 1 while the device runs round r.

Per round, with the cursor of slots 0 .. bucket-1 held on the device, (bucket,) int64:

    drafts    the drafter's ``propose_on_device(contexts, lengths, k, vocab)``     (S, k)
    counts    1 + the drafts a sequence may verify (``DecodeEngine.room``, max_len);
              0 once it holds n_new tokens (its slot is left out of the step)
    folds     replay's grid: a log of L or more entries folds its oldest L first
    verify    the engine's step of T = k + 1 tokens per slot (a CUDA graph on a GPU)
    accept    the leading drafts equal to the target's own tokens (``contexts.accepted``)
    rollback  a cursor move, and each conv window back to the one after its kept tokens

Replay only: its rollback moves numbers, which the device moves alone; snapshot and
recompute copy or re-run state per slot, which the host round drives. The tokens equal the
host round's (both equal greedy): the bits of a slot do not depend on which other slots share
its step. The host's slot table takes the cursor back when the rounds end.

Glossary: S sequences, k drafts, T = k + 1 tokens verified per slot, L log length.
"""

from __future__ import annotations

import torch

from replaylab.serving.contexts import accepted as accepted_drafts

__all__ = ["speculate_on_device", "check_device_drafter"]


def check_device_drafter(engine, drafter):
    """``drafter`` must propose on the engine's device (``propose_on_device``), and the
    engine must be able to take a rollback there (replay with its kernels)."""
    if not callable(getattr(drafter, "propose_on_device", None)):
        raise TypeError(
            "drafters: on_device=True needs one batched drafter with propose_on_device("
            f"contexts, lengths, k, vocab_size) (serving.BatchSyntheticDrafter), got "
            f"{type(drafter).__name__}"
        )
    if engine.strategy != "replay" or not engine.use_kernels:
        raise ValueError(
            "on_device: rounds on the device need strategy='replay' with use_kernels=True "
            f"(a rollback the device does alone); this engine runs {engine.strategy!r} with "
            f"use_kernels={engine.use_kernels}{engine.strategy_hint}"
        )


class _Progress:
    """The batch's progress after a round, (the fewest tokens a sequence holds, how many are
    still going), copied to the host without waiting; ``read`` waits for that round only."""

    def __init__(self, n_out, n_new):
        done = torch.stack([n_out.min(), (n_out < n_new).sum()])
        if n_out.is_cuda:
            self.host = torch.empty(2, dtype=done.dtype, pin_memory=True)
            self.host.copy_(done, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = done, None

    def read(self):
        if self.event is not None:
            self.event.synchronize()
        fewest, going = self.host.tolist()
        return fewest, going


class _Rounds:
    """The device tensors of one ``speculate_on_device`` call and its round."""

    def __init__(self, engine, slots, prompts, pending, n_new, drafter, k):
        e, dev = engine, engine.device
        self.e, self.drafter, self.k, self.n_new = e, drafter, k, n_new
        self.T = T = k + 1
        self.bucket = bucket = e.table.bucket(slots)
        S = len(slots)
        self.index = torch.tensor(slots, device=dev)  # sequence i is slot slots[i]
        cursor = (e.pos, e.log_len, e.head)
        self.pos, self.log_len, self.head = (torch.tensor(c[:bucket], device=dev) for c in cursor)
        self.last = torch.zeros(bucket, dtype=torch.long, device=dev)
        lengths = [p.numel() for p in prompts]
        self.contexts = torch.zeros(S, max(lengths) + n_new + T, dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            self.contexts[i, : p.numel()] = p.to(dev)
        self.lengths = torch.tensor(lengths, device=dev)
        first = pending.flatten().to(dev)
        self.contexts[torch.arange(S, device=dev), self.lengths] = first
        self.lengths += 1
        self.out = torch.zeros(S, n_new + T, dtype=torch.long, device=dev)
        self.out[:, 0] = first
        self.n_out = torch.ones(S, dtype=torch.long, device=dev)
        self.proposed = torch.zeros(S, dtype=torch.long, device=dev)
        self.accepted = torch.zeros(S, dtype=torch.long, device=dev)
        self.folds = torch.zeros((), dtype=torch.long, device=dev)
        self.rollbacks = torch.zeros((), dtype=torch.long, device=dev)
        self.steps = torch.arange(T, device=dev)
        self.rows = torch.zeros(bucket, T, dtype=torch.long, device=dev)  # the step's tokens
        self.checked = False
        table = e.table
        table.index_d[:bucket] = torch.arange(bucket, device=dev)  # row s is slot s
        table.src_row_d[:bucket] = torch.arange(bucket, device=dev)

    def run_one(self):
        """Enqueue one round; returns its ``_Progress``."""
        e, table, k, T, bucket = self.e, self.e.table, self.k, self.T, self.bucket
        L, index = e.L, self.index
        going = self.n_out < self.n_new  # (S,)
        pos, held = self.pos[index], self.log_len[index]
        room = (table.capacity - torch.where(held < L, held, held - L)).clamp(max=e.max_verify)
        ks = torch.minimum(room - 1, e.max_len - pos - 1).clamp(0, k)
        ks = torch.where(going, ks, 0)
        counts = torch.zeros(bucket, dtype=torch.long, device=e.device)
        counts[index] = torch.where(going, ks + 1, 0)
        fold = torch.zeros(bucket, dtype=torch.bool, device=e.device)
        fold[index] = going & (held >= L)
        # the step's numbers, as ``SlotTable.upload`` would give them
        table.head_pre_d[:bucket] = self.head
        self.head = torch.where(fold, (self.head + L) % table.capacity, self.head)
        self.log_len = torch.where(fold, self.log_len - L, self.log_len)
        table.pos_d[:bucket] = self.pos
        table.log_len_d[:bucket] = self.log_len
        table.head_d[:bucket] = self.head
        table.fold_len_d[:bucket] = fold * L
        table.counts_d[:bucket] = counts
        self.folds += fold.sum()

        drafts = self.drafter.propose_on_device(self.contexts, self.lengths, k, e.cfg.vocab_size)
        if not self.checked:  # once: a drafter's bad ids are refused before the first step
            self._check(drafts)
        last = self.out.gather(1, (self.n_out - 1)[:, None])
        self.rows[index] = torch.cat([last, drafts.to(torch.long)], 1)
        logits = e._run(self.rows, bucket, True, save=True)
        pred = logits[index].argmax(-1)  # (S, T)
        taken = accepted_drafts(drafts, pred, ks)
        kept = torch.where(going, taken + 1, 0)  # tokens each slot keeps of its step
        # commit, then roll back: a cursor move
        self.pos[index] += kept
        self.log_len[index] += kept
        self.last = torch.zeros_like(counts)  # slots left out of the step: no rollback now
        self.last[index] = kept
        dropped = going & (kept < ks + 1)
        self.rollbacks += dropped.sum()
        if T > 1:
            back = (kept - 1).clamp(min=0)
            for pool in e.ssm.values():
                window = pool.draft_conv[index, back]
                keep_view = dropped.view(-1, *(1,) * (window.dim() - 1))
                pool.conv[index] = torch.where(keep_view, window, pool.conv[index])
        # the kept tokens after each sequence's output and context
        take = going[:, None] & (self.steps <= taken[:, None])
        for buf, at in ((self.out, self.n_out), (self.contexts, self.lengths)):
            # a finished row (take False) writes back what it holds, its columns clamped
            where = (at[:, None] + self.steps).clamp(max=buf.shape[1] - 1)
            buf.scatter_(1, where, torch.where(take, pred, buf.gather(1, where)))
        self.n_out += kept
        self.lengths += kept
        self.proposed += ks
        self.accepted += torch.where(going, taken, 0)
        e.stats.steps += 1
        e.stats.verify_steps += int(T > 1)
        return _Progress(self.n_out, self.n_new)

    def _check(self, drafts):
        S, k, vocab = self.index.numel(), self.k, self.e.cfg.vocab_size
        if not isinstance(drafts, torch.Tensor) or drafts.is_floating_point():
            raise TypeError(
                f"drafts of propose_on_device: expected an integer tensor, got {type(drafts)}"
            )
        if tuple(drafts.shape) != (S, k) or drafts.device != self.e.device:
            raise ValueError(
                f"drafts of propose_on_device: expected shape ({S}, {k}) on {self.e.device}, "
                f"got {tuple(drafts.shape)} on {drafts.device}"
            )
        bad = (drafts < 0) | (drafts >= vocab)
        if bool(bad.any()):
            g, j = bad.nonzero()[0].tolist()
            raise ValueError(
                f"drafts of sequence {g}: token id {int(drafts[g, j])} at index {j} is outside "
                f"the vocabulary [0, {vocab})"
            )
        self.checked = True

    def finish(self):
        """The host's slot table and stats after the rounds; returns (tokens, proposed,
        accepted) as ``speculate_batch`` does."""
        e, table, bucket = self.e, self.e.table, self.bucket
        cursor = (self.pos, self.log_len, self.head, self.last)
        pos, log_len, head, last = (t.tolist() for t in cursor)
        table.pos[:bucket], table.log_len[:bucket] = pos, log_len
        table.head[:bucket] = head
        table.forget_last()
        table.last[:bucket] = last
        table.plan = {}
        folds = int(self.folds)
        e.stats.folds += folds
        e.stats.folded_tokens += folds * e.L
        e.stats.rollbacks += int(self.rollbacks)
        tokens = [row[: self.n_new] for row in self.out]
        return tokens, self.proposed.tolist(), self.accepted.tolist()


def speculate_on_device(engine, slots, prompts, pending, n_new, drafter, k):
    """The rounds of ``speculate_batch(..., on_device=True)`` after its checks: ``slots`` live
    slots, ``prompts`` (T0,) ids each, ``pending`` (S,) first tokens, one ``drafter`` with
    ``propose_on_device``. Returns (list of (n_new,) tokens, proposed, accepted)."""
    rounds = _Rounds(engine, slots, prompts, pending, n_new, drafter, k)
    fewest, previous = 1, None
    for _ in range(n_new - 1):  # each round gives every going sequence a token at least
        if fewest >= n_new:
            break
        progress = rounds.run_one()
        if previous is not None:  # the round before this one: its progress is known soon
            fewest, _ = previous.read()
            if fewest >= n_new - 1:  # this round finishes every sequence
                break
        # a round adds at most T tokens: further from the end than that, the sequence with
        # the fewest is still going after this round, and the next one is enqueued unread
        if n_new - fewest <= rounds.T:  # near the end: wait for this round before the next
            fewest, going = progress.read()
            previous = None
            if not going:
                break
        else:
            previous = progress
    return rounds.finish()
