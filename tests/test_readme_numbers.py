"""The README's engine table and sentences quote data/bench_engine.json: recomputed here, so
a new run that changes them fails until the README is updated."""

import gzip
import json
import re
from pathlib import Path

from replaylab.results import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _tok_s(row):
    return row["batch"] / row["seconds_per_token"]["median"]


def test_the_engine_table_matches_the_committed_run():
    rows = load_bench("data/bench_engine.json")["rows"]
    get = lambda **k: next(r for r in rows if all(r.get(a) == v for a, v in k.items()))  # noqa: E731
    text = (ROOT / "README.md").read_text()
    table = re.findall(
        r"^\| (\d+) \| ([\d,]+) \((\d+)%\) \| ([\d,]+) \((\d+)%\) \| ([\d,]+) "
        r"\((\d+)%\) \| ([\d,]+) \|$",
        text,
        re.M,
    )
    assert [int(t[0]) for t in table] == [1, 8, 64, 128, 256]
    for batch, *cells in table:
        b = int(batch)
        found = [
            get(preset="8b-layers", strategy="replay", batch=b, fused=True),
            get(preset="8b-layers", strategy="snapshot", batch=b, fused=True),
            get(provider="mamba-ssm generate(cg=True)", batch=b),
        ]
        for i, row in enumerate(found):
            assert int(cells[2 * i].replace(",", "")) == round(_tok_s(row))
            assert int(cells[2 * i + 1]) == round(100 * row["roofline_fraction"])
        hf = get(provider="transformers generate", batch=b)
        assert int(cells[6].replace(",", "")) == round(_tok_s(hf))
    busy = re.search(
        r"replay (\d+)% at batch 1 and\s+(\d+)% at batch 64, snapshot (\d+)% and (\d+)%", text
    )
    cases = [("replay", 1), ("replay", 64), ("snapshot", 1), ("snapshot", 64)]
    for (strategy, batch), pct in zip(cases, busy.groups(), strict=True):
        row = get(preset="8b-layers", strategy=strategy, batch=batch, fused=True)
        assert int(pct) == round(100 * row["gpu_busy"]), (strategy, batch)
    kernels = re.search(r"add up to (\d+)% \(replay\) and (\d+)% \(snapshot\)", text)
    for strategy, pct in zip(("replay", "snapshot"), kernels.groups(), strict=True):
        row = get(preset="8b-layers", strategy=strategy, batch=1, fused=True)
        step_us = row["seconds_per_token"]["median"] * 1e6
        assert int(pct) == round(100 * row["profile"]["device_us_per_step"] / step_us), strategy
    held = {r["strategy"]: r["max_batch"] for r in rows if r.get("workload") == "concurrency"}
    assert f"holds {held['replay']}" in text and f"path's {held['snapshot']}" in text


def test_the_family_kernel_sentence_matches_the_committed_runs():
    text = " ".join((ROOT / "README.md").read_text().split())
    decode = load_bench("data/bench_gdn_kernels.json")["decode"]
    at16 = {d["batch"]: d["vs_fla"] for d in decode if d["L"] == 16}
    quoted = re.search(
        r"step is ([\d.]+)x at batch 1, ([\d.]+)x at 8, ([\d.]+)x at 32, ([\d.]+)x at 128 and "
        r"([\d.]+)x at 256",
        text,
    )
    assert quoted, "the README's Gated DeltaNet sentence is gone"
    for batch, value in zip((1, 8, 32, 128, 256), quoted.groups()):
        assert float(value) == round(at16[batch], 2), (batch, value, at16[batch])
    mamba1 = {b["batch"]: b["L"] for b in load_bench("data/bench_mamba1_kernels.json")["batches"]}
    quoted = re.search(
        r"at its best log length \(L = (\d+)\), is ([\d.]+)x mamba-ssm's "
        r"`selective_state_update` at batch 1 and ([\d.]+)-([\d.]+)x from batch 32",
        text,
    )
    assert quoted, "the README's Mamba-1 sentence is gone"
    L = quoted.group(1)
    speedup = {b: float(by_L[L]["amortised"]["speedup_vs_ssu"]) for b, by_L in mamba1.items()}
    for b, by_L in mamba1.items():  # L is the best log length at every batch
        assert speedup[b] == max(r["amortised"]["speedup_vs_ssu"] for r in by_L.values())
    large = [v for b, v in speedup.items() if b >= 32]
    assert float(quoted.group(2)) == round(speedup[1], 2)
    assert (float(quoted.group(3)), float(quoted.group(4))) == (
        round(min(large), 2),
        round(max(large), 2),
    )


def test_the_family_engine_sentence_matches_the_committed_run():
    fam = load_bench("data/bench_engine_families.json")
    text = " ".join((ROOT / "README.md").read_text().split())
    row = next(
        r for r in fam["rows"]
        if (r["preset"], r["strategy"], r["batch"]) == ("qwen3.5-9b-layers", "replay", 128)
    )  # fmt: skip
    q = next(q for q in fam["ratios"] if (q["preset"], q["batch"]) == ("qwen3.5-9b-layers", 128))
    same = [r["speculative_equal_greedy"] for r in fam["rows"] if "speculative_equal_greedy" in r]
    assert f"equal greedy ones in {sum(same)} of {len(same)} rows" in text
    assert (
        f"at batch 128 at {row['decode_tokens_per_s']:,.0f} tokens/s: "
        f"{q['replay_over_snapshot']:.2f}x the engine's snapshot and "
        f"{q['replay_over_fla_snapshot']:.2f}x a snapshot step through fla's" in text
    )


def test_the_speculation_profile_sentence_matches_the_committed_run():
    prof = load_bench("data/spec_round_profile.json")
    fam = load_bench("data/bench_engine_families.json")
    text = " ".join((ROOT / "README.md").read_text().split())
    phases = prof["phases_ms_per_round"]
    host = sum(ms for name, ms in phases.items() if not name.startswith("verify"))
    verify = next(ms for name, ms in phases.items() if name.startswith("verify"))
    speedup = prof["speculative_tokens_per_s"] / prof["decode_tokens_per_s"]
    ratio = next(
        q["replay_speculative_over_best_decode"]
        for q in fam["ratios"]
        if (q["preset"], q["batch"]) == (prof["preset"], prof["batch"])
    )
    geometric = sum(prof["acceptance"] ** i for i in range(prof["k"] + 1))
    assert (
        f"gains little or nothing: {ratio:.2f}x the best plain decode in that run, "
        f"{speedup:.2f}x in a profile of its rounds" in text
    )
    assert (
        f"round took {prof['round_in_decode_steps']:.2f} decode steps and gave "
        f"{prof['tokens_per_round'] / prof['batch']:.2f} tokens a sequence, where the drafter's "
        f"acceptance gives {geometric:.2f}: the verify step took {verify:.2f} ms, drafting, "
        f"argmax, acceptance and rollback {host:.2f} ms, a round before a fold proposes fewer "
        f"drafts, and the batch ran {prof['rounds']} rounds" in text
    )
    assert prof["speculative_equal_greedy"] and prof["batch"] == 32


def test_the_gdn_fold_sentence_matches_the_committed_runs():
    text = " ".join((ROOT / "README.md").read_text().split())
    rows = load_bench("data/bench_gdn_kernels.json")["rows"]
    share = [r["of_copy"] for r in rows if r["provider"] == "fold" and r.get("L") == 16]
    from_8 = [r["of_copy"] for r in rows if r["provider"] == "fold" and r.get("L") == 16
              and r["batch"] >= 8]  # fmt: skip
    assert len(share) == 5
    fold = load_bench("data/ncu_summary.json")["gdn_fold_default_b128"]
    assert (
        f"at {round(100 * min(from_8))}-{round(100 * max(from_8))}% of the device's copy "
        f"bandwidth from batch 8; Nsight Compute finds it at "
        f"{round(fold['achieved_occupancy_pct'])}% occupancy with {fold['registers']:.0f} "
        f"registers a thread" in text
    )


def test_the_lossless_sentence_matches_the_committed_run():
    run = load_bench("data/bench_matched.json")
    rows = run["rows"]
    get = lambda arm, b, s="replay": next(  # noqa: E731
        r for r in rows if r["arm"] == arm and r["batch"] == b and r["strategy"] == s
    )
    peer = {r["batch"]: _tok_s(r) for r in run["mamba_ssm"]}
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(
        r"replay decodes ([\d,]+), ([\d,]+), ([\d,]+), ([\d,]+) and ([\d,]+) tokens/s at batch "
        r"1, 8, 64, 128 and 256: ([\d.]+)x, ([\d.]+)x, ([\d.]+)x, ([\d.]+)x and ([\d.]+)x "
        r"mamba-ssm's `generate\(cg=True\)`, and ([\d.]+)-([\d.]+)x the same engine on cuBLAS",
        text,
    )
    batches = [1, 8, 64, 128, 256]
    tok = [round(get("row_invariant", b)["decode_tokens_per_s"]) for b in batches]
    assert [int(v.replace(",", "")) for v in m.groups()[:5]] == tok
    ratios = [round(get("row_invariant", b)["decode_tokens_per_s"] / peer[b], 2) for b in batches]
    assert [float(v) for v in m.groups()[5:10]] == ratios
    vs_torch = [
        get("row_invariant", r["batch"])["decode_tokens_per_s"] / r["decode_tokens_per_s"]
        for r in rows
        if r["arm"] == "torch"
    ]
    assert [float(v) for v in m.groups()[10:]] == [round(min(vs_torch), 2), round(max(vs_torch), 2)]
    spec = re.search(
        r"gives ([\d.]+)x plain decode at batch 1, ([\d.]+)x at 8, ([\d.]+)x at 32 and "
        r"([\d.]+)x at 128",
        text,
    )
    found = [round(get("row_invariant", b)["speculation_over_decode"], 2) for b in (1, 8, 32, 128)]
    assert [float(v) for v in spec.groups()] == found
    assert all(r["speculative_equal_greedy"] for r in rows if "speculative_equal_greedy" in r)


def test_the_mamba1_and_roofline_sentences_match_the_committed_runs():
    """The Mamba-1 cost-model sentence (the kernel's rate and the break-even log length from
    data/bench_mamba1_kernels.json), the ssu rows' ratios and the families' roofline range."""
    from replaylab import costmodel as cm

    text = " ".join((ROOT / "README.md").read_text().split())
    m1 = load_bench("data/bench_mamba1_kernels.json")
    rate = cm.measured_update_rate(m1)
    assert f"With the {rate / 1e12:.2f}e12 element updates a second" in text
    bandwidth = m1["copy_bandwidth_gbs"] * 1e9
    assert f"could pay at {cm.mamba1_break_even(bandwidth, rate):.2f}" in text
    ratios = load_bench("data/bench_engine_families_ssu.json")["ratios"]
    got = [f"{q['replay_over_ssu_snapshot']:.2f}x" for q in ratios]
    assert f"{got[0]}, {got[1]} and {got[2]} at batch 8, 32 and 128" in text
    assert [q["batch"] for q in ratios] == [8, 32, 128]
    rows = load_bench("data/bench_engine_families_roofline.json")["rows"]
    replay = [r for r in rows if r["strategy"] == "replay" and r["batch"] <= 32]
    assert {r["preset"] for r in replay} == {
        "qwen3.5-9b-layers", "jamba-1.5-mini-layers", "bamba-9b-layers",
    }  # fmt: skip
    shares = [round(100 * r["roofline"]["share"]) for r in replay]
    busy = [round(100 * r["gpu_busy"]) for r in replay]
    assert f"replay at {min(shares)}-{max(shares)}% of the roofline" in text
    assert f"busy for {min(busy)}-{max(busy)}% of the steps" in text


def test_the_mamba1_snapshot_step_sentence_matches_the_committed_runs():
    """The Mamba-1 ``state_update`` sentence: the kernel against selective_state_update, and
    the Jamba-class engine's snapshot rows against the token loop, replay and ssu snapshot."""
    text = " ".join((ROOT / "README.md").read_text().split())
    kernels = load_bench("data/bench_mamba1_kernels_update_h100.json")["batches"]
    ratios = [e["update"]["speedup_vs_ssu"] for e in kernels]
    assert [e["batch"] for e in kernels] == [1, 8, 32, 128, 256]
    assert f"({min(ratios):.2f}-{max(ratios):.2f}x `selective_state_update` at batch 1-256" in text
    rows = load_bench("data/bench_engine_families_jamba_state_update_h100.json")["rows"]
    before = load_bench("data/bench_engine_families_jamba_token_loop_h100.json")["rows"]

    def decode(table, strategy):
        return {r["batch"]: r["decode_tokens_per_s"] for r in table if r["strategy"] == strategy}

    snap, old = decode(rows, "snapshot"), decode(before, "snapshot")
    replay, ssu = decode(rows, "replay"), decode(rows, "ssu snapshot")
    assert list(snap) == [8, 32, 128]
    tok = ", ".join(f"{snap[b]:,.0f}" for b in (8, 32)) + f" and {snap[128]:,.0f}"
    assert f"snapshot decodes {tok} tokens/s at batch 8, 32 and 128" in text

    def three(other):
        q = [f"{snap[b] / other[b]:.2f}x" for b in (8, 32, 128)]
        return f"{q[0]}, {q[1]} and {q[2]}"

    assert f"{three(old)} the token loop before it, {three(replay)} replay and {three(ssu)}" in text
    memory = {
        m["strategy"]: m
        for m in load_bench("data/bench_engine_families_jamba_state_update_h100.json")["memory"]
    }
    mib = {k: m["pool_bytes_per_slot"] / 2**20 for k, m in memory.items()}
    tokens = memory["replay"]["max_len"]
    pools = f"({mib['replay']:.1f} against {mib['snapshot']:.1f} MiB a slot at {tokens:,} tokens)"
    assert pools in text


def test_the_gdn_and_mamba2_snapshot_step_sentence_matches_the_committed_runs():
    """The Gated DeltaNet and Mamba-2 step-kernel sentence: snapshot with the kernel over the
    token loop (the two arms of one call) and over fla snapshot, and replay's range."""
    text = " ".join((ROOT / "README.md").read_text().split())
    on = load_bench("data/bench_engine_families_snapshot_kernels_state_update_h100.json")["rows"]
    off = load_bench("data/bench_engine_families_snapshot_kernels_token_loop_h100.json")["rows"]

    def decode(rows, preset, strategy):
        return {
            r["batch"]: r["decode_tokens_per_s"]
            for r in rows
            if r["preset"] == preset and r["strategy"] == strategy
        }

    def three(num, den):
        q = [f"{num[b] / den[b]:.2f}x" for b in (8, 32, 128)]
        return f"{q[0]}, {q[1]} and {q[2]}"

    qwen, bamba = "qwen3.5-9b-layers", "bamba-9b-layers"
    q_on, b_on = decode(on, qwen, "snapshot"), decode(on, bamba, "snapshot")
    assert f"decoded {three(q_on, decode(off, qwen, 'snapshot'))} its token loop" in text
    assert f"({three(q_on, decode(on, qwen, 'fla snapshot'))} fla's recurrent step" in text
    assert f"and {three(b_on, decode(off, bamba, 'snapshot'))} on the Bamba-class stack" in text
    replay_over = [
        decode(on, p, "replay")[b] / s[b]
        for p, s in ((qwen, q_on), (bamba, b_on))
        for b in (8, 32, 128)
    ]
    lo, hi = min(replay_over), max(replay_over)
    assert f"it decodes at {lo:.2f}-{hi:.2f}x snapshot's speed" in text


