"""The prefix-cache benchmark at serving block sizes (``replaylab.bench.prefix_blocks``): the
model's byte ratios against Nemotron-H 8B's written out from its published shape, the
``ByteTree`` against the real ``EnginePrefixCache`` (the model prefilling every request), the
attention-only ideal against a brute-force longest-common-prefix count, the targets and
tables, the figure, and the committed result with the tables ``data/PREFIX.md`` shows."""

import json
import random
from pathlib import Path

import pytest
import torch

from replaylab.bench.prefix_blocks import (
    BLOCK_WORKLOADS,
    ByteTree,
    attention_ideal,
    block_targets,
    block_workload,
    blocks_markdown,
    model_ratios,
    nemotron_ratios,
    ratio_model,
    run_block_bench,
)
from replaylab.serving import DecodeEngine, EnginePrefixCache
from replaylab.testing import tiny_hybrid

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("replay", "snapshot", "recompute")


@pytest.fixture(autouse=True, scope="module")
def one_thread_no_grad():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        yield
    torch.set_num_threads(threads)


def test_nemotron_ratios_from_the_published_shape():
    """H=128, P=64, N=128, G=8, d_conv 4; 24 Mamba-2 and 4 attention layers of 8 KV heads of
    128; fp32 state, bf16 conv window, node entries and KV; a node keeps xBC and dt."""
    r = nemotron_ratios()
    state = 128 * 64 * 128 * 4 + 3 * (128 * 64 + 2 * 8 * 128) * 2
    entry = ((128 * 64 + 2 * 8 * 128) + 128) * 2  # xBC, dt
    kv = 4 * 2 * 8 * 128 * 2
    assert (r["state_bytes"], r["entry_bytes"], r["kv_token_bytes"]) == (state, entry, kv)
    assert r["state_per_entry"] == pytest.approx(state / entry, abs=1e-3)
    assert r["kv_per_log"] == pytest.approx(kv / (24 * entry), abs=1e-5)
    whole = nemotron_ratios(entry="log")  # what the decode log keeps: xBC, x, dt, B, C
    assert whole["entry_bytes"] == ((128 * 64 + 2 * 8 * 128) + 128 * 64 + 128 + 2 * 8 * 128) * 2
    with pytest.raises(ValueError, match="entry: expected 'node' or 'log', got 'raw'"):
        nemotron_ratios(entry="raw")


def test_the_ratio_model_holds_nemotrons_byte_ratios_within_one_percent():
    model = ratio_model()
    engine = DecodeEngine(model, 1, 64, "replay", log_length=16, max_verify=1)
    mine, real = model_ratios(engine), nemotron_ratios()
    for key in ("state_per_entry", "kv_per_log"):
        assert mine[key] == pytest.approx(real[key], rel=0.01), key
    # the tiny test model is the opposite: its log entry outweighs a hundredth of its state
    tiny = model_ratios(DecodeEngine(tiny_hybrid(), 1, 64, "replay", log_length=16))
    assert tiny["state_per_entry"] < 10
    with pytest.raises(ValueError, match="expected a replay engine"):
        model_ratios(DecodeEngine(model, 1, 64, "snapshot", log_length=16))


def _stream(rng, n=10):
    """Requests over a few shared prefixes of 5-40 tokens (vocabulary 50) + unique tails."""
    heads = [[rng.randrange(50) for _ in range(rng.randint(5, 40))] for _ in range(3)]
    return [
        rng.choice(heads) + [rng.randrange(50) for _ in range(rng.randint(1, 20))] for _ in range(n)
    ]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_byte_tree_gives_the_engine_caches_hits_and_bytes(strategy):
    """Budgets from one block to everything, LRU and cost eviction: every request's hit report,
    the bytes held and the tree's shape equal the real engine cache's."""
    rng = random.Random(strategy)
    engine = DecodeEngine(tiny_hybrid(), 1, 64, strategy, log_length=4, max_verify=1)
    for block in (4, 8):
        one = EnginePrefixCache(engine, block_size=block).block_bytes
        for budget in (None, one, 3 * one, 9 * one):
            eviction = rng.choice(["lru", "cost"])
            real = EnginePrefixCache(engine, block, budget, eviction)
            tree = ByteTree(engine, block, budget, eviction)
            for tokens in _stream(rng):
                slot, _, hit = real.admit(tokens)
                engine.retire(slot)
                assert tree.serve(tokens) == hit
                assert tree.held_bytes == real.held_bytes
            tree.check_rebuildable()
            shape = lambda t: sorted((n.start, n.tokens, n.log is None) for n in t.nodes())  # noqa: E731
            assert shape(tree) == shape(real)


