"""Each notebook and its paired script (jupytext, ``jupytext.toml``) hold the same cells, so a
review can read the script's diff and trust it for the notebook: the same cell types, sources
and the metadata the notebooks' machinery reads (``tags``, ``exercise``), in the same order.
After editing either file: ``jupytext --sync notebooks/[0-9][0-9]_*.ipynb``."""

import re
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


# ------------------------------------------------- issue 40: one symbol, one meaning (00's table)

MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$", re.S)


def _markdown_of_script(path: Path) -> str:
    """The markdown cells of a paired script, without the comment marks."""
    parts = []
    for cell in path.read_text(encoding="utf-8").split("\n# %%")[1:]:
        if cell.startswith(" [markdown]"):
            lines = cell.splitlines()[1:]
            parts.append("\n".join(line[2:] if line.startswith("# ") else "" for line in lines))
    return "\n".join(parts)


def _notebook_set(column: str) -> set[str] | None:
    """'02-08, 11' -> {'02', ..., '08', '11'}; 'all' -> None."""
    if column.strip() == "all":
        return None
    found = set()
    for part in column.split(","):
        lo, _, hi = part.strip().partition("-")
        found |= {f"{n:02d}" for n in range(int(lo), int(hi or lo) + 1)}
    return found


def symbol_table() -> dict[str, tuple[str, set[str] | None]]:
    """00's *Notation and terms* table: {symbol: (meaning, notebooks)} for every symbol written
    bare (no subscript) in its first column."""
    text = _markdown_of_script(SCRIPTS / "00_tour.py")
    table = text.split("| symbol | meaning | notebooks |")[1].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        symbols, meaning, where = cells[0], " | ".join(cells[1:-1]), cells[-1]
        for math in re.findall(r"\$([^$]+)\$", symbols):
            for sym in math.split(","):
                sym = sym.strip()
                assert sym not in rows, f"00's table gives {sym} two rows"
                rows[sym] = (meaning, _notebook_set(where))
    return rows


SUB = r"(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}|\\[A-Za-z]+|[A-Za-z0-9])"


def bare_symbols(text: str) -> set[str]:
    """Single-letter symbols written bare in a text's equations. A letter with a subscript is
    another symbol ($k_t$ is not $k$, $S_c$ not $S$); what a subscript or superscript holds and
    LaTeX commands do not count."""
    found = set()
    for m in MATH.finditer(text):
        math = m.group(1) or m.group(2)
        math = re.sub(r"(?<![\\A-Za-z])[A-Za-z]_" + SUB, " ", math)
        math = re.sub(r"[_^]" + SUB, " ", math)
        math = re.sub(r"\\[A-Za-z]+", " ", math)
        found |= set(re.findall(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])", math))
    return found


def test_symbol_table_parses_and_scan_reads_equations():
    table = symbol_table()
    assert table["j"][1] == {"02", "05", "11", "14"} and "cursor" in table["j"][0]
    assert table["t"][1] is None and "k_{\\mathrm{acc}}" in table
    assert table["K"][1] == {"11"} and table["W"][1] == {"13"}
    assert "block size" in table["n_{\\mathrm{blk}}"][0] and "batch" in table["b"][0]
    probe = r"$S_{c+j} = a_t S_c$, $[i\,n_{\mathrm{blk}}, p)$, $e^{\Delta_t A} + dt_s$, $k + 1$"
    assert bare_symbols(probe) == {"i", "p", "e", "k"}  # A is in a superscript


def test_every_notebook_keeps_the_symbol_table():
    """A symbol of 00's table appears in a notebook's equations only where the table lists that
    notebook (so a second meaning cannot creep in unnoticed elsewhere), and the meanings the table
    retired (issue 40) stay out of the notebooks and the scripts' code."""
    table = symbol_table()
    stray = []
    for script in sorted(SCRIPTS.glob("[0-9][0-9]_*.py")):
        nb = script.name[:2]
        used = bare_symbols(_markdown_of_script(script))
        for sym in sorted(used & table.keys()):
            where = table[sym][1]
            if nb != "00" and where is not None and nb not in where:
                stray.append(f"{script.name}: ${sym}$ ({table[sym][0][:50]}...) not listed there")
    assert not stray, "symbols used outside the notebooks 00's table lists:\n" + "\n".join(stray)

    retired = {
        # j was also the drafts accepted in a round (03, 07): now k_acc
        r"\bk, j = ": "j as the drafts accepted",
        r"\bj accepted\b": "j as the drafts accepted",
        r"k - j\b": "j as the drafts accepted",
        r"E\[a\]": "a as the drafts accepted (a_t is a token's decay)",
        # b was also the dt bias (02) and the prefix cache's block size (14)
        r"softplus\}\(dt_t \+ b\)|b_\{dt\}": "b as the dt bias",
        r"blocks of \$b\$": "b as the block size",
        r"\$b = \d": "b as the block size",
        # K was also the conv window (13)
        r"\bK \* conv\b|, K, k, L = ": "K as the conv window",
        r"\bK and V rows\b|heads of 128, K and V\b": "K, V as a KV cache's keys and values",
        # m was also where a prefix match ends (14) and a split point (08)
        r"ends at \$m\$|\\min_\{1 \\le m < n\}": "m outside notebook 11's chunks",
    }
    found = []
    for script in sorted(SCRIPTS.glob("[0-9][0-9]_*.py")):
        text = script.read_text(encoding="utf-8")
        found += [f"{script.name}: {why}" for rx, why in retired.items() if re.search(rx, text)]
    assert not found, "retired meanings back in a notebook:\n" + "\n".join(found)
