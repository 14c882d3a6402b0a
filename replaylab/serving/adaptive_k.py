"""Each speculation round's number of drafts, chosen for the batch it runs
(``Scheduler(..., k=k_max, adaptive_k=True)``).

A round with k drafts, each one right with probability a once the ones before it were (the
per-draft acceptance), keeps on average

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens a sequence (1 + ``costmodel.expected_accepted``), and costs one round of T = k + 1
tokens a slot, t(bucket, T) seconds. The rate is E(k) / t(bucket, k + 1); k = 0 is plain decode
(E = 1, T = 1). Where the weights' bytes bind, t barely grows with T and the largest k wins; at
large batches a verify of T rows a slot costs nearly T steps (the FLOPs bind), and a small k,
or none, wins. Both a and t are
measured while serving, so the choice follows the drafter and the machine:

- a: ``accepted / (accepted + rejections)`` over the rounds so far (a rejection: a sequence
  that kept fewer drafts than it proposed), the estimate of a geometric law; older rounds
  count less (``decay`` per round), and a prior of one accepted draft and one rejection starts
  it at 1/2.
- t(bucket, T): the fastest of the last ``samples`` rounds of that bucket and width (the first
  one may include a CUDA graph's capture). A width with fewer than ``samples_needed`` rounds
  at that bucket is tried first, the largest k first.
- While k = 0 wins, nothing is learnt about a, so every ``probe_every`` rounds one round with
  k = 1 is run.

The tokens do not depend on the choice: every round keeps the target's greedy tokens.
"""

from __future__ import annotations

from collections import defaultdict, deque

from replaylab.costmodel import expected_accepted
from replaylab.serving.validate import as_int

__all__ = ["best_k", "AdaptiveK"]


def best_k(acceptance, seconds):
    """The k in 0 .. len(seconds) - 1 with the highest rate E(k) / seconds[k], where
    ``seconds[k]`` is a round's time with k drafts (T = k + 1) and E(k) = 1 +
    ``costmodel.expected_accepted(k, acceptance)``; the smaller k on a tie."""
    rates = [(1 + expected_accepted(k, acceptance)) / s for k, s in enumerate(seconds)]
    return max(range(len(rates)), key=lambda k: (rates[k], -k))


class AdaptiveK:
    """The k of each round, at most ``k_max``, from the acceptance and the round times measured
    so far (module docstring). ``choose(bucket)`` before a round, then ``observe(bucket, T,
    seconds, proposed, accepted)`` after it (proposed, accepted: per sequence)."""

    def __init__(self, k_max, samples=8, samples_needed=2, decay=0.98, probe_every=16):
        self.k_max = as_int("k_max", k_max, low=1)
        self.samples = as_int("samples", samples, low=1)
        self.samples_needed = as_int("samples_needed", samples_needed, 1, self.samples)
        if not 0 < decay <= 1:
            raise ValueError(f"decay: expected a number in (0, 1], got {decay!r}")
        self.decay = decay
        self.probe_every = as_int("probe_every", probe_every, low=1)
        self.accepted, self.rejected = 1.0, 1.0  # the prior: a = 1/2
        self.times = defaultdict(lambda: deque(maxlen=self.samples))  # (bucket, T) -> seconds
        self.plain_rounds = 0  # rounds with k = 0 since the last one that drafted

    @property
    def acceptance(self):
        """The per-draft acceptance estimated so far (a)."""
        return self.accepted / (self.accepted + self.rejected)

    def choose(self, bucket):
        """The k of the next round at ``bucket``: an untried width first (largest k first),
        else ``best_k``; k = 1 once in every ``probe_every`` rounds of plain decode."""
        for k in range(self.k_max, -1, -1):
            if len(self.times[bucket, k + 1]) < self.samples_needed:
                return k
        k = best_k(self.acceptance, [min(self.times[bucket, k + 1]) for k in range(self.k_max + 1)])
        if k == 0 and self.plain_rounds + 1 >= self.probe_every:
            return 1
        return k

    def observe(self, bucket, T, seconds, proposed=(), accepted=()):
        """A round of width ``T`` at ``bucket`` took ``seconds``; each sequence proposed
        ``proposed[i]`` drafts and kept ``accepted[i]`` of them."""
        self.times[bucket, T].append(seconds)
        self.plain_rounds = self.plain_rounds + 1 if T == 1 else 0
        if T == 1:
            return
        kept = sum(int(a) for a in accepted)
        rejections = sum(int(a) < int(p) for p, a in zip(proposed, accepted))
        self.accepted = self.decay * self.accepted + kept
        self.rejected = self.decay * self.rejected + rejections
