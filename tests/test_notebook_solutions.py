"""Every exercise check of the notebooks can fail and can pass (see ``exercise_verdicts.py``):
here, the run with each exercise cell (cell metadata ``{"exercise": "<id>"}``) replaced by the
section ``# %% <id>`` of ``notebooks/solutions/<notebook>.py``, where every check must pass. The
run of the stubs is nbval's run of the notebook as committed, which ends with an item that
checks every check failed; where this session does not run the notebook under nbval, this test
runs the stubs itself.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from exercise_verdicts import REPORT, STUB_ITEM, check_verdicts, verdicts_from_text

from replaylab.teaching.exercises import exercise_cells, solution_sections

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
NAMES = sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]_*.py"))


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


def _nbval_checks_stubs(session, name) -> bool:
    return any(
        item.name == STUB_ITEM and Path(str(item.path)).stem == name for item in session.items
    )


def _run(nb):
    from nbclient import NotebookClient

    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    return verdicts_from_text("".join(o.get("text", "") for o in nb.cells[-1].outputs))


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


@pytest.mark.parametrize("name", NAMES)
def test_checks_fail_on_stubs_and_pass_on_solutions(name, request):
    modes = ["solutions"] if _nbval_checks_stubs(request.session, name) else ["stubs", "solutions"]
    for mode in modes:
        nb, n_exercises = _notebook(name, mode)
        check_verdicts(name, mode, _run(nb), n_exercises, request.config)
