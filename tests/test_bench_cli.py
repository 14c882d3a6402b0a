"""replaylab bench: flags out of range are refused by argparse, naming the flag, before any
model is built or file written."""

import pytest


@pytest.mark.parametrize(
    "argv, message",
    [
        (["decode", "--batches", "-1"], "argument --batches: expected comma-separated integers >= 1, got '-1'"),
        (["spec-steady", "--batches", "0"], "argument --batches: expected comma-separated integers >= 1, got '0'"),
        (["decode", "--n-new", "0"], "argument --n-new: expected an integer >= 1, got '0'"),
        (["engine-families", "--k", "-1"], "argument --k: expected an integer >= 1, got '-1'"),
        (["engine-families", "--acceptance", "nan"], "argument --acceptance: expected a number in [0, 1], got 'nan'"),
        (["prefix", "--budgets", "-1"], "argument --budgets: expected comma-separated integers >= 1"),
        (["hf-cache", "--log-lengths", "0"], "argument --log-lengths: expected comma-separated integers >= 1"),
    ],
)  # fmt: skip
def test_bench_flags_out_of_range_are_refused_before_anything_runs(argv, message, capsys):
    """Each ran (or wrote a file of error rows) and failed deep inside: a negative batch in
    torch, --n-new 0 divided by zero, --acceptance nan wrote a file of error rows."""
    import replaylab.bench.cli as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_bad_input_the_library_refuses_is_one_line_not_a_traceback(capsys, tmp_path):
    """A ValueError from the library (here an unknown preset) printed a full traceback."""
    import replaylab.bench.cli as cli
    from replaylab.cli import main

    out = tmp_path / "never.json"
    for run in (cli.main, lambda argv: main(["bench", *argv])):
        assert run(["engine-families", "--presets", "nemotron", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith("replaylab bench: preset: expected one of [") and "Traceback" not in err
        )
        assert not out.exists()
