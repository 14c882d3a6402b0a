"""Checks of notebook 07 (speculative rollback): when recompute stops paying, from the cost
model at ``AcceptanceExplorer``'s defaults, and tokens per round with falling acceptance.

Glossary: k, the drafts per round; acceptance, the probability a draft is accepted; a round
yields 1 + E[accepted drafts] tokens.
"""

from __future__ import annotations

from replaylab.teaching.exercises_common import _answer
from replaylab.teaching.grading import guarded


def recompute_speedup(acceptance, k):
    """Recompute's predicted speedup over plain decoding in ``AcceptanceExplorer``'s default
    setting (its shape, parameter count, hardware, batch and interval), computed by
    ``replaylab.costmodel`` without building the widget."""
    import inspect

    from replaylab import costmodel as cm
    from replaylab.teaching.widgets import AcceptanceExplorer

    d = {n: p.default for n, p in inspect.signature(AcceptanceExplorer).parameters.items()}
    hardware = d["hardware"] or cm.HARDWARE["H200"]
    w = cm.Workload(batch=d["batch"], k=k, acceptance=acceptance, interval=d["interval"])
    plain = cm.plain_decode_seconds_per_token(d["shape"], w, hardware, d["n_params"])
    out = cm.predict(d["shape"], w, hardware, d["n_params"])
    return plain / out["recompute"]["seconds_per_token"]


@guarded("acceptance where recompute stops paying (k={k})")
def check_recompute_break_even(answer, k=12) -> bool:
    """Notebook 07: on the explorer's slider grid (acceptance 0.00, 0.05, ..., 1.00), the
    highest acceptance at which recompute's predicted speedup over plain decoding is below 1
    for draft length k=12 (AcceptanceExplorer's defaults otherwise). At k = 12 the grid
    points either side of the crossing are 5% and 9% from 1 (at k = 8 one was 0.1% above it,
    which the explorer's bars cannot show)."""
    below = [i / 20 for i in range(21) if recompute_speedup(i / 20, k) < 1]
    want = max(below) if below else None
    return _answer(
        f"acceptance where recompute stops paying (k={k})",
        None if answer is None else round(float(answer), 2),
        want,
        f"move the acceptance slider at k={k} and read recompute's bar",
        rel=1e-9,
    )


@guarded("tokens per round with falling acceptance")
def check_tokens_per_round(answer, acceptance=(0.9, 0.8, 0.6, 0.3)) -> bool:
    """Notebook 07: tokens per round when draft i is accepted with probability acceptance[i]
    and a rejection ends the round: 1 + E[accepted drafts]."""
    from replaylab.costmodel import expected_accepted

    want = 1 + expected_accepted(len(acceptance), acceptance)
    return _answer(
        "tokens per round with falling acceptance",
        answer,
        float(want),
        "draft i counts only if drafts 1..i are all accepted: add the running products",
        rel=1e-3,  # three decimals
    )
