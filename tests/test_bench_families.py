"""The per-family engine benchmark (``replaylab.bench.families``, ``bench engine-families``) as
a CPU smoke run: a toy Gated DeltaNet stack through every strategy at two batches, the replay
rows on the Triton kernels (interpreter), speculation equal to greedy, pool bytes per slot
by hand, and the command's JSON with provenance. On a GPU machine it runs on the device (bf16)."""

import json

import pytest
import torch

from replaylab.bench.cli import main
from replaylab.bench.families import (
    PRESETS,
    families_summary,
    load_preset,
    ratios,
    run_families,
    step_bytes,
    timed_speculation,
)
from replaylab.bench.serve import admit_all, greedy_ragged, random_prompts
from replaylab.model import HybridLM
from replaylab.serving import STRATEGIES, DecodeEngine

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_tiny_run_gives_every_row_and_the_table_last():
    result = run_families(  # fla's kernels (where installed) are not for toy head sizes
        presets=("tiny-gdn",), batches=(1, 2), n_new=2, repeats=1, n_spec=4, k=2, fla=False
    )
    assert result["device"] == ("cuda" if CUDA else "cpu")
    assert result["errors"] == []
    arms = (False, True) if CUDA else (False,)
    keys = [(r["strategy"], r["batch"], r["graphs"]) for r in result["rows"]]
    assert sorted(keys) == sorted((s, b, g) for s in STRATEGIES for b in (1, 2) for g in arms)
    rows = {(r["strategy"], r["batch"]): r for r in result["rows"] if not r["graphs"]}
    for r in result["rows"]:  # both arms
        assert r["decode_tokens_per_s"] > 0 and r["speculative_tokens_per_s"] > 0
        assert r["speculative_equal_greedy"] and 0 < r["measured_acceptance"] <= 1
    assert rows[("replay", 2)]["folds"] > 0  # 8-40 token prompts, L = 16
    assert rows[("recompute", 2)]["reruns"] >= 0
    # bytes per slot by hand (activations fp32 on CPU, bf16 on a GPU; state, u, g fp32): GDN
    # H=2, Hk=1, K=V=8, conv 32 channels x 3 rows; a verify of k + 1 = 3; KV of one head of 16
    # for 2048 + 3 rows; L = 16
    act = 2 if CUDA else 4
    state, window = 2 * 8 * 8 * 4, 3 * 32 * act
    common = state + window + 3 * window + 2 * 2051 * 16 * act
    want = dict(
        snapshot=common + 3 * state,  # the state after each verified token
        recompute=common + state + window,  # the state and window before a verify
        replay=common + 16 * (8 * act + 2 * 8 * 4 + 2 * 4),  # log: k (1, 8), u (2, 8), g (2,)
    )
    for m in result["memory"]:
        assert m["pool_bytes_per_slot"] == want[m["strategy"]], m
        assert m["sequences_in_budget"] == 24 * 2**30 // want[m["strategy"]]
    lines = families_summary(result)
    header = next(line for line in lines if line.startswith("preset "))
    assert lines.index(header) == len(lines) - 1 - len(result["rows"])  # the table last
    assert header.split() == ["preset", "strategy", "graphs", "batch", "decode", "tok/s",
                                 "roofline", "busy", "spec", "tok/s", "acc", "spec", "=", "greedy"]  # fmt: skip
    assert "without CUDA graphs" in lines[0] and "weights and activations excluded" in lines[1]
    assert {r["graphs"] for r in result["rows"]} == ({False, True} if CUDA else {False})
    assert all(r["bytes_per_step"] > 0 for r in result["rows"])


