"""The snapshot steps' launches on a GPU (issue 37), one call:

1. Mamba-2 ``kernels.decode.state_update`` at the 8B layer shape, one token and a five-token
   verify (its drafts kept): BLOCK_P x num_warps at batches 1-256, and whether y's or the
   state's bits change between the launch tuned per batch and
   ``BATCH_INVARIANT_STATE_UPDATE`` (the reason the engine pins it).
2. Gated DeltaNet ``kernels.gdn.state_update`` at the Qwen3.5-9B shape: BLOCK_V x num_warps
   at batches 1-256, beside fla's recurrent step and a copy of the state's bytes
   (``bench.gdn_kernels.sweep_launch``).

    python3 tools/step_launch_sweep.py $OUT/step_launch_sweep.json [GDN_BUDGET_S]

Prints the fastest launch per batch and the pinned launch's ratio to it; writes every row.
"""

import json
import math
import sys

import torch

from replaylab.bench import gdn_kernels
from replaylab.bench.mamba2_kernels import SHAPE, kernel_inputs
from replaylab.bench.provenance import provenance
from replaylab.bench.timing import time_ms
from replaylab.kernels import decode
from replaylab.kernels import gdn as gdn_kernels_module

BATCHES = (1, 8, 32, 64, 128, 256)
TOKENS = (1, 5)  # a decode step, and a verify of four drafts (drafts kept for the rollback)
rows = []
for batch in BATCHES:
    for T in TOKENS:
        inp = kernel_inputs(batch, 1, T)
        args = [inp[k] for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")]
        start = inp["states"].clone()
        drafts = None if T == 1 else torch.empty(batch, T, *start.shape[1:], device=start.device)
        ys, states = {}, {}
        for block_p in (8, 16, 32, 64):
            for warps in (2, 4):
                state = start.clone()
                launch = dict(drafts=drafts, block_p=block_p, num_warps=warps)
                ys[block_p, warps] = decode.state_update(state, *args, (0.0, math.inf), **launch)
                states[block_p, warps] = state.clone()
                fn = lambda s=state, a=args, kw=launch: decode.state_update(  # noqa: E731
                    s, *a, (0.0, math.inf), **kw
                )
                us = time_ms(fn)[0] * 1e3
                rows.append(dict(kernel="mamba2 state_update", batch=batch, T=T,
                                 block_p=block_p, num_warps=warps, us=us))  # fmt: skip
        tuned = decode.tuned_state_update_launch(batch)
        pinned = decode.BATCH_INVARIANT_STATE_UPDATE
        differ = {f"{k[0]},{k[1]}": not torch.equal(y, ys[pinned]) for k, y in ys.items()}
        state_differs = {
            f"{k[0]},{k[1]}": not torch.equal(v, states[pinned]) for k, v in states.items()
        }
        rows.append(dict(kernel="mamba2 state_update y differs from the pinned launch's",
                         batch=batch, T=T, tuned=list(tuned), pinned=list(pinned),
                         differs=differ, state_differs=state_differs))  # fmt: skip
        mine = [r for r in rows if r.get("batch") == batch and r.get("T") == T and "us" in r]
        best = min(mine, key=lambda r: r["us"])
        at = {(r["block_p"], r["num_warps"]): r["us"] for r in mine}
        print(f"mamba2 b={batch:3d} T={T}: best {best['block_p']},{best['num_warps']} "
              f"{best['us']:.1f} us; pinned {at[pinned]:.1f} ({at[pinned] / best['us']:.3f}x), "
              f"tuned {at[tuned]:.1f}; y differs from pinned under "
              f"{[k for k, v in differ.items() if v]}, the state under "
              f"{[k for k, v in state_differs.items() if v]}")  # fmt: skip

prov = {**provenance(), "command": "python3 tools/step_launch_sweep.py " + " ".join(sys.argv[1:])}
json.dump(dict(mamba2=rows, shape_mamba2=SHAPE, **prov), open(sys.argv[1], "w"), indent=1)
budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
sweep = gdn_kernels.sweep_launch(batches=BATCHES, kinds=("state_update",), budget_s=budget)
for batch in BATCHES:
    mine = [r for r in sweep["rows"] if r["batch"] == batch and r["provider"] == "state_update"]
    if not mine:
        continue
    best = min(mine, key=lambda r: r["us"])
    now = gdn_kernels_module.STATE_UPDATE_LAUNCH
    cur = [r for r in mine if (r["block_v"], r["num_warps"]) == now]
    fla = [
        r["us"] for r in sweep["rows"] if r["batch"] == batch and r["provider"].startswith("fla")
    ]
    print(f"gdn b={batch:3d}: best {best['block_v']},{best['num_warps']} {best['us']:.1f} us "
          f"({best['of_copy']:.2f} of copy); current {now} {cur[0]['us'] if cur else float('nan'):.1f}; "
          f"fla {fla[0] if fla else float('nan'):.1f}")  # fmt: skip

json.dump(dict(mamba2=rows, gdn=sweep, shape_mamba2=SHAPE, shape_gdn=gdn_kernels.SHAPE, **prov),
          open(sys.argv[1], "w"), indent=1, default=str)  # fmt: skip
