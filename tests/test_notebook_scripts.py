"""Each notebook and its paired script (jupytext, ``jupytext.toml``) hold the same cells, so a
review can read the script's diff and trust it for the notebook: the same cell types, sources
and the metadata the notebooks' machinery reads (``tags``, ``exercise``), in the same order.
After editing either file: ``jupytext --sync notebooks/[0-9][0-9]_*.ipynb``."""

from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_config
from jupytext.paired_paths import paired_paths

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SCRIPTS = ROOT / "notebooks" / "src"
KEPT_METADATA = ("tags", "exercise")  # jupytext.toml's cell_metadata_filter


def cells(nb) -> list[tuple]:
    """(type, source, kept metadata) of every cell; a source's trailing newlines, which the
    script cannot show, do not count."""
    return [
        (
            cell.cell_type,
            cell.source.rstrip("\n"),
            {k: cell.metadata[k] for k in KEPT_METADATA if k in cell.metadata},
        )
        for cell in nb.cells
    ]


def differences(notebook, script) -> list[str]:
    """Where two notebooks' cells differ, one line each (empty when they agree)."""
    a, b = cells(notebook), cells(script)
    found = [
        f"cell {i}: the notebook has {x[0]} {x[1][:60]!r} {x[2]}, the script {y[0]} "
        f"{y[1][:60]!r} {y[2]}"
        for i, (x, y) in enumerate(zip(a, b))
        if x != y
    ]
    if len(a) != len(b):
        found.append(f"the notebook has {len(a)} cells, the script {len(b)}")
    return found


def test_every_notebook_is_paired_by_the_config():
    config = load_jupytext_config(str(ROOT / "notebooks"))
    assert config is not None, "no jupytext.toml above notebooks/"
    assert len(NOTEBOOKS) >= 15
    for nb in NOTEBOOKS:
        paths = dict(
            (fmt["extension"], Path(p))
            for p, fmt in paired_paths(str(nb), "ipynb", config.default_formats(str(nb)))
        )
        assert paths[".py"] == SCRIPTS / f"{nb.stem}.py", paths
    scripts = {p.stem for p in SCRIPTS.glob("*.py")}
    assert scripts == {nb.stem for nb in NOTEBOOKS}, "a script without its notebook or back"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_notebook_and_its_script_hold_the_same_cells(notebook):
    script = SCRIPTS / f"{notebook.stem}.py"
    assert script.exists(), f"{script} missing: run jupytext --sync {notebook.relative_to(ROOT)}"
    text = script.read_text()
    assert text.startswith("# %%"), "a percent-format script with no header (jupytext.toml)"
    found = differences(nbformat.read(notebook, as_version=4), jupytext.reads(text, "py:percent"))
    assert not found, (
        f"{notebook.name} and {script.name} differ (edited one without the other? run "
        f"jupytext --sync {notebook.relative_to(ROOT)}):\n" + "\n".join(found[:10])
    )


def test_an_edit_to_one_side_is_found():
    path = next(p for p in NOTEBOOKS if '"exercise": "' in p.read_text())  # has an exercise

    def pair():
        script = jupytext.reads((SCRIPTS / f"{path.stem}.py").read_text(), "py:percent")
        return nbformat.read(path, as_version=4), script

    notebook, script = pair()
    assert differences(notebook, script) == []
    code = next(i for i, c in enumerate(script.cells) if c.cell_type == "code")
    script.cells[code].source += "\nprint('edited in the script alone')"
    assert [line.split(":")[0] for line in differences(notebook, script)] == [f"cell {code}"]

    notebook, script = pair()
    script.cells[code].cell_type = "markdown"  # same text, another kind of cell
    assert [line.split(":")[0] for line in differences(notebook, script)] == [f"cell {code}"]

    notebook, script = pair()
    exercise = next(i for i, c in enumerate(notebook.cells) if "exercise" in c.metadata)
    notebook.cells[exercise].metadata["exercise"] = "renamed"  # which solution fills it
    assert [line.split(":")[0] for line in differences(notebook, script)] == [f"cell {exercise}"]

    notebook, script = pair()
    notebook.cells.append(nbformat.v4.new_markdown_cell("added to the notebook alone"))
    assert differences(notebook, script)[-1].startswith(f"the notebook has {len(script.cells) + 1}")
