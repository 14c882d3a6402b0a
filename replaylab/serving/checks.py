"""The engine's input checks: each returns the checked values and changes nothing, so every
public method of ``DecodeEngine`` checks first and mutates after (a refused call leaves every
pool and host number as it was). The argument checks themselves are ``serving.validate``'s.

Shapes: prompt (T0,) or (1, T0); prompts (B, T0); tokens (S, T); counts and keep one int per
slot (or one int for all).
"""

from __future__ import annotations

import numpy as np
import torch

from replaylab.serving.validate import as_int, as_ints, as_token_ids, given

__all__ = ["check_prompt", "check_prompts", "check_slots", "check_step", "per_slot"]


def check_prompt(engine, prompt, name="prompt"):
    """``prompt`` (T0,) or (1, T0) ids of any integer dtype -> (T0,) int64, checked."""
    prompt = as_token_ids(name, prompt, engine.cfg.vocab_size, ("T0",), (1, "T0"))
    prompt = prompt.reshape(-1)
    T0 = prompt.numel()
    if not 1 <= T0 < engine.max_len:
        raise ValueError(f"{name}: length {T0}: expected 1 <= length < max_len={engine.max_len}")
    return prompt


def check_slots(engine, slots, name="slots"):
    """``slots``: distinct live slots (None: every live slot, in order) -> a list."""
    if type(slots) is list and slots and all(type(s) is int for s in slots):  # a scheduler's
        flags, top = engine.live, engine.max_batch
        if len(set(slots)) == len(slots) and all(0 <= s < top and flags[s] for s in slots):
            return list(slots)
    live = engine.slots
    if slots is None:
        if not live:
            raise ValueError(f"{name}: no live sequence: admit one (or prefill) first")
        return live
    if not isinstance(slots, (list, tuple, range, torch.Tensor, np.ndarray)):
        raise TypeError(f"{name}: expected a list of live slots {live}, got {given(slots)}")
    slots = [as_int(name, s, 0, engine.max_batch - 1) for s in slots]
    for s in slots:
        if not engine.live[s]:
            raise ValueError(f"{name}: slot {s} is not live (live slots: {live})")
    if len(set(slots)) != len(slots) or not slots:
        raise ValueError(f"{name}: expected distinct live slots, got {slots}")
    return slots


def check_slot(engine, slot, name="slot"):
    """``slot``: one live slot -> an int."""
    slot = as_int(name, slot, 0, engine.max_batch - 1)
    if not engine.live[slot]:
        raise ValueError(f"{name}: slot {slot} is not live (live slots: {engine.slots})")
    return slot


def per_slot(name, values, slots, low, high):
    """One int per slot (an int for all); each in [low, high] (high may be per slot)."""
    if type(values) is list and len(values) == len(slots):  # ints in range: nothing to name
        highs = high if isinstance(high, list) else [high] * len(values)
        if all(type(v) is int and low <= v <= h for v, h in zip(values, highs)):
            return list(values)
    return as_ints(name, values, [f"slot {s}" for s in slots], low, high)


def check_step(engine, tokens, counts, slots, check):
    """``DecodeEngine.step``'s arguments -> (tokens (S, T) int64, counts list, slots list)."""
    slots = check_slots(engine, slots)
    spec = (("slots", len(slots)), "T")
    tokens = as_token_ids("tokens", tokens, engine.cfg.vocab_size, spec, check_range=check)
    T = tokens.shape[1]
    if not 1 <= T <= engine.max_verify:
        raise ValueError(
            f"tokens: {T} per step, expected 1 <= T <= max_verify="
            f"{engine.max_verify} (the captured verify size)"
        )
    counts = [T] * len(slots) if counts is None else per_slot("counts", counts, slots, 1, T)
    for s, c in zip(slots, counts):
        if engine.pos[s] + c > engine.max_len:
            raise ValueError(
                f"tokens: slot {s} at position {engine.pos[s]} + {c} exceeds "
                f"max_len={engine.max_len}"
            )
        limit = engine._limits.get(s)
        if limit is not None and engine.pos[s] + c > limit:
            raise ValueError(
                f"counts: slot {s} at position {engine.pos[s]} may reach position {limit} "
                f"inside engine.provisional (its next fold); a step of {c} would pass it"
            )
        if c > engine.policy.room(s):
            raise ValueError(
                f"counts: slot {s} may take at most room={engine.policy.room(s)} tokens in this "
                f"step (replay folds its log every L={engine.L} tokens and its ring holds "
                f"log_capacity={engine.capacity} entries after a step's fold), got {c}"
            )
    return tokens, counts, slots


def check_prompts(engine, prompts, n_new=1, name="prompts"):
    """``prompts`` (B, T0) ids for ``prefill`` (B slots, the live ones retired first) and
    ``n_new`` greedy tokens after them -> (prompts int64, n_new)."""
    prompts = as_token_ids(name, prompts, engine.cfg.vocab_size, ("batch", "T0"))
    B, T0 = prompts.shape
    room = engine.max_batch - len(engine.prefilling)
    if not 1 <= B <= room:
        busy = f" - {len(engine.prefilling)} prefilling" if engine.prefilling else ""
        raise ValueError(
            f"{name}: batch {B} does not fit the pools: expected 1 <= batch "
            f"<= max_batch={engine.max_batch}{busy}"
        )
    if not 1 <= T0 < engine.max_len:
        raise ValueError(f"{name}: length {T0}: expected 1 <= length < max_len={engine.max_len}")
    n_new = as_int("n_new", n_new, low=1)
    if T0 + n_new - 1 > engine.max_len:
        raise ValueError(
            f"n_new: {n_new} tokens after a prompt of {T0} need T0 + n_new - 1 = "
            f"{T0 + n_new - 1} positions: expected at most max_len={engine.max_len}"
        )
    return prompts, n_new