def test_the_command_writes_json_with_provenance_and_refuses_unknown_presets(tmp_path, capsys):
    out = tmp_path / "families.json"
    argv = ["engine-families", "--presets", "tiny-mamba1", "--strategies", "replay"]
    argv += ["--batches", "1", "--n-new", "1", "--repeats", "1", "--n-spec", "0", "--no-fla"]
    argv += ["--graphs", "off"]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["command"].startswith("replaylab bench engine-families --presets tiny-mamba1")
    assert result["versions"]["torch"] == torch.__version__ and result["date"]
    (row,) = result["rows"]
    assert row["strategy"] == "replay" and "speculative_tokens_per_s" not in row
    assert "replay" in capsys.readouterr().out.splitlines()[-1]
    stopped = run_families(
        presets=("tiny-mamba1", "tiny-bamba"), strategies=("replay",), batches=(1, 2),
        time_budget_s=0, graphs=(False,),
    )  # fmt: skip
    assert [(r["preset"], r["batch"], r["error"]) for r in stopped["rows"]] == [
        (p, b, "time budget") for b in (1, 2) for p in ("tiny-mamba1", "tiny-bamba")
    ]  # batch by batch; the pool bytes are still there
    assert len(stopped["memory"]) == 2 and "time budget" in families_summary(stopped)[-1]
    with pytest.raises(ValueError, match=r"preset: expected one of \[.*'tiny-gdn'"):
        run_families(presets=("nemotron",), device="cpu")
    assert set(PRESETS) == {"qwen3.5-9b-layers", "jamba-1.5-mini-layers", "bamba-9b-layers"}
    gdn = PRESETS["qwen3.5-9b-layers"]["config"]["gdn"]
    assert (gdn["k_heads"], gdn["v_heads"], gdn["k_head_dim"], gdn["v_head_dim"]) == (
        16, 32, 128, 128,
    )  # fmt: skip


def test_the_ssu_rows_put_mamba_ssms_update_in_the_mamba1_snapshot_decode_step():
    """The "ssu snapshot" rows' plumbing, with a stand-in of ``selective_state_update``'s
    signature (the S6 update, state written in place): every one-token state update goes
    through it, prefill does not, its greedy tokens equal the snapshot path's, and the ratios
    carry replay / ssu snapshot."""
    import torch.nn.functional as F

    calls = []

    def update(state, x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False):
        assert dt_softplus and x.dim() == 2 and state.shape[1:] == A.shape
        calls.append(x.shape[0])
        delta = F.softplus(dt.float() + dt_bias.float())
        state.mul_(torch.exp(delta[..., None] * A)).add_(
            (delta * x.float())[..., None] * B.float()[:, None, :]
        )
        return ((state * C.float()[:, None, :]).sum(-1) + D.float() * x.float()).to(x.dtype)

    result = run_families(
        presets=("tiny-mamba1",), strategies=("snapshot", "replay"), batches=(2,), n_new=2,
        repeats=1, n_spec=4, k=2, ssu=update, graphs=(False,),
    )  # fmt: skip
    plain, replay, ssu = result["rows"]
    assert (plain["strategy"], ssu["strategy"]) == ("snapshot", "ssu snapshot")
    assert ssu["greedy_equal_snapshot"] == 1.0 and "speculative_tokens_per_s" not in ssu
    # 3 greedy steps, then 2 timed (prefill: the spec's), on a GPU 8 more for the busy fraction
    assert calls == [2] * (4 - 1 + 2 + (8 if CUDA else 0))
    (q,) = result["ratios"]
    want = replay["decode_tokens_per_s"] / ssu["decode_tokens_per_s"]
    assert q["replay_over_ssu_snapshot"] == pytest.approx(want)
    assert "replay / ssu snapshot" in "\n".join(families_summary(result))


def test_the_fla_rows_put_a_recurrent_kernel_in_the_snapshot_decode_step():
    """The "fla snapshot" rows' plumbing, with a stand-in of fla's signature (the token
    recurrence): every one-token state update goes through it, prefill does not, and its
    greedy tokens equal the snapshot path's."""
    from replaylab.scan import gdn_scan

    calls = []

    def recurrent(q, k, v, g, beta, scale, initial_state, output_final_state):
        assert scale == 1.0 and output_final_state and q.shape[1] == 1 and q.is_contiguous()
        calls.append(q.shape[0])
        r = gdn_scan(q, k, v, g, beta, initial_state=initial_state)
        return r.y, r.state

    result = run_families(
        presets=("tiny-gdn",), strategies=("snapshot",), batches=(2,), n_new=2, repeats=1,
        n_spec=4, k=2, fla=recurrent, graphs=(False,),
    )  # fmt: skip
    plain, fla = result["rows"]
    assert (plain["strategy"], fla["strategy"]) == ("snapshot", "fla snapshot")
    assert fla["greedy_equal_snapshot"] == 1.0 and "speculative_tokens_per_s" not in fla
    # 3 greedy steps, then 2 timed (prefill: the spec's), on a GPU 8 more for the busy fraction
    assert calls == [2] * (4 - 1 + 2 + (8 if CUDA else 0))
    assert "greedy tokens = snapshot's: 100%" in families_summary(result)[-1]


