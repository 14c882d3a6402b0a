"""Each speculation round's number of drafts, chosen for the batch it runs
(``Scheduler(..., k=k_max, adaptive_k=True)``).

A round with k drafts, each one right with probability a once the ones before it were (the
per-draft acceptance), keeps on average

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens a sequence (1 + ``costmodel.expected_accepted``; under replay with a ring of L rows
the fold grid clips some rounds, which ``AdaptiveK.for_engine`` counts with
``costmodel.tokens_per_round``), and costs one round of T = k + 1 tokens a slot,
t(bucket, T) seconds. The rate is
E(k) / t(bucket, k + 1); k = 0 is plain decode (E = 1, T = 1). Where the weights' bytes bind,
t barely grows with T and the largest k wins; at large batches a verify of T rows a slot costs
nearly T steps (the FLOPs bind), and a small k, or none, wins. Both a and t are measured while
serving, so the choice follows the drafter and the machine:

- a: ``accepted / (accepted + rejections)`` over the drafting rounds so far (a rejection: a
  sequence that kept fewer drafts than it proposed), the estimate of a geometric law; each
  drafting round weighs the earlier ones by ``decay``, and a prior of one accepted draft and
  one rejection starts it at 1/2.
- t(bucket, T): the median of the last ``samples`` rounds of that bucket and width, leaving out
  the first round of each (it may include a CUDA graph's capture). Each width is tried first,
  the largest k first, until it has ``samples_needed`` rounds after that first one.
- Every ``refresh_every`` rounds at a bucket, the width timed longest ago runs once (other than
  the best): round times drift, and while k = 0 wins nothing else would be learnt about a.

The tokens do not depend on the choice: every round keeps the target's greedy tokens.
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics
from collections import defaultdict, deque

from replaylab.costmodel import expected_accepted, tokens_per_round
from replaylab.serving.validate import as_int, given
from replaylab.validation import as_real

__all__ = ["best_k", "AdaptiveK", "geometric_tokens", "policy_for"]


def geometric_tokens(k, acceptance):
    """E(k) = 1 + a + ... + a^k, the tokens a round of k drafts keeps (none clipped)."""
    return 1 + expected_accepted(k, acceptance)


def _checked_pair(i, proposed, accepted, T):
    """Sequence i's (proposed, accepted) drafts as ints, 0 <= accepted <= proposed < T."""
    proposed = as_int(f"proposed[{i}]", proposed, 0, T - 1)
    return proposed, as_int(f"accepted[{i}]", accepted, 0, proposed)


def _is_time(s):
    return isinstance(s, numbers.Real) and not isinstance(s, bool) and 0 < s < math.inf


def best_k(acceptance, seconds, tokens=geometric_tokens):
    """The k in 0 .. len(seconds) - 1 with the highest rate ``tokens(k, acceptance) /
    seconds[k]``, where ``seconds[k]`` is a round's time with k drafts (T = k + 1) and
    ``tokens`` E(k) (default: 1 + a + ... + a^k); the smaller k on a tie."""
    seconds = seconds.tolist() if hasattr(seconds, "tolist") else list(seconds)  # arrays, tensors
    if not seconds or not all(map(_is_time, seconds)):
        raise ValueError(f"seconds: expected one finite time > 0 per k = 0, 1, ..., got {seconds}")
    rates = [tokens(k, acceptance) / s for k, s in enumerate(seconds)]
    return max(range(len(rates)), key=lambda k: (rates[k], -k))