def test_the_pinned_mamba2_step_sentence_matches_the_committed_runs():
    """Bamba-class snapshot speculation at batch 128 with Mamba-2's step launched alike at every
    batch, over the launch tuned per batch (two arms of one call), on both paths."""
    text = " ".join((ROOT / "README.md").read_text().split())
    spec = {
        (arm, r["fused"]): r["speculative_tokens_per_s"]
        for arm in ("tuned", "pinned")
        for r in load_bench(f"data/bench_engine_families_bamba_step_{arm}_h100.json")["rows"]
        if r["batch"] == 128 and r["strategy"] == "snapshot"
    }
    ref, fused = (spec["pinned", f] / spec["tuned", f] for f in (False, True))
    assert f"batch 128 up {ref:.2f}x on the reference path and {fused:.2f}x on the fused" in text


def test_the_matched_snapshot_speculation_sentence_matches_the_committed_runs():
    """The weight-matched model's steady snapshot speculation over plain decode at batch 128,
    the tree before the pin and the pinned one (one call)."""
    text = " ".join((ROOT / "README.md").read_text().split())
    steady = [
        next(r for r in load_bench(f"data/{name}")["rows"] if r["batch"] == 128)
        for name in (
            "bench_spec_steady_snapshot_previous_2b24083_h100.json",
            "bench_spec_steady_snapshot_this_3d43fb7_h100.json",
        )
    ]
    assert all(r["strategy"] == "snapshot" and r["speculative_equal_greedy"] for r in steady)
    before, after = (f"{r['steady_speculation_over_decode']:.2f}x" for r in steady)
    assert f"from {before} to {after} plain decode" in text


def test_the_prompt_conv_ttft_sentence_matches_the_committed_runs():
    """The median prefix hit's speedup on the tree with the prompt conv in one launch over the
    tree before it (two rounds), and replay's hit over its cold admission after."""
    text = " ".join((ROOT / "README.md").read_text().split())
    runs = {
        (tree, r): load_bench(f"data/bench_prefix_ttft_conv_{tree}_{r}_h100.json")["strategies"]
        for tree in ("previous", "this")
        for r in (1, 2)
    }

    def hit(tree, r, s):
        return runs[tree, r][s]["prefix_ttft_s"]["median"]

    faster = {
        s: [f"{hit('previous', r, s) / hit('this', r, s):.2f}x" for r in (1, 2)]
        for s in ("replay", "snapshot")
    }
    assert (
        f"came {faster['replay'][0]} and {faster['replay'][1]} faster under replay and "
        f"{faster['snapshot'][0]} and {faster['snapshot'][1]} under snapshot" in text
    )
    over_cold = [
        f"{runs['this', r]['replay']['cold_ttft_s']['median'] / hit('this', r, 'replay'):.2f}x"
        for r in (1, 2)
    ]
    assert f"still only {over_cold[0]} and {over_cold[1]} faster than its cold" in text


def test_the_hit_trims_ttft_sentence_matches_the_committed_runs():
    """The median hit and cold admission on the tree with the hit's trims over the tree before
    them (two rounds, H200), and replay's hit over its cold admission after."""
    text = " ".join((ROOT / "README.md").read_text().split())
    trees = {"previous": "previous_91bc487", "this": "this_71f43c0"}
    runs = {
        (tree, r): load_bench(f"data/bench_prefix_ttft_trims_{name}_{r}_h200.json")["strategies"]
        for tree, name in trees.items()
        for r in (1, 2)
    }

    def median(tree, r, s, kind):
        return runs[tree, r][s][f"{kind}_ttft_s"]["median"]

    def ratios(s, kind):
        return [
            f"{median('previous', r, s, kind) / median('this', r, s, kind):.2f}x" for r in (1, 2)
        ]

    replay_hit, snapshot_hit = ratios("replay", "prefix"), ratios("snapshot", "prefix")
    assert (
        f"came {replay_hit[0]} and {replay_hit[1]} faster under replay and {snapshot_hit[0]} "
        f"and {snapshot_hit[1]} under snapshot" in text
    )
    replay_cold, snapshot_cold = ratios("replay", "cold"), ratios("snapshot", "cold")
    assert (
        f"cold admissions {replay_cold[0]} and {replay_cold[1]} faster under replay and "
        f"{snapshot_cold[0]} and {snapshot_cold[1]} under snapshot" in text
    )

    def over_cold(tree):
        return [
            f"{median(tree, r, 'replay', 'cold') / median(tree, r, 'replay', 'prefix'):.2f}x"
            for r in (1, 2)
        ]

    now, then = over_cold("this"), over_cold("previous")
    assert (
        f"replay's hit is now {now[0]} and {now[1]} faster than its cold admission, down from "
        f"{then[0]} and {then[1]} on the previous tree in the same runs" in text
    )
    counts = {r["strategy"]: r["launches"] for r in
              load_bench("data/prefill_launch_count_hit_final_cpu.json")["rows"]}  # fmt: skip
    before = {r["strategy"]: r["launches"] for r in
              load_bench("data/prefill_launch_count_hit_conv_splits_cpu.json")["rows"]}  # fmt: skip
    assert (
        f"launches {counts['replay']} operations under replay and {counts['snapshot']} under "
        f"snapshot, where it launched {before['replay']} and {before['snapshot']}" in text
    )


def test_the_batched_drafter_sentence_matches_the_host_probe():
    runs = load_bench("data/spec_host_probe_drafters_cpu.json")["runs"]
    text = " ".join((ROOT / "README.md").read_text().split())
    found = re.search(r"at batch 128 falls from ([\d.]+) to ([\d.]+) ms", text)
    at_128 = [next(r for r in run["rows"] if r["batch"] == 128) for run in runs]
    previous, batched = at_128[0], at_128[2]
    assert previous["label"].startswith("previous") and batched["drafters"] == "batched"
    assert found.groups() == (f"{previous['ms_per_round']:.2f}", f"{batched['ms_per_round']:.2f}")


def test_the_draft_model_table_in_data_readme_matches_its_json():
    result = load_bench("data/bench_draft_model_cpu.json")
    text = (ROOT / "data" / "README.md").read_text()
    rate = {(r["batch"], r["part"], r["mode"]): r for r in result["rows"]}
    for batch in (1, 8):
        for part in ("static", "continuous"):
            row = [rate[(batch, part, m)] for m in ("decode", "ModelDrafter", "BatchModelDrafter")]
            tps = [r["tokens_per_s"]["median"] for r in row]
            assert row[1]["acceptance"] == row[2]["acceptance"] and row[2]["same_tokens_as_decode"]
            line = (
                f"| {batch}, {part} | {tps[0]:.1f} | {tps[1]:.1f} | {tps[2]:.1f} | "
                f"{tps[2] / tps[1]:.2f}x | {row[2]['acceptance']:.3f} |"
            )
            assert line in text, line


def test_the_prefill_kernel_sentence_matches_the_committed_probe():
    import json

    probe = json.loads((ROOT / "data" / "prefill_kernel_probe.json").read_text())
    ms = {(r["kind"], r["strategy"], r["arm"]): 1e3 * r["seconds"] for r in probe["rows"]}
    text = " ".join((ROOT / "README.md").read_text().split())
    torch_ms = [ms[("cold", s, "default")] for s in ("snapshot", "replay")]
    fused_ms = [ms[("cold", s, "fused kernels")] for s in ("snapshot", "replay")]
    assert probe["date"].startswith("2026-12-05") and probe["device"] == "NVIDIA H200"
    assert (
        f"took {torch_ms[0]:.1f} ms under snapshot and {torch_ms[1]:.1f} ms under replay with the "
        f"PyTorch scan, {fused_ms[0]:.1f} ms and {fused_ms[1]:.1f} ms with the fused path's "
        f"kernels: {torch_ms[0] / fused_ms[0]:.2f}x and {torch_ms[1] / fused_ms[1]:.2f}x"
    ) in text


def test_the_scan_checkpoint_sentence_matches_the_committed_runs():
    def busy_ms(name, strategy):
        rows = load_bench(ROOT / "data" / f"prefill_profile_fused_h100{name}.json")["rows"]
        cold = [r for r in rows if r["strategy"] == strategy and "shared" not in r]
        return cold[0]["device_busy_ms"]

    runs = [
        load_bench(ROOT / "data" / f"bench_prefix_ttft_warm_shapes_{first}_first_h100.json")
        for first in ("replay", "snapshot")
    ]
    for run, first in zip(runs, ("replay", "snapshot")):
        assert run["pass_orders"][0][0] == first
    cold = [{s: 1e3 * r["strategies"][s]["cold_ttft_s"]["median"] for s in r["strategies"]}
            for r in runs]  # fmt: skip
    text = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"kept the device busy {busy_ms('', 'replay'):.1f} ms under replay and "
        f"{busy_ms('', 'snapshot'):.1f} ms under snapshot ({busy_ms('_before', 'replay'):.1f} ms "
        f"under replay before"
    ) in text
    assert (
        f"replay's median cold admission took {cold[0]['replay']:.1f} and "
        f"{cold[1]['replay']:.1f} ms, "
        f"{cold[0]['replay'] / cold[0]['snapshot']:.2f}x and "
        f"{cold[1]['replay'] / cold[1]['snapshot']:.2f}x snapshot's in the same runs"
    ) in text


def test_the_spare_ring_sentence_matches_the_cost_model():
    from replaylab.costmodel import tokens_per_round

    text = " ".join((ROOT / "README.md").read_text().split())
    clipped, spare = tokens_per_round(4, 0.8, 16), tokens_per_round(4, 0.8, 16, 16 + 4)
    assert (
        f"at L = 16, k = 4 and acceptance 0.8 a round keeps {clipped:.2f} tokens on average "
        f"with the ring of L rows and {spare:.2f} with the spare ones"
    ) in text


def test_the_steady_speculation_and_fused_gdn_sentences_match_the_committed_runs():
    text = " ".join((ROOT / "README.md").read_text().split())
    ratios = re.search(
        r"speculation gave ([\d.]+)x plain decode at batch 8, ([\d.]+)x at 32 and ([\d.]+)x at "
        r"128, where the tree before that session's host-work cut gave ([\d.]+)x, ([\d.]+)x and "
        r"([\d.]+)x",
        text,
    ).groups()
    runs = [load_bench(f"data/bench_spec_steady_h100_{c}.json") for c in ("ed17032", "96028da")]
    want = [r["steady_speculation_over_decode"] for run in runs for r in run["rows"]]
    assert [r["batch"] for run in runs for r in run["rows"]] == [8, 32, 128] * 2
    assert all(r["speculative_equal_greedy"] for run in runs for r in run["rows"])
    assert [float(q) for q in ratios] == [round(w, 2) for w in want]
    flat = re.search(r"rate did not move \(([\d,]+) and ([\d,]+) tokens/s\)", text).groups()
    at8 = [run["rows"][0]["speculative"]["steady_tokens_per_s"] for run in runs[::-1]]
    assert [int(q.replace(",", "")) for q in flat] == [round(t) for t in at8]
    slower = re.search(r"plain decode measured (\d+)% slower", text).group(1)
    plain8 = [run["rows"][0]["plain"]["steady_tokens_per_s"] for run in runs]
    assert int(slower) == round(100 * (1 - plain8[0] / plain8[1]))
    fused = re.search(
        r"it decoded ([\d.]+)x, ([\d.]+)x and ([\d.]+)x the graphed reference path at batch 8, "
        r"32 and 64 on one H100 .*?, (\d+)%, (\d+)% and (\d+)% of the two-term roofline; before "
        r"those two Gated DeltaNet kernels, in an earlier call that day, it gave ([\d.]+)x, "
        r"([\d.]+)x and ([\d.]+)x",
        text,
    ).groups()
    for name, quoted in (("norm", fused[:3]), ("inputs_before", fused[6:])):
        run = load_bench(f"data/bench_engine_families_fused_gdn_{name}_h100.json")
        by_batch = {
            q["batch"]: q["fused_replay_over_graphed_reference"]
            for q in run["ratios"]
            if q["graphs"] == "fused"
        }
        assert [float(q) for q in quoted] == [round(by_batch[b], 2) for b in (8, 32, 64)]
        if name == "norm":
            share = {r["batch"]: r["roofline"]["share"] for r in run["rows"] if r["fused"]}
            assert [int(p) for p in fused[3:6]] == [round(100 * share[b]) for b in (8, 32, 64)]


def test_the_prompt_kernel_sentence_matches_the_committed_sweeps_and_profiles():
    import json

    runs = [json.loads((ROOT / "data" / f"ssd_chunked_speed_h100_{c}.json").read_text())
            for c in ("dd8a94b", "9313930")]  # fmt: skip

    def ms(run, T, arm, warps=None, block_p=None):
        (row,) = [r for r in run["rows"] if r["T"] == T and r["arm"] == arm
                  and (warps is None or (r["Q"], r["warps"], r["block_p"]) == (64, warps, block_p))]  # fmt: skip
        return row["ms"]

    text = " ".join((ROOT / "README.md").read_text().split())
    new = [ms(r, 256, "this", 4, 32) for r in runs]
    old = [ms(r, 256, "previous", 8, 64) for r in runs]
    assert (
        f"took {new[0]:.4f} and {new[1]:.4f} ms where the previous kernel took {old[0]:.4f} and "
        f"{old[1]:.4f} ms ({old[0] / new[0]:.2f}x and {old[1] / new[1]:.2f}x)"
    ) in text
    new = {f"{ms(r, 2048, 'this', 4, 32):.3f}" for r in runs}
    old = {f"{ms(r, 2048, 'previous', 8, 64):.3f}" for r in runs}
    ratios = {f"{ms(r, 2048, 'previous', 8, 64) / ms(r, 2048, 'this', 4, 32):.2f}" for r in runs}
    assert len(new) == len(old) == len(ratios) == 1  # the two sweeps agree to the digits quoted
    assert f"tokens {new.pop()} ms where they took {old.pop()} ms ({ratios.pop()}x in both)" in text
    for T in (256, 2048):
        peer = sorted(ms(r, T, "mamba_chunk_scan_combined") for r in runs)
        assert f"{peer[0]:.3f}-{peer[1]:.3f} ms" in text
    busy = [
        json.loads((ROOT / "data" / f"prefill_profile_ssd_{t}_h100.json").read_text())["rows"][0]
        for t in ("previous", "this")
    ]
    assert all(b["strategy"] == "snapshot" and b["tokens"] == 2048 for b in busy)
    before, after = (b["device_busy_ms"] for b in busy)
    assert f"busy {after:.1f} ms where it took {before:.1f} ms" in text


def test_the_row_bucketed_product_sentence_matches_the_committed_run():
    run = load_bench("data/bench_matched_rows_h200_cc8bbd3.json")
    rows = {(r["arm"], r["batch"]): r for r in run["rows"] if r["strategy"] == "replay"}
    peer = {r["batch"]: _tok_s(r) for r in run["mamba_ssm"]}
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(
        r"\(`data/bench_matched_rows_h200_cc8bbd3.json`, 2026-12-06\) "
        r"replay decodes ([\d,]+), ([\d,]+), ([\d,]+), ([\d,]+) and ([\d,]+) tokens/s at batch "
        r"1, 8, 64, 128 and 256: ([\d.]+)x, ([\d.]+)x, ([\d.]+)x, ([\d.]+)x and ([\d.]+)x "
        r"mamba-ssm's `generate\(cg=True\)` in the same run, ([\d.]+)-([\d.]+)x the launches it "
        r"replaced and ([\d.]+)-([\d.]+)x the engine on cuBLAS",
        text,
    )
    assert m, "README: the row-bucketed product's sentence is gone or reworded"
    assert run["date"].startswith("2026-12-06") and run["commit"] == "cc8bbd3"
    batches = [1, 8, 64, 128, 256]
    new = [rows[("row_invariant", b)]["decode_tokens_per_s"] for b in batches]
    assert [int(v.replace(",", "")) for v in m.groups()[:5]] == [round(t) for t in new]
    ratios = [round(t / peer[b], 2) for t, b in zip(new, batches)]
    assert [float(v) for v in m.groups()[5:10]] == ratios
    over_previous = [
        1 / rows[("row_invariant_previous_launch", b)]["over_first_arm_paired_median"]
        for b in batches
    ]
    over_cublas = [1 / rows[("torch", b)]["over_first_arm_paired_median"] for b in batches]
    for found, spread in ((m.groups()[10:12], over_previous), (m.groups()[12:14], over_cublas)):
        assert [float(v) for v in found] == [round(min(spread), 2), round(max(spread), 2)]


