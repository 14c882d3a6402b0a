"""The committed measurements in ``data/`` (GPU runs with their provenance), read without any
plotting dependency. ``data/`` ships with the repository, not inside the wheel."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DATA_DIR", "amortised_decode", "load_bench", "measured_log_length"]

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


def amortised_decode(result):
    """Rows (batch, L, step_us, fold_us, amortised_us, ssu_us, speedup): replay's decode cost
    step + fold(L)/L against mamba-ssm's selective_state_update, from one run's rows."""
    rows = [r for r in result["rows"] if "us" in r]
    get = lambda **k: next((r for r in rows if all(r[a] == v for a, v in k.items())), None)  # noqa: E731
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        ssu = get(provider="ssu", batch=batch, T=1)
        for L in sorted({r["log_len"] for r in rows if r["kind"] == "decode"}):
            step = get(provider="replay_step", batch=batch, log_len=L, T=1)
            fold = get(provider="fold", batch=batch, log_len=L)
            if ssu and step and fold:
                amortised = step["us"] + fold["us"] / L
                out.append(
                    dict(
                        batch=batch,
                        L=L,
                        step_us=step["us"],
                        fold_us=fold["us"],
                        amortised_us=amortised,
                        ssu_us=ssu["us"],
                        speedup=ssu["us"] / amortised,
                    )
                )
    return out


def measured_log_length(batch, path="data/bench_kernels.json", default=16):
    """Replay's L with the lowest measured amortised decode cost, step + fold(L)/L, at the
    benchmarked batch nearest to ``batch`` (``amortised_decode`` over a committed GPU run);
    ``default`` when no such file can be read."""
    try:
        rows = amortised_decode(load_bench(path))
    except (OSError, KeyError, ValueError):
        return default
    if not rows:
        return default
    nearest = min({r["batch"] for r in rows}, key=lambda b: (abs(b - batch), b))
    return min((r for r in rows if r["batch"] == nearest), key=lambda r: r["amortised_us"])["L"]
