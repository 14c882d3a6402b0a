"""The explorers without a browser: set a control, read the figure, compare with the model."""

import pytest

from replaylab import costmodel as cm
from replaylab.teaching.widgets import AcceptanceExplorer, BudgetExplorer, IntervalExplorer


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


# --- the log-length explorer (notebook 06) ---------------------------------------------------


def _legend_colors(fig):
    """The colour of every trace the legend shows."""
    out = []
    for t in fig.data:
        if t.showlegend is False:
            continue
        color = t.marker.color if t.mode and "markers" in t.mode else t.line.color
        out.append(color)
    return out


def _log_explorer(**kw):
    from replaylab.teaching.widgets import LogLengthExplorer

    return LogLengthExplorer(**kw)


def test_log_length_explorer_shows_the_measurements_and_the_model():
    from replaylab.bench.mamba2_kernels import amortised_decode
    from replaylab.results import load_bench

    bench = load_bench()
    ex = _log_explorer(batch=32, L=16)
    rows = [r for r in amortised_decode(bench) if r["batch"] == 32]
    names = [t.name for t in ex.figure.data]
    measured = ex.figure.data[names.index("replay, measured: step + fold / L")]
    assert list(measured.x) == [r["L"] for r in rows] == [1, 4, 16, 64]
    # step + fold / L from the raw rows, not through amortised_decode
    raw = {
        (r["provider"], r.get("log_len")): r["us"]
        for r in bench["rows"]
        if r.get("batch") == 32 and r.get("T") in (0, 1) and "us" in r
    }
    want = [raw[("replay_step", L)] + raw[("fold", L)] / L for L in (1, 4, 16, 64)]
    assert list(measured.y) == pytest.approx(want)
    # the cost model: bytes over the copy bandwidth recorded in the same file
    model = ex.figure.data[names.index("replay, cost model: bytes / copy bandwidth")]
    shape = bench["shape"]
    at16 = (
        cm.kernel_bytes("replay_step", 32, 16, 1, **shape)
        + cm.kernel_bytes("fold", 32, 16, 0, **shape) / 16
    )
    assert model.y[list(model.x).index(16)] == pytest.approx(
        at16 / (bench["copy_bandwidth_gbs"] * 1e9) * 1e6
    )
    ssu = ex.figure.data[names.index("selective_state_update (mamba-ssm), measured")]
    assert set(ssu.y) == {raw[("ssu", 1)]}
    # the stars: the fastest measured L, and the model's minimum over every integer L
    best = ex.figure.data[names.index("best L, measured")]
    assert best.x[0] == min(rows, key=lambda r: r["amortised_us"])["L"]
    best_model = ex.figure.data[names.index("best L, cost model")]
    assert best_model.y[0] == min(model.y) and best_model.x[0] == ex.best_L()["model"]


def test_log_length_explorer_controls_change_the_figure_but_not_the_axes():
    ex = _log_explorer(batch=32, L=16)
    axes = lambda: (  # noqa: E731
        tuple(ex.figure.layout.xaxis.range),
        tuple(ex.figure.layout.yaxis.range),
        tuple(ex.figure.layout.yaxis2.range),
    )
    data = lambda: [(tuple(t.x), tuple(t.y)) for t in ex.figure.data]  # noqa: E731
    fixed, before = axes(), data()
    ex.controls["L"].value = 5
    moved = data()
    assert moved != before and moved[0] == before[0]  # the "this L" line moves, the data stay
    assert "L=5" in ex.figure.layout.title.text and "not measured" in ex.figure.layout.title.text
    ex.controls["batch"].value = 128
    assert data()[0][1] != moved[0][1]  # another batch's measurements
    lo, hi = fixed[1]
    for batch in ex.batches:
        for L in (1, 4, 33, 64):
            ex.controls["batch"].value, ex.controls["L"].value = batch, L
            assert axes() == fixed
            for t in ex.figure.data:
                panel = fixed[2] if t.yaxis == "y2" else (10**lo, 10**hi)
                slack = 1e-9 * panel[1]  # the "this L" line spans the axis exactly
                assert all(panel[0] - slack <= y <= panel[1] + slack for y in t.y), (
                    t.name,
                    batch,
                    L,
                )


