"""Rewrite the old flat teaching-module names (``replaylab.exercises``, ``replaylab.plotting``,
...) to their places in ``replaylab.teaching`` in the files given, in place.

The teaching modules moved from ``replaylab/`` into ``replaylab/teaching/`` (issue 21, item 8);
code written against the old names (a notebook on another branch, a script) is brought over by

    python tools/rename_teaching.py notebooks/09_measuring.ipynb notebooks/solutions/09_*.py
    jupytext --sync notebooks/*.ipynb

It rewrites dotted names wherever they appear (imports, monkeypatch targets, prose) and splits
``from replaylab import exercises, scan`` into ``from replaylab import scan`` plus
``from replaylab.teaching import exercises``. Notebooks are rewritten cell by cell (outputs
untouched). A file already rewritten is left as it is. A parenthesised
``from replaylab import (...)`` over several lines is not split; the script names it. ``--check``
lists the files that still use an old name and exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# old module under replaylab -> its module under replaylab.teaching
RENAMES = {
    "exercises": "exercises",
    "exercises_common": "grading",
    "exercises_families": "exercises_families",
    "exercises_prefix": "exercises_prefix",
    "exercises_serving": "exercises_serving",
    "exercises_text": "exercises_text",
    "puzzles": "puzzles",
    "quiz": "quiz",
    "widgets": "widgets",
    "plotting": "plotting",
    "plotting_prefix": "plotting_prefix",
    "plotting_serving": "plotting_serving",
    "timeline": "timeline",
    "experiments": "experiments",
    "diagrams": "diagrams",
}

_OLD = "|".join(sorted(RENAMES, key=len, reverse=True))
# replaylab.exercises (a module path, a monkeypatch target, prose) and replaylab/exercises.py;
# \b keeps replaylab.exercises from matching the start of replaylab.exercises_text
_DOTTED = re.compile(rf"\breplaylab([./])({_OLD})\b")
# `from replaylab import a, b as c` on a line of its own, or inside a string of code (a cell
# a test appends: "from replaylab import exercises as _exercises\n")
_FROM = re.compile(
    r"(?:^(?P<indent>[ \t]*)|(?P<quote>(?<=[\"'])))"
    r"from replaylab import (?P<names>\w+(?:[ \t]+as[ \t]+\w+)?(?:,[ \t]*\w+(?:[ \t]+as[ \t]+\w+)?)*)"
    r"(?=[ \t]*(?:$|#|\\n|[\"']))",
    re.M,
)


def _split_from(match: re.Match) -> str:
    """``from replaylab import a, exercises as ex`` -> the core names and the teaching names
    as two statements (a name keeps its ``as`` alias): on two lines, or joined by "; " inside a
    string."""
    names = [n.strip() for n in match["names"].split(",") if n.strip()]
    core = [n for n in names if n.split()[0] not in RENAMES]
    moved = []
    for name in names:
        base, *alias = name.split()
        if base in RENAMES:
            new = RENAMES[base]
            if new != base and not alias:
                alias = ["as", base]  # the code below still says the old name
            moved.append(" ".join([new, *alias]))
    if not moved:
        return match[0]
    statements = [f"from replaylab import {', '.join(core)}"] if core else []
    statements.append(f"from replaylab.teaching import {', '.join(moved)}")
    if match["quote"] is not None:
        return "; ".join(statements)
    return "\n".join(match["indent"] + statement for statement in statements)


_PARENTHESISED = re.compile(r"from replaylab import \(([^)]*)\)")


def unsplit(text: str) -> list[str]:
    """The old names ``rewrite`` leaves alone: those inside a parenthesised
    ``from replaylab import (...)`` over several lines (split those by hand)."""
    return [
        name
        for group in _PARENTHESISED.findall(text)
        for name in re.findall(r"\w+", group)
        if name in RENAMES
    ]


def rewrite(text: str) -> str:
    """``text`` with every old teaching-module name replaced by its new one."""
    text = _FROM.sub(_split_from, text)
    return _DOTTED.sub(lambda m: f"replaylab{m[1]}teaching{m[1]}{RENAMES[m[2]]}", text)


def _rewrite_notebook(path: Path) -> bool:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        new = rewrite(cell.source)
        if new != cell.source:
            cell.source, changed = new, True
    if changed:
        nbformat.write(nb, path)
    return changed


def rewrite_file(path: Path) -> bool:
    """Rewrite ``path`` in place; True if it changed."""
    if path.suffix == ".ipynb":
        return _rewrite_notebook(path)
    text = path.read_text()
    new = rewrite(text)
    if new != text:
        path.write_text(new)
    return new != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only list files with old names")
    args = parser.parse_args(argv)
    stale = []
    for path in args.files:
        if left := unsplit(path.read_text()):
            print(f"{path}: split by hand: from replaylab import ({', '.join(left)} ...)")
            stale.append(path)
        if args.check:
            if rewrite(path.read_text()) != path.read_text():
                stale.append(path)
        elif rewrite_file(path):
            print(f"rewrote {path}")
    for path in stale:
        print(f"old teaching-module names in {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
