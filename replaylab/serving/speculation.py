"""Batched greedy speculative decoding on a ``DecodeEngine``: each round, every sequence's
drafter proposes k tokens, one step verifies k + 1 tokens per sequence, the target keeps the
leading drafts equal to its own tokens (acceptance: the cumulative product of matches), and one
rollback per round keeps 1 + accepted tokens per sequence.

Shapes: prompts a list of (T0,) ids; pending (S, 1) or (S,); a round's tokens (G, k + 1) for
the G sequences still going; contexts (S, width) on the host.
"""

from __future__ import annotations

import torch

from replaylab.serving.checks import check_slots
from replaylab.serving.contexts import accepted as accepted_drafts
from replaylab.serving.device_rounds import check_device_drafter, speculate_on_device
from replaylab.serving.validate import as_drafts, as_int, as_token_ids, given

__all__ = ["speculate_batch", "check_k", "check_drafters"]


def check_k(engine, k):
    """``k`` drafts per round, with k + 1 <= the engine's max_verify."""
    k = as_int("k", k, low=0)
    if k + 1 > engine.max_verify:
        raise ValueError(
            f"k: a verify of k + 1 = {k + 1} tokens exceeds max_verify={engine.max_verify}"
        )
    return k


def check_drafters(drafters, S):
    """``drafters``: a list of S objects with ``propose``, or one batched drafter (with
    ``propose_batch``, ``serving.drafters``)."""
    if callable(getattr(drafters, "propose_batch", None)):
        return
    if not isinstance(drafters, (list, tuple)) or len(drafters) != S:
        raise ValueError(f"drafters: expected a list of {S}, one per slot, got {given(drafters)}")
    for i, d in enumerate(drafters):
        if not callable(getattr(d, "propose", None)):
            raise TypeError(
                f"drafters[{i}]: expected a drafter with propose(context, k, vocab), got {given(d)}"
            )


def speculate_batch(engine, prompts, pending, n_new, drafters, k=4, slots=None, on_device=False):
    """``DecodeEngine.speculate_batch``: checks everything, then runs the rounds (on the host,
    or with ``on_device`` on the engine's device: ``serving.device_rounds``). Returns (list of
    (n_new,) tokens on the engine's device, proposed, accepted), the last two per sequence."""
    e = engine
    k = check_k(e, k)
    slots = check_slots(e, slots)
    S, vocab = len(slots), e.cfg.vocab_size
    if not isinstance(on_device, bool):
        raise ValueError(f"on_device: expected True or False, got {on_device!r}")
    if not isinstance(prompts, (list, tuple)) or len(prompts) != S:
        raise ValueError(f"prompts: expected a list of {S}, one per slot, got {given(prompts)}")
    prompts = [as_token_ids(f"prompts[{i}]", p, vocab, ("T0",)) for i, p in enumerate(prompts)]
    pending = as_token_ids("pending", pending, vocab, (("slots", S), 1), (("slots", S),))
    if on_device:
        check_device_drafter(e, drafters)
    else:
        check_drafters(drafters, S)
    n_new = as_int("n_new", n_new, low=1)
    for s in slots:
        if e.pos[s] + n_new - 1 > e.max_len:
            raise ValueError(
                f"n_new: slot {s} at position {e.pos[s]} cannot take n_new={n_new} tokens: "
                f"expected position + n_new - 1 <= max_len={e.max_len}"
            )
    if on_device:
        return speculate_on_device(e, slots, prompts, pending, n_new, drafters, k)
    outs = [[int(t)] for t in pending.flatten().tolist()]
    # the contexts on the host, a row each: prompt, then the tokens so far; a drafter reads a
    # view (no copy of the whole context every round)
    width = max(p.numel() for p in prompts) + n_new + k + 1
    contexts = torch.zeros(S, width, dtype=torch.long)
    lengths = [p.numel() + 1 for p in prompts]  # each context's tokens so far
    for i, (prompt, first) in enumerate(zip(prompts, outs)):
        contexts[i, : prompt.numel()] = prompt.cpu()
        contexts[i, prompt.numel()] = first[0]
    proposed, accepted = [0] * S, [0] * S
    steps = torch.arange(k + 1)
    batched = callable(getattr(drafters, "propose_batch", None))
    while True:
        going = [i for i in range(S) if len(outs[i]) < n_new]
        if not going:
            break
        # fewer drafts just before a fold and near max_len
        ks = [min(k, e.policy.room(slots[i]) - 1, e.max_len - e.pos[slots[i]] - 1) for i in going]
        if batched:
            batch = propose_rows(drafters, contexts, lengths, going, outs, k, vocab, slots)
        else:
            rows = []
            for i in going:
                drafts = drafters[i].propose(contexts[i, : lengths[i]], k, vocab)
                drafts = as_drafts(f"drafts of slot {slots[i]}", drafts, vocab, k)
                rows.append([outs[i][-1], *drafts])
            batch = torch.tensor(rows)
        limit = torch.tensor(ks)
        step_slots = [slots[i] for i in going]
        pred = e._step(batch.to(e.device), [kj + 1 for kj in ks], step_slots)
        pred = pred.argmax(-1).cpu()  # (G, k + 1)
        # accepted: the leading drafts equal to the target's tokens; the tokens taken are the
        # target's first 1 + accepted (an accepted draft is the target's token)
        taken = accepted_drafts(batch[:, 1:], pred, limit)
        index = torch.tensor(going)[:, None].expand(-1, k + 1)
        at = torch.tensor([lengths[i] for i in going])[:, None] + steps  # (G, k + 1)
        new = steps <= taken[:, None]
        contexts[index[new], at[new]] = pred[new]
        for j, (i, a, tokens) in enumerate(zip(going, taken.tolist(), pred.tolist())):
            proposed[i], accepted[i] = proposed[i] + ks[j], accepted[i] + a
            outs[i] += tokens[: a + 1]
            lengths[i] += a + 1
        e._rollback((taken + 1).tolist(), step_slots)
    return [torch.tensor(o[:n_new], device=e.device) for o in outs], proposed, accepted


def propose_rows(drafter, contexts, lengths, going, outs, k, vocab, slots):
    """A round's tokens (G, k + 1) from a batched drafter: each sequence's last token, then
    its k drafts, checked at once (an integer (G, k) tensor, every id in [0, vocab))."""
    index = torch.tensor(going)
    drafts = drafter.propose_batch(contexts[index], torch.tensor(lengths)[index], index, k, vocab)
    shape = (("sequences going", len(going)), ("k", k))
    drafts = as_token_ids("drafts of propose_batch", drafts, vocab, shape, check_range=False)
    drafts = drafts.cpu()
    bad = (drafts < 0) | (drafts >= vocab)
    if bad.any():
        g, j = bad.nonzero()[0].tolist()
        raise ValueError(
            f"drafts of slot {slots[going[g]]}: token id {int(drafts[g, j])} at index {j} is "
            f"outside the vocabulary [0, {vocab})"
        )
    last = torch.tensor([outs[i][-1] for i in going])
    return torch.cat([last[:, None], drafts], 1)