def test_log_length_explorer_legend_and_bad_values():
    ex = _log_explorer()
    colors = _legend_colors(ex.figure)
    assert len(colors) == len(set(colors)) >= 6
    assert not any("`" in (t.name or "") for t in ex.figure.data)
    assert "tokens" in ex.controls["L"].description
    # two panels side by side, one y-axis each (no twin axes overlaid)
    assert ex.figure.layout.xaxis.domain[1] < ex.figure.layout.xaxis2.domain[0]
    assert {t.yaxis for t in ex.figure.data} == {"y", "y2"}
    assert ex.figure.layout.yaxis2.overlaying is None
    with pytest.raises(ValueError, match="batch"):
        _log_explorer(batch=3)
    with pytest.raises(ValueError, match="L"):
        _log_explorer(L=0)
    with pytest.raises(ValueError, match="L"):
        _log_explorer(L=65)
    import traitlets

    with pytest.raises(traitlets.TraitError):
        ex.controls["batch"].value = 3


# --- the combined speculative explorer (notebook 07) -----------------------------------------


def _spec(**kw):
    from replaylab.teaching.widgets import SpeculativeExplorer

    return SpeculativeExplorer(**kw)


def _bars(ex):
    return [list(ex.figure.data[i].y) for i in range(4)]


def test_speculative_explorer_follows_the_cost_model_and_keeps_the_old_api():
    ex = _spec(acceptance=0.5, k=4)
    pred, counts = ex.predictions(), ex.counts()
    bars = _bars(ex)
    assert bars[0] == pytest.approx([pred[n][0] for n in cm.STRATEGIES])
    assert bars[1] == pytest.approx([counts[n]["held_bytes"] / 1024 for n in cm.STRATEGIES])
    # the same numbers AcceptanceExplorer gives, with the same defaults (exercise 07.1 uses them)
    old = AcceptanceExplorer(acceptance=0.5, k=4)
    assert ex.predictions() == old.predictions()
    assert (ex.batch, ex.interval, ex.shape, ex.n_params, ex.hardware) == (
        old.batch,
        old.interval,
        old.shape,
        old.n_params,
        old.hardware,
    )
    # every control moves the figure; the batch moves only the speedup panel
    for name, value in (("acceptance", 0.95), ("k", 8), ("interval", 40), ("batch", 1)):
        before = _bars(ex)
        ex.controls[name].value = value
        after = _bars(ex)
        assert after != before, name
        if name == "batch":
            assert after[1:] == before[1:] and after[0] != before[0]
    assert ex.figure.layout.title.text.startswith("k=8, acceptance 0.95 per draft, L=40, batch 1")


def test_speculative_explorer_axes_stay_put_and_hold_every_prediction():
    ex = _spec()
    ranges = lambda: [tuple(ex.figure.layout[f"yaxis{s}"].range) for s in ("", "2", "3", "4")]  # noqa: E731
    fixed = ranges()
    for a, k, L, b in (
        (0.0, 1, 1, 1),
        (1.0, 16, 64, 128),
        (1.0, 16, 1, 1),
        (0.35, 7, 3, 8),
        (0.9, 16, 64, 1),
        (0.0, 16, 64, 32),
    ):
        for name, v in (("acceptance", a), ("k", k), ("interval", L), ("batch", b)):
            ex.controls[name].value = v
        assert ranges() == fixed
        for panel, ys in enumerate(_bars(ex)):
            assert max(ys) <= fixed[panel][1], (panel, a, k, L, b)
    # distinct strategy colours, the same in every panel; one legend entry for the live run
    colors = list(ex.figure.data[0].marker.color)
    assert len(set(colors)) == len(cm.STRATEGIES)
    assert all(list(ex.figure.data[i].marker.color) == colors for i in range(4))
    assert [t.name for t in ex.figure.data if t.showlegend is not False] == [
        "measured: live run of the tiny model on this CPU"
    ]
    assert not any("`" in (t.name or "") for t in ex.figure.data)
    for name in ("k", "interval"):
        assert "tokens" in ex.controls[name].description
    assert "sequences" in ex.controls["batch"].description


