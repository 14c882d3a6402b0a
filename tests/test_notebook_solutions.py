"""Every exercise check of the notebooks can fail and can pass: each notebook with exercises
runs twice.

* stubs: the notebook as committed. Every ``check_*`` it calls must report a failure.
* solutions: each exercise cell (cell metadata ``{"exercise": "<id>"}``) replaced by the section
  ``# %% <id>`` of ``notebooks/solutions/<notebook>.py``. Every check must pass.

The verdicts are read from ``replaylab.teaching.exercises.results()`` (every check records one) by a
cell appended to the notebook, not parsed from printed text. Both runs must call the same
checks in the same order, and at least one per exercise cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from replaylab.teaching.exercises import exercise_cells, solution_sections

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
NAMES = sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]_*.py"))
MARK = "REPLAYLAB_EXERCISE_RESULTS "
REPORT = (
    "import json as _json\n"
    "from replaylab.teaching import exercises as _exercises\n"
    f"print({MARK!r} + _json.dumps(_exercises.results()))"
)


def _notebook(name, mode):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    cells = exercise_cells(nb)
    if mode == "solutions":
        sections = solution_sections(SOLUTIONS / f"{name}.py")
        assert sorted(sections) == sorted(cells), (
            f"{name}: exercise cells {sorted(cells)} but solutions for {sorted(sections)}"
        )
        for key, index in cells.items():
            nb.cells[index].source = sections[key]
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    return nb, len(cells)


def _run(nb):
    from nbclient import NotebookClient

    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    for out in nb.cells[-1].outputs:
        text = out.get("text", "")
        if MARK in text:
            return [tuple(r) for r in json.loads(text.split(MARK, 1)[1].strip())]
    raise AssertionError("the notebook did not report its exercise results")


def test_every_notebook_with_exercises_has_solutions():
    """Notebooks 03-09 all have exercises; any numbered notebook with an exercise cell has a
    solutions file, and every solutions file has its notebook."""
    numbered = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    for name in numbered:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        if exercise_cells(nb) or "03" <= name[:2] <= "09":
            assert exercise_cells(nb), f"{name}: no exercise cells"
            assert name in NAMES, f"{name}: exercise cells but no notebooks/solutions/{name}.py"
    assert set(NAMES) <= set(numbered), (
        f"solutions without a notebook: {set(NAMES) - set(numbered)}"
    )


_verdicts: dict[str, list] = {}


@pytest.mark.parametrize("mode", ["stubs", "solutions"])
@pytest.mark.parametrize("name", NAMES)
def test_checks_fail_on_stubs_and_pass_on_solutions(name, mode):
    nb, n_exercises = _notebook(name, mode)
    verdicts = _run(nb)
    assert len(verdicts) >= n_exercises, f"{name}: {len(verdicts)} checks ran, {n_exercises} cells"
    want = mode == "solutions"
    wrong = [check for check, ok in verdicts if ok != want]
    assert not wrong, f"{name} ({mode}): these checks should {'pass' if want else 'fail'}: {wrong}"
    other = _verdicts.setdefault(name, [])
    other.append([check for check, _ in verdicts])
    if len(other) == 2:
        assert other[0] == other[1], f"{name}: the two runs called different checks: {other}"
