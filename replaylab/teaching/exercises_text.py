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
from replaylab.teaching.exercises_common import whole_number
from replaylab.teaching.grading import describe_exception, guarded, record

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


def _explain_lookup(context, k, max_ngram) -> str:
    """Where the right drafts come from, naming the n-gram and its positions."""
    drafts, source, n = lookup_with_source(context, k, max_ngram)
    length, top = len(context), min(max_ngram, len(context) - 1)
    longer = ", ".join(
        f"the last {m}-gram {context[-m:]} only at the suffix itself (position {length - m})"
        for m in range(top, n, -1)
    )
    if n:
        text = (
            f"the last {n}-gram {context[-n:]} (the suffix, at position {length - n}) occurs "
            f"earlier at position {source - n}, its latest earlier occurrence, so the drafts are "
            f"the ids from position {source}"
            + (" (the last one repeated)" if source + k > length else "")
            + f": {drafts}"
        )
        return text + (f"; longer n-grams do not occur earlier ({longer})" if longer else "")
    return (
        f"no suffix n-gram occurs earlier ({longer}), so the drafts are the last id "
        f"{context[-1]} repeated: {drafts}"
    )


def _copied_from(context, got, max_ngram) -> str | None:
    """Where the learner's drafts ``got`` were copied from, if they follow an occurrence of one
    of the context's last n-grams: 'your drafts follow the 2-gram [1, 2] at position 4'."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = context[-n:]
        for start in range(length - n, -1, -1):
            follow = context[start + n : start + n + len(got)]
            if context[start : start + n] == tail and follow:
                if follow + [follow[-1]] * (len(got) - len(follow)) == got:
                    itself = " (the suffix itself)" if start == length - n else ""
                    return f"your drafts follow the {n}-gram {tail} at position {start}{itself}"
    return None


@guarded("prompt_lookup")
def check_prompt_lookup(find_draft, max_ngram=3) -> bool:
    """Exercise (notebook 10): ``find_draft(context: list[int], k: int) -> list[int]``, prompt
    lookup's k drafts, compared with ``PromptLookupDrafter(max_ngram)`` on fixed and random
    contexts. Prints PASS or FAIL with the first mismatch, naming the n-gram matched and where
    the right drafts come from; a stub that returns None or raises NotImplementedError is
    reported as not done, any other exception as a FAIL on the context where it was raised."""
    name = "prompt_lookup"
    reference = PromptLookupDrafter(max_ngram)

    def fail(message):
        print(f"FAIL prompt lookup: {message}")
        return record(name, False)

    for context, k in _cases():
        want = reference.propose(torch.tensor(context), k, 100).tolist()
        where = f"context {context}, k={k}"
        try:
            got = find_draft(list(context), k)
        except NotImplementedError:
            got = None
        except Exception as err:  # the learner's code raised: report it on this context
            message = f"{where}: {describe_exception(err)}"
            if isinstance(err, IndexError):
                top = min(max_ngram, len(context) - 1)
                message += (
                    f". An IndexError here usually means the search let the suffix match "
                    f"itself: the last {top}-gram {context[-top:]} at position "
                    f"{len(context) - top} is the suffix, nothing follows it; an earlier "
                    f"occurrence starts at most at len(context) - n - 1 = {len(context) - top - 1}"
                )
            return fail(f"{message}. Expected {want}: {_explain_lookup(context, k, max_ngram)}")
        if got is None:
            return fail("not done yet (find_draft returned None)")
        try:
            ids = [whole_number(t) for t in (got.tolist() if torch.is_tensor(got) else got)]
        except (TypeError, ValueError):
            ids = [None]
        if None in ids:
            return fail(f"{where}: expected a list of {k} integer ids, got {got!r}")
        got = ids
        if got != want:
            message = f"{where}: expected {want}, got {got}"
            if len(got) != k:
                message += f" ({len(got)} ids, not k={k})"
            else:
                source = _copied_from(context, got, max_ngram)
                if source is not None:
                    message += f" ({source})"
            return fail(f"{message}; {_explain_lookup(context, k, max_ngram)}")
    print(f"PASS prompt lookup: {len(_cases())} contexts give the library's drafts")
    return record(name, True)