def test_the_byte_tree_refuses_what_the_engine_cache_refuses():
    engine = DecodeEngine(tiny_hybrid(), 1, 64, "replay", log_length=4, max_verify=1)
    with pytest.raises(ValueError, match="multiples of the engine's log_length L=4"):
        ByteTree(engine, 6)
    tree = ByteTree(engine, 8)
    # the default eviction (lru-fit) holds a block without its log; less is refused
    assert tree.floor_bytes == tree.block_bytes - tree.block_log_bytes < tree.block_bytes
    with pytest.raises(ValueError, match="at least one replay block of 8 tokens without its log"):
        tree.set_budget(tree.floor_bytes - 1)
    tree.set_budget(tree.floor_bytes)
    tree.set_budget(None)
    with pytest.raises(ValueError, match=r"expected 1\.\.63 tokens \(fewer than the engine"):
        tree.serve([1] * 64)
    assert tree.held_bytes == 0 and not list(tree.nodes())


def test_a_bad_eviction_is_refused_before_the_sweep():
    from replaylab.bench.prefix import budget_sweep

    with pytest.raises(ValueError, match=r"eviction: expected one of .* got 'LRU'"):
        run_block_bench(eviction="LRU", log=lambda line: None)
    with pytest.raises(ValueError, match=r"eviction: expected one of .* got 'LRU'"):
        budget_sweep(tiny_hybrid(), (50_000,), eviction="LRU", log=lambda line: None)


def test_attention_ideal_counts_longest_common_prefixes():
    stream = [[1, 2, 3, 4], [1, 2, 9], [1, 2, 3, 4, 5], [7], [1, 2, 3, 4]]
    # 0 + min(2, 2) + min(4, 4) + 0 + min(5 matched, 3) over 17 tokens
    assert attention_ideal(stream) == round((0 + 2 + 4 + 0 + 3) / 17, 4)


def test_block_workloads_are_up_to_two_blocks_of_512():
    for name in BLOCK_WORKLOADS:
        stream = block_workload(name)
        assert stream == block_workload(name)  # seeded
        assert 256 < min(map(len, stream)) and max(map(len, stream)) <= 1024
        assert 0.5 < attention_ideal(stream) < 0.8
    docs = block_workload("shared_docs")
    assert all(attention_ideal([a, b]) * (len(a) + len(b)) < 512 for a, b in zip(docs, docs[4:]))
    with pytest.raises(ValueError, match="block_workload: expected one of"):
        block_workload("chat")


