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

import warnings

import numpy as np
import torch

from replaylab.serving.validate import as_int, given
from replaylab.validation import as_real

__all__ = [
    "BatchSyntheticDrafter",
    "BatchPromptLookupDrafter",
    "BatchModelDrafter",
    "check_scheduler_drafter",
]


class BatchSyntheticDrafter:
    """``decoding.SyntheticDrafter`` for a whole batch: sequence i proposes
    ``references[i]``'s next k ids after its context (0 past the reference's end), each
    replaced by id + 1 with probability 1 - ``acceptance``. The draw of a draft is keyed by
    (``seed``, sequence, position) (``position_draws``), not by a generator's state: the same
    on the host and the device and whatever the rounds before, so host and device rounds
    draft alike. ``references``: S tensors (n_i,), each the sequence's prompt then its greedy
    tokens."""

    def __init__(self, references, acceptance, seed=0):
        acceptance = as_real("acceptance", acceptance, low=0, high=1)
        if not isinstance(references, (list, tuple)) or not references:
            raise ValueError(
                "references: expected a list of one reference (n,) per sequence, got "
                f"{type(references).__name__}"
            )
        for i, r in enumerate(references):  # floats were truncated to ids without a word
            if not isinstance(r, torch.Tensor) or r.is_floating_point() or r.dtype == torch.bool:
                raise TypeError(
                    f"references[{i}]: expected a tensor of token ids (n,), got {given(r)}"
                )
        width = max(r.numel() for r in references)
        self.reference = torch.zeros(len(references), width, dtype=torch.long)
        for i, r in enumerate(references):
            self.reference[i, : r.numel()] = r.flatten().cpu()
        self.acceptance, self.seed = acceptance, as_int("seed", seed, low=0)
        self._on = {}  # device -> the reference there
        self._table = None  # (vocab_size, (S, width) every draft inside the references)

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        # the host's rounds: numpy (a few microseconds an operation, not a dispatch each)
        k = as_int("k", k, low=0)
        index, n = np.asarray(rows.cpu()), np.asarray(lengths.cpu())
        if len(n) and int(n.min()) < 0:
            raise ValueError(
                f"lengths: row {int(n.argmin())} holds {int(n.min())} tokens: expected >= 0"
            )
        if len(index) and int(index.max()) >= self.reference.shape[0]:
            raise ValueError(
                f"rows: sequence {int(index.max())} has no reference (this drafter holds "
                f"{self.reference.shape[0]}); expected one reference per sequence"
            )
        if len(index) and int(index.min()) < 0:
            raise ValueError(f"rows: sequence {int(index.min())}: expected 0 <= row")
        at = n[:, None] + np.arange(k)  # (G, k) positions
        table = self._proposals(vocab_size)
        if table is not None and at.size and 0 <= at.min() and at.max() < table.shape[1]:
            return torch.from_numpy(table[index[:, None], at]).to(rows.device)  # a lookup
        return self._drafts(self.reference, rows, lengths, k, vocab_size)

    TABLE_ENTRIES = 1 << 22  # the most drafts the table holds (32 MiB); past it, no table

    def _proposals(self, vocab_size):
        """(S, width) numpy: the draft at every position inside the references, the same as
        ``_drafts`` gives there, computed once per vocabulary size (the host's rounds read
        it instead of hashing each round's positions); None for references of more than
        ``TABLE_ENTRIES`` ids, padded."""
        if self.reference.numel() > self.TABLE_ENTRIES:
            return None
        if self._table is None or self._table[0] != vocab_size:
            S, width = self.reference.shape
            every = torch.arange(width).expand(S, width)
            drafts = self._drafts_at(self.reference, torch.arange(S), every, vocab_size)
            self._table = (vocab_size, drafts.numpy())
        return self._table[1]

    def propose_on_device(self, contexts, lengths, k, vocab_size):
        """``propose_batch`` as tensor operations on the device of ``lengths`` (S,) int64,
        for every sequence of the call (row i is sequence i; ``contexts`` unread): the same
        drafts."""
        device = lengths.device
        if lengths.numel() > self.reference.shape[0]:
            raise ValueError(
                f"lengths: {lengths.numel()} sequences, this drafter holds "
                f"{self.reference.shape[0]} references; expected one reference per sequence"
            )
        if device not in self._on:
            self._on[device] = self.reference.to(device)
        rows = torch.arange(lengths.numel(), device=device)
        return self._drafts(self._on[device], rows, lengths, k, vocab_size)

    def _drafts(self, reference, rows, lengths, k, vocab_size):
        at = lengths[:, None] + torch.arange(k, device=lengths.device)  # (G, k) positions
        return self._drafts_at(reference, rows, at, vocab_size)

    def _drafts_at(self, reference, rows, at, vocab_size):
        """The drafts of sequences ``rows`` (G,) at positions ``at`` (G, n)."""
        width = reference.shape[1]
        true = reference[rows[:, None], at.clamp(max=width - 1)].masked_fill(at >= width, 0)
        wrong = position_draws(self.seed, rows, at) >= self.acceptance
        return torch.where(wrong, (true + 1) % vocab_size, true)


