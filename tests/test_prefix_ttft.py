"""Time to first token through the serving engine's prefix cache (``bench.prefix.run_engine_ttft``)
on the CPU with its tiny preset: the smoke run of the GPU benchmark. What it must get right on
any device: every request after the warming one hits the shared prompt, computes only its own
suffix (and the last shared token's logits, never), and its first-token logits are the cold
admit's (tolerance 1e-5 over the largest |logit|: a hit prefills from another position than a
cold admit, so its chunks round differently; measured here ~2e-7)."""

import json

import pytest
import torch

from replaylab.bench.prefix import TTFT_PRESETS, run_engine_ttft, ttft_summary

TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_hits_compute_only_the_suffixes_and_give_the_cold_first_tokens():
    result = run_engine_ttft("cpu", device="cpu", log=lambda line: None)
    p = TTFT_PRESETS["cpu"]
    n, S = p["batch"], p["shared_tokens"]
    assert result["device_type"] == "cpu" and set(result["strategies"]) == {
        "replay",
        "snapshot",
        "recompute",
    }
    for strategy, r in result["strategies"].items():
        assert len(r["cold_ttft_s"]["values"]) == len(r["prefix_ttft_s"]["values"]) == n
        assert (
            r["cold_computed_tokens"]
            == result["prompt_tokens"]
            == n * S + r["prefix_computed_tokens"]
        )
        # the shared prompt (on the block grid) is resumed whole by every strategy
        assert r["token_hit_rate"] == round(n * S / result["prompt_tokens"], 4)
        assert r["max_logit_diff_over_scale"] < TOL, strategy
        assert r["first_tokens_agree"] == n
        assert r["bytes_held"] >= (S // p["block_size"]) * r["block_bytes"]
        c, q = r["cold_ttft_s"], r["prefix_ttft_s"]
        assert 0 < c["median"] <= c["p90"] and 0 < q["median"] <= q["p90"]
        assert r["speedup"] == round(c["median"] / q["median"], 3)
    assert len(ttft_summary(result)) == 2 + 3
    lo, hi = p["suffix_tokens"]
    assert len(result["suffix_lengths"]) == n and all(
        lo <= k <= hi for k in result["suffix_lengths"]
    )


def test_an_off_grid_shared_prompt_separates_replay_from_align():
    """A shared prompt of 40 tokens at block 32: replay resumes at 40, align and recompute's
    state at 32 (recompute re-runs 32..40)."""
    result = run_engine_ttft(
        "cpu", device="cpu", shared_tokens=40, batch=2, warm_up=0, log=lambda line: None
    )
    rows = result["strategies"]
    assert rows["replay"]["token_hit_rate"] > rows["snapshot"]["token_hit_rate"]
    assert (
        rows["replay"]["prefix_computed_tokens"] + 2 * 8
        == rows["snapshot"]["prefix_computed_tokens"]
    )
    assert rows["snapshot"]["prefix_computed_tokens"] == rows["recompute"]["prefix_computed_tokens"]
    assert all(r["max_logit_diff_over_scale"] < TOL for r in rows.values())


def test_passes_alternate_the_strategies_order_and_pool_their_times():
    """Two passes: the strategies in the given order, then reversed, so none is always timed
    first; every value of both passes in the spread, each pass's medians beside it, and the
    logits checked in both."""
    strategies = ("replay", "snapshot")
    result = run_engine_ttft(
        "cpu", device="cpu", strategies=strategies, batch=2, warm_up=0, passes=2,
        log=lambda line: None,
    )  # fmt: skip
    assert result["passes"] == 2
    assert result["pass_orders"] == [["replay", "snapshot"], ["snapshot", "replay"]]
    assert list(result["strategies"]) == list(strategies)
    for r in result["strategies"].values():
        for key, spread in (("cold_s", r["cold_ttft_s"]), ("prefix_s", r["prefix_ttft_s"])):
            assert len(spread["values"]) == 2 * 2
            assert len(r["pass_medians"][key]) == 2
            lo, hi = min(r["pass_medians"][key]), max(r["pass_medians"][key])
            assert min(spread["values"]) <= lo <= hi <= max(spread["values"])
        assert r["first_tokens_agree"] == 2 and r["max_logit_diff_over_scale"] < TOL
        assert r["cold_device_allocs"] is None and r["prefix_device_allocs"] is None  # CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_each_admit_reports_its_device_allocations():
    result = run_engine_ttft(
        "cpu", device="cuda", strategies=("replay",), batch=2, warm_up=0, passes=2,
        log=lambda line: None,
    )  # fmt: skip
    row = result["strategies"]["replay"]
    for key in ("cold_device_allocs", "prefix_device_allocs"):
        assert len(row[key]) == 2 * 2 and all(isinstance(a, int) and a >= 0 for a in row[key])


def test_each_admit_reports_the_collectors_seconds_and_freeze_leaves_gc_as_it_was():
    """The seconds Python's garbage collector ran inside each admit, one per admit in the order
    of the times (a collection forced inside an admit shows); ``gc="freeze"`` freezes the heap
    for the timed passes, and unfreezes it after where nothing was frozen before."""
    import gc

    from replaylab.bench import prefix as bench_prefix

    clock = bench_prefix._CollectorClock()
    gc.callbacks.append(clock)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(clock)
    assert clock.seconds > 0
    seen = []
    out, seconds = bench_prefix._first_token(
        lambda: (gc.collect(), torch.zeros(3)), torch.device("cpu"), collector=seen
    )
    assert len(seen) == 1 and 0 < seen[0] <= seconds
    frozen = gc.get_freeze_count()
    result = run_engine_ttft(
        "cpu", device="cpu", strategies=("replay",), batch=2, warm_up=0, gc="freeze",
        log=lambda line: None,
    )  # fmt: skip
    assert result["gc_frozen_before"] == frozen
    if not frozen:  # frozen for the passes, then unfrozen (else left frozen, as found)
        assert gc.get_freeze_count() == 0
    row = result["strategies"]["replay"]
    for key in ("cold_collector_s", "prefix_collector_s"):
        assert len(row[key]) == 2 and all(isinstance(s, float) and s >= 0 for s in row[key])
    assert result["gc"] == "freeze"


def test_replay_chunk_times_replay_with_hits_resumed_on_the_chunk_grid():
    """ "replay:chunk" is replay's engine with its prefix cache under ``resume="chunk"``: hits
    resume on the prefill's chunk grid (so compute as many tokens or more than replay's) and
    give the cold logits bit for bit."""
    result = run_engine_ttft(
        "cpu", device="cpu", strategies=("replay", "replay:chunk"), batch=3, warm_up=0,
        shared_tokens=90, block_size=64, prefill_chunk=32, log=lambda line: None,
    )  # fmt: skip
    plain, chunk = result["strategies"]["replay"], result["strategies"]["replay:chunk"]
    assert chunk["max_abs_logit_diff"] == 0.0 and chunk["first_tokens_agree"] == 3
    # replay resumes at the match (90), replay:chunk at the chunk grid below it (64)
    extra = chunk["prefix_computed_tokens"] - plain["prefix_computed_tokens"]
    assert extra == 3 * (90 - 64)
    assert any("replay:chunk" in line for line in ttft_summary(result))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="preset: expected one of"):
        run_engine_ttft("h100")
    with pytest.raises(ValueError, match=r"overrides: unknown fields \['shared'\]"):
        run_engine_ttft("cpu", shared=10)
    with pytest.raises(ValueError, match="suffix_tokens: expected 1 <= low <= high"):
        run_engine_ttft("cpu", suffix_tokens=(5, 2))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=rf"passes: expected an integer >= 1, got {bad!r}"):
            run_engine_ttft("cpu", passes=bad)
    for bad in ("replay:near", "snapshot:chunk"):
        with pytest.raises(ValueError, match=f"strategies: expected .* got '{bad}'"):
            run_engine_ttft("cpu", strategies=(bad,))
    with pytest.raises(ValueError, match="gc: expected 'default' or 'freeze', got 'off'"):
        run_engine_ttft("cpu", gc="off")