def test_a_small_block_bench_its_targets_and_tables():
    result = run_block_bench(
        block_sizes=(64, 512),
        budgets=(2**22, 2**26),
        workloads=("shared_docs", "few_shot"),
        validate=(),
        log=lambda line: None,
    )
    rows = {(r["workload"], r["block_size"], r["strategy"], r["budget"]): r for r in result["rows"]}
    assert len(rows) == 2 * 2 * 3 * 3
    for name in ("shared_docs", "few_shot"):
        free = rows[(name, 512, "replay", None)]
        assert (
            free["token_hit_rate"]
            == free["ideal_hit_rate"]
            == attention_ideal(block_workload(name))
        )
        # under one replay block, but over one without its log (the default eviction, lru-fit)
        assert "skipped" not in rows[(name, 512, "replay", 2**22)]
        assert (
            rows[(name, 512, "replay", 2**22)]["token_hit_rate"]
            >= (rows[(name, 512, "snapshot", 2**22)]["token_hit_rate"])
        )
        for b in (64, 512):
            held = [rows[(name, b, "replay", x)].get("bytes_held", 0) for x in (2**22, 2**26)]
            assert held[0] <= 2**22 and held[1] <= 2**26
    assert rows[("shared_docs", 512, "snapshot", None)]["token_hit_rate"] == 0  # docs < 512
    t = block_targets(result)
    none = t["per_budget"][-1]
    assert none["budget"] is None and none["ratio"] > 1
    assert t["ideal_from"][512]["replay"] >= 0.95 * t["pooled_ideal"]
    tables = blocks_markdown(result)
    assert tables["no_budget"][2].startswith("| shared_docs (")
    assert [line.split(" |")[0] for line in tables["equal_bytes"][2:]] == [
        "| 4.0 MiB (0.14 GiB)",
        "| 64.0 MiB (2.27 GiB)",
        "| none",
    ]
    assert len(tables["pooled"]) == 2 + 3 and len(tables["ideal_from"]) == 2 + 2
    assert (
        len(tables["ratios"]) == 2 + 2
        and "| Nemotron-H 8B | 4,255,744 | 20,736 |" in tables["ratios"][2]
    )


def test_logs_first_never_hits_less_than_align():
    """Under ``eviction="logs-first"`` a replay budget of one block without its log is served
    (it would be refused under LRU), and replay's hit rate is at least align's at every budget
    and block size: its tree under pressure is align's plus the logs that still fit."""
    result = run_block_bench(
        block_sizes=(64, 512),
        budgets=(2**22, 2**23, 2**26),
        workloads=("system_prompts", "multi_turn"),
        validate=(),
        eviction="logs-first",
        strategies=("replay", "snapshot"),
        log=lambda line: None,
    )
    assert result["eviction"] == "logs-first"
    rows = {(r["workload"], r["block_size"], r["strategy"], r["budget"]): r for r in result["rows"]}
    compared = 0
    for (name, b, strategy, budget), row in rows.items():
        if strategy != "replay" or "skipped" in rows[(name, b, "snapshot", budget)]:
            continue
        assert row["token_hit_rate"] >= rows[(name, b, "snapshot", budget)]["token_hit_rate"]
        compared += 1
    assert compared == 2 * 2 * 4 and "skipped" not in rows[("system_prompts", 512, "replay", 2**22)]
    assert rows[("system_prompts", 512, "replay", 2**23)]["token_hit_rate"] > 0


def test_lru_fit_serves_a_logless_block_and_never_hits_less_than_align():
    """Under ``eviction="lru-fit"`` (the default) a replay budget of one block without its log
    is served (LRU refuses it), and per workload, block size and budget replay hits at least
    what align (snapshot) hits; the committed sweep says the same of every row, and against
    the LRU sweep of the same tree it is lower in at most 5 of them."""
    result = run_block_bench(
        block_sizes=(64, 512),
        budgets=(2**22, 2**23, 2**24, 2**25, 2**26),
        workloads=("system_prompts", "multi_turn"),
        validate=(),
        eviction="lru-fit",
        strategies=("replay", "snapshot"),
        log=lambda line: None,
    )
    key = lambda r: (r["workload"], r["block_size"], r["budget"])  # noqa: E731
    rows = {(*key(r), r["strategy"]): r for r in result["rows"]}
    for (name, b, budget, strategy), row in rows.items():
        if strategy == "replay":
            align = rows[(name, b, budget, "snapshot")]["token_hit_rate"]
            assert row["token_hit_rate"] >= align, (name, b, budget)
    assert "skipped" not in rows[("system_prompts", 512, 2**22, "replay")]
    assert rows[("system_prompts", 512, 2**23, "replay")]["token_hit_rate"] > 0
    committed = json.loads((ROOT / "data" / "bench_prefix_blocks_cpu.json").read_text())
    previous = json.loads((ROOT / "data" / "bench_prefix_blocks_lru_cpu.json").read_text())
    assert committed["eviction"] == "lru-fit" and previous["eviction"] == "lru"
    assert committed["commit"] == previous["commit"]  # side by side: one tree
    assert all(v["hits_equal"] and v["bytes_equal"] for v in committed["validation"])
    old = {(*key(r), r["strategy"]): r for r in previous["rows"]}
    below_lru = 0
    for row in committed["rows"]:
        if row["strategy"] != "replay":
            continue
        align = old[(*key(row), "snapshot")].get("token_hit_rate")
        lru = old[(*key(row), "replay")].get("token_hit_rate")
        assert align is None or row["token_hit_rate"] >= align
        below_lru += lru is not None and row["token_hit_rate"] < lru
    assert below_lru <= 5


