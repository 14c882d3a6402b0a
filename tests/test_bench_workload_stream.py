"""``replaylab bench workload-stream`` (issue 38, item 3): the four prefix-sharing workloads,
their arrivals, the rows of a small run on the tiny model (every request's tokens its greedy
tokens served alone, replay's hit rate above align's off the grid, a budget that binds), the
prediction's formula, bad input, and the committed CPU result with its table in
data/README.md."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from replaylab.bench.stream import sustainable_rate
from replaylab.bench.workload_stream import (
    WORKLOADS,
    arrivals,
    predicted_rate,
    run_workload_stream,
    workload_budget,
    workload_prediction,
    workload_prompts,
    workload_summary,
)

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVE = dict(tpot_p99_max_s=0.01, wait_p90_max_s=0.1)


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("block", [16, 512])
def test_the_workloads_share_what_they_say(block):
    for name in WORKLOADS:
        prompts, outs = workload_prompts(name, block, vocab=50_000)
        assert (prompts, outs) == workload_prompts(name, block, vocab=50_000)  # seeded
        assert len(outs) == len(prompts) and all(block // 8 <= n <= block // 4 for n in outs)
        shared = [common_prefix(a, b) for i, a in enumerate(prompts) for b in prompts[:i]]
        assert max(shared) >= block  # some pair shares at least one block
    agents, _ = workload_prompts("agents", block, vocab=50_000)
    parts = {common_prefix(a, b) for i, a in enumerate(agents) for b in agents[:i]}
    assert len(parts) == 2 and all(p % block for p in parts)  # both divergences off the grid
    chats, _ = workload_prompts("multi_turn", block, vocab=50_000)
    for earlier, later in zip(chats, chats[3:]):  # each turn extends the conversation
        assert later[: len(earlier)] == earlier and len(later) > len(earlier)


@pytest.mark.parametrize("name", WORKLOADS)
def test_rounds_repeat_the_requests_over_the_same_shared_parts(name):
    one, one_outs = workload_prompts(name, 64, vocab=50_000)
    three, outs = workload_prompts(name, 64, vocab=50_000, rounds=3)
    assert len(three) == len(outs) == 3 * len(one) and three[: len(one)] == one
    assert outs[: len(one)] == one_outs and outs[len(one) :] != 2 * one_outs
    later = three[len(one) :]
    other_seed, _ = workload_prompts(name, 64, vocab=50_000, seed=1)
    assert all(p not in other_seed for p in later)  # a later round is no other seed's first
    assert all(p not in one for p in later)  # fresh unique parts
    if name == "multi_turn":  # new conversations: a new opening, shared along its own turns
        assert all(common_prefix(a, b) < 32 for a in later for b in one)
    else:  # each later request shares its workload's longest prefix with some first-round one
        assert all(
            max(common_prefix(p, q) for q in one) >= max(common_prefix(one[0], q) for q in one[1:])
            for p in later
        )


def small_run(**settings):
    """``run_workload_stream`` of the cpu preset on the CPU, one torch thread, every request
    arriving at once, no log."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return run_workload_stream("cpu", device="cpu", rates=(math.inf,), log=None, **settings)
    finally:
        torch.set_num_threads(threads)


def test_more_rounds_make_a_longer_stream_under_the_same_budget():
    """The budget is a share of one round's requests at once under snapshot: with rounds it
    grew with the stream (an H200 run with --rounds 3 had three times the bytes)."""
    runs = {
        rounds: small_run(
            workloads=("few_shot",),
            strategies=("replay",),
            modes=("decode",),
            rate_modes=(),
            rounds=rounds,
        )["workloads"]["few_shot"]  # fmt: skip
        for rounds in (1, 2)
    }
    assert runs[2]["prompts"] == 2 * runs[1]["prompts"]
    assert runs[2]["budget_bytes"] == runs[1]["budget_bytes"]
    assert runs[2]["rows"][0]["requests"] == runs[2]["prompts"]