def test_the_cli_writes_the_result_with_provenance(tmp_path, capsys):
    from replaylab.bench.cli import main

    out = tmp_path / "ttft.json"
    argv = ["prefix", "--engine", "--ttft", "--preset", "cpu", "--batch", "2", "--warm-up", "0"]
    assert main([*argv, "--strategies", "replay", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"device", "versions", "date", "command"} <= set(result)
    assert result["batch"] == 2 and list(result["strategies"]) == ["replay"]
    assert "--ttft" in result["command"] and "replay" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="add --engine"):
        main(["prefix", "--ttft", "--out", str(out)])


@pytest.mark.figures
def test_the_notebook_reads_both_committed_gpu_runs():
    """Notebook 14's section 6: a line per strategy with its medians and ratios, and a panel per
    run whose bars are the medians in ms, cold then hit, from the committed JSON."""
    from replaylab.results import load_bench
    from replaylab.teaching.plotting_prefix import TTFT_RESULTS, ttft_figure, ttft_rows

    results = [load_bench(p) for p in TTFT_RESULTS]
    assert [r["shared_tokens"] for r in results] == [2048, 2000]
    assert all(r["device"] == "NVIDIA H200" and r["device_type"] == "cuda" for r in results)
    for r in results:
        lines = ttft_rows(r)
        assert len(lines) == 1 + len(r["strategies"])
        replay = r["strategies"]["replay"]
        cut = replay["cold_ttft_s"]["median"] / replay["prefix_ttft_s"]["median"]
        assert f"cut {cut:4.1f}x" in next(line for line in lines if "replay" in line)
    fig = ttft_figure(results)
    assert len(fig.data) == 2 * len(results)
    for i, r in enumerate(results):
        cold, hit = fig.data[2 * i], fig.data[2 * i + 1]
        for trace, key in ((cold, "cold_ttft_s"), (hit, "prefix_ttft_s")):
            want = [1e3 * s[key]["median"] for s in r["strategies"].values()]
            assert list(trace.y) == pytest.approx(want)


