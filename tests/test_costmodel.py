"""The cost model against the cache (bytes, exactly), against measured restore counts, against
a brute-force checkpointing search, and against the committed GPU data."""

import itertools
import math
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from replaylab import costmodel as cm
from replaylab.cache import CacheConfig, HybridCache
from replaylab.decoding import SyntheticDrafter, greedy, speculative
from replaylab.model import HybridConfig, HybridLM

CFG = HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=32, n_groups=2)
MODEL = HybridLM(CFG, seed=0).eval()
SHAPE = cm.shape_from_config(CFG)
N_PARAMS = sum(p.numel() for p in MODEL.parameters())


def costs(**kw):
    return cm.model_costs(SHAPE, cm.Workload(act_bytes=4, **kw), N_PARAMS)


def ssm_part(nbytes):
    return {k: v for k, v in nbytes.items() if k != "kv"}


@pytest.mark.parametrize("k", [1, 4])
def test_predicted_bytes_equal_what_the_cache_holds(k):
    m = costs(k=k)
    prompt = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        snap = HybridCache(MODEL, 1, "snapshot")
        MODEL(prompt, snap)
        snap.snapshot()
        MODEL(torch.randint(0, 128, (1, k + 1)), snap)  # verify: a copy per verified token
        assert ssm_part(snap.nbytes()) == cm.bytes_held(m, "snapshot", copies=k + 2)
        rec = HybridCache(MODEL, 1, "recompute", checkpoint_interval=4, log_length=4)
        MODEL(prompt, rec)  # checkpoints at 4 and 8
        assert ssm_part(rec.nbytes()) == cm.bytes_held(m, "recompute", checkpoints=2)
        rep = HybridCache(MODEL, 1, "replay", checkpoint_interval=16, log_length=16)
        MODEL(prompt, rep)
        rep.snapshot()
        MODEL(torch.randint(0, 128, (1, k + 1)), rep)
        assert ssm_part(rep.nbytes()) == cm.bytes_held(m, "replay", log_entries=9 + k + 1)


def test_predicted_peak_and_restores_match_a_measured_speculative_run():
    """Replay's peak SSM bytes are predicted exactly; restores counted per round agree with
    the expected count within a factor 1.5 over a long synthetic run."""
    prompt = torch.randint(0, 128, (1, 8))
    n_new, k, alpha, L = 120, 4, 0.6, 8
    ref = torch.cat([prompt, greedy(MODEL, prompt, n_new).tokens], 1)
    run = speculative(
        MODEL,
        prompt,
        n_new,
        SyntheticDrafter(ref, alpha, seed=3),
        k=k,
        cache=CacheConfig("replay", log_length=L),
    )
    m = costs(k=k, interval=L)
    peak = run.stats.peak_by_component
    assert {c: peak[c] for c in ("ssm_state", "conv_state", "logs")} == cm.bytes_held(
        m, "replay", log_entries=max(L - 1, k + 1)
    )
    rounds = run.proposed / k
    p_reject = 1 - alpha**k
    assert 1 / 1.5 < run.restores / (rounds * p_reject) < 1.5
    tokens_per_round = n_new / rounds
    assert 1 / 1.3 < tokens_per_round / (cm.expected_accepted(k, alpha) + 1) < 1.3


def test_expected_accepted():
    assert cm.expected_accepted(4, 1.0) == 4 and cm.expected_accepted(4, 0.0) == 0
    assert math.isclose(cm.expected_accepted(3, 0.5), 0.5 + 0.25 + 0.125)
    assert math.isclose(cm.expected_accepted(2, (0.9, 0.5)), 0.9 + 0.45)
    with pytest.raises(ValueError, match=r"acceptance: expected a probability or 3"):
        cm.expected_accepted(3, (0.5, 0.5))
    with pytest.raises(
        ValueError, match=r"acceptance: expected a probability in \[0, 1\], got 1.5"
    ):
        cm.expected_accepted(1, 1.5)  # not "a probability or 1 probabilities"
    # tensors, arrays and generators of probabilities, as a tuple; a word is refused by type
    assert math.isclose(cm.expected_accepted(2, torch.tensor([0.9, 0.5])), 0.9 + 0.45, rel_tol=1e-6)
    assert math.isclose(cm.expected_accepted(2, (p for p in (0.9, 0.5))), 0.9 + 0.45)
    assert math.isclose(cm.expected_accepted(2, torch.tensor(0.5)), 0.5 + 0.25)
    with pytest.raises(ValueError, match=r"got str '0.8'"):
        cm.expected_accepted(2, "0.8")


