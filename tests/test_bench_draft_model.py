"""``bench draft-model`` on the CPU, small: the trained pair speculates with a ModelDrafter per
sequence and with one BatchModelDrafter, both giving greedy's tokens, and the summary reads
the rows."""

from replaylab.bench.draft_model import draft_model_summary, run_draft_model_bench


def test_the_trained_pair_speculates_losslessly_with_both_drafters():
    result = run_draft_model_bench("cpu", batches=(2,), n_new=8, k=3, repeats=1, log=lambda _: 0)
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"greedy", "per-sequence ModelDrafter", "BatchModelDrafter"}
    for mode in ("per-sequence ModelDrafter", "BatchModelDrafter"):
        assert rows[mode]["same_tokens_as_greedy"] is True
        assert 0 <= rows[mode]["acceptance"] <= 1 and rows[mode]["proposed"] > 0
    # a round: one catch-up step and k - 1 drafting steps (more where a fold splits them)
    rounds = rows["BatchModelDrafter"]["proposed"] // (2 * 3)
    assert rows["BatchModelDrafter"]["draft_engine_steps"] >= 3 * rounds
    table = draft_model_summary(result)
    assert len(table) == 2 + 3 and "| 2 | BatchModelDrafter |" in table[-1]