class AdaptiveK:
    """The k of each round, at most ``k_max``, from the acceptance and the round times measured
    so far (module docstring). ``choose(bucket)`` before a round, then ``observe(bucket, T,
    seconds, proposed, accepted)`` after it (proposed, accepted: per sequence). ``tokens``:
    E(k) as a function of (k, a) (default ``geometric_tokens``)."""

    def __init__(
        self, k_max, samples=8, samples_needed=1, decay=0.98, refresh_every=16,
        tokens=geometric_tokens,
    ):  # fmt: skip
        self.k_max = as_int("k_max", k_max, low=1)
        self.samples = as_int("samples", samples, low=1)
        self.samples_needed = as_int("samples_needed", samples_needed, 1, self.samples)
        self.decay = as_real("decay", decay, above=0, high=1)  # numpy float32 was refused
        self.refresh_every = as_int("refresh_every", refresh_every, low=2)
        if not callable(tokens):
            raise TypeError(f"tokens: expected a function of (k, acceptance), got {tokens!r}")
        self.tokens = tokens
        self.accepted, self.rejected = 1.0, 1.0  # the prior: a = 1/2
        self.times = defaultdict(lambda: deque(maxlen=self.samples))  # (bucket, T) -> seconds
        self.first_seen = set()  # (bucket, T) whose first round (left out) has run
        self.last_timed = {}  # (bucket, T) -> the bucket's round count when it last ran
        self.rounds = defaultdict(int)  # bucket -> rounds run there

    @classmethod
    def for_engine(cls, engine, k_max, **settings):
        """An ``AdaptiveK`` for ``engine`` (a ``DecodeEngine``): under replay its E(k) counts
        the drafts the fold grid clips (``costmodel.tokens_per_round`` with the engine's L and
        log ring, a to two decimals, cached), else 1 + a + ... + a^k."""
        if "tokens" in settings:
            raise TypeError(
                "tokens: for_engine chooses E(k) from the engine; build AdaptiveK itself"
            )
        if engine.strategy != "replay":
            return cls(k_max, **settings)
        L, capacity = engine.L, engine.capacity

        @functools.lru_cache(maxsize=4096)
        def clipped(k, acceptance):
            return tokens_per_round(k, acceptance, L, capacity)

        def tokens(k, acceptance):  # the cache keyed by a to two decimals
            return clipped(k, round(acceptance, 2))

        tokens.cache_info = clipped.cache_info
        return cls(k_max, tokens=tokens, **settings)

    @property
    def acceptance(self):
        """The per-draft acceptance estimated so far (a)."""
        return self.accepted / (self.accepted + self.rejected)

    def round_seconds(self, bucket):
        """t(bucket, k + 1) for k = 0 .. k_max (medians; None where not yet measured)."""
        out = []
        for k in range(self.k_max + 1):
            times = self.times[bucket, k + 1]
            out.append(statistics.median(times) if len(times) >= self.samples_needed else None)
        return out

    def choose(self, bucket):
        """The k of the next round at ``bucket``: an unmeasured width first (largest k first),
        else the best rate, except every ``refresh_every``-th round the width timed longest
        ago."""
        seconds = self.round_seconds(bucket)
        for k in range(self.k_max, -1, -1):
            if seconds[k] is None:
                return k
        best = best_k(self.acceptance, seconds, self.tokens)
        if (self.rounds[bucket] + 1) % self.refresh_every == 0:
            others = [k for k in range(self.k_max + 1) if k != best]
            return min(others, key=lambda k: self.last_timed.get((bucket, k + 1), -1))
        return best

    def observe(self, bucket, T, seconds, proposed=(), accepted=()):
        """A round of width ``T`` (1 .. k_max + 1) at ``bucket`` took ``seconds``; sequence i
        proposed ``proposed[i]`` drafts and kept ``accepted[i]`` of them."""
        T = as_int("T", T, 1, self.k_max + 1)
        if not _is_time(seconds):
            raise ValueError(f"seconds: expected a finite time > 0, got {seconds!r}")
        proposed, accepted = list(proposed), list(accepted)
        if len(proposed) != len(accepted):
            raise ValueError(
                f"proposed, accepted: one of each per sequence, got {len(proposed)} and "
                f"{len(accepted)}"
            )
        pairs = list(zip(proposed, accepted))
        if not all(type(p) is int and type(a) is int and 0 <= a <= p < T for p, a in pairs):
            pairs = [_checked_pair(i, p, a, T) for i, (p, a) in enumerate(pairs)]
        key = bucket, T
        if key in self.first_seen:
            self.times[key].append(seconds)
        self.first_seen.add(key)
        self.last_timed[key] = self.rounds[bucket]
        self.rounds[bucket] += 1
        if T > 1:
            self.accepted = self.decay * self.accepted + sum(a for _, a in pairs)
            self.rejected = self.decay * self.rejected + sum(a < p for p, a in pairs)


def policy_for(adaptive_k, k, engine):
    """``Scheduler``'s ``adaptive_k`` with its k -> None (k drafts every round), or the
    ``AdaptiveK`` choosing each round's (``True``: ``AdaptiveK.for_engine(engine, k)``)."""
    if adaptive_k is False:
        return None
    if adaptive_k is True:
        if not k:
            raise ValueError("adaptive_k: choosing k per round needs k >= 1 (the most), got k=0")
        return AdaptiveK.for_engine(engine, k)
    if isinstance(adaptive_k, AdaptiveK):
        if adaptive_k.k_max != k:
            raise ValueError(
                f"adaptive_k: its k_max={adaptive_k.k_max} must equal the scheduler's k={k}"
            )
        return adaptive_k
    raise TypeError(f"adaptive_k: expected True, False or an AdaptiveK, got {given(adaptive_k)}")
