"""Notebook 10's helpers and check: where prompt lookup finds its drafts, how many drafts each
round of speculative decoding accepts, and ``check_prompt_lookup`` for the learner's own
prompt lookup.

Glossary: context (the prompt and every token kept so far, as ids); k drafts per round;
n the length of the n-gram matched at the end of the context; source the index in the context
where the copied drafts begin.
"""

from __future__ import annotations

import torch

from replaylab.decoding import PromptLookupDrafter
from replaylab.exercises import record

__all__ = ["lookup_with_source", "RoundRecorder", "check_prompt_lookup"]


def lookup_with_source(context, k, max_ngram=3):
    """Prompt lookup (``PromptLookupDrafter``'s rule) with where its drafts come from:
    ``(drafts, source, n)``. The context's last n-gram (n from ``max_ngram`` down to 1) is
    looked up at its latest earlier occurrence; the k tokens after it are the drafts (the last
    one repeated if the context ends first), ``source`` their first index. With no match:
    the last token k times, source None, n 0."""
    seq = [int(t) for t in (context.flatten().tolist() if torch.is_tensor(context) else context)]
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == tail:
                follow = seq[start + n : start + n + k]
                follow += [follow[-1]] * (k - len(follow))
                return follow, start + n, n
    return [seq[-1]] * k, None, 0


class RoundRecorder:
    """Wraps a drafter and records each round of ``decoding.speculative``: the context length,
    the drafts and (from the next round's context) how many were accepted. ``rounds``: list of
    dicts ``{"position", "drafts", "accepted"}``; the last round's ``accepted`` is filled by
    ``finish(result)``."""

    def __init__(self, drafter):
        self.drafter, self.rounds = drafter, []

    def propose(self, context, k, vocab_size):
        n = context.numel()
        if self.rounds:  # the last round kept its accepted drafts and one token of the target
            self.rounds[-1]["accepted"] = n - self.rounds[-1]["position"] - 1
        drafts = self.drafter.propose(context, k, vocab_size)
        self.rounds.append(dict(position=n, drafts=drafts.flatten().tolist(), accepted=None))
        return drafts

    def finish(self, result):
        if self.rounds:
            self.rounds[-1]["accepted"] = result.accepted - sum(
                r["accepted"] for r in self.rounds[:-1]
            )
        return self.rounds


def _cases(seed=0, n=300):
    g = torch.Generator().manual_seed(seed)
    cases = [([1, 2, 3, 4], 3), ([5, 5], 2), ([1, 2, 3, 1, 2], 4), ([7, 8, 9], 1)]
    for _ in range(n):
        vocab = int(torch.randint(2, 8, (1,), generator=g))
        length = int(torch.randint(2, 40, (1,), generator=g))
        k = int(torch.randint(1, 7, (1,), generator=g))
        cases.append((torch.randint(0, vocab, (length,), generator=g).tolist(), k))
    return cases


def check_prompt_lookup(find_draft, max_ngram=3) -> bool:
    """Exercise (notebook 10): ``find_draft(context: list[int], k: int) -> list[int]``, prompt
    lookup's k drafts, compared with ``PromptLookupDrafter(max_ngram)`` on fixed and random
    contexts. Prints PASS or FAIL with the first mismatch; a stub that returns None or raises
    NotImplementedError is reported as not done."""
    name = "prompt_lookup"
    reference = PromptLookupDrafter(max_ngram)
    for context, k in _cases():
        want = reference.propose(torch.tensor(context), k, 100).tolist()
        try:
            got = find_draft(list(context), k)
        except NotImplementedError:
            got = None
        if got is None:
            print("FAIL prompt lookup: not done yet (find_draft returned None)")
            return record(name, False)
        got = [int(t) for t in (got.tolist() if torch.is_tensor(got) else got)]
        if got != want:
            print(f"FAIL prompt lookup: context {context}, k={k}: expected {want}, got {got}")
            return record(name, False)
    print(f"PASS prompt lookup: {len(_cases())} contexts give the library's drafts")
    return record(name, True)
