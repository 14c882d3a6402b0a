"""``bench draft-model`` on the CPU, small: the trained pair speculates with a ModelDrafter per
sequence and with one BatchModelDrafter, in a static batch and through the scheduler, every
mode giving decode's tokens, and the summary reads the rows."""

from replaylab.bench.draft_model import draft_model_summary, run_draft_model_bench


def test_the_trained_pair_speculates_losslessly_with_both_drafters():
    result = run_draft_model_bench(
        "cpu", batches=(2,), n_new=8, k=3, repeats=1, stream_factor=2, log=lambda _: 0
    )
    rows = {(r["part"], r["mode"]): r for r in result["rows"]}
    modes = ("decode", "ModelDrafter", "BatchModelDrafter")
    assert set(rows) == {(p, m) for p in ("static", "continuous") for m in modes}
    for part in ("static", "continuous"):
        assert rows[(part, "decode")]["requests"] == (2 if part == "static" else 4)
        for mode in modes[1:]:
            row = rows[(part, mode)]
            assert row["same_tokens_as_decode"] is True
            assert 0 <= row["acceptance"] <= 1 and row["proposed"] > 0
        # each round: a catch-up step, then up to k - 1 drafting steps
        assert rows[(part, "BatchModelDrafter")]["draft_steps_per_run"] > 0
    table = draft_model_summary(result)
    assert len(table) == 2 + 6 and "| 2 | continuous | BatchModelDrafter |" in table[-1]
