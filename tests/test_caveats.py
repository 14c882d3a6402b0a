"""The figures of the seed article's caveats and the roofline (notebooks 08, 09 and 15): each
shows the numbers it is given, no more, no fewer."""

import math

from replaylab import costmodel as cm
from replaylab.results import load_bench
from replaylab.shapes import PUBLISHED_SHAPES
from replaylab.teaching.plotting import (
    attention_gain_figure,
    log_length_per_workload_figure,
    replay_frontier_figure,
    roofline_bytes_figure,
)

NEMO = PUBLISHED_SHAPES["Nemotron-H 8B"]


def test_roofline_bars_stack_to_the_bytes_per_token():
    kw = dict(context_len=8192, log_length=16, interval=16, weight_bytes=16e9)
    parts = {
        (b, s): cm.decode_token_bytes(NEMO, s, batch=b, **kw)
        for b in (1, 64)
        for s in ("snapshot", "replay")
    }
    fig = roofline_bytes_figure(parts)
    for col, b in enumerate((1, 64)):
        axis = "x" if col == 0 else f"x{col + 1}"
        bars = [t for t in fig.data if t.xaxis == axis]
        for i, s in enumerate(("snapshot", "replay")):
            stacked = sum(t.y[i] for t in bars) * 2**20
            assert math.isclose(stacked, sum(parts[b, s].values()), rel_tol=1e-9)
    # replay writes the state only when it folds: its write bar is 1/L of snapshot's
    write = next(t for t in fig.data if t.name == "state write" and t.xaxis == "x2")
    assert math.isclose(write.y[1] * 16, write.y[0])


def test_frontier_figure_draws_the_model_map_and_every_measured_point():
    bench = load_bench()
    measured = cm.measured_replay_vs_ssu(bench)
    grid = [
        cm.replay_vs_ssu(b, L, bandwidth=4e12, H=128, P=64, N=128, G=8)
        for b in (1, 8, 64)
        for L in (1, 16, 256)
    ]
    fig = replay_frontier_figure(grid, measured, bytes_frontier=198.0)
    contour = fig.data[1]
    assert contour.type == "contour" and contour.contours.start == contour.contours.end == 1
    points = [t for t in fig.data if t.type == "scatter" and t.mode == "markers+text"]
    assert sum(len(t.x) for t in points) == len(measured)
    pays = next(t for t in points if "pays" in t.name)
    assert all(float(s) >= 1 for s in pays.text)


def test_workload_figure_marks_each_optimum_at_its_minimum():
    m = cm.model_costs(NEMO, cm.Workload(), 8e9)
    curves = {w: [(L, cm.log_length_cost(m, w, L)) for L in range(2, 65)] for w in cm.WORKLOADS}
    optima = {w: cm.best_log_length(m, w, range(2, 65)) for w in cm.WORKLOADS}
    fig = log_length_per_workload_figure(curves, optima)
    stars = [t for t in fig.data if t.mode == "markers+text"]
    assert [t.x[0] for t in stars] == [optima[w] for w in cm.WORKLOADS]
    assert all(t.y[0] == 1 for t in stars)  # relative: the optimum is each curve's minimum
    assert len(set(optima.values())) == 3


def test_attention_gain_figure_carries_model_and_live_rows():
    rows = cm.gain_vs_attention(["MMM*", "M*M*"], NEMO, 8e9)
    live = [dict(attention_share=0.25, gain_predicted=2.0, gain_measured=2.0, pattern="MMM*")]
    fig = attention_gain_figure(rows, live)
    assert list(fig.data[0].y) == [r["memory_gain"] for r in rows]
    assert list(fig.data[3].y) == [2.0]
