"""What the notebook build scripts (``tools/build_notebook_NN.py``) share: a list of cells to an
unexecuted notebook file.

A cell is ``(kind, source)``: kind "md" (markdown), "code", or "exercise:<id>" (a code cell
carrying the metadata ``{"exercise": "<id>"}`` and the tag ``exercise``, which
``tests/test_notebook_solutions.py`` swaps for the section ``# %% <id>`` of the notebook's
solutions file).
"""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook


def write_notebook(cells, out):
    """Write ``cells`` to the notebook ``out`` (validated, no outputs); return ``out``."""
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for kind, source in cells:
        if kind == "md":
            nb.cells.append(new_markdown_cell(source))
        elif kind == "code":
            nb.cells.append(new_code_cell(source))
        elif kind.startswith("exercise:"):
            key = kind.split(":", 1)[1]
            nb.cells.append(new_code_cell(source, metadata={"exercise": key, "tags": ["exercise"]}))
        else:
            raise ValueError(f"cell kind: expected 'md', 'code' or 'exercise:<id>', got {kind!r}")
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out