def test_the_fused_arm_runs_the_layouts_the_fused_path_serves():
    """fused=True: a third arm for the layouts the fused path serves (Bamba's and the Gated
    DeltaNet preset's), through its kernels, speculation equal to its own greedy tokens; the
    table names it."""
    result = run_families(presets=("tiny-bamba", "tiny-gdn"), strategies=("replay",),
                          batches=(2,), n_new=2, repeats=1, n_spec=4, k=2, fla=False,
                          graphs=(False,), fused=True)  # fmt: skip
    assert result["errors"] == []
    arms = {(r["preset"], r["fused"]) for r in result["rows"]}
    assert arms == {(p, f) for p in ("tiny-bamba", "tiny-gdn") for f in (False, True)}
    for fused in (r for r in result["rows"] if r["fused"]):
        assert fused["speculative_equal_greedy"] and fused["graphs"] == CUDA
    ratio = next(q for q in result["ratios"] if q["graphs"] == "fused")
    assert ratio["fused_replay_over_graphed_reference"] is None  # no graphed arm asked for
    for preset in ("tiny-bamba", "tiny-gdn"):
        assert any(line.startswith(preset) and " fused " in line
                   for line in families_summary(result))  # fmt: skip


def test_the_ratios_are_the_targets_of_the_issue():
    """replay / snapshot, replay / fla snapshot and replay / ssu snapshot decode, and replay's
    speculation over the best plain decode of any strategy, per preset and batch (by hand)."""
    row = lambda s, b, d, spec=None: dict(  # noqa: E731
        preset="p", strategy=s, batch=b, decode_tokens_per_s=d,
        **({} if spec is None else {"speculative_tokens_per_s": spec}),
    )  # fmt: skip
    rows = [
        row("snapshot", 8, 100.0, 90.0),
        row("recompute", 8, 125.0),
        row("replay", 8, 120.0, 300.0),
    ]
    rows += [
        row("fla snapshot", 8, 150.0),
        row("ssu snapshot", 8, 60.0),
        dict(preset="p", strategy="replay", batch=32, error="OOM"),
    ]
    rows.append(dict(row("replay", 8, 240.0), graphs=True))  # its own arm
    rows.append(dict(row("replay", 8, 360.0), graphs=True, fused=True))  # the fused arm
    none = dict(replay_over_snapshot=None, replay_over_fla_snapshot=None,
                replay_over_ssu_snapshot=None, replay_speculative_over_best_decode=None)  # fmt: skip
    assert ratios(rows) == [
        dict(preset="p", batch=8, graphs=False, replay_over_snapshot=1.2,
             replay_over_fla_snapshot=0.8, replay_over_ssu_snapshot=2.0,
             replay_speculative_over_best_decode=2.0),
        dict(preset="p", batch=32, graphs=False, **none),
        dict(preset="p", batch=8, graphs=True, **none),
        dict(preset="p", batch=8, graphs="fused", **none,
             fused_replay_over_graphed_reference=1.5),
    ]  # fmt: skip


@pytest.mark.parametrize("strategy", ["snapshot", "replay"])
def test_the_bytes_of_a_decode_step_counted_by_hand(strategy):
    _, cfg = load_preset("tiny-gdn")
    model = HybridLM(cfg, seed=0).to(DEVICE).eval()  # fp32 on a GPU too
    engine = DecodeEngine(model, 3, 64, strategy, log_length=16, use_kernels=True)
    tok = admit_all(engine, random_prompts(3, cfg.vocab_size, seed=7)).argmax(-1, keepdim=True)
    for _ in range(5):  # logs of several lengths, one past a fold
        tok = engine.step(tok)[:, -1].argmax(-1, keepdim=True)
    assert strategy == "snapshot" or engine.stats.folds > 0
    embed = model.model.embeddings.weight
    weights = sum(p.numel() * 4 for p in model.parameters()) - embed.numel() * 4 + 3 * 32 * 4
    # fp32: GDN state (2, 8, 8), window 3 x 32, the kernels' log entry k (1, 8) + u (2, 8)
    # + g (2,);
    # one KV head of 16, K and V, per position up to the next token's
    state, window, entry, kv_row = 2 * 8 * 8 * 4, 3 * 32 * 4, (8 + 16 + 2) * 4, 2 * 16 * 4
    want = weights
    for s in engine.slots:
        want += 2 * window + (engine.pos[s] + 1) * kv_row
        if strategy == "snapshot":
            want += 2 * state
        else:
            held = engine.log_len[s] % 16
            want += state + (held + 1) * entry + (2 * state + 16 * entry) / 16
    assert step_bytes(engine) == int(want)