def test_the_device_rounds_sentence_matches_the_committed_probe():
    probe = json.loads((ROOT / "data/spec_host_probe_device_rounds_cpu.json").read_text())
    ms = {(r["batch"], r["drafters"]): r["ms_per_round"] for r in probe["rows"]}
    text = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(
        r"enqueueing a device round took ([\d.]+)x a host round's time at batch 8 and "
        r"([\d.]+)x at batch 128 \(`data/spec_host_probe_device_rounds_cpu.json`\)",
        text,
    )
    assert m, "README: the device rounds' sentence is gone or reworded"
    assert probe["provenance"]["commit"] == "8befbca"
    want = [round(ms[(b, "device")] / ms[(b, "batched")], 2) for b in (8, 128)]
    assert [float(v) for v in m.groups()] == want
    gpu = json.loads((ROOT / "data/bench_matched_device_rounds_h100_b39a1ad.json").read_text())
    assert gpu["device"].startswith("NVIDIA H100") and gpu["commit"] == "b39a1ad"
    replay = {r["batch"]: r for r in gpu["rows"] if r["strategy"] == "replay"}
    device = {b: r["other_drafters"]["device"] for b, r in replay.items()}
    assert f"{2 * gpu['n_steps']} tokens a sequence" in text  # bench matched's spec length
    r8, r32, r128 = (
        device[b]["speculative_tokens_per_s"] / replay[b]["speculative_tokens_per_s"]
        for b in (8, 32, 128)
    )
    acceptance = (
        f"{device[8]['measured_acceptance']:.2f} against {replay[8]['measured_acceptance']:.2f}"
    )
    over_decode = device[128]["speculative_tokens_per_s"] / replay[128]["decode_tokens_per_s"]
    assert all(r["speculative_equal_greedy"] and device[b]["speculative_equal_greedy"]
               for b, r in replay.items())  # fmt: skip
    ratios = f"{r8:.2f}x, {r32:.2f}x and {r128:.2f}x"
    for phrase in (f"replay's device rounds gave {ratios} the host rounds' speculation rate",
                   f"different acceptance ({acceptance} at batch 8;",
                   f"speculation stays {over_decode:.2f}x plain decode at batch 128"):  # fmt: skip
        assert phrase in text, phrase


def test_the_data_readmes_gpu_device_rounds_and_fused_jamba_tables_match_their_files():
    text = (ROOT / "data/README.md").read_text()
    rounds = json.loads((ROOT / "data/bench_matched_device_rounds_h100_b39a1ad.json").read_text())
    for r in rounds["rows"]:
        d = r["other_drafters"]["device"]
        host, dev = r["speculative_tokens_per_s"], d["speculative_tokens_per_s"]
        name = {"replay": "replay", "replay-ring": "replay, ring L + k"}[r["strategy"]]
        row = (f"| {name} | {r['batch']} | {r['decode_tokens_per_s']:,.0f} | {host:,.0f} "
               f"({r['measured_acceptance']:.2f}) | {dev:,.0f} ({d['measured_acceptance']:.2f}) "
               f"| {dev / host:.2f}x |")  # fmt: skip
        assert row in text, row
    fused = json.loads((ROOT / "data/bench_engine_families_jamba_fused_h100.json").read_text())
    rate = {(r["strategy"], r["batch"], r["fused"]): r for r in fused["rows"]}
    for (strategy, batch, on), r in rate.items():
        if on:
            ref = rate[(strategy, batch, False)]["decode_tokens_per_s"]
            tok = r["decode_tokens_per_s"]
            row = (f"| {strategy} | {batch} | {ref:,.0f} | {tok:,.0f} | {tok / ref:.2f}x | "
                   f"{r['roofline']['share']:.0%} |")  # fmt: skip
            assert row in text, row


