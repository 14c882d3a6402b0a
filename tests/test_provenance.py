"""A measurement names the code that made it: ``bench.provenance`` records the commit."""

import subprocess
from pathlib import Path

from replaylab.bench.provenance import provenance, source_commit

ROOT = Path(__file__).resolve().parents[1]


def test_the_commit_comes_from_the_environment_where_the_run_sets_it(monkeypatch):
    monkeypatch.setenv("REPLAYLAB_COMMIT", "abc1234")
    assert source_commit() == "abc1234"
    assert provenance([])["commit"] == "abc1234"


def test_the_commit_is_the_checkouts_head_otherwise(monkeypatch):
    monkeypatch.delenv("REPLAYLAB_COMMIT", raising=False)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    got = source_commit()
    if head.returncode or not (ROOT / ".git").exists():  # a copy without its history
        assert got is None
    else:
        assert got in (head.stdout.strip(), head.stdout.strip() + "+changes")


def test_the_commit_is_pinned_while_a_run_lasts(monkeypatch):
    """``pin_commit`` (the CLIs run each benchmark inside it) keeps the commit of the run's
    start while the run lasts, and puts the environment back after; a set commit stays."""
    import os

    from replaylab.bench import provenance as prov

    real = prov.source_commit
    monkeypatch.setenv("REPLAYLAB_COMMIT", "x")  # so that monkeypatch restores it after
    monkeypatch.delenv("REPLAYLAB_COMMIT")
    monkeypatch.setattr(prov, "source_commit", lambda: "start00")  # the checkout at the start
    with prov.pin_commit():
        monkeypatch.setattr(prov, "source_commit", real)  # whatever HEAD is by the end
        assert prov.provenance([])["commit"] == "start00"
    assert "REPLAYLAB_COMMIT" not in os.environ  # put back: a later run pins afresh
    monkeypatch.setenv("REPLAYLAB_COMMIT", "given22")
    with prov.pin_commit():
        assert prov.provenance([])["commit"] == "given22"
    assert os.environ["REPLAYLAB_COMMIT"] == "given22"


def test_the_bench_cli_pins_the_commit_before_it_runs(monkeypatch):
    import os

    import replaylab.bench.cli as cli
    from replaylab.bench import provenance as prov

    monkeypatch.setenv("REPLAYLAB_COMMIT", "x")
    monkeypatch.delenv("REPLAYLAB_COMMIT")
    monkeypatch.setattr(prov, "source_commit", lambda: "start00")
    seen = []
    monkeypatch.setattr(
        cli, "_prefix", lambda args: seen.append(os.environ.get("REPLAYLAB_COMMIT"))
    )
    cli.main(["prefix"])
    assert seen == ["start00"] and "REPLAYLAB_COMMIT" not in os.environ
