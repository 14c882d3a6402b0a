"""``bench matched``'s plumbing on CPU (a tiny model in mamba-ssm's block layout): every arm and
batch gives a row, speculation equals greedy, the summary prints. The GPU run is
``replaylab bench matched`` (data/bench_matched.json)."""

import pytest
import torch

from replaylab.bench.matched import MATCHED, matched_summary, run_matched
from replaylab.model import PRESETS
from replaylab.testing import DEVICE


def test_matched_smoke_run_on_cpu():
    torch.manual_seed(0)
    result = run_matched(
        batches=(1, 3),
        n_steps=2,
        repeats=1,
        arms=("torch",),
        spec_batches=(2,),
        log_length=4,
        config=dict(PRESETS["tiny"], pattern=MATCHED["pattern"]),
        device="cpu",
        progress=False,
    )
    plain = [(r["strategy"], r["batch"]) for r in result["rows"]]
    assert plain == [("replay", 1), ("replay", 2), ("replay", 3), ("snapshot", 2)]
    spec = [r for r in result["rows"] if "speculative_tokens_per_s" in r]
    assert [r["batch"] for r in spec] == [2, 2]
    assert all(r["speculative_equal_greedy"] for r in spec)
    assert all(r["decode_tokens_per_s"] > 0 for r in result["rows"])
    lines = matched_summary(result)
    assert lines[0].split()[-3:] == ["1", "2", "3"] and "speculation replay" in lines[-2]


def test_matched_replay_ring_keeps_every_draft_before_a_fold():
    """The "replay-ring" rows (log ring L + k) speculate the greedy tokens and verify more
    drafts than replay's, whose rounds shrink before a fold; an unknown name is refused."""
    torch.manual_seed(0)
    kw = dict(
        batches=(), n_steps=6, repeats=1, arms=("torch",), spec_batches=(2,), log_length=4,
        config=dict(PRESETS["tiny"], pattern=MATCHED["pattern"]), device="cpu", progress=False,
    )  # fmt: skip
    result = run_matched(spec_strategies=("replay", "replay-ring"), **kw)
    rows = {r["strategy"]: r for r in result["rows"]}
    assert set(rows) == {"replay", "replay-ring"}
    assert all(r["speculative_equal_greedy"] for r in rows.values())
    assert rows["replay-ring"]["drafts_proposed"] > rows["replay"]["drafts_proposed"]
    with pytest.raises(ValueError, match=r"spec_strategies: expected names of .* got 'ring'"):
        run_matched(spec_strategies=("ring",), **kw)
    with pytest.raises(ValueError, match=r"arms: expected names of .* got 'cublas'"):
        run_matched(**{**kw, "arms": ("cublas",)})


def test_matched_arms_take_turns_and_pair_their_runs(monkeypatch):
    """Two arms at one batch: their timed runs alternate (first, second, first, ...), each has
    ``repeats`` runs, and the second arm's paired ratio is the median of its runs over the
    first arm's, run by run."""
    from replaylab.bench import matched

    timed = []
    decode_seconds = matched.decode_seconds

    def recording(engine, tok, n_new):
        timed.append(engine.matmul)
        return decode_seconds(engine, tok, n_new)

    monkeypatch.setattr(matched, "decode_seconds", recording)
    torch.manual_seed(0)
    result = run_matched(
        batches=(2,), n_steps=2, repeats=3, arms=("torch", "row_invariant"), spec_batches=(),
        log_length=4, config=dict(PRESETS["tiny"], pattern=MATCHED["pattern"]), device=DEVICE,
        progress=False,
    )  # fmt: skip
    first, second = result["rows"]
    assert (first["arm"], second["arm"]) == ("torch", "row_invariant")
    assert len(first["decode_runs_tokens_per_s"]) == len(second["decode_runs_tokens_per_s"]) == 3
    paired = [
        b / a for a, b in zip(first["decode_runs_tokens_per_s"], second["decode_runs_tokens_per_s"])
    ]
    assert second["over_first_arm_paired_median"] == pytest.approx(sorted(paired)[1])
    assert "over_first_arm_paired_median" not in first
    assert timed == ["torch", "row_invariant"] * 3


def test_matched_layout_holds_mamba_ssms_bytes():
    """The relu2 MLP of the replaylab side and mamba-ssm's gated MLP hold the same weights."""
    from replaylab.bench.matched import MAMBA_SSM_INTERMEDIATE

    d = MATCHED["hidden_size"]
    assert 2 * d * MATCHED["intermediate_size"] == 3 * d * MAMBA_SSM_INTERMEDIATE
    assert MATCHED["pattern"].count("-") == sum(c != "-" for c in MATCHED["pattern"])


