"""The cost model against the cache (bytes, exactly), against measured restore counts, against
a brute-force checkpointing search, and against the committed GPU data."""

import itertools
import math

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
    from replaylab.plotting import load_bench

    assert cm.HARDWARE["H200"].bandwidth == load_bench()["copy_bandwidth_gbs"] * 1e9


def test_kernel_bytes_per_decode_step_against_gpu_data():
    """The model's state traffic for a replay decode step vs selective_state_update (one read
    vs read + write) predicts the measured speedup at large batch within a factor 1.3."""
    from replaylab.plotting import load_bench

    rows = [r for r in load_bench()["rows"] if "us" in r and r["batch"] == 128 and r["T"] == 1]
    ours = next(r for r in rows if r["provider"] == "replay_step" and r["log_len"] == 4)
    ssu = next(r for r in rows if r["provider"] == "ssu")
    predicted = ssu["bytes"] / ours["bytes"]  # both memory-bound at batch 128
    measured = ssu["us"] / ours["us"]
    assert 1 / 1.3 < measured / predicted < 1.3
