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


def test_acceptance_explorer_panels_do_not_overlap_and_axes_stay_put():
    ex = AcceptanceExplorer(acceptance=0.5, k=4)
    left, right = ex.figure.layout.xaxis.domain, ex.figure.layout.xaxis2.domain
    assert left[1] < right[0]  # two panels side by side, not two axes over each other
    assert ex.figure.data[0].yaxis != ex.figure.data[1].yaxis
    ranges = (ex.figure.layout.yaxis.range, ex.figure.layout.yaxis2.range)
    for a, k in ((0.0, 1), (1.0, 16), (0.35, 7)):
        ex.controls["acceptance"].value, ex.controls["k"].value = a, k
        assert (ex.figure.layout.yaxis.range, ex.figure.layout.yaxis2.range) == ranges
        assert max(ex.figure.data[0].y) <= ranges[0][1]
        assert max(ex.figure.data[1].y) <= ranges[1][1]
    # one color per strategy, the same in both panels
    colors = list(ex.figure.data[0].marker.color)
    assert len(set(colors)) == len(cm.STRATEGIES) and colors == list(ex.figure.data[1].marker.color)


def test_interval_explorer_axis_reads_in_powers_of_two_and_stays_put():
    ex = IntervalExplorer(n=64, interval=8)
    assert list(ex.figure.layout.xaxis.tickvals) == [1, 2, 4, 8, 16, 32, 64]
    fixed = ex.figure.layout.yaxis.range
    ex.controls["interval"].value = 1
    assert ex.figure.layout.yaxis.range == fixed and ex.figure.data[2].y[0] <= fixed[1]
    assert not any("`" in (t.name or "") for t in ex.figure.data)


def test_budget_explorer_axis_covers_the_largest_budget():
    ex = BudgetExplorer(budget_gb=40)
    fixed = ex.figure.layout.yaxis.range
    ex.controls["budget_gb"].value = 141
    assert ex.figure.layout.yaxis.range == fixed and max(ex.figure.data[0].y) <= fixed[1]