def test_arrivals_are_a_seeded_poisson_process():
    times = arrivals(2000, 50.0, seed=1)
    assert times == sorted(times) and times == arrivals(2000, 50.0, seed=1)
    assert 2000 / times[-1] == pytest.approx(50.0, rel=0.1)
    assert arrivals(3, math.inf) == [0.0, 0.0, 0.0]


def test_the_prediction_is_the_stated_formula():
    rate, concurrency = predicted_rate(4, 1000, 100, 0.01, 0.02, 10, 5, 0.5)
    assert concurrency == 4 and rate == pytest.approx(4 / (0.01 * 10 * 0.5 + 5 * 0.02))
    rate, concurrency = predicted_rate(16, 1000, 300, 0.01, 0.02, 10, 5, 0.0)
    assert concurrency == 3 and rate == pytest.approx(3 / 0.2)


def test_a_workload_prediction_reads_the_lowest_rate_row_and_leaves_the_tree_out():
    """The scheduler evicts the tree down to what running requests leave, so a tree as large
    as the budget (replay's, on the GPU) does not hold the prediction's concurrency at 1."""

    def row(rate, nbytes, hit):
        return dict(strategy="replay", mode="decode", rate=rate, token_hit_rate=hit,
                    accounted_bytes_per_request=dict(mean=nbytes), tree_peak_bytes=1000)  # fmt: skip

    w = dict(prompts=4, prompt_tokens=40, output_tokens=20, budget_bytes=1000,
             batch1=dict(replay=dict(prefill_s_per_token=0.01, tpot_s=0.02)),
             rows=[row(8.0, 500, 0.0), row(2.0, 100, 0.5)])  # fmt: skip
    rate, concurrency = workload_prediction(w, dict(max_batch=32), "replay", "decode")
    assert concurrency == 10 and rate == pytest.approx(10 / (0.01 * 10 * 0.5 + 5 * 0.02))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: workload_prompts("chat", 16, 50), "workload: expected one of"),
        (lambda: workload_prompts("agents", 4, 50), "block: expected at least 8 tokens, got 4"),
        (lambda: workload_prompts("agents", 16, 50, rounds=0), r"rounds: expected 1 <= rounds"),
        (lambda: arrivals(3, 0.0), r"rate: expected a number \(requests/s\) > 0, got 0"),
        (lambda: arrivals(-1, 5.0), r"n: expected 0 <= n, got -1"),
        (lambda: arrivals(3, math.nan), r"rate: expected .* > 0, got nan"),
        (lambda: workload_prompts("agents", 16, 0), r"vocab: expected 2 <= vocab, got 0"),
        (lambda: run_workload_stream(rates=()), r"rates: expected one rate or more, got \(\)"),
        # 1.5 failed in the drafter after the first strategy's rows had run
        (
            lambda: run_workload_stream(acceptance=1.5),
            r"acceptance: expected a finite number >= 0 and <= 1",
        ),
        # k = 0 made a "synthetic" row that never speculated
        (
            lambda: run_workload_stream(k=0, modes=("synthetic",)),
            r"k: expected 1 <= k with the speculative modes \['synthetic'\], got 0",
        ),
        (lambda: run_workload_stream(k=-1, modes=("decode",)), r"k: expected 0 <= k, got -1"),
        # a hit rate above 1 gave a rate, not an error
        (
            lambda: predicted_rate(4, 1e6, 1e3, 1e-3, 1e-2, 100, 10, 1.5),
            r"hit_rate: expected .* <= 1",
        ),
        (
            lambda: predicted_rate(0, 1e6, 1e3, 1e-3, 1e-2, 100, 10, 0.5),
            r"max_batch: expected 1 <=",
        ),
        (lambda: predicted_rate(4, 1e6, 1e3, 1e-3, -1.0, 100, 10, 0.5), r"tpot_s: expected .* > 0"),
        (lambda: predicted_rate(4, 1e6, 1e3, 1e-3, 1e-2, 100, 0, 0.5), r"n_out: expected .* > 0"),
        (
            lambda: sustainable_rate(lambda r: None, 0, OBJECTIVE),
            r"start: expected a finite number .* > 0, got 0",
        ),
        (lambda: sustainable_rate(lambda r: None, 2.0, OBJECTIVE, 0), r"probes: expected 1 <="),
        (lambda: sustainable_rate(lambda r: None, 2.0, {}), r"objective: expected a dict with"),
        (lambda: run_workload_stream("tpu"), r"preset: expected one of \['cpu', 'gpu'\]"),
        (lambda: run_workload_stream(modes=("decode", "beam")), "modes: expected some of"),
        (lambda: run_workload_stream(workloads=()), r"workloads: expected some of .* got \(\)"),
        (lambda: run_workload_stream(rates=(1.0, -2.0)), r"rates: expected > 0 .* got -2.0"),
        (lambda: run_workload_stream(block_size=16), r"overrides: unknown fields \['block_size'\]"),
    ],
)
def test_bad_input_is_refused_naming_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: arrivals(2.5, 5.0), r"n: expected an integer, got float 2.5"),
        (lambda: arrivals(3, True), r"rate: expected a number \(requests/s\), got bool True"),
        (lambda: arrivals(3, "5"), r"rate: expected a number .* got str '5'"),
        # 20.7 ran at block 20
        (lambda: workload_prompts("agents", 20.7, 50), r"block: expected an integer, got float"),
        (lambda: workload_prompts("agents", 16, 50, seed=1.5), r"seed: expected an integer"),
    ],
)
def test_the_wrong_kind_of_value_is_refused_naming_it(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def w_rows(result):
    return [r for w in result["workloads"].values() for r in w["rows"]]


def test_a_small_run_is_lossless_hits_more_with_replay_and_binds_the_budget(monkeypatch):
    import replaylab.serving

    built = []  # (strategy, slots, drafts a step verifies) of every engine the run builds

    class CountedEngine(replaylab.serving.DecodeEngine):
        def __init__(self, model, max_batch, *args, **kwargs):
            super().__init__(model, max_batch, *args, **kwargs)
            built.append((self.strategy, max_batch, self.max_verify))

    monkeypatch.setattr(replaylab.serving, "DecodeEngine", CountedEngine)
    seen = []  # what a run cut short would have kept: (rows, rates, complete) at each call
    result = small_run(
        workloads=("agents",),
        strategies=("replay", "snapshot"),
        modes=("decode", "synthetic", "draft-model"),
        rate_modes=("decode",),
        rate_probes=2,
        progress=lambda r: seen.append(
            (
                len(r["workloads"]["agents"]["rows"]),
                len(r["workloads"]["agents"]["rates"]),
                r["complete"],
            )
        ),  # fmt: skip
    )
    assert result["complete"]
    # every stream of a strategy and kind (plain decode; speculating) ran on one engine, as did
    # the drafts: a GPU's warm-up captures the graphs the timed streams replay; plain decode's
    # engines hold no room for drafts
    serving = [e for e in built if e[1] == result["config"]["max_batch"]]
    assert sorted(serving) == [
        ("replay", 4, 1), ("replay", 4, 5), ("replay", 4, 5), ("snapshot", 4, 1), ("snapshot", 4, 5)
    ]  # fmt: skip
    decode = {r["strategy"]: r for r in w_rows(result) if r["mode"] == "decode"}
    synthetic = {r["strategy"]: r for r in w_rows(result) if r["mode"] == "synthetic"}
    held = {s: r["accounted_bytes_per_request"]["mean"] for s, r in decode.items()}
    assert held["snapshot"] < 0.5 * synthetic["snapshot"]["accounted_bytes_per_request"]["mean"]
    # one call per row and per rate, each with one more than the last, none claiming the end
    assert [rows + rates for rows, rates, _ in seen] == list(range(1, 2 * 3 + 2 + 1))
    assert not any(done for _, _, done in seen)
    w = result["workloads"]["agents"]
    rows = {(r["strategy"], r["mode"]): r for r in w["rows"]}
    assert len(rows) == 2 * 3
    for r in rows.values():
        assert r["tokens_equal_alone"] == r["requests"] == 12
        assert r["peak_used_bytes"] <= r["budget_bytes"] == workload_budget(w, r["mode"])
    for mode in ("decode", "synthetic", "draft-model"):  # the divergences are off the grid
        assert rows[("replay", mode)]["token_hit_rate"] > rows[("snapshot", mode)]["token_hit_rate"]
    # all arriving at once, snapshot runs fewer than the engine's slots: the budget binds
    assert rows[("snapshot", "decode")]["peak_running"] < result["config"]["max_batch"]
    # each mode's budget is a quarter of one round's requests under snapshot on its engines,
    # so plain decode's smaller snapshot slots bind as the speculative ones do
    share = result["config"]["budget_share"] * w["prompts"]
    for mode in ("decode", "synthetic", "draft-model"):
        held = rows[("snapshot", mode)]["accounted_bytes_per_request"]["mean"]
        assert abs(workload_budget(w, mode) / held - share) < 0.01, mode
        assert rows[("snapshot", mode)]["peak_running"] <= share
    assert (
        w["budget_bytes"]["decode"]
        < w["budget_bytes"]["synthetic"]
        == w["budget_bytes"]["draft-model"]
    )
    assert rows[("replay", "synthetic")]["acceptance"] > 0.5
    assert {(r["strategy"], r["mode"]) for r in w["rates"]} == {
        ("replay", "decode"),
        ("snapshot", "decode"),
    }
    table = workload_summary(result)
    assert len(table) == 3 and table[2].startswith("| agents | decode |")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_on_a_gpu_no_timed_stream_captures_a_graph():
    with torch.no_grad():
        result = run_workload_stream(
            "cpu",
            workloads=("system_prompts",),
            strategies=("replay", "snapshot"),
            modes=("decode", "synthetic", "draft-model"),
            rates=(math.inf, 0.5),
            rate_modes=(),
            log=None,
        )
    rows = result["workloads"]["system_prompts"]["rows"]
    assert len(rows) == 2 * 3 * 2
    assert {(r["graph_captures"], r["draft_graph_captures"]) for r in rows} == {(0, 0)}
    assert all(r["tokens_equal_alone"] == r["requests"] for r in rows)


def test_the_committed_cpu_result_and_its_table_in_the_data_readme():
    result = json.loads((ROOT / "data" / "bench_workload_stream_cpu.json").read_text())
    assert {"device", "versions", "date", "command", "commit"} <= set(result)
    assert set(result["workloads"]) == set(WORKLOADS)
    for w in result["workloads"].values():
        for r in w["rows"]:
            assert r["tokens_equal_alone"] == r["requests"], (r["strategy"], r["mode"])
            assert r["peak_used_bytes"] <= r["budget_bytes"] == workload_budget(w, r["mode"])
    assert "\n".join(workload_summary(result)) in (ROOT / "data" / "README.md").read_text()


def test_as_real_takes_numbers_as_as_int_takes_integers():
    from replaylab.validation import as_real

    assert as_real("x", np.float32(0.5)) == 0.5 and as_real("x", torch.tensor(0.25)) == 0.25
    assert as_real("rate", math.inf, above=0, finite=False) == math.inf
    with pytest.raises(ValueError, match=r"x: expected a finite number, got inf"):
        as_real("x", 10**400)  # a raw OverflowError before
    with pytest.raises(TypeError, match=r"x: expected a number, got Tensor"):
        as_real("x", torch.tensor([0.5]))