def test_the_fused_jamba_prose_and_the_gpu_logs_match_their_files():
    data = " ".join((ROOT / "data/README.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    rows = {}
    for name in ("jamba_fused", "jamba_fused_spec"):
        result = json.loads((ROOT / f"data/bench_engine_families_{name}_h100.json").read_text())
        assert result["device"].startswith("NVIDIA H100")
        for r in result["rows"]:
            rows[(name, r["strategy"], r["batch"], r["fused"])] = r
    tok = {key: r["decode_tokens_per_s"] for key, r in rows.items()}
    spec = "jamba_fused_spec"
    ratio = {
        s: tok[(spec, s, 32, True)] / tok[(spec, s, 32, False)] for s in ("snapshot", "replay")
    }
    phrases = [
        f"snapshot {tok[(spec, 'snapshot', 32, False)]:,.0f} against "
        f"{tok[(spec, 'snapshot', 32, True)]:,.0f} ({ratio['snapshot']:.2f}x), replay "
        f"{tok[(spec, 'replay', 32, False)]:,.0f} against {tok[(spec, 'replay', 32, True)]:,.0f} "
        f"({ratio['replay']:.2f}x)",
    ]
    one = "jamba_fused"
    over = [tok[(one, "snapshot", b, True)] / tok[(one, "replay", b, True)] for b in (8, 128)]
    phrases.append(f"({over[0]:.2f}x at batch 8, {over[1]:.2f}x at 128 on the fused path)")
    fused8, fused32 = rows[(spec, "snapshot", 8, True)], rows[(spec, "snapshot", 32, True)]
    s8, s32 = fused8["speculative_tokens_per_s"], fused32["speculative_tokens_per_s"]
    reference32 = rows[(spec, "snapshot", 32, False)]["speculative_tokens_per_s"]
    phrases.append(
        f"{s8 / fused8['decode_tokens_per_s']:.2f}x snapshot's decode at batch 8 ({s8:,.0f} tok/s) "
        f"but {s32 / fused32['decode_tokens_per_s']:.2f}x at batch 32 ({s32:,.0f}), where the "
        f"graphed reference path's speculation is {reference32:,.0f}"
    )
    assert all(
        r["speculative_equal_greedy"] for r in rows.values() if "speculative_tokens_per_s" in r
    )
    for phrase in phrases:
        assert phrase in data, phrase
    snap = [tok[(one, "snapshot", b, True)] / tok[(one, "snapshot", b, False)] for b in (8, 128)]
    rep = [tok[(one, "replay", b, True)] / tok[(one, "replay", b, False)] for b in (8, 128)]
    assert f"{min(snap):.2f}" == f"{max(snap):.2f}"
    low, high = sorted(rep)
    want = (
        f"1.13x the graphed reference path's under snapshot and {low:.2f}-{high:.2f}x under replay"
    )
    assert f"{snap[0]:.2f}" == "1.13" and want in readme, want
    suite = (ROOT / "data/gpu_suite_h100_b39a1ad.log").read_text().strip().splitlines()[-1]
    assert "5 failed, 1378 passed, 60 skipped, 2 xfailed" in suite and "338.57s" in suite
    assert "**1,378 passed, 5 failed, 60 skipped, 2 xfailed in 339 s**" in data
    rerun = (ROOT / "data/gpu_tests_rounds_jamba_h100_adeeef1.log").read_text()
    assert "19 passed" in rerun and "failed" not in rerun and "**19 passed**" in data


def test_the_k_per_batch_table_and_sentence_match_the_committed_run():
    run = json.loads((ROOT / "data/bench_spec_steady_adaptive_h100_a6e10de.json").read_text())
    assert run["device"].startswith("NVIDIA H100") and run["commit"] == "a6e10de"
    assert (run["k"], run["other_k"], run["adaptive"], run["acceptance"]) == (4, [1, 2], True, 0.8)
    data = (ROOT / "data/README.md").read_text()
    ratio = {}
    for row in run["rows"]:
        plain = row["plain"]["steady_tokens_per_s"]
        arms = [("k = 4", row["speculative"]["steady_tokens_per_s"], row["speculative_equal_greedy"])]  # fmt: skip
        arms += [(label, a["steady_tokens_per_s"], a["equal_greedy"]) for label, a in row["arms"].items()]  # fmt: skip
        assert all(equal for _, _, equal in arms)
        cells = [f"{rate:,.0f} ({rate / plain:.2f}x)" for _, rate, _ in arms]
        assert f"| {row['batch']} | {plain:,.0f} | " + " | ".join(cells) + " |" in data
        ratio[row["batch"]] = [f"{rate / plain:.2f}x" for _, rate, _ in arms]
    k4_32, (_, k1_128, k2_128, _) = ratio[32][0], ratio[128]
    data = " ".join(data.split())
    rows = {r["batch"]: r for r in run["rows"]}
    spec = lambda r: [r["speculative"], *r["arms"].values()]  # noqa: E731
    iterations = [a["steady_iterations"] for r in rows.values() for a in spec(r)]
    plain = [rows[b]["plain"]["steady_iterations"] for b in (32, 128)]
    shares = {b: [a["steady_share"] for a in [rows[b]["plain"], *spec(rows[b])]] for b in rows}
    span = {b: f"{100 * min(v):.0f}-{100 * max(v):.0f}%" for b, v in shares.items()}
    adaptive = {b: rows[b]["arms"]["adaptive, k <= 4"] for b in rows}
    rounds = {b: {int(T) - 1: n for T, n in a["steady_widths"].items()} for b, a in adaptive.items()}  # fmt: skip
    earlier = {}
    for commit, name in (("ed17032", "h100_ed17032"), ("62c0c65", "h100_plain_branch_62c0c65")):
        old = json.loads((ROOT / f"data/bench_spec_steady_{name}.json").read_text())
        by = {r["batch"]: r["steady_speculation_over_decode"] for r in old["rows"]}
        earlier[commit] = f"{by[32]:.2f}x and {by[128]:.2f}x"
    step_ms = 1e3 * 32 / rows[32]["plain"]["steady_tokens_per_s"]
    estimates = {f"{a['acceptance_estimate']:.2f}" for a in adaptive.values()}
    assert rounds[32] == {3: 19, 4: 1} and rounds[128][3] == 7 and rounds[128][0] == 3
    for phrase in (
        f"k = 2 is {k2_128} it and k = 1 {k1_128}",
        f"k = 4 is best ({k4_32})",
        f"{min(iterations)} to {max(iterations)} steady iterations per speculative arm "
        f"({plain[0]} and {plain[1]} plain), {span[32]} of each run's time at batch 32 and "
        f"{span[128]} at 128",
        f"gave {earlier['ed17032']} at batch 32 and 128 on ed17032 and {earlier['62c0c65']} on "
        "62c0c65",
        f"settled on k = 3 ({rounds[32][3]} of {sum(rounds[32].values())} steady rounds)",
        f"(k = 3 in {rounds[128][3]} of {sum(rounds[128].values())} steady rounds, k = 0 in "
        f"{rounds[128][0]})",
        f"acceptance estimate was right ({estimates.pop()} at both)",
        f"takes {step_ms:.1f} ms, 32 / {rows[32]['plain']['steady_tokens_per_s']:,.0f} tokens/s",
    ):
        assert phrase in data, phrase
    assert not estimates  # one estimate, the same at both batches to two decimals
    log = (ROOT / "data/gpu_tests_adaptive_h100_a6e10de.log").read_text()
    assert "tree of commit a6e10de" in log and "84 passed, 1 skipped" in log


def test_the_scheduler_host_probe_table_matches_its_file():
    probe = json.loads((ROOT / "data/spec_host_probe_scheduler_cpu.json").read_text())
    assert [r["commit"] for r in probe["runs"]] == ["b2851a2", "c9b6dc9"] * 2
    ms = {}
    for r in probe["rows"]:
        assert r["drafters"] == "scheduler" and r["k"] == 4
        ms.setdefault((r["label"], r["batch"]), []).append(r["ms_per_round"])
    data = (ROOT / "data/README.md").read_text()
    for tree in ("b2851a2", "c9b6dc9"):
        cells = " | ".join(" / ".join(f"{v:.2f}" for v in ms[tree, b]) for b in (8, 32, 128))
        assert f"| {tree} | {cells} |" in data, cells
    best = {b: [min(ms[t, b]) for t in ("b2851a2", "c9b6dc9")] for b in (8, 32, 128)}
    saved = {b: round(100 * (1 - new / old)) for b, (old, new) in best.items()}
    text = " ".join(data.split())
    assert f"{saved[128]}% less host time a round at batch 128, {saved[32]}% at 32" in text
    assert saved[8] <= 1 and "none at 8" in text


def _ratios(row):
    """Arm label -> (steady tokens/s, over plain) of a spec-steady row, k = 4 first."""
    plain = row["plain"]["steady_tokens_per_s"]
    arms = {"k=4": row["speculative"], **row["arms"]}
    return {label: (a["steady_tokens_per_s"], a["steady_tokens_per_s"] / plain) for label, a in arms.items()}  # fmt: skip


def _rounds(arm):
    """k -> steady rounds of a spec-steady arm (its widths T = k + 1)."""
    return {int(T) - 1: n for T, n in arm["steady_widths"].items()}


def test_the_k_sweep_profile_rounds_and_matmul_of_cfbdb4f_match_their_files():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    suite = (ROOT / "data/gpu_suite_h100_cfbdb4f.log").read_text()
    assert "tree of commit cfbdb4f" in suite
    assert "1433 passed, 60 skipped, 2 xfailed, 1 warning in 285.88s" in suite
    assert "**1,433 passed, 60 skipped, 2 xfailed in 286 s**" in text
    run = json.loads((ROOT / "data/bench_spec_steady_k_h100_cfbdb4f.json").read_text())
    assert run["commit"] == "cfbdb4f" and (run["other_k"], run["adaptive"]) == ([1, 2, 3], True)
    rows = {r["batch"]: r for r in run["rows"]}
    order = ["k=1", "k=2", "k=3", "k=4", "adaptive, k <= 4"]
    for b, row in rows.items():
        got = _ratios(row)
        assert row["speculative_equal_greedy"] and all(a["equal_greedy"] for a in row["arms"].values())  # fmt: skip
        cells = " | ".join(f"{got[a][0]:,.0f} ({got[a][1]:.2f}x)" for a in order)
        assert f"| {b} | {row['plain']['steady_tokens_per_s']:,.0f} | {cells} |" in data, cells
    x = {b: {a: f"{v[1]:.2f}x" for a, v in _ratios(r).items()} for b, r in rows.items()}
    best = {b: max(order[:4], key=lambda a: _ratios(rows[b])[a][1]) for b in rows}
    assert best == {8: "k=3", 32: "k=3", 128: "k=3"}
    arms = [a for r in rows.values() for a in (r["speculative"], *r["arms"].values())]
    its = [a["steady_iterations"] for a in arms]
    shares = [a["steady_share"] for r in rows.values() for a in (r["plain"], *r["arms"].values(), r["speculative"])]  # fmt: skip
    ad = {b: _rounds(r["arms"]["adaptive, k <= 4"]) for b, r in rows.items()}
    plain = [rows[b]["plain"] for b in (8, 32, 128)]
    for phrase in (
        f"k = 4 lost to it most at batch 32 ({x[32]['k=4']} against {x[32]['k=3']})",
        f"did not repeat ({x[128]['k=2']} against {x[128]['k=4']} here)",
        f"{min(its)} to {max(its)} steady iterations a speculative arm",
        f"{100 * min(shares):.0f}-{100 * max(shares):.0f}% of each run's time",
        f"settled on k = 3 at batch 32 ({ad[32][3]} of {sum(ad[32].values())} steady rounds) but "
        f"gave {x[32]['adaptive, k <= 4']} where fixed k = 3 gave {x[32]['k=3']}",
        f"chose k = 4 and k = 3 ({ad[8][4]} and {ad[8][3]} of {sum(ad[8].values())} steady rounds)",
        "steady iterations are {:.0f}%, {:.0f}% and {:.0f}%".format(
            *(100 * p["steady_share"] for p in plain)
        ),  # fmt: skip
        "it makes {:,.0f}, {:,.0f} and {:,.0f} tokens/s, against {:,.0f}, {:,.0f} and {:,.0f} "
        "steady".format(
            *(p["tokens_per_s"] for p in plain), *(p["steady_tokens_per_s"] for p in plain)
        ),  # fmt: skip
    ):
        assert phrase in text, phrase
    probe = json.loads((ROOT / "data/capture_probe_b32_h100_cfbdb4f.json").read_text())
    (prow,) = probe["result"]["rows"]
    parms = {"k=4": prow["speculative"], **prow["arms"]}
    caps = {a: v["captures_in_run"] for a, v in parms.items()}
    assert all(v["steady_with_capture"] == 0 for v in parms.values())
    px = {a: f"{v[1]:.2f}x" for a, v in _ratios(prow).items()}
    assert (
        f"found {caps['k=3']} captures in the k = 3 run and {caps['adaptive, k <= 4']} in" in text
    )
    assert f"k = 3 gave {px['k=3']}, adaptive {px['adaptive, k <= 4']}, k = 4 {px['k=4']}" in text
    prof = json.loads((ROOT / "data/scheduler_cprofile_matched_b128_k3_h100.json").read_text())
    calls, seconds = re.search(r"(\d+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+[\d.]+ \S*engine.py:\d+\(admit\)", prof["k=3"]["cumtime"]).groups()  # fmt: skip
    assert f"puts the {calls} admissions at {float(seconds):.2f} s" in text
    assert f"{1e3 * float(seconds) / int(calls):.1f} ms an admit" in text
    step = rows[128]["plain"]["steady_tokens_per_s"]
    assert f"96 / {step:,.0f} s = {96e3 / step:.1f} ms of full-batch decode" in text


def test_the_round_profile_and_device_rounds_and_matmul_of_cfbdb4f_match_their_files():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    busy = {}
    for b in (32, 128):
        p = json.loads((ROOT / f"data/spec_round_profile_matched_b{b}_k3_h100.json").read_text())
        dec, spec = p["profiler"]["decode"], p["profiler"]["speculation"]
        steps, rounds = 16, spec["rounds"]
        assert dec["launches_per_step"] and sum(t["calls"] for t in dec["top"] if t["kernel"] == "_linear_tma_kernel") == 17 * steps  # fmt: skip
        ms = lambda prof, name, n: next(t["ms"] for t in prof["top"] if t["kernel"] == name) / n  # noqa: E731
        cells = [
            f"{p['decode_ms_per_step']:.2f} ({dec['gpu_busy_ms_per_step']:.2f})",
            f"{p['round_ms']:.2f} ({spec['gpu_busy_ms_per_round']:.2f})",
            f"{ms(dec, '_linear_tma_kernel', steps):.2f} / {ms(spec, '_linear_tma_kernel', rounds):.2f}",  # fmt: skip
            f"{ms(dec, '_replay_step_kernel', steps):.2f} / {ms(spec, '_replay_step_kernel', rounds):.2f}",  # fmt: skip
            f"{p['phases_ms_per_round']['drafting, upload and host bookkeeping']:.2f} ms",
        ]
        assert f"| {b} | " + " | ".join(cells) + " |" in data, cells
        busy[b] = spec["gpu_busy_ms_per_round"] / dec["gpu_busy_ms_per_step"]
        if b == 128:
            lin = ms(spec, "_linear_tma_kernel", rounds) / ms(dec, "_linear_tma_kernel", steps)
            rep = ms(spec, "_replay_step_kernel", rounds) / ms(dec, "_replay_step_kernel", steps)
            e3 = p["drafter_tokens_per_round"]
    assert f"the verify's GPU work is {busy[32]:.2f}x a decode step's" in text
    assert f"the GPU work alone is {busy[128]:.2f} decode steps" in text
    assert f"({lin:.1f}x their 128-row time)" in text
    assert f"({rep:.1f}x its one-row time)" in text
    assert f"E(3) = {e3:.2f} tokens" in text
    assert f"{e3:.2f} / {busy[128]:.2f} = {e3 / round(busy[128], 2):.2f}x plain decode" in text
    rounds_run = json.loads((ROOT / "data/bench_matched_device_rounds_h100_cfbdb4f.json").read_text())  # fmt: skip
    for r in rounds_run["rows"]:
        dev = r["other_drafters"]["device"]
        assert r["speculative_equal_greedy"] and dev["speculative_equal_greedy"]
        assert (dev["measured_acceptance"], dev["drafts_proposed"]) == (r["measured_acceptance"], r["drafts_proposed"])  # fmt: skip
        name = {"replay": "replay", "replay-ring": "replay, ring L + k"}[r["strategy"]]
        ratio = dev["speculative_tokens_per_s"] / r["speculative_tokens_per_s"]
        row = (
            f"| {name} | {r['batch']} | {r['decode_tokens_per_s']:,.0f} | "
            f"{r['speculative_tokens_per_s']:,.0f} | {dev['speculative_tokens_per_s']:,.0f} | {ratio:.2f}x |"
        )  # fmt: skip
        assert row in data, row
    log = (ROOT / "data/gpu_tests_rounds_h100_cfbdb4f.log").read_text()
    assert "28 passed" in log and "failed" not in log and "(`gpu_tests_rounds_h100_cfbdb4f.log`: 28 passed)" in text  # fmt: skip
    mm = json.loads((ROOT / "data/bench_matmul_retuned_h100_cfbdb4f.json").read_text())
    with gzip.open(ROOT / "data/bench_matmul_sweep_inloop_h100_cfbdb4f.json.gz") as f:
        assert json.load(f)["commit"] == mm["commit"] == "cfbdb4f"
    assert all(all(s["rows_equal"].values()) for s in mm["shapes"])

    def summed(m):
        key = lambda d: str(m) if str(m) in d else m  # noqa: E731
        tot = {a: sum(s[a][key(s[a])] for s in mm["shapes"]) for a in ("row_invariant_us", "previous_launch_us", "cublas_us")}  # fmt: skip
        return tot["row_invariant_us"] / tot["cublas_us"], tot["previous_launch_us"] / tot["cublas_us"]  # fmt: skip

    for m in (1, 32, 128, 256, 320, 640):
        new, old = summed(m)
        assert f"M = {m} {new:.3f}x / {old:.3f}x" in text, m
    assert max(max(summed(m)) for m in (1, 2, 4, 8, 16, 32, 64, 128)) < 1.03
    assert f"gains {100 * (1 - summed(320)[0] / summed(320)[1]):.0f}% at 320 rows and {100 * (1 - summed(640)[0] / summed(640)[1]):.0f}% at 640" in text  # fmt: skip


def test_the_k_sweep_with_192_tokens_and_the_admitting_time_match_their_file():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    run = json.loads((ROOT / "data/bench_spec_steady_k_n192_h100_a0f4d0b.json").read_text())
    assert (run["commit"], run["n_new"], run["other_k"]) == ("a0f4d0b", 192, [2, 3])
    rows = {r["batch"]: r for r in run["rows"]}
    order = ["k=2", "k=3", "k=4", "adaptive, k <= 4"]
    x = {}
    for b, row in rows.items():
        arms = [row["speculative"], *row["arms"].values()]
        assert row["speculative_equal_greedy"] and all(a["equal_greedy"] for a in row["arms"].values())  # fmt: skip
        assert all(a["steady_captures"] == 0 for a in [row["plain"], *arms])
        got = _ratios(row)
        cells = " | ".join(f"{got[a][0]:,.0f} ({got[a][1]:.2f}x)" for a in order)
        assert f"| {b} | {row['plain']['steady_tokens_per_s']:,.0f} | {cells} |" in data, cells
        x[b] = {a: f"{v[1]:.2f}x" for a, v in got.items()}
    fixed = {b: max(order[:3], key=lambda a: _ratios(rows[b])[a][1]) for b in rows}
    assert fixed[8] == "k=4" and fixed[32] == "k=3"
    spread = [_ratios(rows[128])[a][1] for a in order]
    its = [a["steady_iterations"] for r in rows.values() for a in (r["speculative"], *r["arms"].values())]  # fmt: skip
    ad = {b: _rounds(r["arms"]["adaptive, k <= 4"]) for b, r in rows.items()}
    a8, a32 = x[8]["adaptive, k <= 4"], x[32]["adaptive, k <= 4"]
    share = lambda a: a["admitting_s"] / a["seconds"]  # noqa: E731
    plain = [rows[b]["plain"] for b in (8, 32, 128)]
    spec = [rows[b]["speculative"] for b in (8, 32, 128)]
    p128 = rows[128]["plain"]
    refresh = sum(ad[8].values()) - ad[8][4]
    for phrase in (
        f"so {min(its)} to {max(its)} steady iterations a speculative arm",
        f"at batch 8 the most drafts win in this run (k = 4, {x[8]['k=4']};",
        f"at batch 32 k = 3 wins again ({x[32]['k=3']}, as in that file and the capture probe)",
        f"({min(spread):.2f}-{max(spread):.2f}x)",
        f"k = 4 in {ad[8][4]} of {sum(ad[8].values())} steady rounds at batch 8, k = 3 in "
        f"{ad[32][3]} of {sum(ad[32].values())} at batch 32",
        f"gave {a8} and {a32} against that arm's {x[8]['k=4']} and {x[32]['k=3']}",
        f"At batch 128 it gave {x[128]['adaptive, k <= 4']}",
        f"{refresh} of {sum(ad[8].values())} at batch 8",
        "admit take {:.0%}, {:.0%} and {:.0%} of plain decode's run**".format(*map(share, plain)),
        "steady ones ({:.0%} against {:.0%}); at batch 8 less ({:.0%} against {:.0%})".format(
            share(plain[2]), plain[2]["steady_share"], share(plain[0]), plain[0]["steady_share"]
        ),
        "4, {:.0%}, {:.0%} and {:.0%}".format(*map(share, spec)),
        f"plain decode's {p128['admitting_iterations']} admitting iterations took "
        f"{1e3 * p128['admitting_s'] / p128['admitting_iterations']:.1f} ms each on average "
        f"against a steady step's {128e3 / p128['steady_tokens_per_s']:.1f} ms",
    ):
        assert phrase in text, phrase
    assert max(spread) == _ratios(rows[128])["adaptive, k <= 4"][1]  # "the best of the row"
    log = (ROOT / "data/gpu_tests_spec_steady_h100_a0f4d0b.log").read_text()
    assert "tree of commit a0f4d0b" in log and "86 passed, 1 skipped" in log
    lo, hi = min(map(share, plain)), max(map(share, plain))
    assert share(plain[2]) > plain[2]["steady_share"]  # "at batch 128 they took more of it"
    sweeps = {}  # every run of the session with k = 3 and k = 4: which led, per batch
    for name in ("k_h100_cfbdb4f", "k_n192_h100_a0f4d0b", "widths_h100_e466a9d",
                 "threads16_h100_e466a9d", "threads1_h100_e466a9d"):  # fmt: skip
        sweep = json.loads((ROOT / f"data/bench_spec_steady_{name}.json").read_text())
        sweeps[name] = {r["batch"]: _ratios(r) for r in sweep["rows"]}
    led = {b: sum(v[b]["k=3"][1] > v[b]["k=4"][1] for v in sweeps.values()) for b in (8, 32)}
    assert led[32] == len(sweeps)
    prof = json.loads((ROOT / "data/spec_round_profile_matched_b128_k3_h100.json").read_text())
    busy128 = (
        prof["profiler"]["speculation"]["gpu_busy_ms_per_round"]
        / prof["profiler"]["decode"]["gpu_busy_ms_per_step"]
    )
    for phrase in (
        f"{min(its)} to {max(its)} steady iterations an arm",
        f"best with k = 4 at batch 8 ({x[8]['k=4']}; k = 3 led there in {led[8]} of the "
        f"session's {len(sweeps)} runs of this bench)",
        f"with k = 3 at batch 32 ({x[32]['k=3']}, where k = 4 gave {x[32]['k=4']}; k = 3 led there "
        f"in all {led[32]})",
        f"where a round's GPU work alone is {busy128:.2f} decode steps'",
        f"({min(spread):.2f}-{max(spread):.2f}x)",
        f"gave {a8} and {a32} at batch 8 and 32",
        f"took {100 * lo:.0f}-{100 * hi:.0f}% of plain decode's time",
    ):
        assert phrase in readme, phrase


def test_the_round_against_its_step_table_and_bounds_match_their_files():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    files = {"widths": "widths", "threads 16": "threads16", "threads 1": "threads1"}
    parts, bounds, rests, rollbacks, shares = {}, {}, [], [], []
    for label, name in files.items():
        run = json.loads((ROOT / f"data/bench_spec_steady_{name}_h100_e466a9d.json").read_text())
        assert run["commit"] == "e466a9d" and run["n_new"] == 192
        if name != "widths":
            assert run["env"]["OMP_NUM_THREADS"] == name.removeprefix("threads")
        for row in run["rows"]:
            b, plain = row["batch"], row["plain"]
            arms = {"plain": plain, "k = 3": row["arms"]["k=3"], "k = 4": row["speculative"]}
            cells = []
            for arm_name, arm in arms.items():
                ((T, it),) = arm["steady_ms_by_width"].items()
                step, rb = arm["steady_step_ms_by_width"][T], arm["steady_rollback_ms_by_width"][T]
                parts[label, b, arm_name] = it, step, rb, it - step - rb
                if arm_name == "plain":
                    cells.append(f"{it:.2f} / {step:.2f} / 0 / {it - step - rb:.2f}")
                    assert rb == 0
                    continue
                ratio = arm["steady_tokens_per_s"] / plain["steady_tokens_per_s"]
                cells.append(f"{it:.2f} / {step:.2f} / {rb:.2f} / {it - step - rb:.2f} ({ratio:.2f}x)")  # fmt: skip
                p_it, p_step = parts[label, b, "plain"][:2]
                bounds[label, b, arm_name] = ratio * it / step * p_step / p_it
                rests.append(it - step - rb)
                rollbacks.append(rb)
                if b in (8, 32):
                    shares.append((it - step) / it)
            assert f"| {label} | {b} | " + " | ".join(cells) + " |" in data, cells
    plain_rest = [v[3] for k, v in parts.items() if k[2] == "plain"]
    b8 = [f"{bounds[f, 8, 'k = 4']:.2f}x" for f in files]
    b32 = [f"{bounds[f, 32, 'k = 3']:.2f}x" for f in files]
    for phrase in (
        f"A plain iteration spends {min(plain_rest):.2f}-{max(plain_rest):.2f} ms on the host",
        f"a speculation round {min(rests):.2f}-{max(rests):.2f} ms, plus "
        f"{min(rollbacks):.2f}-{max(rollbacks):.2f} ms of rollback: "
        f"{100 * min(shares):.0f}-{100 * max(shares):.0f}% of a round at batch 8 and 32",
        f"k = 4 at batch 8 would reach {b8[0]}, {b8[1]} and {b8[2]} in the three runs",
        f"k = 3 at batch 32 {b32[0]}, {b32[1]} and {b32[2]}",
        f"At batch 128 k = 3 would reach {bounds['widths', 128, 'k = 3']:.2f}x",
    ):
        assert phrase in text, phrase
    steps = [parts[f, 8, "k = 4"][1] for f in files]
    rest8 = [parts[f, 8, "k = 4"][3] for f in files]
    assert f"({min(steps):.2f}-{max(steps):.2f} ms)" in text and max(steps) / min(steps) < 1.1
    assert f"moves from {min(rest8):.2f} to {max(rest8):.2f} ms" in text

    def span(b, arm):
        values = [bounds[f, b, arm] for f in files]
        return min(values), max(values)

    ratios = {}
    for label, name in files.items():
        run = json.loads((ROOT / f"data/bench_spec_steady_{name}_h100_e466a9d.json").read_text())
        ratios[label] = {r["batch"]: _ratios(r) for r in run["rows"]}
    n192 = json.loads((ROOT / "data/bench_spec_steady_k_n192_h100_a0f4d0b.json").read_text())
    k4 = [_ratios(n192["rows"][0])["k=4"][1]] + [ratios[f][8]["k=4"][1] for f in files]
    assert "gave {:.2f}x on a0f4d0b and {:.2f}x, {:.2f}x and {:.2f}x here".format(*k4) in text
    assert f"by up to {100 * (max(k4) / min(k4) - 1):.0f}% between runs" in text
    pairs = {
        (b, a): (parts["threads 1", b, a][3], parts["threads 16", b, a][3])
        for b in (8, 32) for a in ("k = 3", "k = 4")
    }  # fmt: skip
    want = "(batch 32: {:.2f} / {:.2f} ms for k = 3, {:.2f} / {:.2f} ms for k = 4; batch 8: {:.2f} / {:.2f} and {:.2f} / {:.2f})"  # fmt: skip
    assert want.format(*pairs[32, "k = 3"], *pairs[32, "k = 4"], *pairs[8, "k = 3"], *pairs[8, "k = 4"]) in text  # fmt: skip
    diff = {key: max(v) / min(v) - 1 for key, v in pairs.items()}
    others = [d for key, d in diff.items() if key != (8, "k = 3")]
    assert f"differs by {100 * diff[8, 'k = 3']:.0f}%, the other three by {100 * min(others):.0f}-{100 * max(others):.0f}%" in text  # fmt: skip
    widths = json.loads((ROOT / "data/bench_spec_steady_widths_h100_e466a9d.json").read_text())
    w = {r["batch"]: r for r in widths["rows"]}
    adaptive_ms = lambda b, T: w[b]["arms"]["adaptive, k <= 4"]["steady_ms_by_width"][T]  # noqa: E731
    assert f"width 5 took {adaptive_ms(8, '5'):.2f} ms against fixed k = 4's {w[8]['speculative']['steady_ms_by_width']['5']:.2f}" in text  # fmt: skip
    assert f"{adaptive_ms(32, '4'):.2f} against fixed k = 3's {w[32]['arms']['k=3']['steady_ms_by_width']['4']:.2f}" in text  # fmt: skip
    wr = {b: _ratios(r) for b, r in w.items()}
    three = lambda a: (
        ", ".join(f"{wr[b][a][1]:.2f}x" for b in (8, 32)) + f" and {wr[128][a][1]:.2f}x"
    )  # noqa: E731
    assert f"Its arm gave {three('adaptive, k <= 4')}" in text
    assert f"(k = 3 {three('k=3')}; k = 4 {three('k=4')})" in text
    gaps = []  # the adaptive arm below the fixed arm of the k it chose most, earlier runs
    cf = json.loads((ROOT / "data/bench_spec_steady_k_h100_cfbdb4f.json").read_text())
    cr = {r["batch"]: _ratios(r) for r in cf["rows"]}
    nr = {r["batch"]: _ratios(r) for r in n192["rows"]}
    probe = json.loads((ROOT / "data/capture_probe_b32_h100_cfbdb4f.json").read_text())
    pr = _ratios(probe["result"]["rows"][0])
    for got, fixed in ((cr[32], "k=3"), (nr[8], "k=4"), (nr[32], "k=3"), (pr, "k=3")):
        gaps.append(1 - got["adaptive, k <= 4"][1] / got[fixed][1])
    assert f"the fixed arm of its choice ({100 * min(gaps):.0f}-{100 * max(gaps):.0f}%)" in text
    for phrase in (
        "k = 4 at batch 8 would reach about {:.2f}-{:.2f}x".format(*span(8, "k = 4")),
        "k = 3 at batch 32 about {:.2f}-{:.2f}x".format(*span(32, "k = 3")),
        f"took {100 * min(shares):.0f}-{100 * max(shares):.0f}% of it at batch 8 and 32",
    ):
        assert phrase in readme, phrase


def test_the_bench_drafters_host_probe_tables_match_their_files():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    best = {}
    for name, batches in (("drafters", (8, 32, 128)), ("long", (32, 128))):
        probe = json.loads((ROOT / f"data/spec_host_probe_scheduler_{name}_cpu.json").read_text())
        assert [r["commit"] for r in probe["runs"]] == ["b0efe98", "24caec7"] * 2
        ms = {}
        for r in probe["rows"]:
            assert r["drafters"] == "scheduler" and r["k"] == 4
            assert r["prompt_length"] == (None if name == "drafters" else 4096)
            ms.setdefault((r["label"], r["batch"]), []).append(r["ms_per_round"])
        saved = {
            b: round(100 * (1 - min(ms["24caec7", b]) / min(ms["b0efe98", b]))) for b in batches
        }
        best[name] = saved
        if name == "drafters":
            for tree in ("b0efe98", "24caec7"):
                cells = " | ".join(" / ".join(f"{v:.2f}" for v in ms[tree, b]) for b in batches)
                assert f"| {tree} | {cells} |" in data, cells
            assert (
                f"{saved[8]}% less host time a round at batch 8, {saved[32]}% at 32, "
                f"{saved[128]}% at 128" in text
            )
        else:
            pair = lambda tree, b, ms=ms: " / ".join(f"{v:.2f}" for v in ms[tree, b])  # noqa: E731
            assert (
                f"{pair('b0efe98', 32)} ms against {pair('24caec7', 32)} ms at batch 32, and "
                f"{pair('b0efe98', 128)} ms against {pair('24caec7', 128)} ms at batch 128" in text
            )
            assert f"{saved[32]}% less at 32 and {saved[128]}% at 128" in text
    assert min(best["drafters"].values()) > 5 and min(best["long"].values()) > 20
    readme = " ".join((ROOT / "README.md").read_text().split())
    low, high = min(best["drafters"].values()), max(best["drafters"].values())
    assert f"host time by {low}-{high}% on this project's CPU" in readme


def _steady_round(row, arm, width):
    """(round ms, step ms, rollback ms, rate over plain) of ``arm`` ("k=4" the row's own
    speculation, else an ``arms`` entry) at ``width`` in a spec-steady row."""
    x = row["speculative"] if arm == "k=4" else row["arms"][arm]
    rate = x["steady_tokens_per_s"] / row["plain"]["steady_tokens_per_s"]
    w = str(width)
    return (
        x["steady_ms_by_width"][w],
        x["steady_step_ms_by_width"][w],
        x["steady_rollback_ms_by_width"][w],
        rate,
    )


def test_the_numpy_rounds_and_the_graph_rollback_match_their_files():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    # the CPU probe, side by side
    probe = json.loads((ROOT / "data/spec_host_probe_scheduler_numpy_cpu.json").read_text())
    ms = {}
    for r in probe["rows"]:
        assert r["drafters"] == "scheduler" and r["k"] == 4
        ms.setdefault((r["label"], r["batch"]), []).append(r["ms_per_round"])
    assert [r["label"] for r in probe["rows"][::3]] == ["093a1a9", "621fa8f"] * 2
    for tree in ("093a1a9", "621fa8f"):
        cells = " | ".join(" / ".join(f"{v:.2f}" for v in ms[tree, b]) for b in (8, 32, 128))
        assert f"| {tree} | {cells} |" in data, cells
    saved = [round(100 * (1 - min(ms["621fa8f", b]) / min(ms["093a1a9", b]))) for b in (8, 32, 128)]
    assert min(saved) > 10
    assert (
        f"{saved[0]}% less host time a round at batch 8, {saved[1]}% at 32, {saved[2]}% at 128"
        in text
    )
    hosts = {}
    for name in (
        "h100_093a1a9",
        "previous_093a1a9_h100",
        "this_5aed305_h100",
        "second_5aed305_h100",
    ):
        rows = json.loads(
            (ROOT / f"data/spec_host_probe_scheduler_gpu_host_{name}.json").read_text()
        )["rows"]
        assert [r["batch"] for r in rows] == [8, 32, 128]
        hosts[name] = " / ".join(f"{r['ms_per_round']:.2f}" for r in rows)
    assert f"took {hosts['h100_093a1a9']} ms a round at batch 8 / 32 / 128" in text
    assert f"and {hosts['previous_093a1a9_h100']} ms on the second" in text
    assert f"gave 5aed305 {hosts['second_5aed305_h100']} ms" in text
    assert (
        f"{hosts['previous_093a1a9_h100']} ms (093a1a9) against {hosts['this_5aed305_h100']} ms (5aed305"
        in text
    )
    # the two calls' spec-steady runs, the table row by row
    calls = {"host_numpy": ("093a1a9", "5aed305"), "graph_rollback": ("5aed305", "d2c23eb")}
    runs = {}
    for stem, (old, new) in calls.items():
        for p in (1, 2):
            for tree, sha in (("previous", old), ("this", new)):
                run = load_bench(f"data/bench_spec_steady_{stem}_{tree}_{sha}_{p}_h100.json")
                assert run["commit"] == sha and run["n_new"] == 128 and run["other_k"] == [3]
                assert [r["batch"] for r in run["rows"]] == [8, 32, 128]
                for row in run["rows"]:
                    assert row["speculative_equal_greedy"] and row["arms"]["k=3"]["equal_greedy"]
                runs[stem, tree, p] = run["rows"]
    for stem, (old, new) in calls.items():
        later = " (next call)" if stem == "graph_rollback" else ""
        for i, batch in enumerate((8, 32, 128)):
            for p in (1, 2):
                for tree, sha in (("previous", old), ("this", new)):
                    row = runs[stem, tree, p][i]
                    cells = [f"{row['plain']['steady_ms_by_width']['1']:.2f}"]
                    for arm, width in (("k=4", 5), ("k=3", 4)):
                        t, step, back, rate = _steady_round(row, arm, width)
                        cells.append(f"{t:.2f} ({step:.2f}, {back:.2f}) {rate:.2f}x")
                    tag = later if tree == "previous" else ""
                    line = f"| {sha} {p}, {batch}{tag} | " + " | ".join(cells) + " |"
                    assert line in data, line

    def cuts(stem, i):
        out, steps = [], []
        for p in (1, 2):
            for arm, width in (("k=4", 5), ("k=3", 4)):
                a = _steady_round(runs[stem, "previous", p][i], arm, width)
                b = _steady_round(runs[stem, "this", p][i], arm, width)
                out.append(100 * (1 - b[0] / a[0]))
                steps.append(abs(100 * (b[1] / a[1] - 1)))
        return out, steps

    span = lambda v: f"{round(min(v))}-{round(max(v))}%"  # noqa: E731
    numpy = [cuts("host_numpy", i) for i in range(3)]
    assert all(min(c) > 0 for c, _ in numpy) and max(max(s) for _, s in numpy) < 2
    assert (
        f"were {span(numpy[0][0])} shorter at batch 8, {span(numpy[1][0])} at batch 32 and "
        f"{span(numpy[2][0])} at batch 128, with their engine steps within 2%" in text
    )
    graph = [cuts("graph_rollback", i) for i in range(3)]
    assert f"{span(graph[0][0])} shorter at batch 8" in text
    assert f"and {span(graph[2][0])} shorter at batch 128" in text
    b32 = graph[1][0]
    assert round(-min(b32)) == 3 and round(max(b32)) == 5
    backs = {}
    for i, batch in enumerate((8, 32, 128)):
        for tree in ("previous", "this"):
            v = [
                _steady_round(runs["graph_rollback", tree, p][i], arm, w)[2]
                for p in (1, 2)
                for arm, w in (("k=4", 5), ("k=3", 4))
            ]
            backs[batch, tree] = f"{min(v):.2f}-{max(v):.2f}"
    assert (
        f"the rollback {backs[8, 'this']} ms at batch 8, where it took {backs[8, 'previous']} ms"
        in text
    )
    assert f"{backs[32, 'this']} ms against {backs[32, 'previous']} ms at batch 32" in text
    assert f"{backs[128, 'this']} against {backs[128, 'previous']} ms at batch 128" in text

    # outside the step, its share, and the ratios of the final tree
    def outside(stem, tree, i, arm, width):
        got = [_steady_round(runs[stem, tree, p][i], arm, width) for p in (1, 2)]
        return [t - s for t, s, _, _ in got], [100 * (t - s) / t for t, s, _, _ in got], got

    o8, share8, new8 = outside("graph_rollback", "this", 0, "k=4", 5)
    o32, share32, new32 = outside("graph_rollback", "this", 1, "k=3", 4)
    assert (
        f"{min(o8):.2f}-{max(o8):.2f} ms at batch 8 (k = 4) and {min(o32):.2f}-{max(o32):.2f} ms "
        f"at batch 32 (k = 3)** on d2c23eb: {span(share8)} and {round(min(share32))}% of the round"
        in text
    ) and round(min(share32)) == round(max(share32))
    _, old8, first8 = outside("host_numpy", "previous", 0, "k=4", 5)
    _, old32, first32 = outside("host_numpy", "previous", 1, "k=3", 4)
    assert f"where 093a1a9 spent {span(old8)} and {span(old32)} in the first call" in text
    new128 = [_steady_round(runs["graph_rollback", "this", p][2], "k=3", 4) for p in (1, 2)]
    first128 = [_steady_round(runs["host_numpy", "previous", p][2], "k=3", 4) for p in (1, 2)]
    pair = lambda got: " and ".join(f"{g[3]:.2f}x" for g in got)  # noqa: E731
    slash = lambda got: " / ".join(f"{g[3]:.2f}x" for g in got)  # noqa: E731
    assert (
        f"On d2c23eb: {pair(new8)} at batch 8 with k = 4, {new32[0][3]:.2f}x twice at batch 32 "
        f"with k = 3, {pair(new128)} at batch 128 with k = 3; 093a1a9, in the other call (another machine; plain decode's own time "
        f"differed), gave "
        f"{slash(first8)}, {slash(first32)} and {slash(first128)}" in text
    ) and f"{new32[0][3]:.2f}" == f"{new32[1][3]:.2f}"
    assert max(g[3] for g in new8) < 2.5 and max(g[3] for g in new32) < 2.0
    # the phases table at batch 8
    for label, name in (
        ("k4 093a1a9 (first machine)", "k4_h100_093a1a9"),
        ("host numpy, previous 093a1a9", "host_numpy_previous_093a1a9_h100"),
        ("host numpy, this 5aed305", "host_numpy_this_5aed305_h100"),
        ("graph rollback, previous 5aed305", "graph_rollback_previous_5aed305_h100"),
        ("graph rollback, this d2c23eb", "graph_rollback_this_d2c23eb_h100"),
    ):
        phases = json.loads((ROOT / f"data/iteration_phases_{name}.json").read_text())
        row = phases["rows"][0]
        assert row["batch"] == 8 and row["speculative_equal_greedy"]
        x = row["k=4"]
        cells = [f"{x['iteration']:.2f}", f"{x['step']:.2f} ({x['enqueue']:.2f})"]
        cells += [f"{x[k]:.2f}" for k in ("drafts", "accept", "extend", "rollback", "rest")]
        line = f"| {label} | " + " | ".join(cells) + " |"
        assert line in data, line
    logs = {
        name: (ROOT / f"data/{name}").read_text()
        for name in (
            "gpu_tests_graph_rollback_h100_d2c23eb.log",
            "gpu_tests_rounds_h100_d2c23eb.log",
        )
    }
    assert "10 passed in" in logs["gpu_tests_graph_rollback_h100_d2c23eb.log"]
    assert "replay]" in logs["gpu_tests_graph_rollback_h100_d2c23eb.log"]
    rounds = logs["gpu_tests_rounds_h100_d2c23eb.log"]
    assert "168 passed, 1 skipped" in rounds and "failed" not in rounds
    readme = " ".join((ROOT / "README.md").read_text().split())
    k3_128 = [g[3] for g in new128]
    assert (
        f"the rounds of the numpy tree were {span(numpy[0][0])} shorter at batch 8 and "
        f"{span(numpy[1][0])} at batch 32 than the tree before it, and the graph rollback took "
        f"{backs[8, 'this']} ms at batch 8 where the rollback had taken {backs[8, 'previous']} ms. "
        f"On d2c23eb the work outside the engine step is {span(share8)} of a round at batch 8 "
        f"(k = 4) and {round(min(share32))}% at batch 32 (k = 3), and speculation gave "
        f"{pair(new8)} plain decode at batch 8 with k = 4, {new32[0][3]:.2f}x at batch 32 with "
        f"k = 3 and {min(k3_128):.2f}-{max(k3_128):.2f}x at batch 128 with k = 3" in readme
    )


def test_the_prompt_lookup_probe_table_matches_its_file():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    probe = json.loads((ROOT / "data/prompt_lookup_probe_cpu.json").read_text())
    shapes = [(G, W) for G in (8, 32, 128) for W in (200, 2000)]
    ms = {}
    for r in probe["rows"]:
        assert r["k"] == 4
        ms.setdefault((r["label"], r["rows"], r["width"]), []).append(r["ms"])
    assert [r["label"] for r in probe["rows"][:: len(shapes)]] == ["e4d874c", "52b856e"] * 2
    for tree in ("e4d874c", "52b856e"):
        cells = " | ".join(" / ".join(f"{v:.3f}" for v in ms[tree, G, W]) for G, W in shapes)
        assert f"| {tree} | {cells} |" in data, cells
    ratios = [min(ms["e4d874c", G, W]) / min(ms["52b856e", G, W]) for G, W in shapes]
    assert min(ratios) > 2
    listed = ", ".join(f"{r:.1f}x" for r in ratios[:-1]) + f" and {ratios[-1]:.1f}x less time"
    assert f"The best run of each tree: {listed}" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"took {min(ms['52b856e', 128, 2000]):.2f} ms where the tensor version took "
        f"{min(ms['e4d874c', 128, 2000]):.2f} ms, {min(ratios):.1f}-{max(ratios):.1f}x less"
        in readme
    )


def test_the_admissions_run_and_suite_of_6288728_match_their_files():
    data = (ROOT / "data/README.md").read_text()
    text = " ".join(data.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    suite = (ROOT / "data/gpu_suite_h100_6288728.log").read_text()
    assert "tree of commit 6288728" in suite and "--dist worksteal" in suite
    assert "1482 passed, 64 skipped, 2 xfailed, 4 warnings in 180.39s" in suite
    assert "**1,482 passed, 64 skipped, 2 xfailed in 180 s**" in text
    runs = {
        arm: json.loads(
            (ROOT / f"data/bench_spec_steady_admissions_{arm}_h100_6288728.json").read_text()
        )
        for arm in ("alone", "together")
    }
    assert "--batched-admission" in runs["together"]["command"]
    assert "--batched-admission" not in runs["alone"]["command"]
    admit, steady, uncaptured = [], [], []
    for a, t in zip(runs["alone"]["rows"], runs["together"]["rows"]):
        assert a["batch"] == t["batch"]
        pairs = [("plain", a["plain"], t["plain"]), ("k = 4", a["speculative"], t["speculative"])]
        pairs.append(("k = 3", a["arms"]["k=3"], t["arms"]["k=3"]))
        assert a["speculative_equal_greedy"] and t["speculative_equal_greedy"]
        assert a["arms"]["k=3"]["equal_greedy"] and t["arms"]["k=3"]["equal_greedy"]
        for label, x, y in pairs:
            admit.append(y["admitting_s"] / x["admitting_s"])
            steady.append(y["steady_tokens_per_s"] / x["steady_tokens_per_s"])
            if x["capture_s"] == 0 and y["capture_s"] == 0:
                uncaptured.append(f"{admit[-1]:.2f}x")
            cells = (
                f"| {a['batch']} | {label} | {x['admitting_s']:.2f} s | {y['admitting_s']:.2f} s "
                f"({admit[-1]:.2f}x) | {x['capture_s']:.2f} / {y['capture_s']:.2f} s | "
                f"{x['tokens_per_s']:,.0f} tok/s | {y['tokens_per_s']:,.0f} "
                f"({y['tokens_per_s'] / x['tokens_per_s']:.2f}x) | {steady[-1]:.2f}x |"
            )
            assert cells in data, cells
    less = sum(r < 1 for r in admit)
    span = f"{min(admit):.2f}-{max(admit):.2f}x"
    drift = f"{100 * (min(steady) - 1):.0f}-{100 * (max(steady) - 1):.0f}%"
    assert min(steady) > 1  # "all faster in the second"
    assert f"moved by {drift} between the two runs, all faster in the second" in text
    assert f"took {span} the time of admitting alone, with no direction: less in {less} arms" in text  # fmt: skip
    assert f"more in {len(admit) - less}" in text and len(uncaptured) == 3
    assert f"it took {uncaptured[0]}, {uncaptured[1]} and {uncaptured[2]}" in text
    assert f"took {span} the admitting time, less in {less} arms and more in {len(admit) - less}" in readme  # fmt: skip
    assert f"moved by {drift} between the two runs; at batch 128 plain decode it took 20% longer" in readme  # fmt: skip
    assert f"{admit[6]:.2f}" == "1.20"  # batch 128, plain


def test_the_failed_suite_of_c01327c_is_counted_by_cause():
    text = " ".join((ROOT / "data/README.md").read_text().split())
    log = (ROOT / "data/gpu_suite_h100_c01327c_failed.log").read_text()
    assert "46 failed, 1466 passed, 60 skipped, 2 xfailed, 1 warning, 5 errors in 329.08s" in log
    summary = log.split("short test summary info")[1].splitlines()
    failed = [ln for ln in summary if ln.startswith("FAILED")]
    batched = [ln for ln in failed if "test_batched_admission.py" in ln]
    widgets = [ln for ln in failed if "test_recompute_break_even_has_room_either_side" in ln]
    assert "No module named 'ipywidgets'" in log and len(widgets) == 1
    assert "Pointer argument (at 0) cannot be accessed from Triton" in log
    n_kernels = len(failed) - len(batched) - len(widgets)
    assert log.count("Kernels are not available") >= n_kernels
    assert (len(failed), n_kernels, len(batched)) == (46, 28, 17)
    assert "had 46 failures and 5 errors: 28 of the failures and the 5 errors" in text
    assert f"{len(batched)} because a CPU engine" in text
    slowest = [float(m) for m in re.findall(r"^([0-9.]+)s call +tests/test_decode_kernels.py", log, re.M)]  # fmt: skip
    assert f"{sum(sorted(slowest)[-8:]):.0f} s by the failed run's durations" in text


def test_the_final_trees_gpu_tests_of_the_changed_serving_code_match_their_logs():
    text = " ".join((ROOT / "data/README.md").read_text().split())
    said = []
    for name in ("serving", "engine"):
        log = (ROOT / f"data/gpu_tests_{name}_h100_021e082.log").read_text()
        assert "tree of commit 021e082" in log and "NVIDIA H100" in log and "failed" not in log
        assert "transformers 5.17.0" in log  # the image's packages, as the README says
        passed, skipped = re.search(r"(\d+) passed, (\d+) skipped in", log).groups()
        said.append(f"**{passed} passed, {skipped} skipped**")
    assert f"{said[0]} and {said[1]}" in text


def test_the_gpu_workload_streams_of_6b344e2_match_their_files():
    from replaylab.bench.workload_stream import (
        burst_point,
        stopping_probe,
        workload_prediction,
        workload_summary,
    )

    text = " ".join((ROOT / "data/README.md").read_text().split())
    names = ("multi_turn", "system_prompts", "few_shot", "agents")
    runs = {
        n: json.loads((ROOT / f"data/bench_workload_stream_gpu_{n}_h100_6b344e2.json").read_text())
        for n in names
    }
    table = workload_summary(runs[names[0]])
    for n in names[1:]:
        table += workload_summary(runs[n])[2:]
    assert " ".join("\n".join(table).split()) in text
    ws = {n: r["workloads"][n] for n, r in runs.items()}
    for r in runs.values():
        assert r["complete"] and r["commit"] == "6b344e2" and "H100" in r["device"]
        assert r["versions"]["transformers"] == "5.17.0"
    secs = sorted(r["seconds"] for r in runs.values())
    assert f"every file `complete`, {secs[0]:.0f}-{secs[-1]:.0f} s each" in text
    budgets = sorted(w["budget_bytes"] / 1e6 for w in ws.values())
    assert f"under snapshot, {budgets[0]:.0f}-{budgets[-1]:.0f} MB)" in text
    streams = [s for w in ws.values() for s in w["rows"] + [p for r in w["rates"] for p in r["probes"]]]  # fmt: skip
    assert {s["graph_captures"] for s in streams} == {0}
    assert f"**0 in all {len(streams)} timed streams** ({len(streams) // 4} a workload)" in text
    rows = [r for w in ws.values() for r in w["rows"]]
    assert all(r["tokens_equal_alone"] == r["requests"] for r in rows)

    def span(values, fmt="{:.2f}"):
        return f"{fmt.format(min(values))}-{fmt.format(max(values))}"

    tpot2 = [1e3 * r["tpot_s"]["p50"] for r in rows if r["rate"] == 2.0 and r["mode"] == "decode"]
    b1 = [1e3 * b["tpot_s"] for w in ws.values() for b in w["batch1"].values()]
    assert f"the TPOT p50 is {span(tpot2)} ms, against batch-1 TPOTs of {span(b1)} ms" in text
    peak = {
        s: sorted(
            max(r["peak_running"] for r in w["rows"] if r["strategy"] == s) for w in ws.values()
        )  # fmt: skip
        for s in ("replay", "snapshot")
    }
    assert f"At most {peak['snapshot'][0]}-{peak['snapshot'][-1]} snapshot requests" in text
    assert f"ran up to {peak['replay'][0]}-{peak['replay'][-1]} under the same bytes" in text
    fs = ws["few_shot"]
    entry = {r["strategy"]: r for r in fs["rates"] if r["mode"] == "decode"}
    rfail, sfail = stopping_probe(entry["replay"]), stopping_probe(entry["snapshot"])
    obj = fs["objective"]
    assert rfail["wait_p90_s"] <= obj["wait_p90_max_s"] < sfail["wait_p90_s"]
    assert sfail["tpot_p99_s"] <= obj["tpot_p99_max_s"] < rfail["tpot_p99_s"]
    assert (
        f"TPOT bound ({1e3 * rfail['tpot_p99_s']:.2f} ms over {1e3 * obj['tpot_p99_max_s']:.2f} "
        f"at {rfail['rate']:.1f} requests a second" in text
    )
    assert (
        f"wait bound ({1e3 * sfail['wait_p90_s']:.0f} ms over {1e3 * obj['wait_p90_max_s']:.0f} "
        f"ms at {sfail['rate']:.1f})" in text
    )
    point = {n: burst_point(w) for n, w in ws.items()}
    assert f"({span(list(point.values()), '{:.0f}')} requests a second here)" in text
    rates = {
        (n, r["strategy"], r["mode"]): r["sustainable_rate"] for n, w in ws.items() for r in w["rates"]
    }  # fmt: skip
    synth = [v for (n, s, m), v in rates.items() if s == "replay" and m == "synthetic"]
    assert f"synthetic drafter ({min(synth):.0f} to at least {max(synth):.0f} requests" in text
    assert all(rates[(n, "replay", "synthetic")] > point[n] for n in names)  # bursts, each
    assert rates[("agents", "replay", "decode")] > point["agents"]
    assert all(rates[(n, "replay", "decode")] < point[n] for n in names[:3])
    pred = [
        workload_prediction(w, runs[n]["config"], "replay", "decode")[0]
        / workload_prediction(w, runs[n]["config"], "snapshot", "decode")[0]
        for n, w in ws.items()
    ]
    measured = [rates[(n, "replay", "decode")] / rates[(n, "snapshot", "decode")] for n in names]
    assert (
        f"puts replay at {min(pred):.2f}-{max(pred):.2f}x snapshot for decode, against "
        f"{min(measured):.2f}-{max(measured):.2f}x measured: it misses every workload, both ways"
        in text
    )
    assert min(pred) > min(measured) and max(pred) < max(measured)
    assert all(abs(p / m - 1) > 0.2 for p, m in zip(pred, measured))
    assert f"below the burst point (next item) on two workloads (multi-turn {measured[0]:.2f}x, system prompts {measured[1]:.2f}x)" in text  # fmt: skip
    assert f"on agents ({measured[3]:.2f}x) replay's rate lies above its burst point; missed on few-shot ({measured[2]:.2f}x)" in text  # fmt: skip
    assert measured[2] < 1.3 <= min(measured[0], measured[1], measured[3])
    per_req = {
        r["strategy"]: r["accounted_bytes_per_request"]["mean"] / 1e6
        for r in fs["rows"]
        if r["mode"] == "decode" and r["rate"] == 2.0
    }
    assert f"{per_req['snapshot']:.1f} MB a request on few-shot against replay's {per_req['replay']:.1f} MB" in text  # fmt: skip
    synth_stop = {
        n: [p["rate"] for p in r["probes"] if not p["ok"]]
        for n, w in ws.items()
        for r in w["rates"]
        if r["strategy"] == "replay" and r["mode"] == "synthetic"
    }
    assert synth_stop["system_prompts"] == synth_stop["agents"] == []
    mt, few = synth_stop["multi_turn"], sorted(synth_stop["few_shot"])
    assert f"bursts too ({mt[0]:.1f}; {few[0]:.1f} and {few[1]:.1f})" in text and len(mt) == 1
    ttft = []
    for w in ws.values():
        got = {r["strategy"]: 1e3 * r["ttft_s"]["p50"] for r in w["rows"] if r["rate"] == 2.0 and r["mode"] == "decode"}  # fmt: skip
        ttft.append(f"{got['replay']:.1f} / {got['snapshot']:.1f}")
    assert (
        f"multi-turn {ttft[0]} ms, system prompts {ttft[1]}, few-shot {ttft[2]}, agents {ttft[3]}"
        in text
    )
    slots = json.loads((ROOT / "data/slot_bytes_8b_layers.json").read_text())
    assert slots["dtype"] == "bfloat16" and slots["k"] == 4 and slots["preset"] == "8b-layers"
    mb = {(r["strategy"], r["max_verify"]): r["recurrent_bytes"] / 1e6 for r in slots["rows"]}
    kv_rows = per_req["snapshot"] - mb[("snapshot", 5)]  # the run's KV rows, MB
    assert abs(kv_rows * 1e6 / slots["rows"][0]["kv_bytes_per_token"] - 885) < 5  # ~ T + n - 1
    fair = mb[("snapshot", 1)] + kv_rows
    run_replay = per_req["replay"] - kv_rows
    assert (
        f"a snapshot slot {mb[('snapshot', 5)]:.1f} MB of recurrent state built for k = 4 (the GPU "
        f"run's {per_req['snapshot']:.1f} MB less its KV rows: {kv_rows:.1f} MB) and "
        f"{mb[('snapshot', 1)]:.1f} MB built for plain decode" in text
    )
    saved = mb[("replay", 5)] - mb[("replay", 1)]
    fair_replay = per_req["replay"] - saved
    assert (
        f"accounted about {fair:.1f} MB, and a replay one about {fair_replay:.1f} MB (the run's "
        f"{per_req['replay']:.1f} MB less the {saved:.1f} MB a replay slot saves built for plain "
        f"decode, {mb[('replay', 5)]:.1f} against {mb[('replay', 1)]:.1f} MB here): "
        f"{fair / fair_replay:.1f}x, where the run had {per_req['snapshot'] / per_req['replay']:.1f}x"
        in text
    )
    admits = [
        w["budget_bytes"] / next(r for r in w["rows"] if r["strategy"] == "replay" and r["mode"] == "decode")["accounted_bytes_per_request"]["mean"]
        for w in ws.values()
    ]  # fmt: skip
    assert f"below the {int(min(admits))}-{int(max(admits))} the budget admits" in text
    assert all(max(r["peak_running"] for r in w["rows"] if r["strategy"] == "replay") < a for w, a in zip(ws.values(), admits))  # fmt: skip
    assert f"{mb[('replay', 5)]:.1f} MB here against the run's {run_replay:.1f} MB" in text
    assert 2.5 < per_req["snapshot"] / fair < 3.5  # "about three times as many"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (  # README keeps the ratios of this run beside the fair one's
        f"gave {measured[0]:.2f}x, {measured[1]:.2f}x, {measured[2]:.2f}x and {measured[3]:.2f}x: "
        "higher than the fair run on system prompts and agents, lower on multi-turn and few-shot"
        in readme
    )
    fair = {
        n: json.loads((ROOT / f"data/bench_workload_stream_gpu_{n}_decode_h100_90b36f1.json").read_text())["workloads"][n]
        for n in names
    }  # fmt: skip
    fair_ratio = []
    for n in names:
        got = {
            r["strategy"]: r["sustainable_rate"] for r in fair[n]["rates"] if r["mode"] == "decode"
        }
        fair_ratio.append(got["replay"] / got["snapshot"])
    assert [m > f for m, f in zip(measured, fair_ratio)] == [False, True, False, True]
    assert (
        "they overstate it on system prompts and agents and understate it on multi-turn and few-shot"
        in text
    )
    assert fs["rows"][0]["token_hit_rate"] == next(
        r["token_hit_rate"] for r in fs["rows"] if r["strategy"] == "snapshot" and r["rate"] == 2.0
    )
    log = (ROOT / "data/gpu_tests_workload_stream_h100_6b344e2.log").read_text()
    assert "tree of 6b344e2" in log and "15 passed in" in log and "failed" not in log


def test_the_h200_serving_tests_and_the_cut_rounds_run_match_their_files():
    text = " ".join((ROOT / "data/README.md").read_text().split())
    log = (ROOT / "data/gpu_tests_serving_h200_6e318a1.log").read_text()
    assert "NVIDIA H200" in log and "tree of commit 6e318a1" in log and "transformers 5.25.0" in log
    passed, skipped = re.search(r"(\d+) passed, (\d+) skipped in", log).groups()
    assert "failed" not in log and f"**{passed} passed, {skipped} skipped**" in text
    run = json.loads(
        (ROOT / "data/bench_workload_stream_gpu_few_shot_rounds3_h200_6e318a1_cut.json").read_text()
    )
    assert not run["complete"] and run["commit"] == "6e318a1" and run["config"]["rounds"] == 3
    w = run["workloads"]["few_shot"]
    one = json.loads(
        (ROOT / "data/bench_workload_stream_gpu_few_shot_h100_6b344e2.json").read_text()
    )
    one = one["workloads"]["few_shot"]
    assert w["prompts"] == 3 * one["prompts"] == 30
    assert (
        f"the budget grew with the rounds ({w['budget_bytes'] / 1e6:.0f} MB, three times one round's;"
        in text
    )
    assert abs(w["budget_bytes"] / one["budget_bytes"] - 3) < 0.01
    assert all(r["tokens_equal_alone"] == r["requests"] == 30 for r in w["rows"])
    assert {r["graph_captures"] for r in w["rows"]} == {0}
    assert {r["strategy"] for r in w["rates"]} == {"replay"}  # snapshot's search was cut
    replay = w["rates"][0]
    assert f"rate with 30 requests, {replay['sustainable_rate']:.1f} requests a second" in text
    from replaylab.bench.workload_stream import stopping_probe

    p = stopping_probe(replay)
    assert p["tpot_p99_s"] > w["objective"]["tpot_p99_max_s"]
    assert p["wait_p90_s"] <= w["objective"]["wait_p90_max_s"]
    from replaylab.bench.workload_stream import workload_prompts
    from replaylab.model import preset

    vocab = preset("8b-layers").vocab_size
    now, _ = workload_prompts("few_shot", 512, vocab, rounds=3)  # the current tree's stream
    assert sum(map(len, now[:10])) == one["prompt_tokens"]  # the first round agrees
    assert sum(map(len, now)) != w["prompt_tokens"]  # the file's later rounds differ
    assert "only the first 10 prompts agree" in text
    peaks = [
        max(r["peak_running"] for r in x["rows"] if r["strategy"] == "replay") for x in (w, one)
    ]
    assert f"replay ran up to {peaks[0]} requests at once here, {peaks[1]} in the one-round run" in text  # fmt: skip
    old = next(r for r in one["rates"] if r["strategy"] == "replay" and r["mode"] == "decode")
    assert f"against {old['sustainable_rate']:.1f} with 10 requests on the H100" in text


def test_the_cpu_workload_streams_with_a_budget_per_mode_match_their_file():
    from replaylab.bench.workload_stream import workload_budget

    text = " ".join((ROOT / "data/README.md").read_text().split())
    run = load_bench("data/bench_workload_stream_cpu.json")
    ws = run["workloads"]
    assert run["commit"] == "1c71227" and run["versions"]["torch"] == "2.13.0+cpu"
    assert f"torch 2.13.0+cpu, {run['seconds']:.0f} s; issue 38" in text

    def span(values, fmt="{:.2f}"):
        return f"{fmt.format(min(values))}-{fmt.format(max(values))}"

    def low(w, s, mode):
        rows = [r for r in w["rows"] if r["strategy"] == s and r["mode"] == mode]
        return min(rows, key=lambda r: r["rate"])

    def held(w, s, mode):
        return low(w, s, mode)["accounted_bytes_per_request"]["mean"] / 1e6

    assert all(r["tokens_equal_alone"] == r["requests"] for w in ws.values() for r in w["rows"])
    decode = [workload_budget(w, "decode") / 1e6 for w in ws.values()]
    drafts = [workload_budget(w, "synthetic") / 1e6 for w in ws.values()]
    assert (
        f"Plain decode's budget is now {span(decode)} MB, the speculative modes' {span(drafts)} MB"
        in text
    )
    fitted = {
        round(workload_budget(w, "synthetic") / 1e6 / held(w, "snapshot", "decode"), 1)
        for w in ws.values()
    }
    mt = ws["multi_turn"]
    slots = run["config"]["max_batch"]
    assert max(fitted) > slots
    assert (
        f"the budget held the bytes of {max(fitted):.1f} of a workload's {mt['prompts']} "
        f"plain-decode snapshot requests" in text
    )
    assert f"where a quarter is {mt['prompts'] // 4}: more than the preset's {slots} slots" in text
    for mode, words in (("decode", "in plain decode"), ("synthetic", "built for k drafts")):
        r = {round(held(w, "replay", mode), 2) for w in ws.values()}
        s = {round(held(w, "snapshot", mode), 2) for w in ws.values()}
        assert len(r) == len(s) == 1
        assert f"{r.pop():.2f} / {s.pop():.2f} MB {words}" in text
    lead = {
        round(held(w, "snapshot", "decode") / held(w, "replay", "decode"), 2) for w in ws.values()
    }
    assert lead == {1.28} and "replay's lead in bytes is 1.28x in plain decode here" in text
    hit = {
        (s, m): low(mt, s, m)["token_hit_rate"]
        for s in ("replay", "snapshot")
        for m in ("decode", "synthetic")
    }
    assert (
        f"replay's token hit rate falls to {hit['replay', 'decode']:.3f} on multi-turn "
        f"({hit['replay', 'synthetic']:.3f} under the speculative budget) and snapshot's to "
        f"{hit['snapshot', 'decode']:.3f} ({hit['snapshot', 'synthetic']:.3f})"
    ) in text
    others = [
        low(w, s, "synthetic")["token_hit_rate"] - low(w, s, "decode")["token_hit_rate"]
        for n, w in ws.items() if n != "multi_turn" for s in ("replay", "snapshot")
    ]  # fmt: skip
    assert 0 <= min(others) and max(others) < 0.16
    rates = {
        (n, r["strategy"], r["mode"]): r["sustainable_rate"]
        for n, w in ws.items()
        for r in w["rates"]
    }
    met = [
        rates[n, "replay", m] / rates[n, "snapshot", m]
        for n, _, m in rates
        if rates[n, "replay", m] is not None
        and rates[n, "snapshot", m] is not None
        and _ == "replay"
    ]
    assert len(met) == 2 and f"on two rows only, and there at {span(met)}x snapshot's rate" in text
    tpot = [
        w["batch1"]["replay"]["tpot_s"] / w["batch1"]["snapshot"]["tpot_s"] for w in ws.values()
    ]
    pre = [
        w["batch1"]["replay"]["prefill_s_per_token"]
        / w["batch1"]["snapshot"]["prefill_s_per_token"]
        for w in ws.values()
    ]
    assert (
        f"batch-1 TPOT is {span(tpot, '{:.1f}')}x snapshot's and its prefill {span(pre, '{:.1f}')}x"
        in text
    )


def test_the_cpu_serve_stream_rerun_matches_its_file():
    text = " ".join((ROOT / "data/README.md").read_text().split())
    run = load_bench("data/bench_serve_stream_cpu.json")
    assert run["commit"] == "bba3b1d" and run["date"].startswith("2026-12-07")
    snap = run["strategies"]["snapshot"]
    plain, drafts = (
        snap["pool_bytes_per_slot_plain_decode"] / 1e6,
        snap["pool_bytes_per_slot"] / 1e6,
    )
    assert f"a snapshot slot {plain:.2f} MB against {drafts:.2f} MB built for k drafts" in text
    modes = [m for row in run["strategies"].values() for m in row["modes"].values()]
    alone = {(m["tokens_equal_alone"], m["requests_served_alone"]) for m in modes}
    stream = {m["tokens_equal_decode_stream"] for m in modes}
    n = run["stream"]["n_requests"]
    assert alone == {(8, 8)} and stream == {n}
    assert (
        f"8 of the first 8 requests served alone and {n} of {n} in the plain-decode stream" in text
    )


def test_the_fair_workload_streams_serve_stream_and_suite_of_90b36f1_match_their_files():
    from replaylab.bench.workload_stream import (
        burst_point,
        stopping_probe,
        workload_prediction,
        workload_summary,
    )

    text = " ".join((ROOT / "data/README.md").read_text().split())
    section = text.split("## Plain decode on its own engines under a budget that binds")[1]
    suite = (ROOT / "data/gpu_suite_h100_90b36f1.log").read_text()
    assert "tree of commit 90b36f1" in suite and "NVIDIA H100" in suite
    assert "1560 passed, 64 skipped, 2 xfailed, 2 warnings in 237.44s" in suite
    assert "**1,560 passed, 64 skipped, 2 xfailed in 237 s**" in section
    names = ("multi_turn", "system_prompts", "few_shot", "agents")
    load = lambda name: json.loads((ROOT / f"data/{name}").read_text())  # noqa: E731
    runs = {n: load(f"bench_workload_stream_gpu_{n}_decode_h100_90b36f1.json") for n in names}
    runs["rounds3"] = load("bench_workload_stream_gpu_few_shot_decode_rounds3_h100_90b36f1.json")
    old = {n: load(f"bench_workload_stream_gpu_{n}_h100_6b344e2.json") for n in names}
    ws = {n: r["workloads"]["few_shot" if n == "rounds3" else n] for n, r in runs.items()}
    for n, r in runs.items():
        assert r["complete"] and r["commit"] == "90b36f1" and "H100" in r["device"]
        assert r["versions"]["transformers"] == "5.25.0" and r["config"]["rounds"] == (3 if n == "rounds3" else 1)  # fmt: skip
        assert "--modes decode --strategies replay,snapshot" in r["command"]
    secs = sorted(r["seconds"] for r in runs.values())
    assert f"every file `complete`, {secs[0]:.0f}-{secs[-1]:.0f} s each" in section
    for n in names:  # the same streams as 6b344e2's
        o = old[n]["workloads"][n]
        assert (o["prompts"], o["prompt_tokens"], o["output_tokens"]) == (
            ws[n]["prompts"], ws[n]["prompt_tokens"], ws[n]["output_tokens"]
        )  # fmt: skip
    table = []
    for r in runs.values():
        table += workload_summary(r)[(0 if not table else 2) :]
    assert " ".join("\n".join(table).split()) in section
    budget = {n: w["budget_bytes"]["decode"] / 1e6 for n, w in ws.items()}
    assert f"on those engines: {min(budget.values()):.0f}-{max(budget.values()):.0f} MB" in section
    old_budget = [old[n]["workloads"][n]["budget_bytes"] / 1e6 for n in names]
    assert f"the 6b344e2 run had {min(old_budget):.0f}-{max(old_budget):.0f} MB" in section
    grown = [b / budget[n] for b, n in zip(old_budget, names)]
    assert all(2.6 < g < 2.8 for g in grown)  # "budgets about 2.7x larger"

    def accounted(w, s):
        row = next(r for r in w["rows"] if r["strategy"] == s)
        return row["accounted_bytes_per_request"]["mean"] / 1e6

    fs = {s: accounted(ws["few_shot"], s) for s in ("snapshot", "replay")}
    assert (
        f"accounted {fs['snapshot']:.1f} MB under snapshot against replay's {fs['replay']:.1f} MB "
        f"({fs['snapshot'] / fs['replay']:.2f}x;" in section
    )
    admits = {s: [w["budget_bytes"]["decode"] / 1e6 / accounted(w, s) for w in ws.values()] for s in ("snapshot", "replay")}  # fmt: skip
    peaks = {s: [max(r["peak_running"] for r in w["rows"] if r["strategy"] == s) for w in ws.values()] for s in admits}  # fmt: skip
    assert (
        f"admits {min(admits['snapshot']):.1f}-{max(admits['snapshot']):.1f} snapshot requests at "
        f"once and {min(admits['replay']):.1f}-{max(admits['replay']):.1f} replay ones" in section
    )
    assert f"snapshot {min(peaks['snapshot'])}-{max(peaks['snapshot'])} at once, replay {min(peaks['replay'])}-{max(peaks['replay'])}." in section  # fmt: skip
    for s in admits:  # each ran up to what the budget admits (requests' bytes vary a little)
        assert all(int(a) <= p <= int(a) + 1 for a, p in zip(admits[s], peaks[s]))
    assert all(r["peak_used_bytes"] <= w["budget_bytes"]["decode"] for w in ws.values() for r in w["rows"])  # fmt: skip
    rate = {
        n: {r["strategy"]: r for r in w["rates"] if r["mode"] == "decode"} for n, w in ws.items()
    }
    ratio = {n: e["replay"]["sustainable_rate"] / e["snapshot"]["sustainable_rate"] for n, e in rate.items()}  # fmt: skip
    assert min(ratio.values()) >= 1.3
    assert (
        f"met on all four workloads:** {ratio['multi_turn']:.2f}x on multi-turn, "
        f"{ratio['system_prompts']:.2f}x on system prompts, {ratio['few_shot']:.2f}x on few-shot "
        f"and {ratio['agents']:.2f}x on agents, and {ratio['rounds3']:.2f}x on few-shot over three"
        in section
    )
    point = {n: burst_point(w) for n, w in ws.items()}
    assert all(rate[n][s]["sustainable_rate"] < point[n] for n in ws for s in ("replay", "snapshot"))  # fmt: skip
    one = [point[n] for n in names]
    assert f"({min(one):.0f}-{max(one):.0f} requests a second; {point['rounds3']:.0f} over three rounds)" in section  # fmt: skip
    stop = {n: {s: stopping_probe(e) for s, e in rate[n].items()} for n in ws}
    obj = {n: w["objective"] for n, w in ws.items()}

    def bound(n, s):
        p, o = stop[n][s], obj[n]
        wait, tpot = p["wait_p90_s"] > o["wait_p90_max_s"], p["tpot_p99_s"] > o["tpot_p99_max_s"]
        assert wait != tpot, (n, s)  # one bound each
        return "wait" if wait else "tpot"

    assert {bound(n, "snapshot") for n in ws} == {"wait"}
    assert [n for n in ws if bound(n, "replay") == "tpot"] == ["few_shot"]
    p = stop["few_shot"]["replay"]
    assert (
        f"its TPOT on one-round few-shot ({1e3 * p['tpot_p99_s']:.2f} ms over "
        f"{1e3 * obj['few_shot']['tpot_p99_max_s']:.2f} at {p['rate']:.1f} requests a second)"
        in section
    )
    assert f"replay's search failed at {p['rate']:.1f} requests a second, the probe just above its {rate['few_shot']['replay']['sustainable_rate']:.1f}" in section  # fmt: skip
    old_rate = {n: {r["strategy"]: r["sustainable_rate"] for r in old[n]["workloads"][n]["rates"] if r["mode"] == "decode"} for n in names}  # fmt: skip
    old_ratio = {n: v["replay"] / v["snapshot"] for n, v in old_rate.items()}
    assert (
        f"replay's lead fell on agents ({old_ratio['agents']:.2f}x to {ratio['agents']:.2f}x) and "
        f"system prompts ({old_ratio['system_prompts']:.2f}x to {ratio['system_prompts']:.2f}x) and "
        f"rose on multi-turn ({old_ratio['multi_turn']:.2f}x to {ratio['multi_turn']:.2f}x) and "
        f"few-shot ({old_ratio['few_shot']:.2f}x to {ratio['few_shot']:.2f}x)" in section
    )

    def span(values):
        return f"{min(values):.1f}-{max(values):.1f}"

    for s, label in (("snapshot", "Snapshot's"), ("replay", "replay's")):
        before = [old_rate[n][s] for n in names]
        after = [rate[n][s]["sustainable_rate"] for n in names]
        assert f"{label} rates moved from {span(before)} to {span(after)}" in section or (
            f"{label} from {span(before)} to {span(after)}" in section
        )
    pred = {
        n: workload_prediction(w, runs[n]["config"], "replay", "decode")[0]
        / workload_prediction(w, runs[n]["config"], "snapshot", "decode")[0]
        for n, w in ws.items()
    }
    assert (
        f"replay at {min(pred.values()):.2f}-{max(pred.values()):.2f}x snapshot, against "
        f"{min(ratio.values()):.2f}-{max(ratio.values()):.2f}x measured" in section
    )
    assert [n for n in ws if pred[n] > ratio[n]] == ["few_shot", "rounds3"]
    assert 0.9 < pred["system_prompts"] / ratio["system_prompts"] < 0.95  # "by 7%"
    rows = [r for w in ws.values() for r in w["rows"]]
    assert all(r["tokens_equal_alone"] == r["requests"] for r in rows)
    n_req = sum(r["requests"] for r in rows)
    assert f"{n_req} of {n_req} requests" in section and len(rows) == 6 * len(ws)
    streams = [s for w in ws.values() for s in w["rows"] + [p for r in w["rates"] for p in r["probes"]]]  # fmt: skip
    assert {s["graph_captures"] for s in streams} == {0}
    assert f"0 graph captures in all {len(streams)} timed streams" in section
    ttft = {}
    for n, w in ws.items():
        got = {r["strategy"]: 1e3 * r["ttft_s"]["p50"] for r in w["rows"] if r["rate"] == 2.0}
        ttft[n] = f"{got['replay']:.1f} / {got['snapshot']:.1f}"
        assert (got["replay"] > got["snapshot"]) == (n != "rounds3")
    assert (
        f"multi-turn {ttft['multi_turn']} ms, system prompts {ttft['system_prompts']}, few-shot "
        f"{ttft['few_shot']}, agents {ttft['agents']}, and few-shot over three rounds {ttft['rounds3']}"
        in section
    )

    # the request stream under 0.25 GiB
    run = load("bench_serve_stream_h100_90b36f1.json")
    first = load("bench_serve_stream.json")
    assert run["commit"] == "90b36f1" and "--budget-gib 0.25" in run["command"]
    assert run["budget_bytes"] == 2**28 and run["stream"] == first["stream"]
    assert "(`bench_serve_stream.json`, above). At the reference rate" in section
    assert f"`bench_serve_stream_h100_90b36f1.json` ({run['seconds']:.0f} s)" in section

    def ms(d, digits):
        return f"{1e3 * d['p50']:.{digits}f} / {1e3 * d['p99']:.{digits}f}"

    lines = []
    for s, row in run["strategies"].items():
        for mode in ("decode", "synthetic"):
            m = row["modes"][mode]
            acc = "" if m["acceptance"] is None else f"{m['acceptance']:.2f}"
            lines.append(
                f"| {s}, {mode} | {ms(m['ttft_s'], 1)} | {ms(m['tpot_s'], 2)} | {m['tokens_per_s']:,.0f} "
                f"| {acc} | {m['peak_running']} | {m['sustainable_rate']:.1f} |"
            )
    assert " ".join(" ".join(lines).split()) in section
    dec = {s: row["modes"]["decode"] for s, row in run["strategies"].items()}
    syn = {s: row["modes"]["synthetic"] for s, row in run["strategies"].items()}
    sr = {s: m["sustainable_rate"] for s, m in dec.items()}
    assert f"plain decode is {sr['replay'] / sr['snapshot']:.2f}x snapshot's** (the 2026-12-01 run: 0.71x" in section  # fmt: skip
    assert sr["recompute"] == sr["replay"]
    acc = {s: m["accounted_bytes_per_request"]["mean"] / 1e6 for s, m in dec.items()}
    assert (
        f"accounted {acc['snapshot']:.1f} MB under snapshot, {acc['recompute']:.1f} under recompute "
        f"and {acc['replay']:.1f} under replay; 0.25 GiB admits {int(2**28 / 1e6 / acc['snapshot'])} "
        f"snapshot requests at once, and snapshot ran up to {dec['snapshot']['peak_running']}"
        in section
    )
    o = run["objective"]
    fails = {}
    for s, m in dec.items():
        above = [p for p in m["rate_probes"] if not p["ok"] and p["rate"] > m["sustainable_rate"]]
        p = min(above, key=lambda p: p["rate"])
        assert p["tpot_p99_s"] > o["tpot_p99_max_s"] and p["wait_p90_s"] < o["wait_p90_max_s"]
        fails[s] = f"{1e3 * p['tpot_p99_s']:.2f}"
        fails[s + "_rate"] = f"{p['rate']:.1f}"
    assert (
        f"stopped at the TPOT bound ({1e3 * o['tpot_p99_max_s']:.2f} ms; the failed probes: "
        f"snapshot {fails['snapshot']} ms at {fails['snapshot_rate']} requests a second, recompute "
        f"{fails['recompute']} and replay {fails['replay']} at {fails['replay_rate']})" in section
    )
    assert fails["recompute_rate"] == fails["replay_rate"]
    waits = [p["wait_p90_s"] for m in dec.values() for p in m["rate_probes"]]
    assert max(waits) <= 0.008 and f"against a {1e3 * o['wait_p90_max_s']:.0f} ms bound" in section
    b1 = {s: row["batch1"] for s, row in run["strategies"].items()}
    assert (
        f"(batch-1 TPOT {1e3 * b1['snapshot']['tpot_s']['p50']:.2f} ms against recompute's "
        f"{1e3 * b1['recompute']['tpot_s']['p50']:.2f} and replay's {1e3 * b1['replay']['tpot_s']['p50']:.2f})"
        in section
    )
    sacc = {s: m["accounted_bytes_per_request"]["mean"] / 1e6 for s, m in syn.items()}
    assert (
        f"({sacc['snapshot']:.1f} MB a request built for k = 4, {syn['snapshot']['peak_running']} at "
        f"once; recompute {sacc['recompute']:.1f} MB and replay {sacc['replay']:.1f} MB)" in section
    )
    at = {s: next(p for p in m["rate_probes"] if p["rate"] == m["sustainable_rate"]) for s, m in syn.items()}  # fmt: skip
    assert (
        f"at {syn['snapshot']['sustainable_rate']:.1f} requests a second snapshot's p90 wait is "
        f"{1e3 * at['snapshot']['wait_p90_s']:.1f} ms against replay's {1e3 * at['replay']['wait_p90_s']:.1f}"
        in section
    )
    assert len({m["sustainable_rate"] for m in syn.values()}) == 1
    failed_syn = {min(p["rate"] for p in m["rate_probes"] if not p["ok"]) for m in syn.values()}
    assert len(failed_syn) == 1 and f"fail {failed_syn.pop():.1f}" in section
    worst = max(b1.values(), key=lambda b: b["request_latency_s"])
    assert worst is b1["snapshot"] and worst["request_latency_s"] == o["wait_p90_max_s"]
    assert (
        f"TTFT p50 ({1e3 * b1['snapshot']['ttft_s']['p50']:.0f} ms, against "
        f"{1e3 * b1['recompute']['ttft_s']['p50']:.0f} and {1e3 * b1['replay']['ttft_s']['p50']:.0f} ms"
        in section
    )
    t50 = [1e3 * m["ttft_s"]["p50"] for m in dec.values()]
    t_old = [1e3 * row["modes"]["decode"]["ttft_s"]["p50"] for row in first["strategies"].values()]
    assert f"is {min(t50):.1f}-{max(t50):.1f} ms p50 in plain decode where the 2026-12-01 run had {min(t_old):.0f}-{max(t_old):.0f} ms" in section  # fmt: skip
    cross = {s: row["crossover"] for s, row in run["strategies"].items()}
    old_cross = " / ".join(str(row["crossover"]["measured_batch"]) for row in first["strategies"].values())  # fmt: skip
    assert (
        f"from batch {cross['snapshot']['measured_batch']} ({cross['snapshot']['measured_batch_on_the_clock']}) "
        f"under snapshot, {cross['recompute']['measured_batch']} ({cross['recompute']['measured_batch_on_the_clock']}) "
        f"under recompute and {cross['replay']['measured_batch']} ({cross['replay']['measured_batch_on_the_clock']}) "
        f"under replay; the 2026-12-01 run had {old_cross}" in section
    )
    for row in run["strategies"].values():
        for m in row["modes"].values():
            assert m["tokens_equal_decode_stream"] == m["requests"] == 40
            assert m["tokens_equal_alone"] == m["requests_served_alone"] == 8
    captured = {(s, mode): m["graph_captures"] for s, row in run["strategies"].items() for mode, m in row["modes"].items() if m["graph_captures"]}  # fmt: skip
    assert captured == {("recompute", "synthetic"): 2}
    assert f"p99 TPOT of {1e3 * syn['recompute']['tpot_s']['p99']:.2f} ms includes them" in section
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"A few-shot request is accounted {fs['snapshot']:.1f} MB under snapshot and "
        f"{fs['replay']:.1f} MB under replay, so {min(peaks['snapshot'])}-{max(peaks['snapshot'])} "
        f"snapshot requests ran at once and {min(peaks['replay'])}-{max(peaks['replay'])} replay ones"
        in readme
    )
    assert (
        f"came out {ratio['multi_turn']:.2f}x snapshot's on multi-turn chat, "
        f"{ratio['system_prompts']:.2f}x on shared system prompts, {ratio['few_shot']:.2f}x on "
        f"few-shot and {ratio['agents']:.2f}x on agents (issue 38's target: 1.3x), and "
        f"{ratio['rounds3']:.2f}x on few-shot over three rounds of {ws['rounds3']['prompts']} requests"
        in readme
    )
    assert (
        f"under 0.25 GiB, replay's rate is {sr['replay'] / sr['snapshot']:.2f}x snapshot's"
        in readme
    )
    lat = {s: b["request_latency_s"] for s, b in b1.items()}
    assert (
        f"recompute and replay served one in {1e3 * lat['recompute']:.1f} and {1e3 * lat['replay']:.1f} ms"
        in section
    )
    tight = max(lat["recompute"], lat["replay"])
    snap = {round(p["rate"], 1): p for p in syn["snapshot"]["rate_probes"]}
    for r in (92.3, 130.6):  # failed on the wait alone
        assert snap[r]["tpot_p99_s"] <= o["tpot_p99_max_s"]
        assert not snap[r]["ok"] and snap[r]["wait_p90_s"] > o["wait_p90_max_s"]
    assert (
        f"failed on the wait alone ({1e3 * snap[92.3]['wait_p90_s']:.1f} and {1e3 * snap[130.6]['wait_p90_s']:.1f} ms)"
        in section
    )
    assert snap[65.3]["wait_p90_s"] > tight  # "would fail too"
    others = {
        s: next(p for p in syn[s]["rate_probes"] if round(p["rate"], 1) == 65.3)
        for s in ("replay", "recompute")
    }
    assert all(p["wait_p90_s"] < tight for p in others.values())
    assert (
        f"replay's ({1e3 * others['replay']['wait_p90_s']:.1f} ms) and recompute's ({1e3 * others['recompute']['wait_p90_s']:.1f} ms) would not"
        in section
    )


