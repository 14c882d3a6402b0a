"""The committed measurements in ``data/`` (GPU runs with their provenance), read without any
plotting dependency. ``data/`` ships with the repository, not inside the wheel."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DATA_DIR", "load_bench"]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def load_bench(path="data/bench_kernels.json") -> dict:
    """A committed benchmark result: rows plus provenance (device, versions, date, command).
    A relative path is tried from the working directory, then from the repository root."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = DATA_DIR.parent / path
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: no such result; the committed results live in the "
            f"repository's data/ folder, which an installed wheel lacks"
        )
    return json.loads(path.read_text())