def test_the_prefill_roofline_counts_what_torchs_flop_counter_counts():
    """prefill_roofline's FLOPs against torch.utils.flop_counter on the model's own forward of T
    tokens: every linear layer but the LM head per token (the head once), the attention
    products over the causal triangle where the forward computes the full square, and 5 FLOPs
    per state element per token of each recurrent layer (from the config, not the pools)."""
    from torch.utils.flop_counter import FlopCounterMode

    from replaylab.bench.prefix import prefill_roofline
    from replaylab.model import HybridLM, preset
    from replaylab.serving import DecodeEngine

    cfg = preset("tiny")
    model = HybridLM(cfg, seed=0).eval()
    T = 40
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, cfg.vocab_size, (1, T)), None)
    counts = counter.get_flop_counts()
    total = counts["Global"]
    head_mm = counts["HybridLM.lm_head"][torch.ops.aten.mm]
    attention = total[torch.ops.aten.bmm]  # the full T x T square of QKᵀ and PV
    recurrent = cfg.pattern.count("M")
    state = cfg.ssm_heads * cfg.ssm_head_dim * cfg.d_state
    expected = (
        total[torch.ops.aten.mm] - head_mm + head_mm // T
        + (attention + 4 * cfg.attn_heads * cfg.head_dim * T) // 2
        + 5 * state * T * recurrent
    )  # fmt: skip
    engine = DecodeEngine(model, 1, T + 8, "replay", log_length=8, graphs=False)
    roof = prefill_roofline(engine, T, copy_gbs=100.0, matrix_tflops=1.0)
    assert roof["flops"] == expected
    assert roof["flop_seconds"] == pytest.approx(expected / 1e12)
    assert roof["seconds"] == max(roof["flop_seconds"], roof["byte_seconds"])
    assert roof["binds"] == ("flops" if roof["flop_seconds"] >= roof["byte_seconds"] else "bytes")
    # bytes: the weights once (T rows of the embedding table), K and V written for T
    # positions, each recurrent layer's fp32 state and its conv window written once
    f32 = 4
    weights = sum(p.numel() for p in model.parameters()) * f32
    weights -= (cfg.vocab_size - T) * cfg.hidden_size * f32
    kv = T * 2 * cfg.kv_heads * cfg.head_dim * f32 * cfg.pattern.count("*")
    window = (cfg.d_conv - 1) * (cfg.ssm_heads * cfg.ssm_head_dim + 2 * cfg.n_groups * cfg.d_state)
    assert roof["bytes"] == weights + kv + recurrent * (state + window) * f32


def test_cold_admissions_are_set_against_their_roofline_pass_by_pass():
    from replaylab.bench.prefix import prefill_roofline

    rates = (50.0, 0.5)
    result = run_engine_ttft("cpu", device="cpu", log=lambda line: None, rates=rates,
                             passes=2, strategies=("snapshot", "replay"))  # fmt: skip
    assert result["rates"] == dict(copy_gbs=50.0, matrix_tflops=0.5)
    lengths = [result["shared_tokens"] + k for k in result["suffix_lengths"]]
    for strategy, row in result["strategies"].items():
        roof = row["cold_roofline"]
        cold = row["cold_ttft_s"]["values"]
        n = len(lengths)
        passes = [cold[:n], cold[n:]]
        assert len(roof["pass_shares"]) == 2
        # the engine is the strategy's own: rebuild one to price the same prompts
        from replaylab.bench.stream import _model
        from replaylab.serving import DecodeEngine

        engine = DecodeEngine(_model("tiny", torch.device("cpu")), 1, max(lengths) + 1,
                              strategy, log_length=8, graphs=False)  # fmt: skip
        seconds = sum(prefill_roofline(engine, t, *rates)["seconds"] for t in lengths)
        for share, times in zip(roof["pass_shares"], passes):
            assert share == pytest.approx(seconds / sum(times), rel=1e-4)
        assert roof["share"] == pytest.approx(sum(roof["pass_shares"]) / 2)
    assert "cold/roofline" in ttft_summary(result)[1]
    assert run_engine_ttft("cpu", device="cpu", log=lambda line: None, batch=1,
                           strategies=("replay",))["strategies"]["replay"]["cold_roofline"] is None  # fmt: skip


def test_bad_rates_are_refused_before_anything_runs(monkeypatch):
    import replaylab.bench.stream as stream

    def no_model(*args):
        raise AssertionError("a model was built before the rates were checked")

    monkeypatch.setattr(stream, "_model", no_model)
    for bad in ((0.0, 1.0), (1.0,), "fast", "12", (1.0, -2.0), (float("inf"), 1.0)):
        with pytest.raises(
            ValueError, match=r"rates: expected \(copy GB/s > 0, matrix TFLOP/s > 0\)"
        ):
            run_engine_ttft("cpu", device="cpu", rates=bad)