def test_speculative_explorer_rejects_bad_values():
    for kw, err in (
        (dict(acceptance=1.5), ValueError),
        (dict(acceptance=-0.1), ValueError),
        (dict(acceptance="high"), TypeError),
        (dict(k=0), ValueError),
        (dict(k=17), ValueError),
        (dict(interval=0), ValueError),
        (dict(batch=3), ValueError),
    ):
        with pytest.raises(err):
            _spec(**kw)


def test_run_live_matches_a_direct_library_run_and_overlays_it():
    import torch

    from replaylab.cache import CacheConfig
    from replaylab.decoding import SyntheticDrafter, greedy, speculative

    ex = _spec(acceptance=0.6, k=3, interval=5, n_new=24)
    assert ex.measured is None
    assert all(len(ex.figure.data[i].y) == 0 for i in (4, 5, 6))
    live = ex.run_live()
    assert ex.measured is live and "measured in" in ex.status.value
    assert not ex.button.disabled
    # the same run, straight from the library
    reference = greedy(ex.model, ex.prompt, 24 + 3).tokens
    full = torch.cat([ex.prompt, reference], 1)
    for strategy in cm.STRATEGIES:
        run = speculative(
            ex.model,
            ex.prompt,
            24,
            SyntheticDrafter(full, 0.6, 0),
            k=3,
            cache=CacheConfig(strategy, checkpoint_interval=5, log_length=5),
        )
        rounds = run.proposed / 3
        peak = run.stats.peak_by_component
        m = live[strategy]
        assert (m["accepted"], m["proposed"]) == (run.accepted, run.proposed)
        assert m["restores_per_round"] == run.restores / rounds
        assert m["rerun_tokens_per_round"] == run.recomputed_tokens / rounds
        assert m["held_bytes"] == sum(v for c, v in peak.items() if c != "kv")
        assert m["same_tokens_as_greedy"] and torch.equal(run.tokens, reference[:, :24])
    assert live["recompute"]["rerun_tokens_per_round"] > 0  # acceptance 0.6: it re-ran tokens
    assert (
        live["snapshot"]["rerun_tokens_per_round"] == live["replay"]["rerun_tokens_per_round"] == 0
    )
    # snapshot's memory is predicted byte for byte
    assert live["snapshot"]["held_bytes"] == ex.counts()["snapshot"]["held_bytes"]
    # the overlay: held (KiB), restores, re-run tokens, one marker per strategy
    names = list(cm.STRATEGIES)
    assert list(ex.figure.data[4].y) == [live[n]["held_bytes"] / 1024 for n in names]
    assert list(ex.figure.data[5].y) == [live[n]["restores_per_round"] for n in names]
    assert list(ex.figure.data[6].y) == [live[n]["rerun_tokens_per_round"] for n in names]
    # the batch does not change a one-sequence run; the others make it stale
    ex.controls["batch"].value = 8
    assert ex.measured is live and len(ex.figure.data[4].y) == 3
    ex.controls["k"].value = 4
    assert ex.measured is None and all(len(ex.figure.data[i].y) == 0 for i in (4, 5, 6))
    assert "run live again" in ex.status.value


def test_run_live_stays_small_and_inside_the_fixed_axes():
    import time

    ex = _spec(acceptance=0.0, k=16, interval=64)  # the slowest corner: every round rolls back
    fixed = [ex.figure.layout[f"yaxis{s}"].range[1] for s in ("2", "3", "4")]
    t0 = time.perf_counter()
    ex.run_live()
    # a guard against a live run of minutes: about 3 s alone, 15.3 s once on a 2-core CI
    # machine shared with other work (2026-12-01), so the bound leaves room for load
    assert time.perf_counter() - t0 < 60
    for top, trace in zip(fixed, ex.figure.data[4:]):
        assert max(trace.y) <= top
    ex.controls["interval"].value = 1  # recompute then keeps a checkpoint per token
    ex.run_live()
    for top, trace in zip(fixed, ex.figure.data[4:]):
        assert max(trace.y) <= top
