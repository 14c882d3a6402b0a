"""The byte budget of continuous batching (``serving.scheduler``): what one engine slot holds
(``SlotBytes``, ``slot_bytes``), what a request holds while it runs (``request_bytes``), and
how many waiting requests fit now (``admissible``).

One byte budget covers KV + recurrent state + logs. A request holds (``request_bytes``):

    recurrent   its slot's Mamba-2 pools, from the engine: state, conv window, the draft
                windows, and per strategy the per-draft states (snapshot), the saved state
                (recompute) or the log ring (replay)
    KV          kv_token bytes x the rows it can write: T0 + max_new_tokens - 1 + k (the
                last verify writes k padding rows past the last kept token)

(``kv_accounting="slot"`` counts the engine's whole KV row of the slot instead: the engine
preallocates max_len + max_verify rows per slot; a paged KV allocator would hold only the
request's own.) The budget binds the three strategies differently: a snapshot slot carries
k + 1 copies of the state, a replay slot a log of L entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from replaylab.validation import as_int

__all__ = ["SlotBytes", "slot_bytes", "request_bytes", "admissible"]

BOOLS = (torch.bool, np.dtype(bool))


@dataclass(frozen=True)
class SlotBytes:
    """What one engine slot holds, from the engine's pools: ``recurrent`` bytes (every SSM
    layer's pools of the slot), ``kv_token`` bytes per KV row (every attention layer, K and
    V), ``kv_rows`` rows per slot (max_len + max_verify)."""

    recurrent: int
    kv_token: int
    kv_rows: int

    @property
    def slot(self) -> int:
        """The whole slot: recurrent + every KV row (``engine.nbytes_per_slot()``)."""
        return self.recurrent + self.kv_token * self.kv_rows


def slot_bytes(engine) -> SlotBytes:
    """``SlotBytes`` of a ``DecodeEngine``'s pools."""
    recurrent = sum(p.nbytes_per_slot() for p in engine.ssm.values())
    kv = sum(p.nbytes_per_slot() for p in engine.kv.values())
    rows = engine.max_len + engine.max_verify
    return SlotBytes(recurrent, kv // rows, rows)


def request_bytes(sizes: SlotBytes, prompt_len, max_new_tokens, k=0, kv_accounting="request"):
    """Bytes a request of ``prompt_len`` prompt tokens and ``max_new_tokens`` outputs holds
    while it runs (see the module docstring): recurrent + kv_token x (prompt_len +
    max_new_tokens - 1 + k), or the whole slot under ``kv_accounting="slot"``."""
    if kv_accounting == "slot":
        return sizes.slot
    if kv_accounting != "request":
        raise ValueError(f"kv_accounting: expected 'request' or 'slot', got {kv_accounting!r}")
    prompt_len = as_int("prompt_len", prompt_len, low=1)
    max_new_tokens = as_int("max_new_tokens", max_new_tokens, low=1)
    rows = prompt_len + max_new_tokens - 1 + as_int("k", k, low=0)
    return sizes.recurrent + sizes.kv_token * rows


def _is_bytes(value) -> bool:
    """A byte count: a number >= 0, a 0-d tensor or array too (not NaN, a bool or a text)."""
    if isinstance(value, (str, bytes, bool)) or getattr(value, "dtype", None) in BOOLS:
        return False
    if getattr(value, "ndim", 0) != 0:  # an array or tensor of one element or more
        return False
    try:
        return float(value) >= 0
    except (TypeError, ValueError):  # a list, None, a tensor of many elements
        return False


def admissible(needs, used, budget, free_slots) -> int:
    """The admission rule: how many requests from the head of the queue to admit now.

    needs: bytes of each waiting request that has arrived, in queue order (FCFS); used: bytes
    the running requests hold; budget: the byte budget; free_slots: engine slots free. Returns
    the largest n with n <= free_slots and used + sum(needs[:n]) <= budget. First come, first
    served: a request that does not fit blocks the ones behind it (no overtaking, so a large
    request is not starved by small ones). A negative count or byte size it reads raises
    ValueError naming it."""
    free_slots = as_int("free_slots", free_slots, low=0)
    for name, value in (("used", used), ("budget", budget)):
        if not _is_bytes(value):
            raise ValueError(f"admissible: expected {name} >= 0 bytes, got {value!r}")
    n, total = 0, used
    for need in needs:
        if n >= free_slots:
            break
        if not _is_bytes(need):
            raise ValueError(f"admissible: needs[{n}] = {need!r}; expected bytes >= 0")
        if total + need > budget:
            break
        total += need
        n += 1
    return n