def test_a_sweeps_launch_table_reaches_the_row_invariant_arm():
    """``--launches``: a sweep's chosen launch replaces ``launch_for``'s for its weight only,
    and the row-invariant arm's products run it (here a launch of 3 slices that the tiny
    model's default would not pick, recorded as it runs)."""
    from replaylab.bench import matmul as bench_matmul
    from replaylab.kernels import matmul as kernels_matmul

    cfg = dict(PRESETS["tiny"], pattern=MATCHED["pattern"])
    d, vocab = cfg["hidden_size"], cfg["vocab_size"]
    chosen = kernels_matmul.Launch(64, 32, 32, 3, 4, 4)
    slower = kernels_matmul.Launch(64, 64, 32, 1, 4, 4)
    sweep = dict(shapes=[dict(weight=[vocab, d], cublas_us={"1": 1.0, "640": 2.0}, tried=[
        dict(launch=chosen._asdict(), us={"1": 1.5, "640": 2.5}, rows_equal=True),
        dict(launch=slower._asdict(), us={"1": 3.0, "640": 6.0}, rows_equal=True),
    ])])  # fmt: skip
    table = bench_matmul.best_launches(sweep)
    assert table == {(vocab, d): ((None, chosen),)}
    policy = bench_matmul.table_policy(table)
    assert policy(vocab, d, 1) == chosen and policy(7, d, 5) == kernels_matmul.launch_for(7, d, 5)

    seen = []
    product = kernels_matmul.linear

    def recording(x, w, launch=None):
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        seen.append((tuple(w.shape), rows, launch or kernels_matmul._policy.get()(*w.shape, rows)))
        return product(x, w, launch)

    torch.manual_seed(0)
    kernels_matmul.linear = recording
    try:
        run_matched(
            batches=(1,), n_steps=1, repeats=1, arms=("row_invariant",), spec_batches=(),
            log_length=4, config=cfg, device=DEVICE, progress=False, launches=table,
        )  # fmt: skip
    finally:
        kernels_matmul.linear = product
    assert any(shape == (vocab, d) and launch == chosen for shape, _, launch in seen)
    assert all(launch == policy(*shape, rows) for shape, rows, launch in seen)


def test_matched_speculation_with_the_batched_drafter():
    """``drafter="batched"``: the speculation rows run one BatchSyntheticDrafter, say so, and
    still equal greedy; a second drafter is timed beside it on the same engine; the command
    line refuses a drafter it does not know."""
    import argparse

    from replaylab.bench.cli import _drafters

    torch.manual_seed(0)
    result = run_matched(
        batches=(), n_steps=2, repeats=1, arms=("torch",), spec_batches=(2,),
        spec_strategies=("replay",), log_length=4,
        config=dict(PRESETS["tiny"], pattern=MATCHED["pattern"]), device="cpu", progress=False,
        drafter=("batched", "list"),
    )  # fmt: skip
    (row,) = result["rows"]
    assert row["drafter"] == "batched" and row["speculative_equal_greedy"]
    other = row["other_drafters"]["list"]
    assert other["drafter"] == "list" and other["speculative_equal_greedy"]
    assert other["speculation_over_decode"] > 0
    assert matched_summary(result)[-1].endswith("(list)")
    assert _drafters("batched,device") == ("batched", "device") and _drafters("list") == "list"
    with pytest.raises(argparse.ArgumentTypeError, match="got 'gpu'"):
        _drafters("batched,gpu")
    with pytest.raises(argparse.ArgumentTypeError, match="each drafter once"):
        _drafters("batched,batched")
    with pytest.raises(ValueError, match="'device' rounds need replay.*device='cpu'"):
        run_matched(batches=(), spec_batches=(2,), device="cpu", drafter=("batched", "device"))


def test_an_interrupted_matched_run_keeps_the_engines_it_finished(monkeypatch):
    """A SIGINT (the device call's time limit) ends the run with the rows of the engines done
    and says how many of how many."""
    import replaylab.bench.matched as matched

    timed = matched.decode_seconds
    calls = []

    def decode_seconds(engine, tok, n_steps):
        calls.append(engine.max_batch)
        if engine.max_batch == 3:
            raise KeyboardInterrupt
        return timed(engine, tok, n_steps)

    monkeypatch.setattr(matched, "decode_seconds", decode_seconds)
    result = run_matched(
        batches=(1, 3), n_steps=2, repeats=1, arms=("torch",), spec_batches=(),
        spec_strategies=("replay",), log_length=4,
        config=dict(PRESETS["tiny"], pattern=MATCHED["pattern"]), device="cpu", progress=False,
    )  # fmt: skip
    assert [r["batch"] for r in result["rows"]] == [1]
    assert result["stopped"] == "interrupted after 1 of 2 engines" and calls == [1, 3]