def test_the_hit_sites_paragraph_matches_its_count():
    """data/README's 'A prefix hit's operations by the line that launches them'."""
    rows = {
        r["strategy"]: r for r in load_bench("data/prefill_launch_count_hit_sites_cpu.json")["rows"]
    }
    text = " ".join((ROOT / "data/README.md").read_text().split())
    assert f"replay {rows['replay']['launches']}, snapshot {rows['snapshot']['launches']}." in text
    sites = rows["replay"]["sites"]
    assert sum(sites.values()) == rows["replay"]["launches"]

    def n(*keys):
        return sum(v for k, v in sites.items() if any(k.startswith(key) for key in keys))

    def op(name):
        return sum(v for k, v in sites.items() if k.endswith(" " + name))

    said = {
        "2 `cat`s of the held KV rows": n("serving/prefix.py:269 cat"),
        "6 copies of the state and conv window": n(
            "serving/prefix.py:285", "serving/prefix.py:286"
        ),
        "3 chained folds": op("triton:_fold_kernel"),
        "17 matrix products": op("mm"),
        "8 add + norm": op("triton:_add_rmsnorm_kernel"),
        "3 gated norms": op("triton:_gated_rmsnorm_kernel"),
        "3 MLP activations": op("triton:_relu2_kernel"),
        "3 scan launches": op("triton:_ssd_chunked_kernel"),
        "5 copies (each layer's conv window and the KV rows)": n(
            "serving/prefill.py:188", "serving/prefill.py:202", "serving/prefill.py:203"
        ),
        "3 checkpoint copies at the grid": n("serving/strategies/replay.py:210"),
        "6 clones of the block's end state and window": n("serving/prefill.py:80 clone"),
        "2 of its KV rows": n("serving/prefix.py:300", "serving/prefix.py:301"),
        "6 `cat`s of its log": n("serving/strategies/replay.py:347 cat"),
        "one `_foreach_zero_`": op("_foreach_zero_"),
    }
    for words, count in said.items():
        assert words in text, words
        first = words.split()[0]
        assert (1 if first == "one" else int(first)) == count, (words, count)
    # the seat's 3 conv launches and the prefill's 3
    assert op("triton:_conv_prompt_kernel") == 6 and "3 conv-kernel launches" in text
