"""A draft model's engine drafting past its sequences' true tokens and giving the drafts back
(``DecodeEngine.provisional``): under replay, a cursor move (``serving.cursor``).

Inside the block the slots' steps are kept as any step; when it ends their positions and log
lengths move back to where they were on entry and their conv windows are copied back. The
checkpoint stays valid because a slot takes at most ``provisional_room(slot)`` tokens inside
(``step`` refuses more), so the only fold inside folds entries held on entry. A slot retired
inside is left as it is, even when a new sequence takes it inside. Blocks do not nest.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from replaylab.serving.checks import check_slots

__all__ = ["provisional"]


@contextmanager
def provisional(engine, slots):
    """Steps of ``slots`` inside the block are given back when it ends; yields the room per
    slot (a list)."""
    e = engine
    if e.strategy != "replay":
        raise ValueError(
            f"provisional: the engine's {e.strategy!r} strategy cannot give back more "
            f"than its last step; use strategy='replay' (a cursor move){e.strategy_hint}"
        )
    if e._limits:
        raise ValueError(
            f"provisional: slots {sorted(e._limits)} are inside a provisional block "
            "already; blocks do not nest"
        )
    slots = check_slots(e, slots)
    start = [e.pos[s] for s in slots]
    room = [e.provisional_room(s) for s in slots]
    index = torch.tensor(slots, device=e.device)
    windows = {l: pool.conv[index].clone() for l, pool in e.ssm.items()}
    e._limits = dict(zip(slots, (p + r for p, r in zip(start, room))))
    try:
        yield room
    finally:
        kept = [i for i, s in enumerate(slots) if s in e._limits]  # not retired inside
        e._limits = {}
        if kept:
            back = torch.tensor(kept, device=e.device)
            for l, pool in e.ssm.items():
                pool.conv[index[back]] = windows[l][back]
        for i in kept:
            e.table.rewind(slots[i], e.pos[slots[i]] - start[i])
