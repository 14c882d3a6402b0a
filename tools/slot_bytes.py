"""Bytes one engine slot holds per strategy, built for plain decode (``max_verify`` 1) or for
speculation with k drafts (``max_verify`` k + 1), on a preset's model in bf16 (the GPU runs'
dtype), from the engine's own pools (``serving.budget.slot_bytes``); building the engines
allocates their pools on the CPU, nothing runs. Prints a table; writes OUT.json.

    python tools/slot_bytes.py OUT.json [--preset 8b-layers] [--k 4] [--log-length 16]

What it is for: ``bench workload-stream`` ran plain decode on engines built for speculation
until 2026-12-07, so a snapshot slot held its k + 1 draft states unused; this says how many
bytes that was against an engine built for plain decode.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from replaylab.bench.provenance import provenance
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine
from replaylab.serving.budget import slot_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--preset", default="8b-layers")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--log-length", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = HybridLM(preset(args.preset), seed=0).eval().to(torch.bfloat16)  # as the benches
    rows = []
    for strategy in ("snapshot", "recompute", "replay"):
        for verify in (1, args.k + 1):
            engine = DecodeEngine(
                model, 1, 64, strategy, log_length=args.log_length, max_verify=verify
            )
            sizes = slot_bytes(engine)
            rows.append(dict(strategy=strategy, max_verify=verify, recurrent_bytes=sizes.recurrent,
                             kv_bytes_per_token=sizes.kv_token))  # fmt: skip
            print(f"{strategy:9s} max_verify {verify}: {sizes.recurrent / 1e6:6.2f} MB recurrent, "
                  f"{sizes.kv_token:,} bytes of KV a token")  # fmt: skip
            del engine
    prov = {**provenance(), "command": "python tools/slot_bytes.py " + " ".join(sys.argv[1:])}
    result = dict(prov, preset=args.preset, dtype="bfloat16", k=args.k,
                  log_length=args.log_length, rows=rows)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
