"""One GPU call on the Gated DeltaNet fold: sweep its launches (``bench.gdn.FOLD_LAUNCHES``:
BLOCK_V x warps x tl.dot precision) beside a copy of the same bytes under the same timer, apply
the fastest launch of the largest batch, then the whole GDN kernel bench with it (amortised
decode against fla). Writes under OUT:
    gdn_fold_sweep.jsonl       every launch, as it comes (a run cut short keeps its rows)
    bench_gdn_kernels.json     the bench with the chosen launch (its ``launch`` field says which)

    python3 tools/tune_gdn_fold.py OUT [--batches 128,32,8] [--budget 200] [--no-bench]

The tree of commit ca252fe also swept rows of the state per program, rows per chunk within a
program, and the checkpoint read before or after the log's products (data/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from replaylab.bench import gdn
from replaylab.kernels import gdn as kernels


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", default="128,32,8")
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--no-bench", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.time()
    batches = tuple(int(b) for b in a.batches.split(","))
    with open(f"{a.out}/gdn_fold_sweep.jsonl", "w") as f:

        def write(row):
            f.write(json.dumps(row) + "\n")
            f.flush()

        sweep = gdn.sweep_launch(batches, budget_s=a.budget, on_row=write, kinds=("fold",))
    rows = sweep["rows"]
    _, bv, w = kernels.LAUNCH["fold"][-1]
    print(f"{'batch':>5} {'copy':>6} {'default':>8} {'best':>6}  launch (us; share of copy)")
    for batch in batches:
        mine = [r for r in rows if r["batch"] == batch]
        copy = next((r for r in mine if r["provider"] == "copy"), None)
        folds = [r for r in mine if r["provider"] == "fold"]
        if not folds or copy is None:
            continue
        old = [
            r for r in folds
            if (r["block_v"], r["num_warps"], r["precision"]) == (bv, w, "ieee")
        ]  # fmt: skip
        best = min(folds, key=lambda r: r["us"])
        print(
            f"{batch:5d} {copy['of_copy']:6.2f} {old[0]['of_copy'] if old else float('nan'):8.2f} "
            f"{best['of_copy']:6.2f}  BLOCK_V {best['block_v']} warps {best['num_warps']} "
            f"{best['precision']} ({best['us']:.1f} us)"
        )
    best = gdn.best_launches(rows).get(("fold", max(batches)))
    if best is None or a.no_bench:
        return
    kernels.LAUNCH["fold"] = [(float("inf"), best["block_v"], best["num_warps"])]
    print("launch", kernels.LAUNCH["fold"], f"({time.time() - t0:.0f} s)")
    result = gdn.run_gdn_kernels(progress=False)
    result["launch"] = {k: [list(map(str, row)) for row in v] for k, v in kernels.LAUNCH.items()}
    result["provenance"]["command"] = "python3 tools/tune_gdn_fold.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    with open(f"{a.out}/bench_gdn_kernels.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(gdn.summary(result), f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
