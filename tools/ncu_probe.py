"""Hardware counters behind the kernel targets the H200 runs missed: one launch each of the
kernels below, between cudaProfilerStart and cudaProfilerStop, for Nsight Compute to read.

    ncu --clock-control none --profile-from-start off --csv --page details \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats \
        --log-file OUT/ncu_kernels.csv python3 tools/ncu_probe.py OUT/ncu_labels.json

Launches, in this order (``ncu_labels.json`` names them; ncu's IDs count from 0 in the same
order): a Triton copy of the GDN state (the bandwidth reference), the GDN fold of 16 entries
at batch 128 with the default launch, the GDN
replay step at batch 32 and 128 (8 entries in the log), fla's fused recurrent step at batch
128, the Mamba-1 replay step at batch 32 (8 entries) and mamba-ssm's selective_state_update
(Mamba-1 form) at batch 32. Everything is built and compiled before the profiled region.

    python3 tools/ncu_probe.py --summary OUT/ncu_kernels.csv OUT/ncu_labels.json [OUT.json]

reads ncu's CSV back: per launch its duration, DRAM and SM throughput (% of peak), achieved
occupancy, registers per thread and cycles per issued instruction; a table, and JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl

from replaylab.bench import gdn_kernels as gdn_bench
from replaylab.bench import mamba1_kernels as m1_bench
from replaylab.bench.peers import load_kernel_peers
from replaylab.bench.provenance import provenance
from replaylab.kernels import gdn, mamba1


@triton.jit
def _probe_copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def _copy(src, dst):
    n = src.numel()
    _probe_copy_kernel[(triton.cdiv(n, 4096),)](src, dst, n, BLOCK=4096, num_warps=8)


METRICS = {
    "Duration": "duration_ns",
    "DRAM Throughput": "dram_pct",
    "Memory Throughput": "memory_pct",
    "Compute (SM) Throughput": "sm_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Registers Per Thread": "registers",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
    "Issue Slots Busy": "issue_busy_pct",
    "L2 Hit Rate": "l2_hit_pct",
    "Grid Size": "grid",
    "Block Size": "block",
}


def summarise(csv_path, labels_path):
    """{label: {metric: value}} from ncu's ``--csv --page details`` output. ncu numbers the
    profiled launches from 0 in launch order, which is the order of ``labels``; a count that
    differs (a launch more or fewer matched the filter) is an error, not a shifted table."""
    import csv

    with open(csv_path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("==")))
    meta = json.load(open(labels_path))
    names = meta["labels"]
    ids = sorted({int(row["ID"]) for row in rows})
    if ids != list(range(len(names))):
        raise ValueError(f"{csv_path}: launches {ids}, but {labels_path} names {len(names)}")
    out = {"provenance": meta.get("provenance", {})}
    for row in rows:
        entry = out.setdefault(names[int(row["ID"])], dict(kernel=row["Kernel Name"][:60]))
        key = METRICS.get(row["Metric Name"])
        if not key or key in entry or (key.endswith("_pct") and row["Metric Unit"] != "%"):
            continue  # "Memory Throughput" comes as a % and as bytes/s: take the %
        value = row["Metric Value"].replace(",", "")
        try:
            entry[key] = float(value)
        except ValueError:
            entry[key] = value
    return out


def print_summary(table):
    cols = ["duration_ns", "dram_pct", "sm_pct", "achieved_occupancy_pct", "registers",
            "cycles_per_issue"]  # fmt: skip
    print(f"{'launch':42s} " + " ".join(f"{c[:10]:>10s}" for c in cols))
    for label, entry in table.items():
        if label == "provenance":
            continue
        cells = [entry.get(c, float("nan")) for c in cols]
        print(f"{label:42s} " + " ".join(f"{c:10.1f}" if isinstance(c, float) else f"{c!s:>10s}"
                                         for c in cells))  # fmt: skip


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--summary":
        table = summarise(argv[1], argv[2])
        print_summary(table)
        if len(argv) > 3:
            with open(argv[3], "w") as f:
                json.dump(table, f, indent=1)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("labels")
    a = ap.parse_args(argv)
    H, K, V, L = gdn_bench.SHAPE["H"], gdn_bench.SHAPE["K"], gdn_bench.SHAPE["V"], 16
    launches = []  # (label, fn)

    def gdn_case(batch):
        states = torch.randn(batch, H, K, V, device="cuda") * 0.05
        log, _, slots, _ = gdn_bench.filled_log(batch, L + 1, L, states.clone())
        return states, log, slots, gdn_bench.token_inputs(batch, 1)

    s128, log128, slots128, one128 = gdn_case(128)
    dst = torch.empty_like(s128)
    launches.append(("copy_gdn_state_b128", lambda: _copy(s128, dst)))
    full = torch.full((128,), L, dtype=torch.int32, device="cuda")
    work = s128.clone()
    launches.append(
        ("gdn_fold_default_b128", lambda: gdn.fold(work, slots128, work, slots128, **log128,
                                                    fold_len=full, check=False))
    )  # fmt: skip
    for batch, (states, log, slots, one) in (
        (32, gdn_case(32)),
        (128, (s128, log128, slots128, one128)),
    ):
        at = torch.full((batch,), L // 2, dtype=torch.int32, device="cuda")
        o = torch.empty_like(one["v"])
        launches.append(
            (f"gdn_replay_step_n8_b{batch}",
             lambda states=states, log=log, slots=slots, one=one, at=at, o=o: gdn.replay_step(
                 states, slots, **log, log_len=at, **one, out=o, advance=False, check=False))
        )  # fmt: skip
    fla, fla_error = gdn_bench.fla_kernels()
    if fla is not None:
        launches.append(
            ("fla_fused_recurrent_step_b128",
             lambda: fla[0](**one128, scale=1.0, initial_state=s128, output_final_state=True))
        )  # fmt: skip
    inp = m1_bench.kernel_inputs(32, 16, m1_bench.SHAPE["D"], m1_bench.SHAPE["N"], torch.bfloat16,
                           "cuda")  # fmt: skip
    step_inp = {**inp, "log_len": torch.full_like(inp["log_len"], L // 2)}
    launches.append(
        ("mamba1_replay_step_n8_b32", lambda: mamba1.replay_step(**step_inp, check=False))
    )
    peers, errors = load_kernel_peers()
    if "ssu" in peers:
        state = inp["states"].clone()
        launches.append(
            ("mamba_ssm_ssu_mamba1_b32", lambda: m1_bench.ssu_call(peers["ssu"], inp, state,
                                                                    "cuda"))
        )  # fmt: skip
    for _, fn in launches:  # compile and warm up outside the profiled region
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, fn in launches:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    with open(a.labels, "w") as f:
        json.dump(
            dict(
                labels=[name for name, _ in launches],
                fla_error=fla_error,
                peer_errors=errors,
                provenance=dict(
                    provenance(),
                    command="ncu ... python3 tools/ncu_probe.py "
                    + " ".join(sys.argv[1:])
                    + " (the ncu command: tools/gpu_session.sh profile)",
                ),
            ),
            f,
            indent=1,
        )
    print("\n".join(f"{i}: {name}" for i, (name, _) in enumerate(launches)))


if __name__ == "__main__":
    main()