@pytest.mark.figures
def test_the_hit_rate_figure():
    from replaylab.teaching.plotting_serving import prefix_hit_rate_figure

    result = json.loads((ROOT / "data" / "bench_prefix_blocks_cpu.json").read_text())
    fig = prefix_hit_rate_figure(result, block_sizes=[64, 512])
    assert len(fig.data) == 2 * 4  # three strategies and the ideal per panel
    replay = fig.data[0]
    assert replay.name == "replay" and max(y for y in replay.y if y is not None) <= 1
    one = prefix_hit_rate_figure(result, block_sizes=[512], workload="shared_docs")
    assert max(y or 0 for y in one.data[1].y) == 0  # align never hits a document < 512
    with pytest.raises(ValueError, match="workload"):
        prefix_hit_rate_figure(result, workload="chat")


def test_the_committed_block_result_and_the_tables_in_prefix_md():
    result = json.loads((ROOT / "data" / "bench_prefix_blocks_cpu.json").read_text())
    assert {"device", "versions", "date", "command"} <= set(result)
    assert result["validation"] and all(
        v["hits_equal"] and v["bytes_equal"] for v in result["validation"]
    )
    for r in result["rows"]:
        if r["budget"] is None and r["strategy"] == "replay":
            assert r["token_hit_rate"] == r["ideal_hit_rate"]
        if "skipped" not in r and r["budget"] is not None:
            assert r["bytes_held"] <= r["budget"]
    text = (ROOT / "data" / "PREFIX.md").read_text()
    for name, table in blocks_markdown(result).items():
        assert "\n".join(table) in text, name
    targets = block_targets(result)  # the ratios the prose quotes
    assert f"({targets['per_budget'][-1]['ratio']:.2f}x)" in text
    for rows in targets["per_workload"].values():
        assert rows[-1]["ratio"] is None or f"{rows[-1]['ratio']:.2f}x" in text
        # with no budget replay is the ideal, so its ratio over align is the ceiling any
        # prefix cache could reach on that workload (within the rounding of the rates)
        assert rows[-1]["ceiling"] is None or abs(rows[-1]["ratio"] - rows[-1]["ceiling"]) < 0.01
    few_shot = targets["per_workload"]["few_shot"][-1]
    assert few_shot["ceiling"] < 2 and f"ceiling {few_shot['ceiling']:.2f}x" in text
    system = targets["per_workload"]["system_prompts"][-1]
    assert system["ceiling"] < 2 and f"ceiling {system['ceiling']:.2f}x" in text


@pytest.mark.parametrize("extra", [["--engine"], ["--engine", "--ttft"]])
def test_an_eviction_the_engine_runs_would_ignore_is_refused(extra, tmp_path):
    from replaylab.bench.cli import main

    out = tmp_path / "never.json"
    with pytest.raises(SystemExit, match=r"--eviction lru has no effect with --engine"):
        main(["prefix", *extra, "--eviction", "lru", "--out", str(out)])
    assert not out.exists()
