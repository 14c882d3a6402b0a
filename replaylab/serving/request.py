"""One request of a serving stream and what happened to it: the "sequence" of nano-vllm's
scheduler / sequence / runner split.

A ``Request`` is what a client sends (a prompt, how many tokens it wants, when it arrived, and
optionally its own drafter for speculative decoding); the scheduler fills in the rest as it
serves it (its slot, its tokens, and the times each token became available).

Glossary (code name -> meaning):
    arrival        seconds on the scheduler's clock when the request reached the server
    admitted_at    when its prefill started (it left the queue)
    token_times    when each output token became available (token 0 from the prefill)
    TTFT           time to first token: token_times[0] - arrival (queueing + prefill)
    TPOT           time per output token after the first:
                   (token_times[-1] - token_times[0]) / (n_out - 1)
    proposed       drafts its drafter proposed; accepted: drafts the target kept
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Request", "WAITING", "RUNNING", "FINISHED", "percentile"]

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)  # requests are compared by identity (the queue removes them by it)
class Request:
    """A request: ``prompt`` (T0,) token ids, ``max_new_tokens`` >= 1 tokens to generate,
    ``arrival`` in seconds on the scheduler's clock, ``drafter`` (optional) with
    ``propose(context (n,), k, vocab) -> (k,)`` for speculative decoding.

    Filled in by the scheduler: ``status`` (waiting / running / finished), ``slot`` (the
    engine slot while running), ``tokens`` (the generated ids, a list of ints),
    ``admitted_at``, ``token_times`` (one per token), ``finished_at``, ``proposed``,
    ``accepted``, ``rounds`` (engine steps it took part in), ``reserved`` (bytes the scheduler
    counts against its budget while it runs), ``prefix_hit`` (the ``PrefixHit`` of its admission
    when the scheduler has a prefix cache), ``admission`` (its ``serving.admission.Admission``
    while an interleaved prefill runs it)."""

    id: int
    prompt: torch.Tensor
    max_new_tokens: int
    arrival: float = 0.0
    drafter: object = None
    status: str = WAITING
    slot: int | None = None
    tokens: list = field(default_factory=list)
    admitted_at: float | None = None
    token_times: list = field(default_factory=list)
    finished_at: float | None = None
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    reserved: int = 0
    prefix_hit: object = None
    admission: object = None

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.numel())

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def context(self) -> torch.Tensor:
        """The prompt and the tokens so far, (T0 + n_out,) on the CPU (what a drafter reads)."""
        return torch.cat([self.prompt.cpu().flatten(), torch.tensor(self.tokens, dtype=torch.long)])

    @property
    def ttft(self) -> float:
        """Seconds from arrival to the first token (queueing and prefill)."""
        if not self.token_times:
            raise ValueError(f"request {self.id}: no token yet, so no time to first token")
        return self.token_times[0] - self.arrival

    @property
    def tpot(self) -> float:
        """Mean seconds per output token after the first; nan for a one-token request."""
        n = len(self.token_times)
        if n < 2:
            return float("nan")
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def acceptance(self) -> float:
        """Accepted / proposed drafts; nan when it never speculated."""
        return self.accepted / self.proposed if self.proposed else float("nan")


def percentile(values, q) -> float:
    """The q-th percentile (0 <= q <= 100) of ``values`` by linear interpolation (numpy's
    default), ignoring NaNs; nan for no values."""
    vals = sorted(v for v in values if v == v)
    if not 0 <= q <= 100:
        raise ValueError(f"q: expected 0 <= q <= 100, got {q}")
    if not vals:
        return float("nan")
    pos = (len(vals) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)
