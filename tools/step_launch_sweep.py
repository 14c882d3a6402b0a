"""The snapshot steps' launches on a GPU (issue 37), one call. For each family's
``state_update`` (the snapshot and recompute step) at its serving shape, one token (a decode
step) and five (a verify of four drafts, the drafts kept for the rollback), at batches 1-256:
every launch's time, and whether its outputs or its state differ in bits from the launch the
engine uses (the reason a launch must not be chosen per batch).

1. Mamba-2 ``kernels.decode.state_update`` (8B layer shape): BLOCK_P x num_warps, against
   ``BATCH_INVARIANT_STATE_UPDATE`` (the engine's pin) and the launch tuned per batch.
2. Mamba-1 ``kernels.mamba1.state_update`` (Jamba's D=8192, N=16): BLOCK_D x num_warps,
   against the fixed ``BLOCK_D`` / ``NUM_WARPS``.
3. Gated DeltaNet ``kernels.gdn.state_update`` (Qwen3.5-9B shape): BLOCK_V x num_warps
   against ``STATE_UPDATE_LAUNCH``; at one token through ``bench.gdn_kernels.sweep_launch``,
   beside fla's recurrent step and a copy of the state's bytes.

    python3 tools/step_launch_sweep.py $OUT/step_launch_sweep.json [GDN_BUDGET_S]

Mamba-2's verify is also timed as the engine calls it: with ``counts`` and pools of twice the
batch's rows. GDN_BUDGET_S (default 150) bounds each of Gated DeltaNet's two parts.

Prints the fastest launch per (family, batch, tokens) and the engine's launch's ratio to it;
writes every row (after each batch, so a cut run keeps what it timed).
"""

import json
import math
import sys
import time

import torch

from replaylab.bench import gdn_kernels
from replaylab.bench import mamba1_kernels as m1_bench
from replaylab.bench.mamba2_kernels import SHAPE, kernel_inputs
from replaylab.bench.provenance import provenance
from replaylab.bench.timing import time_ms
from replaylab.kernels import decode, mamba1
from replaylab.kernels import gdn as gdn_kernels_module

BATCHES = (1, 8, 32, 64, 128, 256)
TOKENS = (1, 5)
rows = []


def save(**more):
    prov = {
        **provenance(),
        "command": "python3 tools/step_launch_sweep.py " + " ".join(sys.argv[1:]),
    }
    shapes = dict(mamba2=SHAPE, mamba1=m1_bench.SHAPE, gdn=gdn_kernels.SHAPE)
    json.dump(dict(rows=rows, shapes=shapes, **more, **prov), open(sys.argv[1], "w"), indent=1,
              default=str)  # fmt: skip


def sweep(kernel, batch, T, start, call, launches, engine_launch, tuned=None, pool=None):
    """Time ``call(state, drafts, launch)`` (-> outputs) at every launch from the state
    ``start`` (its first ``batch`` rows are the batch's; ``pool`` rows of drafts, default
    batch); a row per launch, then one naming the launches whose outputs or state differ in
    bits from ``engine_launch``'s."""
    shape = (pool or batch, T, *start.shape[1:])
    drafts = None if T == 1 else torch.empty(shape, device=start.device)
    outs, states = {}, {}
    for launch in launches:
        state = start.clone()
        outs[launch] = call(state, drafts, launch)
        states[launch] = state.clone()
        ms, graph = time_ms(lambda s=state, lc=launch: call(s, drafts, lc))
        rows.append(dict(kernel=kernel, batch=batch, T=T, launch=list(launch), us=ms * 1e3,
                         cuda_graph=graph))  # fmt: skip
    differ = [f"{a},{b}" for (a, b), y in outs.items() if not torch.equal(y, outs[engine_launch])]
    state_differs = [
        f"{a},{b}" for (a, b), v in states.items() if not torch.equal(v, states[engine_launch])
    ]
    rows.append(dict(kernel=kernel + " bits", batch=batch, T=T, engine_launch=list(engine_launch),
                     tuned=list(tuned) if tuned else None, outputs_differ_under=differ,
                     state_differs_under=state_differs))  # fmt: skip
    mine = {tuple(r["launch"]): r["us"] for r in rows
            if r["kernel"] == kernel and r["batch"] == batch and r["T"] == T}  # fmt: skip
    best = min(mine, key=mine.get)
    extra = f", tuned {mine[tuned]:.1f}" if tuned else ""
    print(f"{kernel} b={batch:3d} T={T}: best {best} {mine[best]:.1f} us; engine's "
          f"{engine_launch} {mine[engine_launch]:.1f} ({mine[engine_launch] / mine[best]:.3f}x)"
          f"{extra}; outputs differ under {differ}, the state under {state_differs}")  # fmt: skip
    save()


