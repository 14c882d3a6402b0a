"""The per-slot rollback cursor: what a rollback does to the host's view of each slot.

After a step of ``last[i]`` tokens, slot i keeps the first ``keep[i]`` of them (the pending
token and the accepted drafts, 1 <= keep[i] <= last[i]) and drops ``last[i] - keep[i]``. Under
replay nothing but numbers move: the slot's position and its log length go back by what was
dropped (the entries past the new log length are overwritten by the next step); the ring's
head and the checkpoint stay where they are. ``DecodeEngine.rollback`` applies exactly this to
``engine.pos``, ``engine.log_len`` and ``engine.last`` (and, under snapshot and recompute,
copies state as well).

A draft model's engine drafts past its sequences' true tokens and gives the drafts back after
the round (``DecodeEngine.provisional``): again a cursor move, valid while the slot's
checkpoint stays at or before the position it returns to. ``provisional_room`` is how many
tokens a slot may take for that: up to its next fold after the one its held log may need.

Glossary: pos (tokens a slot holds, the next token's position), log_len (replay: entries in the
log since the checkpoint), last (tokens the slot took in the last step), keep (tokens of that
step it keeps), L (replay's log length: a fold every L tokens).
"""

from __future__ import annotations

from replaylab.validation import as_int

__all__ = ["rollback_cursor", "provisional_room", "held_after_fold"]


def held_after_fold(log_len, L):
    """Entries a replay log of ``log_len`` still holds once the next step has folded: a log of
    L or more entries folds its oldest L first, a shorter one none."""
    return log_len if log_len < L else log_len - L


def rollback_cursor(pos, log_len, last, keep):
    """The cursor after a rollback, per slot: lists ``pos``, ``log_len``, ``last``, ``keep``
    (one int per slot; ``log_len`` None where the strategy keeps no log) -> (new pos, new
    log_len, new last), three new lists (the second None with ``log_len``).

    Slot i drops ``last[i] - keep[i]`` tokens: its position and log length go back by that
    much and its last step now counts ``keep[i]`` tokens. Raises ValueError naming the slot
    when keep[i] is outside 1 .. last[i], when the slot holds fewer than last[i] tokens or log
    entries (its last step's tokens are in both), or when the lists differ in length; the
    inputs are never modified."""
    n = len(pos)
    lists = (("log_len", log_len), ("last", last), ("keep", keep))
    for name, values in lists if log_len is not None else lists[1:]:
        if len(values) != n:
            raise ValueError(f"{name}: expected {n} values, one per slot, got {len(values)}")
    new_pos, new_log, new_last = [], [], []
    for i in range(n):
        lst, k = last[i], keep[i]
        if not (type(lst) is int and type(k) is int and 1 <= k <= lst):  # else: name it
            lst = as_int(f"last of slot {i}", lst, low=1)
            k = as_int(f"keep of slot {i}", k, 1, lst)
        drop = lst - k
        if type(pos[i]) is not int:
            as_int(f"pos of slot {i}", pos[i])  # a float or a string: named
        if not pos[i] >= lst:
            raise ValueError(
                f"slot {i}: pos={pos[i]} but its last step took last={lst} tokens; expected "
                "pos >= last (the slot holds the tokens of its last step)"
            )
        new_pos.append(pos[i] - drop)
        if log_len is not None:
            if type(log_len[i]) is not int:
                as_int(f"log_len of slot {i}", log_len[i])
            if not log_len[i] >= lst:
                raise ValueError(
                    f"slot {i}: log_len={log_len[i]} but its last step took last={lst} tokens; "
                    "expected log_len >= last (a step's tokens are logged after any fold)"
                )
            new_log.append(log_len[i] - drop)
        new_last.append(k)
    return new_pos, None if log_len is None else new_log, new_last


def provisional_room(pos, log_len, L, max_len, capacity=None):
    """Tokens a slot at ``pos`` with ``log_len`` entries since its checkpoint (0 <= log_len
    <= capacity, the log ring's rows: L by default, at most 2L) may take and still give back
    by a cursor move: its log holds L - log_len more before the next fold (a log of L or more
    entries is folded by the next step, whose fold holds only true tokens: then L - (log_len
    - L)), and never past ``max_len``."""
    L = as_int("L", L, low=1)
    capacity = L if capacity is None else as_int("capacity", capacity, L, 2 * L)
    log_len = as_int("log_len", log_len, 0, capacity)
    pos = as_int("pos", pos, low=log_len)
    max_len = as_int("max_len", max_len, low=pos)
    return min(L - held_after_fold(log_len, L), max_len - pos)
