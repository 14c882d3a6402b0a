"""One GPU call: sweep the Gated DeltaNet kernels' launches (rows written as they come), run
the GDN benchmark with the fastest launch per kernel at the swept batch applied to the large
batches, then a small launch sweep of the Mamba-1 step. Writes under $OUT:
    gdn_launch_sweep.jsonl, bench_gdn_kernels.json, mamba1_launch_sweep.jsonl
    python3 tools/tune_families.py"""

import json
import os
import time

out = os.environ["OUT"]
t0 = time.time()

from replaylab.bench import gdn_kernels as gdn  # noqa: E402
from replaylab.kernels import gdn as kernels  # noqa: E402

with open(f"{out}/gdn_launch_sweep.jsonl", "w") as f:
    sweep = gdn.sweep_launch(
        batches=(128, 8), budget_s=170, on_row=lambda r: (f.write(json.dumps(r) + "\n"), f.flush())
    )
best = gdn.best_launches(sweep["rows"])
for (kernel, batch), r in sorted(best.items()):
    print(
        f"best {kernel} b={batch}: BLOCK_V {r['block_v']} warps {r['num_warps']} "
        f"{r.get('block_l') or r.get('precision')}: {r['us']:.1f} us, {r['of_copy']:.2f} of copy"
    )
for kernel in ("replay_step", "fold"):
    small, large = best.get((kernel, 8)), best.get((kernel, 128))
    table = []
    if small:
        table.append((8, small["block_v"], small["num_warps"]))
    if large:
        table.append((float("inf"), large["block_v"], large["num_warps"]))
    if table:
        kernels.LAUNCH[kernel] = table
print("LAUNCH", kernels.LAUNCH, f"({time.time() - t0:.0f} s)")
result = gdn.run_gdn_kernels(progress=False)
result["launch"] = {k: [list(map(str, row)) for row in v] for k, v in kernels.LAUNCH.items()}
result["provenance"]["command"] = "python3 tools/tune_families.py"
with open(f"{out}/bench_gdn_kernels.json", "w") as f:
    json.dump(result, f, indent=1, default=str)
print(gdn.summary(result), f"({time.time() - t0:.0f} s)")

from replaylab.bench import mamba1_kernels  # noqa: E402

with open(f"{out}/mamba1_launch_sweep.jsonl", "w") as f:
    for block_d in (8, 16, 64, 128):
        for warps in (1, 2, 4):
            if time.time() - t0 > 520:
                break
            r = mamba1_kernels.run(batches=(128,), Ls=(4,), block_d=block_d, num_warps=warps)
            f.write(json.dumps(r, default=str) + "\n")
            f.flush()
            print(f"mamba1 BLOCK_D {block_d} warps {warps}:", mamba1_kernels.summary(r)[-1])
