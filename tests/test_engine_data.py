"""The committed GPU engine and kernel-sweep results (``data/bench_engine*.json``,
``data/bench_kernels_sweep.json``): their derived fields agree with their raw ones, and the
claims notebooks 06 and 09 make in prose without numbers hold for them. Also the device choice
of the Triton exercises (``exercises.kernel_device``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replaylab.costmodel import decode_step_bytes
from replaylab.model import HybridLM, preset
from replaylab.results import load_bench
from replaylab.teaching import exercises, puzzles
from replaylab.teaching.plotting import best_launch

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ("data/bench_engine.json", "data/bench_engine_1b.json")


def _load(name):
    return load_bench(str(ROOT / name))


def _tok_s(r):
    return r["batch"] / r["seconds_per_token"]["median"]


def _decode_rows(run, fused=True):
    return [
        r
        for r in run["rows"]
        if "strategy" in r
        and "workload" not in r
        and "seconds_per_token" in r
        and r.get("fused", True) == fused
    ]


def _plain(run, strategy, batch, fused=True):
    return next(
        r for r in _decode_rows(run, fused) if r["strategy"] == strategy and r["batch"] == batch
    )


def _provider(run, provider):
    return {r["batch"]: r for r in run["rows"] if r.get("provider") == provider}


@pytest.mark.parametrize("name", ENGINE)
def test_engine_run_is_complete(name):
    run = _load(name)
    assert not run["errors"]
    assert {"device", "versions", "date", "command"} <= set(run)
    assert run["copy_bandwidth_gbs"] == max(run["copy_bandwidth_methods_gbs"].values())
    for fused in (True, False):
        rows = _decode_rows(run, fused)
        assert {r["strategy"] for r in rows} == {"snapshot", "replay"}
    for strategy in ("snapshot", "replay"):
        assert {1, 128} <= {
            r["batch"] for r in _decode_rows(run, False) if r["strategy"] == strategy
        }
        for b in (1, 128):
            assert _plain(run, strategy, b)["profile"]["kernels_per_step"] > 0


@pytest.mark.parametrize("name", ENGINE)
def test_roofline_fraction_is_bytes_over_bandwidth_over_time(name):
    run = _load(name)
    bw = run["copy_bandwidth_gbs"] * 1e9
    rows = _decode_rows(run, True) + _decode_rows(run, False)
    assert rows
    for r in rows:
        want = r["bytes_per_step"] / bw / r["seconds_per_token"]["median"]
        assert abs(r["roofline_fraction"] - want) < 1e-9, r
        assert r["tokens_per_s"] == pytest.approx(_tok_s(r), rel=1e-12)


def test_mamba_ssm_roofline_counts_snapshot_bytes_of_its_weights():
    run = _load("data/bench_engine.json")
    cfg, bw = preset("8b-layers"), run["copy_bandwidth_gbs"] * 1e9
    rows = _provider(run, "mamba-ssm generate(cg=True)")
    assert set(rows) == {1, 8, 64, 128, 256}
    context = run["prompt_len"] + run["n_new"] // 2
    for b, r in rows.items():
        moved = decode_step_bytes(cfg, "snapshot", b, context, 16, r["weights_bytes"])
        assert abs(r["roofline_fraction"] - moved / bw / r["seconds_per_token"]["median"]) < 1e-9


@pytest.mark.parametrize("name", ENGINE)
def test_batched_verify_tokens_per_s_is_batch_times_kept_over_round(name):
    run = _load(name)
    rounds = [r for r in run["rows"] if r.get("workload", "").startswith("batched verify rounds")]
    assert {(r["strategy"], r["batch"]) for r in rounds} == {
        (s, b) for s in ("snapshot", "replay") for b in (8, 64, 128)
    }
    for r in rounds:
        want = r["batch"] * r["tokens_kept_per_round"] / (r["ms_per_round"] * 1e-3)
        assert r["tokens_per_s"] == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("name", ENGINE)
def test_concurrency_rows_for_both_strategies(name):
    run = _load(name)
    conc = {r["strategy"]: r for r in run["rows"] if r.get("workload") == "concurrency"}
    assert set(conc) == {"snapshot", "replay"}
    # notebook 15: replay fits more than twice the sequences of the per-draft-snapshot path
    assert conc["replay"]["max_batch"] > 2 * conc["snapshot"]["max_batch"]
    assert conc["replay"]["pool_bytes_per_sequence"] < conc["snapshot"]["pool_bytes_per_sequence"]


def test_speculative_rows_keep_greedy_tokens_on_8b_layers():
    run = _load("data/bench_engine.json")
    spec = [r for r in run["rows"] if r.get("workload", "").startswith("speculative k=4 a=")]
    assert len(spec) == 6
    assert all(r["preset"] == "8b-layers" and r["same_tokens_as_greedy"] for r in spec)


@pytest.mark.parametrize("name", ENGINE)
def test_token_checks_part_only_at_near_ties(name):
    """Notebook 15: where the engine's greedy tokens leave the teaching model's, the top two
    logits nearly tie (gap far below the median gap)."""
    run = _load(name)
    assert {c["strategy"] for c in run["token_checks"]} == {"snapshot", "replay"}
    for c in run["token_checks"]:
        assert len(c["parted"]) == c["of"] - c["same_sequences"]
        for p in c["parted"]:
            assert p["top2_gap"] < c["median_top2_gap"] / 2


def test_notebook_09_claims_about_the_8b_layers_engine():
    run = _load("data/bench_engine.json")
    batches = sorted({r["batch"] for r in _decode_rows(run)})
    # fusion: every fused row beats its unfused twin, in time and roofline fraction
    for r in _decode_rows(run, False):
        f = _plain(run, r["strategy"], r["batch"])
        assert _tok_s(f) > _tok_s(r) and f["roofline_fraction"] > r["roofline_fraction"]
    # the fused engine beats transformers and mamba-ssm's graphed loop at every batch measured
    for provider in ("transformers generate", "mamba-ssm generate(cg=True)"):
        rows = _provider(run, provider)
        assert rows
        for b, r in rows.items():
            assert _tok_s(_plain(run, "replay", b)) > _tok_s(r), (provider, b)
            assert _tok_s(_plain(run, "snapshot", b)) > _tok_s(r), (provider, b)
    # replay's lead over the fused snapshot grows with the batch
    ratios = [
        _tok_s(_plain(run, "replay", b)) / _tok_s(_plain(run, "snapshot", b)) for b in batches
    ]
    assert ratios == sorted(ratios)
    # batched speculation: replay beats the per-draft snapshots at 64 and 128
    rounds = {
        (r["strategy"], r["batch"], r["workload"]): r
        for r in run["rows"]
        if r.get("workload", "").startswith("batched verify rounds")
    }
    for (s, b, w), r in rounds.items():
        if s == "replay" and b >= 64:
            assert r["tokens_per_s"] > rounds[("snapshot", b, w)]["tokens_per_s"]


def test_kernel_sweep_fields_and_best_launch():
    sweep = _load("data/bench_kernels_sweep.json")
    for r in sweep["rows"]:
        assert r["copy_fraction"] == pytest.approx(r["gbs"] / sweep["copy_bandwidth_gbs"], rel=1e-3)
    best = best_launch(sweep)
    for (kernel, batch), r in best.items():
        same = [x["us"] for x in sweep["rows"] if (x["kernel"], x["batch"]) == (kernel, batch)]
        assert r["us"] == min(same)
    step, ssu = "replay_step T=1 L=16", "mamba-ssm selective_state_update T=1"
    # notebook 06's prose: the step loses at batch 1 and wins from batch 8 on
    assert best[(step, 1)]["us"] > best[(ssu, 1)]["us"]
    assert all(best[(step, b)]["us"] < best[(ssu, b)]["us"] for b in (8, 32, 128))


@pytest.mark.parametrize(
    ("cuda", "interpret", "want"),
    [(True, "0", "cuda"), (True, "1", "cpu"), (False, "0", "cpu"), (False, "1", "cpu")],
)
def test_kernel_device_follows_gpu_and_interpreter(monkeypatch, cuda, interpret, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert puzzles.interpreting() == (interpret == "1")
    assert exercises.kernel_device() == want


def test_kernel_device_on_this_machine():
    want = "cuda" if torch.cuda.is_available() and not puzzles.interpreting() else "cpu"
    assert exercises.kernel_device() == want
    # and the check that launches replay_step on that device passes and fails as it should
    assert exercises.check_largest_log_len(14)
    assert not exercises.check_largest_log_len(15)


def test_auto_log_length_is_the_committed_kernel_sweeps_choice():
    """``DecodeEngine(log_length="auto")`` takes the constant ``AUTO_LOG_LENGTH`` (the library
    reads no data file): it is the L of lowest amortised decode cost, step + fold(L)/L, at every
    batch of ``data/bench_kernels.json``."""
    from replaylab.results import amortised_decode
    from replaylab.serving import DecodeEngine
    from replaylab.serving.engine import AUTO_LOG_LENGTH

    rows = amortised_decode(_load("data/bench_kernels.json"))
    batches = sorted({r["batch"] for r in rows})
    assert batches
    for b in batches:
        best = min((r for r in rows if r["batch"] == b), key=lambda r: r["amortised_us"])
        assert best["L"] == AUTO_LOG_LENGTH, (b, best)
    model = HybridLM(preset("tiny"), seed=0)
    assert DecodeEngine(model, 2, 16, log_length="auto").L == AUTO_LOG_LENGTH