def test_tokens_per_round_is_one_plus_accepted_with_room_and_less_at_the_fold_grid():
    for k, a, L in ((4, 0.8, 16), (3, 0.5, 4), (2, (0.9, 0.6), 8)):
        want = 1 + cm.expected_accepted(k, a)
        assert math.isclose(cm.tokens_per_round(k, a, L, L + k), want)
        assert cm.tokens_per_round(k, a, L) < want
    assert math.isclose(cm.tokens_per_round(4, 1.0, 5), 5.0)  # rounds of 5 on a grid of 5
    assert math.isclose(cm.tokens_per_round(4, 0.0, 7), 1.0)
    with pytest.raises(ValueError, match=r"capacity: expected L <= capacity <= 2L"):
        cm.tokens_per_round(4, 0.8, 4, 9)


@pytest.mark.parametrize("capacity", [4, 8])
def test_tokens_per_round_matches_the_engines_speculation(capacity):
    """The engine's rounds (replay, L = 4, k = 4, a synthetic drafter accepting 0.8 per draft)
    keep on average what the Markov chain over the log length predicts: 2.50 tokens a round
    with a ring of L rows, 3.28 with L + k, within three standard errors of the mean (~0.17;
    seeds 0-7 measured 2.40-2.65 and 3.24-3.43)."""
    from replaylab.serving import DecodeEngine

    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    n_new = 1200
    engine = DecodeEngine(MODEL, 1, 7 + n_new + 8, "replay", log_length=4, log_capacity=capacity)
    full = torch.cat([prompt, engine.greedy(prompt, n_new)], 1)
    engine.retire(0)
    steps = engine.stats.steps
    tokens, _, accepted = engine.speculative(prompt, n_new, SyntheticDrafter(full, 0.8, 0))
    assert torch.equal(tokens, full[:, 7:])
    rounds = engine.stats.steps - steps
    want = cm.tokens_per_round(4, 0.8, 4, capacity)
    assert abs(1 + accepted / rounds - want) < 3 * 1.2 / math.sqrt(rounds), (accepted, rounds, want)


def test_revolve_matches_griewanks_closed_form():
    # Griewank (1992): with c checkpoints (the start among them) and t the smallest integer
    # with C(c+t, c) >= n, reversing n steps takes t*n - C(c+t, c+1) forward steps at best.
    # The dynamic program in revolve_cost counts slots besides the start: c = slots + 1.
    for n, slots in itertools.product(range(2, 40), range(1, 6)):
        c = slots + 1
        t = next(t for t in range(n + 1) if math.comb(c + t, c) >= n)
        assert cm.revolve_cost(n, slots) == t * n - math.comb(c + t, c + 1), (n, slots)


def test_predict_orders_strategies_as_the_mechanism_says():
    from replaylab.shapes import PUBLISHED_SHAPES

    shape = PUBLISHED_SHAPES["Nemotron-H 8B"]
    hw = cm.HARDWARE["H200"]
    out = cm.predict(
        shape, cm.Workload(batch=32, k=4, acceptance=0.8, interval=16), hw, 8e9, memory_budget=140e9
    )
    assert out["replay"]["held"] < out["recompute"]["held"] < out["snapshot"]["held"]
    assert out["replay"]["max_sequences"] > out["snapshot"]["max_sequences"]
    assert out["replay"]["moved_per_token"] < out["snapshot"]["moved_per_token"]
    assert out["recompute"]["restore_seconds"] > out["snapshot"]["restore_seconds"]