for batch in BATCHES:
    for T in TOKENS:
        inp = kernel_inputs(batch, 1, T)
        args = [inp[k] for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")]
        sweep("mamba2 state_update", batch, T, inp["states"],
              lambda s, d, lc, a=args: decode.state_update(s, *a, (0.0, math.inf), drafts=d,
                                                           block_p=lc[0], num_warps=lc[1]),
              [(p, w) for p in (8, 16, 32, 64) for w in (2, 4)],
              decode.BATCH_INVARIANT_STATE_UPDATE, decode.tuned_state_update_launch(batch))  # fmt: skip
        if T == 1:
            continue
        # as the engine's verify: a ragged step's counts (here every token kept) and pools of
        # more rows than the batch (the engine's slots, and its drafts of max_verify rows)
        pool = 2 * batch
        states = torch.cat([inp["states"], inp["states"]])
        counts = torch.full((batch,), T, dtype=torch.int32, device="cuda")
        sweep("mamba2 state_update, counts, pool 2x", batch, T, states,
              lambda s, d, lc, a=args, c=counts: decode.state_update(
                  s, *a, (0.0, math.inf), drafts=d, counts=c, block_p=lc[0], num_warps=lc[1]),
              [(p, w) for p in (8, 16, 32, 64) for w in (2, 4)],
              decode.BATCH_INVARIANT_STATE_UPDATE, decode.tuned_state_update_launch(batch),
              pool=pool)  # fmt: skip
D, N = m1_bench.SHAPE["D"], m1_bench.SHAPE["N"]
for batch in BATCHES:
    for T in TOKENS:
        inp = m1_bench.kernel_inputs(batch, 1, D, N, torch.bfloat16, "cuda", T=T)
        args = [inp[k] for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")]
        sweep("mamba1 state_update", batch, T, inp["states"],
              lambda s, d, lc, a=args: mamba1.state_update(s, *a, drafts=d, block_d=lc[0],
                                                           num_warps=lc[1]),
              [(bd, w) for bd in (16, 32, 64, 128) for w in (2, 4)],
              (mamba1.BLOCK_D, mamba1.NUM_WARPS))  # fmt: skip
G = gdn_kernels.SHAPE
budget = float(sys.argv[2]) if len(sys.argv) > 2 else 150.0
t0 = time.perf_counter()
for batch in BATCHES:  # the verify (within the budget); the one-token step is sweep_launch's
    if time.perf_counter() - t0 > budget:
        print(f"gdn verify: budget of {budget} s spent before batch {batch}")
        break
    toks = gdn_kernels.token_inputs(batch, 5)
    start = torch.randn(batch, G["H"], G["K"], G["V"], device="cuda") * 0.1
    sweep("gdn state_update", batch, 5, start,
          lambda s, d, lc, t=toks: gdn_kernels_module.state_update(s, **t, drafts=d,
                                                                   block_v=lc[0], num_warps=lc[1]),
          [(bv, w) for bv in (16, 32, 64) for w in (1, 2, 4, 8)],
          tuple(gdn_kernels_module.STATE_UPDATE_LAUNCH))  # fmt: skip
one_token = gdn_kernels.sweep_launch(batches=BATCHES, kinds=("state_update",), budget_s=budget)
for batch in BATCHES:
    mine = [r for r in one_token["rows"] if r["batch"] == batch and r["provider"] == "state_update"]
    if not mine:
        continue
    best = min(mine, key=lambda r: r["us"])
    now = gdn_kernels_module.STATE_UPDATE_LAUNCH
    cur = [r for r in mine if (r["block_v"], r["num_warps"]) == now]
    fla = [
        r["us"]
        for r in one_token["rows"]
        if r["batch"] == batch and r["provider"].startswith("fla")
    ]
    print(f"gdn b={batch:3d} T=1: best {best['block_v']},{best['num_warps']} {best['us']:.1f} us "
          f"({best['of_copy']:.2f} of copy); current {now} {cur[0]['us'] if cur else float('nan'):.1f}; "
          f"fla {fla[0] if fla else float('nan'):.1f}")  # fmt: skip
save(gdn_one_token=one_token)
