"""Does a slot's output depend on the batch it runs in? Slot 0's logits decoded alone and
beside 3 or 7 other sequences (8b-layers, bf16, fused, graphs, L = 8, 40 steps), per strategy,
with the engine's batch-invariant replay launch and with the launch tuned per batch. Prints
the first step at which they differ (or "equal"), one line per case; writes JSON to argv[1].

    python tools/batch_invariance.py $OUT/batch_invariance.json      (a GPU machine)
"""

import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_decode_kernels import decode_beside_others  # noqa: E402

from replaylab.model import HybridLM, preset  # noqa: E402

model = HybridLM(preset("8b-layers"), seed=0).to("cuda", torch.bfloat16).eval()
rows = []
for strategy in ("snapshot", "recompute", "replay"):
    for invariant in (True, False) if strategy == "replay" else (True,):
        alone = decode_beside_others(model, strategy, 1, batch_invariant=invariant)
        for batch in (4, 8):
            beside = decode_beside_others(model, strategy, batch, batch_invariant=invariant)
            differ = (alone != beside).any(1).nonzero()
            first = int(differ[0]) if len(differ) else None
            gap = float((alone - beside).abs().max())
            rows.append(dict(strategy=strategy, batch_invariant=invariant, batch=batch,
                             first_differing_step=first, max_abs_logit_difference=gap))  # fmt: skip
            print(f"{strategy:9s} batch_invariant={invariant!s:5s} alone vs batch {batch}: "
                  f"{'equal' if first is None else f'differ from step {first}'} (max {gap:.3g})")  # fmt: skip
json.dump(rows, open(sys.argv[1], "w"), indent=1)
