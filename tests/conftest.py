"""Shared fixtures and markers.

The session fails if the suite changed a file in the checkout (``checkout_guard``). Figures
skip their static export under the suite (``REPLAYLAB_STATIC_FIGURES=0``, see below).

Markers (registered in pyproject.toml):
    gpu        needs a CUDA device; skipped here with that reason
    mamba_ssm  needs mamba-ssm's references (an optional oracle); skipped with the import error
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from checkout_guard import changed_files, fingerprint
from exercise_verdicts import add_stub_verdict_item

from replaylab.testing import tiny_hybrid

ROOT = Path(__file__).resolve().parents[1]

# Notebook kernels started by the suite (nbval, nbclient, JupyterLab) inherit this: they skip
# the static SVG export of each figure (a Chromium start per kernel, then ~0.3 s a figure). The
# saved notebooks carry the images (tests/test_static_figures.py checks), and that test file
# runs the exporter itself.
os.environ.setdefault("REPLAYLAB_STATIC_FIGURES", "0")
_CHECKOUT = {}


def _compare_checked_outputs_without_stderr():
    """nbval compares a checked cell's stderr stream too; warnings land there depending on the
    machine and its load (a CI run saw one appear under two busy workers that no run alone
    shows), so checked cells are compared on everything but stderr."""
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:
        return
    compare = IPyNbCell.compare_outputs

    def is_stderr(output):
        return output.get("output_type") == "stream" and output.get("name") == "stderr"

    def without_stderr(self, test, ref, skip_compare=None):
        test = [o for o in test if not is_stderr(o)]
        ref = [o for o in ref if not is_stderr(o)]
        return compare(self, test, ref, skip_compare)

    IPyNbCell.compare_outputs = without_stderr


_compare_checked_outputs_without_stderr()
add_stub_verdict_item()  # nbval's run of a notebook with exercises also checks its stubs fail


def pytest_sessionstart(session):
    """Fingerprint the checkout: the suite must leave it as it found it."""
    _CHECKOUT["before"] = fingerprint(ROOT)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run, naming the files, if any test wrote into the checkout."""
    before = _CHECKOUT.get("before")
    if before is None:
        return
    changed = changed_files(before, fingerprint(ROOT) or {})
    if changed:
        print(f"\nthe test suite changed {len(changed)} file(s) in the checkout:")
        for path in changed:
            print(f"    {path}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _mamba_ssm_missing():
    from replaylab.testing import mamba_ssm_references

    try:
        mamba_ssm_references()
    except ImportError as err:
        return str(err)
    return None


# The longest files of a CI run (its --durations summed per file, 2026-12-06: 177, 130, 126,
# 118, 116, 86 and 61 s), collected first. run.sh's xdist hands each worker a whole file at a
# time (--dist loadfile) in the order of the collection (--no-loadscope-reorder): a long file
# handed out near the end keeps one worker busy while the other waits (test_browser.py ran
# last in that run, about 50 s of the 848), while long files first leave the short ones to
# even out the end. Only the order changes; a file missing from the list keeps its place.
SLOW_FILES_FIRST = (
    "test_notebook_solutions.py",
    "test_browser.py",
    "test_engine_families.py",
    "test_hf_cache.py",
    "test_engine.py",
    "test_engine_prefix.py",
    "test_kernels.py",
)


def _slow_files_first(items):
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    tests = ROOT / "tests"
    items.sort(
        key=lambda item: (
            rank.get(item.path.name, len(rank)) if item.path.parent == tests else len(rank)
        )
    )


def pytest_collection_modifyitems(config, items):
    _slow_files_first(items)
    no_gpu = not torch.cuda.is_available()
    no_plotly = importlib.util.find_spec("plotly") is None
    missing = None
    for item in items:
        if no_plotly and item.get_closest_marker("figures"):
            item.add_marker(pytest.mark.skip(reason="plotly is not installed (no notebook stack)"))
        if no_gpu and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine)"))
        if item.get_closest_marker("mamba_ssm"):
            missing = missing if missing is not None else (_mamba_ssm_missing() or "")
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"mamba-ssm oracle unavailable: {missing}"))


@pytest.fixture
def tiny_model():
    """A small NemotronH-layout hybrid (two Mamba-2 layers, one attention) with fixed weights."""
    return tiny_hybrid()


@pytest.fixture
def generator():
    """A seeded torch.Generator, fresh per test."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def one_torch_thread():
    """One torch CPU thread for the test (each row's product alone: row-invariant on CPU),
    the previous count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
