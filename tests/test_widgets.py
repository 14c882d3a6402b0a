"""The explorers without a browser: set a control, read the figure, compare with the model."""

import pytest

from replaylab import costmodel as cm
from replaylab.widgets import AcceptanceExplorer, BudgetExplorer, IntervalExplorer


def test_interval_explorer_moves_its_point_as_the_model_says():
    ex = IntervalExplorer(n=32, interval=4)
    before = (ex.figure.data[2].x[0], ex.figure.data[2].y[0])
    ex.controls["interval"].value = 16
    t = cm.interval_tradeoff(32, 16)
    assert (ex.figure.data[2].x[0], ex.figure.data[2].y[0]) == (
        t["states_kept"],
        t["steps_per_restore"],
    )
    assert (ex.figure.data[2].x[0], ex.figure.data[2].y[0]) != before
    # no schedule beats the optimum: every interval point lies on or above the frontier
    frontier = dict(zip(ex.figure.data[0].x, ex.figure.data[0].y))
    for kept, steps in zip(ex.figure.data[1].x, ex.figure.data[1].y):
        if kept in frontier:
            assert steps >= frontier[kept] - 1e-9


def test_acceptance_explorer_follows_the_cost_model():
    ex = AcceptanceExplorer(acceptance=0.5, k=4)
    low = list(ex.figure.data[0].y)
    ex.controls["acceptance"].value = 0.95
    high = list(ex.figure.data[0].y)
    assert all(h > l for h, l in zip(high, low))  # more accepted drafts, more speedup
    assert high == pytest.approx([v[0] for v in ex.predictions().values()])
    ex.controls["k"].value = 8
    assert list(ex.figure.data[0].y) != high


def test_budget_explorer_counts_sequences():
    ex = BudgetExplorer(budget_gb=40)
    small = list(ex.figure.data[0].y)
    ex.controls["budget_gb"].value = 120
    big = list(ex.figure.data[0].y)
    assert all(b > s for b, s in zip(big, small))
    assert big == [ex.fits()[n] for n in cm.STRATEGIES]
    replay, snapshot = big[2], big[0]
    assert replay > snapshot