def test_h200_preset_comes_from_the_committed_benchmark():
    from replaylab.results import load_bench

    engine = load_bench("data/bench_engine.json")
    assert cm.HARDWARE["H200"].bandwidth == pytest.approx(engine["copy_bandwidth_gbs"] * 1e9, 1e-12)
    assert "bench_engine.json" in cm.HARDWARE["H200"].source
    assert cm.HARDWARE["H200"].matmul_rate == 989e12 and "datasheet" in cm.HARDWARE["H200"].source


def test_the_cost_model_imports_with_no_data_folder(tmp_path):
    """The presets are constants: costmodel answers the same wherever it is imported from."""
    code = "import replaylab.costmodel as cm; print(repr(cm.HARDWARE['H200']))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == repr(cm.HARDWARE["H200"])


def test_kernel_bytes_per_decode_step_against_gpu_data():
    """The model's state traffic for a replay decode step vs selective_state_update (one read
    vs read + write) predicts the measured speedup at large batch within a factor 1.3."""
    from replaylab.results import load_bench

    rows = [r for r in load_bench()["rows"] if "us" in r and r["batch"] == 128 and r["T"] == 1]
    ours = next(r for r in rows if r["provider"] == "replay_step" and r["log_len"] == 4)
    ssu = next(r for r in rows if r["provider"] == "ssu")
    predicted = ssu["bytes"] / ours["bytes"]  # both memory-bound at batch 128
    measured = ssu["us"] / ours["us"]
    assert 1 / 1.3 < measured / predicted < 1.3


# --- issue 15: the cost model's counts against hand counts and the committed runs -----------

SMALL = cm.HybridShape(
    "hand",
    n_attn=1,
    n_ssm=2,
    kv_heads=1,
    head_dim=2,
    ssm_form="mamba2",
    d_state=4,
    d_conv=4,
    ssm_heads=2,
    ssm_head_dim=3,
    n_groups=1,
)


def test_decode_token_bytes_against_a_hand_count():
    # per SSM layer: state 2*3*4 = 24 fp32 = 96 B; conv channels 2*3 + 2*1*4 = 14, window 3 rows
    # of bf16 = 84 B (read + write: 168); one token's log: xBC 14 + x 6 + dt 2 + B, C 8 = 30
    # elements = 60 B. Attention: K and V of 1 head of width 2 = 4 elements = 8 B a row.
    kw = dict(batch=4, context_len=10, log_length=8, interval=5, weight_bytes=400)
    snap = cm.decode_token_bytes(SMALL, "snapshot", **kw)
    assert snap == dict(
        weights=100,
        kv_read=80,
        kv_write=8,
        state_read=192,
        state_write=192,
        conv=336,
        log_read=0,
        log_write=0,
        checkpoint=0,
    )
    rec = cm.decode_token_bytes(SMALL, "recompute", **kw)
    assert rec["checkpoint"] == 2 * (192 + 168) / 5
    rep = cm.decode_token_bytes(SMALL, "replay", **kw)
    # the checkpoint read, then a fold every 8 tokens: 2 states read/written + 8 entries read
    assert rep["state_read"] == 192 + 192 / 8 and rep["state_write"] == 192 / 8
    assert rep["log_read"] == 4 * 120 + 120 and rep["log_write"] == 120
    assert (
        cm.decode_floor_seconds(
            SMALL, "replay", 4, 1e9, **{k: v for k, v in kw.items() if k != "batch"}
        )
        == 4 * sum(rep.values()) / 1e9
    )


def test_decode_step_bytes_equal_what_the_engine_run_recorded():
    """The engine run counted bytes_per_step with decode_step_bytes at its position minus
    n_new / 2: prompt 32 + warm-up 32 + 3 runs of 32 (+ 16 steps where GPU-busy was
    measured, batch 1 and 64, + 8 where the kernels were profiled, batch 1 and 128)."""
    from replaylab.model import preset
    from replaylab.results import load_bench

    eng, weights = load_bench("data/bench_engine.json"), load_bench("data/bench_decode.json")
    cfg = preset("8b-layers")
    rows = [r for r in eng["rows"] if r.get("preset") == "8b-layers" and "bytes_per_step" in r]
    assert len(rows) == 16  # 6 batches x 2 strategies, and the unfused engine at 2 batches
    for r in rows:
        context = 144 + 16 * (r["gpu_busy"] is not None) + 8 * (r.get("profile") is not None)
        got = cm.decode_step_bytes(
            cfg, r["strategy"], r["batch"], context, r["log_length"], weights["weights_bytes"]
        )
        assert got == r["bytes_per_step"], r