def test_the_warmed_up_speculation_is_timed_from_a_fresh_prefill():
    """With ``warm`` (the graph rows) a whole untimed run comes first; the timed run starts
    from a fresh prefill, so its tokens still equal the engine's greedy ones."""
    _, cfg = load_preset("tiny-gdn")
    engine = DecodeEngine(HybridLM(cfg, seed=0).to(DEVICE).eval(), 2, 64, "replay", 16, 3)
    prompts = random_prompts(2, cfg.vocab_size, seed=7)
    ref, _ = greedy_ragged(engine, prompts, 6)
    ref = [r.cpu() for r in ref]
    row = timed_speculation(engine, prompts, ref, 2, 0.8, warm=True)
    assert row["speculative_equal_greedy"] and row["sequences_parted"] == 0
    assert engine.stats.admitted == 3 * 2  # greedy, the warm-up and the timed run
    cold = DecodeEngine(engine.model, 2, 64, "replay", 16, 3)
    once = timed_speculation(cold, prompts, ref, 2, 0.8)
    assert row["rollbacks"] == once["rollbacks"] > 0  # the timed run's own, not the warm-up's
    assert row["measured_acceptance"] == once["measured_acceptance"]


def test_the_two_term_roofline_from_given_rates():
    """With the rates given (a CPU smoke run of the arithmetic): each row's roofline share is
    max(bytes / bandwidth, 2 x matrix weights x batch / matrix rate) over its median step,
    with the binding term named; the table prints it."""
    from replaylab.bench.families import load_preset
    from replaylab.bench.serve import matrix_weights
    from replaylab.model import HybridLM

    result = run_families(
        presets=("tiny-gdn",), strategies=("replay",), batches=(2,), n_new=2, repeats=1,
        n_spec=0, fla=False, graphs=(False,), rates=(1.0, 1e-6),
    )  # fmt: skip
    (row,) = result["rows"]
    flops = 2 * matrix_weights(HybridLM(load_preset("tiny-gdn")[1], seed=0)) * 2
    step = row["seconds_per_step"]["median"]
    roof = row["roofline"]
    assert roof["byte_seconds"] == row["bytes_per_step"] / 1e9
    assert roof["flop_seconds"] == flops / 1e6
    assert roof["binds"] == ("bytes" if roof["byte_seconds"] >= roof["flop_seconds"] else "flops")
    assert roof["share"] == max(roof["byte_seconds"], roof["flop_seconds"]) / step
    assert row["roofline_fraction"] == roof["byte_seconds"] / step
    assert ("gpu_busy" in row) == CUDA  # the profiler's share is a GPU measurement
    assert f"{roof['share']:.0%} ({roof['binds']})" in families_summary(result)[-1]


def test_the_token_loop_arm_keeps_snapshot_off_the_state_update_kernels(monkeypatch):
    """``step_kernels=False`` (``--step-kernels off``): the snapshot rows run the spec's token
    loop, the side-by-side arm for the kernels; the default runs the kernel, once a layer and
    step for the whole batch."""
    from replaylab.serving.pools import Mamba1Pool

    calls = []
    step = Mamba1Pool.step

    def counted(pool, *args):
        calls.append(args[1])
        return step(pool, *args)

    monkeypatch.setattr(Mamba1Pool, "step", counted)
    kw = dict(presets=("tiny-mamba1",), strategies=("snapshot",), batches=(2,), n_new=2,
              repeats=1, n_spec=0, k=2, graphs=(False,), fla=False, ssu=False)  # fmt: skip
    loop = run_families(**kw, step_kernels=False)
    assert calls == [] and loop["step_kernels"] is False
    kernel = run_families(**kw)
    assert calls and set(calls) == {2} and kernel["step_kernels"] is True
