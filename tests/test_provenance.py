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
