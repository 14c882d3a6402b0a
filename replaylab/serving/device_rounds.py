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
recompute copy or re-run state per slot, which the host round drives. Every round steps the
whole bucket (finished sequences with count 0), where the host's rounds shrink it as
sequences finish; the tokens are the same (the greedy ones) where a slot's bits do not depend
on its batch: the engine's defaults on a GPU (``batch_invariant``, ``matmul="row_invariant"``)
and, as measured by the tests, on CPU. The host's slot table takes the cursor back when the
rounds end, or after an error, the cursor of the last whole round.

Glossary: S sequences, k drafts, T = k + 1 tokens verified per slot, L log length.
"""

from __future__ import annotations

import torch

from replaylab.serving.contexts import accepted as accepted_drafts
from replaylab.serving.validate import as_token_ids

__all__ = ["speculate_on_device", "check_device_drafter"]


def check_device_drafter(engine, drafter):
    """``drafter`` must propose on the engine's device (``propose_on_device``), and the
    engine must be able to take a rollback there (replay with its kernels)."""
    if not callable(getattr(drafter, "propose_on_device", None)):
        raise TypeError(
            "drafters: on_device=True needs one batched drafter with propose_on_device("
            "contexts, lengths, k, vocab_size) (serving.BatchSyntheticDrafter, "
            f"BatchPromptLookupDrafter), got {type(drafter).__name__}"
        )
    if engine.strategy != "replay" or not engine.use_kernels:
        raise ValueError(
            "on_device: rounds on the device need strategy='replay' with use_kernels=True "
            f"(a rollback the device does alone); this engine runs {engine.strategy!r} with "
            f"use_kernels={engine.use_kernels}{engine.strategy_hint}"
        )


class _Progress:
    """A few pinned host buffers the progress of a round is copied into without waiting, each
    with the event that says the copy landed; ``read`` waits for that round only."""

    def __init__(self, device, n=4):
        self.cuda = device.type == "cuda"
        self.slots = [
            (torch.zeros(4, dtype=torch.long, pin_memory=self.cuda),
             torch.cuda.Event() if self.cuda else None)
            for _ in range(n)
        ]  # fmt: skip
        self.next = 0

    def record(self, values):
        """Copy ``values`` (4,) int64 on the device to the next buffer; returns a reader."""
        host, event = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        if event is not None:
            event.synchronize()  # its last copy has landed (read or not)
            host.copy_(values, non_blocking=True)
            event.record()
        else:
            host.copy_(values)

        def read():
            if event is not None:
                event.synchronize()
            return host.tolist()

        return read


class _Rounds:
    """The device tensors of one ``speculate_on_device`` call and its round. The cursor of
    slots 0 .. bucket-1 (``pos``, ``log_len``, ``head``, ``last``) is replaced, never written
    in place, at the end of a round, so after an error it is the last whole round's."""

    def __init__(self, engine, slots, prompts, pending, n_new, drafter, k):
        e, dev = engine, engine.device
        self.e, self.drafter, self.k, self.n_new = e, drafter, k, n_new
        self.T = T = k + 1
        self.bucket = bucket = e.table.bucket(slots)
        self.slots, S = list(slots), len(slots)
        self.index = torch.tensor(slots, device=dev)  # sequence i is slot slots[i]
        cursor = (e.pos, e.log_len, e.head, e.last)
        self.pos, self.log_len, self.head, self.last = (
            torch.tensor(c[:bucket], device=dev) for c in cursor
        )
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
        self.round = torch.zeros((), dtype=torch.long, device=dev)
        # the first draft outside the vocabulary: (round, sequence, index, id), -1 for none
        self.bad = torch.full((4,), -1, dtype=torch.long, device=dev)
        self.steps = torch.arange(T, device=dev)
        self.rows = torch.zeros(bucket, T, dtype=torch.long, device=dev)  # the step's tokens
        self.progress = _Progress(torch.device(dev))
        self.rounds_run = 0
        self.started = False

    def run_one(self):
        """Enqueue one round; returns a reader of its progress: [the fewest tokens a sequence
        holds, the round, sequence, index of the first draft outside the vocabulary (-1:
        none)]."""
        e, table, k, T, bucket = self.e, self.e.table, self.k, self.T, self.bucket
        L, index, vocab = e.L, self.index, e.cfg.vocab_size
        drafts = self.drafter.propose_on_device(self.contexts, self.lengths, k, vocab)
        drafts = self._checked(drafts)
        if not self.started:  # the first round's step: row s of the step's tokens is slot s
            table.index_d[:bucket] = torch.arange(bucket, device=e.device)
            table.src_row_d[:bucket] = torch.arange(bucket, device=e.device)
            self.started = True
        going = self.n_out < self.n_new  # (S,)
        pos, held = self.pos[index], self.log_len[index]
        room = (table.capacity - torch.where(held < L, held, held - L)).clamp(max=e.max_verify)
        ks = torch.minimum(room - 1, e.max_len - pos - 1).clamp(0, k)
        ks = torch.where(going, ks, 0)
        counts = torch.zeros(bucket, dtype=torch.long, device=e.device)
        counts[index] = torch.where(going, ks + 1, 0)
        fold = torch.zeros(bucket, dtype=torch.bool, device=e.device)
        fold[index] = going & (held >= L)
        # the step's numbers, as ``SlotTable.upload`` gives them
        head = torch.where(fold, (self.head + L) % table.capacity, self.head)
        log_len = torch.where(fold, self.log_len - L, self.log_len)
        table.pos_d[:bucket] = self.pos
        table.head_pre_d[:bucket] = self.head
        table.log_len_d[:bucket] = log_len
        table.head_d[:bucket] = head
        table.fold_len_d[:bucket] = fold * L
        table.counts_d[:bucket] = counts

        last = self.out.gather(1, (self.n_out - 1)[:, None])
        self.rows[index] = torch.cat([last, drafts], 1)
        logits = e._run(self.rows, bucket, True, save=True)
        pred = logits.argmax(-1)[index]  # (S, T)
        taken = accepted_drafts(drafts, pred, ks)
        kept = torch.where(going, taken + 1, 0)  # tokens each slot keeps of its step
        dropped = going & (kept < ks + 1)
        if T > 1:  # each window back to the one after its kept tokens
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
        self.folds += fold.sum()
        self.rollbacks += dropped.sum()
        self.round += 1
        # the step's commit and the rollback after it: a cursor move; slots left out of the
        # step (count 0) can no longer roll back an earlier one
        self.pos = self.pos.index_add(0, index, kept)
        self.log_len = log_len.index_add(0, index, kept)
        self.head = head
        self.last = torch.zeros_like(counts).index_copy(0, index, kept)
        self.rounds_run += 1
        e.stats.steps += 1
        e.stats.verify_steps += int(T > 1)
        return self.progress.record(torch.cat([self.n_out.min()[None], self.bad[:3]]))

    def _checked(self, drafts):
        """The drafts as int64 (S, k), their type and shape checked on the host; an id
        outside the vocabulary is recorded (``bad``, read with the progress) and verified as
        id 0, a wrong draft, so no round reads past the embedding and every token stays the
        target's own."""
        S, k, vocab = self.index.numel(), self.k, self.e.cfg.vocab_size
        shape = (("sequences", S), ("k", k))
        drafts = as_token_ids(
            "drafts of propose_on_device", drafts, vocab, shape, check_range=False
        )
        if drafts.device != self.e.device:
            raise ValueError(
                f"drafts of propose_on_device: expected them on {self.e.device}, got "
                f"{drafts.device}"
            )
        if not drafts.numel():
            return drafts
        outside = (drafts < 0) | (drafts >= vocab)
        first = outside.flatten().long().argmax()
        found = torch.stack([self.round, first // k, first % k])
        fresh = outside.any() & (self.bad[0] < 0)
        self.bad = torch.where(fresh, torch.cat([found, drafts.flatten()[first][None]]), self.bad)
        return drafts.masked_fill(outside, 0)

    def finish(self):
        """The host's slot table and stats after the rounds enqueued so far (it waits for
        them); returns (tokens, proposed, accepted) as ``speculate_batch`` does."""
        e, table, bucket = self.e, self.e.table, self.bucket
        cursor = torch.stack([self.pos, self.log_len, self.head, self.last]).tolist()
        pos, log_len, head, last = cursor
        table.pos[:bucket], table.log_len[:bucket], table.head[:bucket] = pos, log_len, head
        if self.rounds_run:
            table.forget_last()
            table.last[:bucket] = last
            table.plan = {}
        folds, rollbacks = torch.stack([self.folds, self.rollbacks]).tolist()
        e.stats.folds += folds
        e.stats.folded_tokens += folds * e.L
        e.stats.rollbacks += rollbacks
        tokens = list(self.out[:, : self.n_new])
        return tokens, self.proposed.tolist(), self.accepted.tolist()

    def refuse_bad_draft(self, bad):
        """Raise for the first draft outside the vocabulary (``bad``: round, sequence, index,
        id), after ``finish`` kept the rounds run."""
        r, g, j, token = bad
        raise ValueError(
            f"drafts of slot {self.slots[g]} (sequence {g}): token id {token} at index {j} in "
            f"round {r + 1} is outside the vocabulary [0, {self.e.cfg.vocab_size}); the "
            f"{self.rounds_run} rounds run are kept (that draft verified as id 0, a wrong one, "
            "so every token taken is the target's own)"
        )


def speculate_on_device(engine, slots, prompts, pending, n_new, drafter, k):
    """The rounds of ``speculate_batch(..., on_device=True)`` after its checks: ``slots`` live
    slots, ``prompts`` (T0,) ids each, ``pending`` (S,) first tokens, one ``drafter`` with
    ``propose_on_device``. Returns (list of (n_new,) tokens, proposed, accepted). After an
    error (an interrupt among them) the slot table holds the cursor of the last whole round."""
    rounds = _Rounds(engine, slots, prompts, pending, n_new, drafter, k)
    fewest, previous, bad = 1, None, None
    try:
        for _ in range(n_new - 1):  # each round gives every going sequence a token at least
            if fewest >= n_new:
                break
            progress = rounds.run_one()
            if previous is not None:  # the round before this one: its progress is known soon
                fewest, *bad = previous()
                if bad[0] >= 0 or fewest >= n_new - 1:  # a bad draft, or this round ends all
                    break
            # a round adds at most T tokens: further from the end than that, the sequence with
            # the fewest is still going after this round, and the next one is enqueued unread
            if n_new - fewest <= rounds.T:  # near the end: wait for this round before the next
                fewest, *bad = progress()
                previous = None
                if bad[0] >= 0:
                    break
            else:
                previous = progress
    except BaseException:
        rounds.finish()
        raise
    result = rounds.finish()
    bad = rounds.bad.tolist()
    if bad[0] >= 0:
        rounds.refuse_bad_draft(bad)
    return result