def test_snapshot_counts_each_state_write_once():
    """With every draft accepted (no restore), one more verified position adds exactly one
    state and one conv window written to snapshot's traffic: the scan's write is the snapshot
    (before the fix it added a scan read + write and a copy's read + write)."""
    shape = SMALL
    m = cm.model_costs(shape, cm.Workload(), 1e6)
    hw = cm.Hardware("x", 1e12, 1e15)
    moved = [
        cm.predict(shape, cm.Workload(k=k, acceptance=1.0), hw, 1e6)["snapshot"]["moved_per_round"]
        for k in (2, 3, 4)
    ]
    assert moved[1] - moved[0] == moved[2] - moved[1] == m.S + m.W
    out = cm.predict(shape, cm.Workload(k=4, acceptance=1.0), hw, 1e6)
    assert out["snapshot"]["state_writes_per_round"] == 5
    assert out["snapshot"]["moved_per_round"] == m.S + 5 * (m.S + m.W)


def test_replay_rollback_costs_the_deferred_fold():
    shape = SMALL
    hw = cm.Hardware("x", 1e12, 1e15)
    for L in (4, 16):
        w = cm.Workload(k=4, acceptance=0.6, interval=L)
        out = cm.predict(shape, w, hw, 1e6)["replay"]
        # hand count of one fold: read + write 2 layers' fp32 states (2 x 96 B), read L entries
        # of 2 layers x 60 B
        fold = 2 * 2 * 96 + L * 2 * 60
        assert out["restore_seconds"] > 0
        assert math.isclose(out["restore_seconds"] * hw.bandwidth, fold / L)
        assert math.isclose(out["fold_bytes_per_round"], out["tokens_per_round"] * fold / L)


def test_replay_frontier_is_where_the_kernel_bytes_cross():
    dims = dict(H=128, P=64, N=128, G=8)
    L = cm.replay_bytes_frontier(**dims)
    for batch in (1, 64):
        step = cm.kernel_bytes("replay_step", batch, L, 1, **dims)
        fold = cm.kernel_bytes("fold", batch, L, 0, **dims)
        ssu = cm.kernel_bytes("ssu", batch, L, 1, **dims)
        assert math.isclose(step + fold / L, ssu, rel_tol=1e-9)
        below = cm.replay_vs_ssu(batch, 16, bandwidth=1e12, **dims)["speedup"]
        above = cm.replay_vs_ssu(batch, 256, bandwidth=1e12, **dims)["speedup"]
        assert below > 1 > above


def test_measured_replay_speedup_reads_the_kernel_benchmark():
    from replaylab.results import load_bench

    bench = load_bench()
    rows = {(r["batch"], r["L"]): r for r in cm.measured_replay_vs_ssu(bench)}
    us = {
        (r["provider"], r["batch"], r["log_len"], r["T"]): r["us"]
        for r in bench["rows"]
        if "us" in r
    }
    ssu = next(v for (p, b, _, t), v in us.items() if p == "ssu" and b == 128 and t == 1)
    replay = us[("replay_step", 128, 16, 1)] + us[("fold", 128, 16, 0)] / 16
    assert math.isclose(rows[(128, 16)]["speedup"], ssu / replay)
    assert rows[(1, 16)]["speedup"] < 1 < rows[(128, 16)]["speedup"]