def position_draws(seed, rows, at):
    """Uniform numbers in [0, 1), float64 (G, k), one per (``seed``, sequence ``rows`` (G,),
    position ``at`` (G, k)): a 32-bit integer hash (xorshift-multiply rounds) of the three
    (the seed's low 32 bits), the same bits on any device (int64 arithmetic that never
    overflows for rows below 2**33)."""
    mask = 0xFFFFFFFF
    rows, at = rows.long(), at.long()  # int32 products would wrap to other bits
    x = ((seed & mask) * 0x27D4EB2F + rows[:, None] * 0x165667B1 + at) & mask
    for multiplier in (0x7FEB352D, 0x5BD1E995):
        x = ((x ^ (x >> 16)) * multiplier) & mask
    x = x ^ (x >> 15)
    return x.double() / 2.0**32


class BatchPromptLookupDrafter:
    """``decoding.PromptLookupDrafter`` for a whole batch, the same drafts row for row: the k
    tokens that followed the latest earlier occurrence of the context's last n-gram (n from
    ``max_ngram`` down to 1, the follow padded with its last token), or the last token k times
    when none is found. The host's rounds call ``propose_batch`` (numpy on host tensors), the
    device's rounds ``propose_on_device`` (tensor operations on the device of ``contexts``):
    the same rule, the same drafts."""

    def __init__(self, max_ngram=3):
        self.max_ngram = as_int("max_ngram", max_ngram, low=1)

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        k = as_int("k", k, low=0)
        if contexts.device.type != "cpu" or lengths.device.type != "cpu":
            return self.propose_on_device(contexts, lengths, k, vocab_size)
        ctx, n = contexts.numpy(), lengths.numpy().astype(np.int64)
        if len(n) and not 1 <= n.min() <= n.max() <= ctx.shape[1]:
            g = int(n.argmin() if n.min() < 1 else n.argmax())
            raise ValueError(
                f"lengths: row {g} holds {n[g]} tokens: expected 1 <= length <= "
                f"{ctx.shape[1]} (the contexts' width)"
            )
        return torch.from_numpy(self._propose_host(ctx, n, k))

    def _propose_host(self, ctx, lengths, k):
        """``propose_on_device``'s rule in numpy: ``same[n - 1][g, j]`` says whether the n
        tokens of row g ending at column j equal its last n, each n one comparison of the
        table shifted by n - 1 columns (no (G, width, n) windows); a match may end at most at
        column length - 2 (a token follows it, and it is earlier than the tail itself)."""
        G, width = ctx.shape
        rows, last = np.arange(G), lengths - 1
        follow, found = last.copy(), np.zeros(G, dtype=bool)
        top = min(self.max_ngram, width - 1)
        same = []
        for n in range(1, top + 1):
            nth = ctx[rows, np.maximum(lengths - n, 0)]  # the row's n-th token from its end
            equal = np.zeros((G, width), dtype=bool)
            equal[:, n - 1 :] = ctx[:, : width - n + 1] == nth[:, None]
            same.append(equal if n == 1 else same[-1] & equal)
        inside = np.arange(width) <= (lengths - 2)[:, None]
        for n in range(top, 0, -1):
            hit = same[n - 1] & inside & ((lengths > n) & ~found)[:, None]
            now = hit.any(1)
            latest = width - 1 - hit[:, ::-1].argmax(1)  # the last column where a match ends
            follow = np.where(now, latest + 1, follow)
            found |= now
        at = np.minimum(follow[:, None] + np.arange(k), last[:, None])
        return ctx[rows[:, None], at]

    def propose_on_device(self, contexts, lengths, k, vocab_size):
        """The drafts (G, k) of ``contexts`` (G, width) int64 holding ``lengths`` (G,) tokens
        each (at least one), on their device."""
        G, width = contexts.shape
        device = contexts.device
        last = lengths - 1
        follow = last.clone()  # where each row's follow starts (last: no match yet)
        found = torch.zeros(G, dtype=torch.bool, device=device)
        for n in range(min(self.max_ngram, width - 1), 0, -1):
            steps = torch.arange(n, device=device)
            tail = contexts.gather(1, (lengths[:, None] - n + steps).clamp(min=0))
            windows = contexts.unfold(1, n, 1)  # (G, width - n + 1, n): window at each start
            starts = torch.arange(windows.shape[1], device=device)
            hit = (windows == tail[:, None]).all(-1) & (starts <= (lengths - n - 1)[:, None])
            hit &= (lengths > n)[:, None] & ~found[:, None]
            latest = torch.where(hit, starts, -1).amax(1)
            now = latest >= 0
            follow = torch.where(now, latest + n, follow)
            found |= now
        at = torch.minimum(follow[:, None] + torch.arange(k, device=device), last[:, None])
        return contexts.gather(1, at)


