"""Replay's cold prefill beside snapshot's, side by side in one run: the serving engine's
admission of one prompt on ``8b-layers`` (Nemotron-H 8B layer shapes, bf16 on a GPU, the TTFT
bench's engine settings: reference path, no graphs, L = 16, prefill chunks of 256), three arms
alternating within one process, median of 5 admissions each after a warm-up:

- snapshot;
- replay, each prefill chunk folding all the grid points it reaches in one launch a layer
  (``RecurrentPool.fold_chains``; the default from 2026-12-04);
- replay folding L entries at a time (the previous default: a launch and its ring writes per
  fold).

Both replay arms must leave the same checkpoint bits, which the probe checks.

    python tools/replay_prefill_probe.py OUT.json [--lengths 2048,2148]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from replaylab.bench.provenance import provenance
from replaylab.bench.stream import _model
from replaylab.bench.timing import sync
from replaylab.serving import DecodeEngine

ARMS = ("snapshot", "replay, chained folds (default)", "replay, fold by fold (previous)")


def _engine(model, arm, T):
    strategy = arm.split(",")[0]
    engine = DecodeEngine(model, 1, T + 1, strategy, log_length=16, max_verify=1,
                          prefill_chunk=256, fused=False, graphs=False)  # fmt: skip
    if "fold by fold" in arm:
        for pool in engine.ssm.values():
            pool.fold_chains = lambda L: False
    return engine


def rows_for(model, T, repeats=5):
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(T)
    prompt = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).to(device)
    engines = {arm: _engine(model, arm, T) for arm in ARMS}
    times, picks = {arm: [] for arm in ARMS}, {}

    def admit(arm):
        engine = engines[arm]
        for s in list(engine.slots):
            engine.retire(s)
        sync(device)
        t0 = time.perf_counter()
        logits = engine.admit(prompt)[1]
        picks[arm] = int(logits.argmax())
        sync(device)
        return time.perf_counter() - t0

    with torch.no_grad():
        for arm in ARMS:
            admit(arm)  # warm-up: Triton compiles, the allocator settles
        for _ in range(repeats):
            for arm in ARMS:
                times[arm].append(admit(arm))
    a, b = (engines[arm] for arm in ARMS[1:])
    same_bits = all(torch.equal(p.state, b.ssm[l].state) for l, p in a.ssm.items())
    return [
        dict(
            tokens=T,
            arm=arm,
            seconds=statistics.median(times[arm]),
            values=times[arm],
            next_token=picks[arm],
            replay_arms_same_checkpoint_bits=same_bits,
        )  # fmt: skip
        for arm in ARMS
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--lengths", default="2048,2148")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = _model("8b-layers", device)
    rows = []
    for T in (int(t) for t in args.lengths.split(",") if t):
        rows += rows_for(model, T)
    for row in rows:
        snap = next(r for r in rows if r["tokens"] == row["tokens"] and r["arm"] == ARMS[0])
        row["over_snapshot"] = row["seconds"] / snap["seconds"]
        print(f"T={row['tokens']:5d} {row['arm']:34s} {row['seconds'] * 1e3:9.2f} ms "
              f"{row['over_snapshot']:5.2f}x snapshot  token {row['next_token']}  "
              f"same bits {row['replay_arms_same_checkpoint_bits']}")  # fmt: skip
    result = dict(rows=rows, **provenance())
    result["command"] = "python tools/replay_prefill_probe.py " + " ".join(sys.argv[1:])
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