def test_mamba1_break_even_is_where_updates_meet_the_snapshot_bytes():
    """At a log length of ``mamba1_break_even`` replay's element updates per token take as long
    as selective_state_update's state bytes (inputs negligible next to a large state): speedup 1
    there, above 1 at shorter logs, below at longer ones; d_state cancels."""
    bandwidth, rate = 1e12, 1e12  # break-even at L = 16 x 1 - 3 = 13
    L0 = cm.mamba1_break_even(bandwidth, rate)
    assert L0 == 13
    big = dict(D=4096, N=4096, bandwidth=bandwidth, update_rate=rate)
    assert math.isclose(cm.mamba1_replay_vs_ssu(8, 13, **big)["speedup"], 1, rel_tol=0.01)
    assert cm.mamba1_replay_vs_ssu(8, 5, **big)["speedup"] > 1.3  # bytes bind there
    assert cm.mamba1_replay_vs_ssu(8, 29, **big)["speedup"] < 0.6
    by_n = [
        cm.mamba1_replay_vs_ssu(64, 16, D=8192, N=n, bandwidth=4e12, update_rate=1e12)["speedup"]
        for n in (16, 64, 256)
    ]
    assert max(by_n) / min(by_n) < 1.1


def test_mamba1_model_against_the_h200_kernel_benchmark():
    """data/bench_mamba1_kernels.json (H200, Jamba's D = 8192, N = 16), a consistency check (the
    rate comes from one of the rows checked): the rate the replay step sustains at batch 256
    and L = 64, put in the model, gives the measured replay / selective_state_update ratio
    within 20% where the updates bind (batch >= 32, L >= 16; smaller batches sit at launch
    latency, which the model leaves out); its break-even log length is below 1, and no measured
    row pays."""
    import json
    from pathlib import Path

    bench = json.loads(
        (Path(__file__).resolve().parents[1] / "data" / "bench_mamba1_kernels.json").read_text()
    )
    bandwidth = bench["copy_bandwidth_gbs"] * 1e9
    rate = cm.measured_update_rate(bench)
    assert 0.5e12 < rate < 2e12
    assert cm.mamba1_break_even(bandwidth, rate) < 1
    for row in bench["batches"]:
        for L, cell in row["L"].items():
            measured = cell["amortised"]["speedup_vs_ssu"]
            model = cm.mamba1_replay_vs_ssu(row["batch"], int(L), D=8192, N=16,
                                            bandwidth=bandwidth, update_rate=rate)  # fmt: skip
            assert measured < 1 and model["speedup"] < 1
            if row["batch"] >= 32 and int(L) >= 16:
                assert model["replay_binds"] == "updates"
                assert abs(model["speedup"] / measured - 1) < 0.2, (row["batch"], L)


def test_best_log_length_per_workload_matches_the_closed_forms():
    from replaylab.shapes import PUBLISHED_SHAPES

    m = cm.model_costs(PUBLISHED_SHAPES["Nemotron-H 8B"], cm.Workload(), 8e9)
    r = m.S / m.log_token
    tpr = 1 + cm.expected_accepted(4, 0.8)
    best = {w: cm.best_log_length(m, w) for w in cm.WORKLOADS}
    assert abs(best["best-of-n"] - 2 * r**0.5) <= 1
    assert abs(best["beam search"] - (4 * r / 3) ** 0.5) <= 1
    assert abs(best["speculative"] - 2 * (r * tpr) ** 0.5) <= 1
    assert best["beam search"] < best["best-of-n"] < best["speculative"]
    with pytest.raises(ValueError, match="workload"):
        cm.log_length_cost(m, "tree", 8)


def test_held_crossover_is_where_replay_holds_as_much_as_two_checkpoints():
    m = cm.model_costs(SMALL, cm.Workload(), 1e6)
    L = cm.held_crossover_interval(m)
    replay = sum(cm.bytes_held(m, "replay", log_entries=L - 1).values())
    recompute = sum(cm.bytes_held(m, "recompute", checkpoints=2).values()) - m.S - m.W
    assert math.isclose(replay - m.S - m.W, recompute)


def test_gain_falls_as_attention_grows_and_live_bytes_match_the_model():
    from replaylab.shapes import PUBLISHED_SHAPES
    from replaylab.teaching.experiments import gain_vs_attention_live

    patterns = ["MMMMMMM*", "M*M*M*M*"]
    model = cm.gain_vs_attention(patterns, PUBLISHED_SHAPES["Nemotron-H 8B"], 8e9, repeat=4)
    assert model[0]["memory_gain"] > model[1]["memory_gain"] > 1
    assert model[0]["speed_gain"] > model[1]["speed_gain"] > 1
    with pytest.raises(ValueError, match="rounds"):
        gain_vs_attention_live(patterns, rounds=2)
    live = gain_vs_attention_live(patterns, prompt_len=96, rounds=3)
    for row in live:
        assert row["snapshot_measured"] == row["snapshot_predicted"]
        assert row["replay_measured"] == row["replay_predicted"]
    assert live[0]["gain_measured"] > live[1]["gain_measured"] > 1