class BatchModelDrafter:
    """A draft model in its own ``DecodeEngine`` (strategy "replay"), drafting for every row of
    a round in k batched steps: one step feeds each row the true tokens it has not seen yet
    (its first draft from the last one's logits), then k - 1 one-token steps draft greedily
    inside ``engine.provisional``, which gives those tokens back after the round (a cursor
    move), so every slot holds only its sequence's true tokens between rounds.

    engine   a replay ``DecodeEngine`` over the draft model, with the target's vocabulary,
             ``max_batch`` at least the sequences drafted for at once, ``max_len`` at least the
             longest context (the target's max_len), ``max_verify`` k + 1 for a catch-up in
             one step, and the target's L (or a multiple of it)
    A sequence first seen (or whose context no longer extends what its slot holds) is admitted
    with all but its last token, so its prompt is prefilled as the target's was. A row may
    draft fewer than k tokens before its slot's next fold or max_len (``provisional_room``);
    its last draft then repeats. With the target's L the target's own round stops at the same
    fold, so no draft it verifies is cut. ``proposed_steps`` counts the draft engine's steps."""

    def __init__(self, engine):
        from replaylab.serving.engine import DecodeEngine

        if not isinstance(engine, DecodeEngine):
            raise TypeError(
                f"engine: expected a DecodeEngine over the draft model, got {given(engine)}"
            )
        if engine.strategy != "replay":
            raise ValueError(
                f"engine: the draft engine gives back its drafts by a cursor move, so its "
                f"strategy must be 'replay', got {engine.strategy!r}{engine.strategy_hint}"
            )
        self.engine = engine
        self.seats = {}  # row -> (slot, the true tokens the slot holds (P,))
        self.proposed_steps = 0
        self._warned = False

    def reset(self):
        """Retire every slot this drafter holds (before drafting for new sequences)."""
        for slot, _ in self.seats.values():
            self.engine.retire(slot)
        self.seats = {}

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        e = self.engine
        contexts, lengths, rows, k = self._check(contexts, lengths, rows, k, vocab_size)
        G = len(rows)
        if k == 0 or G == 0:
            return torch.zeros(G, k, dtype=torch.long)
        if min(k + 1, e.L) > e.max_verify and not self._warned:  # a step takes at most L
            warnings.warn(
                f"BatchModelDrafter: the draft engine's max_verify={e.max_verify} is under "
                f"min(k + 1, L) = {min(k + 1, e.L)}, so a catch-up of up to k + 1 tokens takes "
                f"more steps than it must (the same drafts, more time); build it with "
                f"max_verify >= {min(k + 1, e.L)}",
                stacklevel=2,
            )
            self._warned = True
        slots, logits = self._seat(contexts, lengths, rows)
        logits = self._catch_up(contexts, lengths, rows, slots, logits)
        drafts = torch.empty(G, k, dtype=torch.long, device=e.device)  # read back once
        drafts[:, 0] = logits.argmax(-1)
        with e.provisional(slots) as room:
            for j in range(1, k):
                going = [g for g in range(G) if room[g] >= j]
                drafts[:, j:] = drafts[:, j - 1 : j]  # a row out of room repeats its last
                if not going:
                    break
                index = torch.tensor(going, device=e.device)
                step = e.step(
                    drafts[index, j - 1 : j], slots=[slots[g] for g in going], check=False
                )
                self.proposed_steps += 1
                drafts[index, j] = step[:, -1].argmax(-1)
        for g, row in enumerate(rows):
            self.seats[row] = (slots[g], contexts[g, : lengths[g]].clone())
        return drafts.cpu()

    def _check(self, contexts, lengths, rows, k, vocab_size):
        """The arguments checked before any slot changes -> (contexts, lengths as a list,
        rows as a list, k)."""
        e = self.engine
        if e.cfg.vocab_size != vocab_size:
            raise ValueError(
                f"vocab_size: the draft model has {e.cfg.vocab_size} tokens, the target "
                f"{vocab_size}; expected the same vocabulary"
            )
        k = as_int("k", k, low=0)
        for name, t, dims in (
            ("contexts", contexts, 2),
            ("lengths", lengths, 1),
            ("rows", rows, 1),
        ):
            if (
                not isinstance(t, torch.Tensor)
                or t.dim() != dims
                or t.is_floating_point()
                or t.dtype == torch.bool
            ):
                raise TypeError(f"{name}: expected a {dims}-d integer tensor, got {given(t)}")
        G, width = contexts.shape
        if lengths.numel() != G or rows.numel() != G:
            raise ValueError(
                f"lengths, rows: expected {G} each (one per context row), got "
                f"{lengths.numel()} and {rows.numel()}"
            )
        lengths, rows = lengths.tolist(), rows.tolist()
        if len(set(rows)) != G:
            raise ValueError(f"rows: expected distinct sequences, got {rows}")
        for g, n in enumerate(lengths):
            if not 1 <= n <= min(width, e.max_len):
                raise ValueError(
                    f"lengths[{g}]: expected 1 <= length <= {min(width, e.max_len)} (the "
                    f"contexts' width {width} and the draft engine's max_len {e.max_len}), got {n}"
                )
        held = torch.arange(width, device=contexts.device) < torch.tensor(
            lengths, device=contexts.device
        ).unsqueeze(1)
        outside = held & ((contexts < 0) | (contexts >= vocab_size))
        if outside.any():
            g, j = (int(i) for i in outside.nonzero()[0])
            raise ValueError(
                f"contexts: token id {int(contexts[g, j])} at row {g}, column {j} is outside "
                f"the vocabulary [0, {vocab_size})"
            )
        seated = sum(row in self.seats for row in rows)
        free = e.n_free + sum(row not in rows for row in self.seats)
        if G - seated > free:
            raise ValueError(
                f"rows: {G} sequences draft at once, the draft engine has "
                f"max_batch={e.max_batch} slots ({free} free or held for other sequences)"
            )
        return contexts, lengths, rows, k

    def _seat(self, contexts, lengths, rows):
        """Each row's slot, admitting the rows whose slot does not hold a prefix of their
        context; returns (slots, {g: last logits} of rows admitted whole (one token))."""
        e, slots, logits = self.engine, [], {}
        wanted = set(rows)
        for g, row in enumerate(rows):
            seat = self.seats.get(row)
            if seat is not None:
                slot, held = seat
                if held.numel() < lengths[g] and torch.equal(contexts[g, : held.numel()], held):
                    slots.append(slot)
                    continue
                e.retire(slot)
                del self.seats[row]
            if not e.n_free:  # free the slots of sequences not drafted for in this round
                for other in [r for r in self.seats if r not in wanted]:
                    e.retire(self.seats.pop(other)[0])
            n = max(lengths[g] - 1, 1)  # the last token goes through a step, as the target's
            slot, last = e.admit(contexts[g, :n])
            self.seats[row] = (slot, contexts[g, :n].clone())
            if n == lengths[g]:
                logits[g] = last
            slots.append(slot)
        return slots, logits

    def _catch_up(self, contexts, lengths, rows, slots, logits):
        """Step every row's unseen true tokens in (as few steps as its folds allow); the last
        logits (G, vocab) of each row's context."""
        e = self.engine
        out = [logits.get(g) for g in range(len(rows))]
        seen = [self.seats[row][1].numel() for row in rows]
        while True:
            going = [g for g in range(len(rows)) if seen[g] < lengths[g]]
            if not going:
                return torch.stack(out)
            counts = [min(lengths[g] - seen[g], e.room(slots[g])) for g in going]
            tokens = torch.zeros(len(going), max(counts), dtype=torch.long)
            for i, (g, c) in enumerate(zip(going, counts)):
                tokens[i, :c] = contexts[g, seen[g] : seen[g] + c]
            step = e.step(tokens, counts, [slots[g] for g in going], check=False)
            self.proposed_steps += 1
            for i, (g, c) in enumerate(zip(going, counts)):
                seen[g] += c
                out[g] = step[i, c - 1]


def check_scheduler_drafter(engine, drafter, k, max_running):
    """A ``Scheduler``'s ``drafter`` (None, or one batched drafter with ``propose_batch``) for
    ``engine`` with k drafts a round and at most ``max_running`` requests; a draft model's
    engine (``BatchModelDrafter.engine``) must be its own, with room for every request."""
    if drafter is None:
        return
    if not callable(getattr(drafter, "propose_batch", None)):
        raise TypeError(
            f"drafter: expected a batched drafter with propose_batch (serving.drafters), "
            f"got {given(drafter)}"
        )
    if not k:
        raise ValueError("drafter: a batched drafter needs k >= 1 drafts per round, got k=0")
    inner = getattr(drafter, "engine", None)  # a BatchModelDrafter's draft engine
    if inner is engine:
        raise ValueError(
            "drafter: its engine is the scheduler's own; give the draft model a "
            "DecodeEngine of its own"
        )
    if inner is not None and (inner.max_batch < max_running or inner.max_len < engine.max_len):
        raise ValueError(
            f"drafter: its engine has max_batch={inner.max_batch}, max_len={inner.max_len}; "
            f"expected at least max_running={max_running} slots and the target's "
            f"max_len={engine.max_len}"
        )
