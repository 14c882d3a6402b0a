"""The scheduler's interleaved grants on the chunk grid against the previous grants, side by
side in one process (the timing of a GPU-path default change, 5aa0f8a).

    python3 tools/grant_timing.py OUT.json [--preset gpu] [--workloads agents,multi_turn]
        [--strategies replay,snapshot] [--rates 8,32] [--rounds 2]

Since 5aa0f8a a ``Scheduler`` with ``prefill_per_step`` >= the engine's ``prefill_chunk`` grants
a prefilling request only up to the last multiple of ``prefill_chunk`` within reach
(``serving.admission.grid_grant``; none in reach: it waits a step). Before, it granted all
that was left in the step's budget (``previous_grant``). Each arm runs
``bench.workload_stream.run_workload_stream`` (decode only, no rate search, the prefix cache
resuming at the match, which both grants allow) on the same requests and arrivals; the arms
alternate, ``rounds`` times each, the order reversed every round. Rows: per arm, round,
workload, strategy and rate, the stream's TTFT / TPOT p50 and p99, output tokens/s and its
seconds; ``ratios``: per (workload, strategy, rate) the medians over rounds, grid / previous.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replaylab.bench.provenance import write_tool_result  # noqa: E402
from replaylab.serving import scheduler  # noqa: E402

KEYS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "tokens_per_s", "seconds")


def previous_grant(admission, left, per_step, chunk) -> int:
    """The grant before 5aa0f8a: all of ``left`` the admission can take."""
    return min(left, admission.remaining)


def run_arm(arm, args):
    """One ``run_workload_stream`` under ``arm``'s grant ("grid" or "previous"): its rows."""
    from replaylab.bench.workload_stream import run_workload_stream

    real = scheduler.grid_grant
    scheduler.grid_grant = real if arm == "grid" else previous_grant
    try:
        result = run_workload_stream(
            preset=args.preset,
            workloads=args.workloads.split(","),
            strategies=args.strategies.split(","),
            modes=("decode",),
            log=None,
            rates=tuple(float(r) for r in args.rates.split(",")),
            rate_modes=(),
            resume="match",
        )
    finally:
        scheduler.grid_grant = real
    rows = []
    for name, w in result["workloads"].items():
        for r in w["rows"]:
            rows.append(
                dict(
                    workload=name,
                    strategy=r["strategy"],
                    rate=r["rate"],
                    ttft_p50=r["ttft_s"]["p50"],
                    ttft_p99=r["ttft_s"]["p99"],
                    tpot_p50=r["tpot_s"]["p50"],
                    tpot_p99=r["tpot_s"]["p99"],
                    tokens_per_s=r["tokens_per_s"],
                    seconds=r["seconds"],
                    tokens_equal_alone=r.get("tokens_equal_alone"),
                )
            )
    return rows


def ratios(rows) -> list[dict]:
    """Per (workload, strategy, rate): each key's median over rounds, grid / previous."""
    out = []
    keys = sorted({(r["workload"], r["strategy"], r["rate"]) for r in rows})
    for w, s, rate in keys:
        pick = {
            arm: [r for r in rows if (r["workload"], r["strategy"], r["rate"], r["arm"]) ==
                  (w, s, rate, arm)]
            for arm in ("grid", "previous")
        }  # fmt: skip
        if not pick["grid"] or not pick["previous"]:
            continue
        row = dict(workload=w, strategy=s, rate=rate)
        for key in KEYS:
            g = statistics.median(r[key] for r in pick["grid"])
            p = statistics.median(r[key] for r in pick["previous"])
            row[key] = dict(grid=g, previous=p, ratio=g / p if p else None)
        out.append(row)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--preset", default="gpu", choices=("cpu", "gpu"))
    p.add_argument("--workloads", default="agents,multi_turn")
    p.add_argument("--strategies", default="replay,snapshot")
    p.add_argument("--rates", default="8,32")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds: expected at least 1, got {args.rounds}")
    rows = []
    for i in range(args.rounds):
        for arm in ("grid", "previous")[:: 1 if i % 2 == 0 else -1]:
            for r in run_arm(arm, args):
                rows.append(dict(arm=arm, round=i, **r))
            print(f"round {i} {arm}: {len(rows)} rows", flush=True)
            # after every run, so a run cut short keeps what it measured
            summary = ratios(rows)
            write_tool_result(args.out, "grant_timing.py", dict(runs=rows, ratios=summary))
    print(f"{'workload':14s} {'strategy':9s} {'rate':>5s} " + " ".join(f"{k:>14s}" for k in KEYS))
    for r in summary:
        cells = " ".join(f"{r[k]['ratio']:14.3f}" if r[k]["ratio"] else f"{'-':>14s}" for k in KEYS)
        print(f"{r['workload']:14s} {r['strategy']:9s} {r['rate']:5.1f} {cells}")


if __name__ == "__main__":
    main()
