"""Plumbing for the solutions / stubs double run (``tests/test_notebook_solutions.py``): an
exercise cell carries ``{"exercise": "<id>"}`` in its metadata, and a solutions file holds one
``# %% <id>`` section per exercise cell.
"""

from __future__ import annotations

EXERCISE_KEY = "exercise"  # cell metadata key holding an exercise cell's id


def solution_sections(path) -> dict[str, str]:
    """The reference answers in a solutions file: ``# %% <id>`` starts the section for the
    notebook cell whose metadata has ``{"exercise": "<id>"}``. Returns {id: source}."""
    import re
    from pathlib import Path

    sections: dict[str, list[str]] = {}
    current = None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = re.match(r"^# %% (\S+)\s*$", line)
        if m:
            current = m.group(1)
            if current in sections:
                raise ValueError(f"{path}: section {current!r} appears twice")
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v).strip() + "\n" for k, v in sections.items()}


def exercise_cells(nb) -> dict[str, int]:
    """{exercise id: cell index} of a notebook (an ``nbformat`` node or the parsed JSON)."""
    found = {}
    for i, cell in enumerate(nb["cells"]):
        key = cell.get("metadata", {}).get(EXERCISE_KEY)
        if key:
            if key in found:
                raise ValueError(f"exercise id {key!r} on cells {found[key]} and {i}")
            found[key] = i
    return found
