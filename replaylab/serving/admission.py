"""A prompt admitted a chunk at a time, so a scheduler can run the other slots' decode steps
between its chunks (chunked prefill interleaved with decode).

``DecodeEngine.admit`` prefills a whole prompt before it returns, and every running sequence
waits for it: in a request stream each arrival stalls every decoder for its whole prefill
(measured in ``data/bench_serve_stream.json``). ``Admission`` splits that work. ``engine.begin_admit(prompt)`` claims a slot and
reserves it; each ``advance(n)`` runs the next n prompt tokens through the engine's own
prefill (the same ``_prefill`` ``admit`` runs, continued from where the last chunk stopped);
after the last chunk the slot goes live with the prompt's last logits, as ``admit`` leaves it.

While it is reserved the slot is not live: no other admission takes it, a step cannot name it,
and steps of the live slots leave its pools alone. A step runs every slot below its bucket
(slots not named advance by a count of 0), so the only write it makes to a reserved slot is
its KV rows at the slot's position: that position is parked at ``max_len`` while the slot
prefills, past every row a prompt fills and within the ``max_verify`` rows of padding each slot
has.

Glossary: T0 prompt length, n tokens per chunk, ``done`` tokens prefilled so far.
"""

from __future__ import annotations

import torch

from replaylab.serving.validate import as_int

__all__ = ["Admission", "check_interleaving", "grid_grant"]


class Admission:
    """``prompt`` (T0,) being prefilled into ``slot`` of ``engine`` a chunk at a time (made by
    ``DecodeEngine.begin_admit``). ``done``: tokens prefilled; ``finished``: the slot is live;
    ``logits`` (vocab,): the prompt's last logits once finished."""

    def __init__(self, engine, slot, prompt):
        self.engine, self.slot, self.prompt = engine, slot, prompt
        self.done = 0
        self.logits = None
        self.aborted = False
        # replay's state at ``done`` (the chunks carry it; the checkpoint sits on the grid)
        self._carried = {l: torch.zeros_like(p.state[:1]) for l, p in engine.ssm.items()}

    @property
    def T0(self) -> int:
        return self.prompt.numel()

    @property
    def finished(self) -> bool:
        return self.logits is not None

    @property
    def remaining(self) -> int:
        return self.T0 - self.done

    @torch.no_grad()
    def advance(self, n) -> bool:
        """Prefill the next ``n`` tokens (at most what remains); True when the prompt is done
        and the slot is live."""
        e = self.engine
        if self.finished or self.aborted:
            raise ValueError(
                f"admission of slot {self.slot}: already {'finished' if self.finished else 'aborted'}"
            )
        n = as_int("n", n, low=1)  # tokens
        end = min(self.T0, self.done + n)
        logits = self._prefill_to(end)
        self.done = end
        if self.done == self.T0:
            e.prefilling.discard(self.slot)
            e._go_live(self.slot, self.T0)
            self.logits = logits
            self._finished()
        else:
            e.pos[self.slot] = e.max_len  # parked (module docstring)
        return self.finished

    def _prefill_to(self, end):
        """Prefill prompt tokens [done, end) into the slot: the last logits (vocab,)."""
        return self.engine._prefill(
            self.slot, self.prompt[:end], start=self.done, carried=self._carried
        )

    def _finished(self):
        """Called once, when the slot has gone live (a prefix cache inserts the prompt here)."""

    def abort(self):
        """Give the slot back unfinished (its pools are cleared when it is next claimed)."""
        e = self.engine
        if self.finished:
            raise ValueError(f"admission of slot {self.slot}: finished; retire the slot instead")
        if self.aborted:
            return
        self.aborted = True
        e.prefilling.discard(self.slot)
        e.pos[self.slot] = e.log_len[self.slot] = e.head[self.slot] = 0


def check_interleaving(engine, prefix, per_step):
    """Refuse, naming the values, a ``prefill_per_step`` of ``per_step`` tokens under which a
    prefix cache under ``resume="chunk"`` would insert blocks prefilled off the engine's chunk
    grid (fewer than ``prefill_chunk`` tokens a step)."""
    if prefix is None or per_step is None or getattr(prefix, "resume_step", 1) == 1:
        return
    if per_step < engine.prefill_chunk:
        raise ValueError(
            f"prefill_per_step: a prefix cache under resume='chunk' needs its blocks prefilled "
            f"on the engine's chunk grid, so at least prefill_chunk={engine.prefill_chunk} "
            f"tokens a step; got {per_step}"
        )


def grid_grant(admission, left, per_step, chunk) -> int:
    """Tokens ``admission`` may prefill this step out of ``left`` (a step prefills at most
    ``per_step``): all it has left if they fit, else, where ``per_step`` >= ``chunk``, up to
    the last multiple of ``chunk`` within reach, so its chunks end where a cold admission's do
    (0: none in reach, wait a step); else ``left``."""
    n = min(left, admission.remaining)
    if n < admission.remaining and per_step >= chunk:
        n = max(0, (admission.done + n) // chunk * chunk - admission.done)
    return n
