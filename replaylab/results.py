"""The committed measurements in ``data/`` (GPU runs with their provenance), read without any
plotting dependency. ``data/`` ships with the repository, not inside the wheel."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = [
    "DATA_DIR",
    "amortised_decode",
    "load_bench",
    "replay_wins",
    "replay_wins_summary",
]

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


def replay_wins(engine=None, ragged=None, acceptance=0.8):
    """Where replay wins on the GPU, per workload and batch, from the two engine runs of the
    ``8b-layers`` preset: ``data/bench_engine.json`` (fused engine, every prompt the same length;
    its other fused strategy is snapshot) and ``data/bench_serve_ragged.json`` (every slot at its
    own position, row-invariant matmul; snapshot and recompute). Rows (workload, run, batch,
    replay, rival, rival_tok_s, replay_tok_s, ratio): replay's tokens/s over the fastest other
    strategy's in the same run. Speculative rows are at per-draft ``acceptance``."""
    engine = load_bench("data/bench_engine.json") if engine is None else engine
    ragged = load_bench("data/bench_serve_ragged.json") if ragged is None else ragged
    out = []

    def add(workload, run, batch, rates):
        rivals = {s: v for s, v in rates.items() if s != "replay" and v}
        if "replay" not in rates or not rivals:
            return
        rival = max(rivals, key=rivals.get)
        out.append(
            dict(
                workload=workload,
                run=run,
                batch=batch,
                rival=rival,
                rival_tok_s=rivals[rival],
                replay_tok_s=rates["replay"],
                ratio=rates["replay"] / rivals[rival],
            )
        )

    rows = [r for r in engine["rows"] if r.get("preset") == "8b-layers"]
    plain = [
        r
        for r in rows
        if "workload" not in r
        and r.get("strategy")
        and r.get("fused", True)
        and "seconds_per_token" in r
    ]
    for b in sorted({r["batch"] for r in plain}):
        add(
            "decode",
            "bench_engine",
            b,
            {r["strategy"]: b / r["seconds_per_token"]["median"] for r in plain if r["batch"] == b},
        )
    spec = f"speculative k=4 a={acceptance}"
    one = [r for r in rows if r.get("workload") == spec]
    if one:
        add(
            "speculative, batch 1",
            "bench_engine",
            1,
            {r["strategy"]: 1 / r["seconds_per_token"]["median"] for r in one},
        )
    verify = [r for r in rows if r.get("workload") == f"batched verify rounds k=4 a={acceptance}"]
    for b in sorted({r["batch"] for r in verify}):
        add(
            "batched speculation",
            "bench_engine",
            b,
            {r["strategy"]: r["tokens_per_s"] for r in verify if r["batch"] == b},
        )
    for run in ragged.get("ragged", []):
        if run.get("preset") != "8b-layers" or run.get("matmul") != "row_invariant":
            continue
        for b in sorted({r["batch"] for r in run["rows"]}):
            here = [r for r in run["rows"] if r["batch"] == b]
            add(
                "decode",
                "bench_serve_ragged",
                b,
                {r["strategy"]: r["decode_tokens_per_s"] for r in here},
            )
            if any("speculative_tokens_per_s" in r for r in here):
                add(
                    "batched speculation",
                    "bench_serve_ragged",
                    b,
                    {r["strategy"]: r.get("speculative_tokens_per_s") for r in here},
                )
    return out


def replay_wins_summary(rows=None, margin=0.03):
    """One line per workload and run: replay's ratio at every measured batch, and the batch from
    which it wins (more than ``margin`` ahead of the fastest other strategy) at every larger
    measured batch too; within ``margin`` either way counts as a tie."""
    rows = replay_wins() if rows is None else rows
    lines = []
    for key in dict.fromkeys((r["workload"], r["run"]) for r in rows):
        here = sorted(
            (r for r in rows if (r["workload"], r["run"]) == key), key=lambda r: r["batch"]
        )
        from_batch = None
        for r in reversed(here):
            if r["ratio"] <= 1 + margin:
                break
            from_batch = r["batch"]

        def verdict(x):
            return "wins" if x > 1 + margin else "trails" if x < 1 - margin else "ties"

        cells = ", ".join(
            f"batch {r['batch']} {r['ratio']:.2f}x ({verdict(r['ratio'])}, vs {r['rival']})"
            for r in here
        )
        wins = f"wins from batch {from_batch}" if from_batch else "does not win"
        lines.append(f"{key[0]} ({key[1]}): {wins}; {cells}")
    return lines