@pytest.mark.parametrize(
    "call, error, match",
    [
        # a batch or interval of 0 divided by zero later; a negative batch gave negative seconds
        (lambda: cm.Workload(batch=0), ValueError, r"batch: expected 1 <= batch, got 0"),
        (lambda: cm.Workload(interval=0), ValueError, r"interval: expected 1 <= interval"),
        (lambda: cm.Workload(context_len=-5), ValueError, r"context_len: expected 0 <="),
        (lambda: cm.Workload(k=2.5), TypeError, r"k: expected an integer, got float 2.5"),
        (lambda: cm.Workload(k=True), TypeError, r"k: expected an integer, got a boolean"),
        (lambda: cm.Workload(acceptance=float("nan")), ValueError, r"acceptance: expected"),
        # k = -1 blamed the acceptance
        (lambda: cm.expected_accepted(-1, 0.8), ValueError, r"k: expected 0 <= k, got -1"),
        # 5 with 0 slots is 10 steps: -1 slots gave 5
        (lambda: cm.revolve_cost(6, -1), ValueError, r"slots: expected 0 <= slots, got -1"),
        (lambda: cm.revolve_cost(-3, 1), ValueError, r"n: expected 0 <= n, got -3"),
        (lambda: cm.interval_tradeoff(10, 0), ValueError, r"interval: expected 1 <= interval"),
        (lambda: cm.interval_tradeoff(10, -2), ValueError, r"interval: expected 1 <= interval"),
        (lambda: cm.optimal_frontier(0, 2), ValueError, r"n: expected 1 <= n, got 0"),
        (lambda: cm.bytes_held(costs(), "snapshot", copies=-1), ValueError, r"copies: expected"),
        (
            lambda: cm.predict(
                SHAPE, cm.Workload(), cm.HARDWARE["H200"], N_PARAMS, memory_budget=-1
            ),
            ValueError,
            r"memory_budget: expected a finite number \(bytes\) > 0",
        ),
        (
            lambda: cm.predict(SHAPE, cm.Workload(), cm.Hardware("x", 0.0, 1e12), N_PARAMS),
            ValueError,
            r"hardware.bandwidth: expected a finite number \(bytes/s\) > 0",
        ),
        # each of these divided by zero (a raw ZeroDivisionError) or took min() of nothing
        (lambda: cm.decode_token_bytes(SHAPE, "replay", batch=0), ValueError, r"batch: expected"),
        (
            lambda: cm.decode_token_bytes(SHAPE, "replay", log_length=0),
            ValueError,
            r"log_length: expected a finite number >= 1, got 0",
        ),
        (
            lambda: cm.decode_token_bytes(SHAPE, "recompute", interval=0),
            ValueError,
            r"interval: expected a finite number >= 1, got 0",
        ),
        (
            lambda: cm.attention_share(replace(SHAPE, n_attn=0, n_ssm=0)),
            ValueError,
            r"has no layers \(n_attn 0, n_ssm 0\)",
        ),
        (
            lambda: cm.replay_vs_ssu(8, 0, H=4, P=8, N=16, G=1, bandwidth=1e12),
            ValueError,
            r"L: expected 1 <= L, got 0",
        ),
        (
            lambda: cm.replay_vs_ssu(8, 4, H=4, P=8, N=16, G=1, bandwidth=0),
            ValueError,
            r"bandwidth: expected a finite number \(bytes/s\) > 0, got 0",
        ),
        (lambda: cm.log_length_cost(costs(), "best-of-n", 0), ValueError, r"L: expected 1 <= L"),
        (lambda: cm.best_log_length(costs(), "best-of-n", []), ValueError, r"lengths: expected"),
    ],
)
def test_bad_cost_model_input_is_refused_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call()
