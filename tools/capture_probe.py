"""A one-off GPU probe (2026-12-07): bench spec-steady at batch 32 (plain, k = 4, k = 3 and the
adaptive k) with the CUDA graphs each scheduler iteration captured counted by patching
``ModelRunner.graph_step``; it asked whether the adaptive arm lost to captures inside steady
iterations (it found 3-4 captures a speculative run, none in steady ones). Since 4fe79c0 the
scheduler records ``StepRecord.captures`` and the bench leaves such iterations out itself
(on such a tree the probe leaves the scheduler's count alone). On cfbdb4f the bench's
helpers it patches were private (``_timing``); they are public since (``steady_timing``).

    python tools/capture_probe.py OUT.json    (a GPU)
"""

import json
import sys
import time

import replaylab.bench.spec_steady as S
import replaylab.serving.runner as R

EV = []
orig = R.ModelRunner.graph_step


def gs(self, tokens, bucket, folds, save):
    key = (bucket, tokens.shape[1], folds, self.engine.policy.saves(save, tokens.shape[1]))
    new = key not in self.captured
    t0 = time.perf_counter()
    out = orig(self, tokens, bucket, folds, save)
    if new:
        import torch

        torch.cuda.synchronize()
        EV.append((t0, time.perf_counter(), key))
    return out


R.ModelRunner.graph_step = gs
import replaylab.serving.scheduler as SC

ost = SC.Scheduler.step


def step(self):
    n0 = len(EV)
    done = ost(self)
    if self.history:
        self.history[-1].captures = getattr(self.history[-1], "captures", 0) + len(EV) - n0
    return done


if "captures" not in SC.StepRecord.__dataclass_fields__:  # (later trees count them)
    SC.Scheduler.step = step
ot = S.steady_timing


def timing(history, batch):
    d = ot(history, batch)
    steady = [h for h in history if h.running == batch and not h.admitted and not h.prefilled]
    d["captures_in_run"] = sum(getattr(h, "captures", 0) for h in history)
    d["steady_with_capture"] = sum(getattr(h, "captures", 0) > 0 for h in steady)
    cap = [h for h in steady if getattr(h, "captures", 0) == 0]
    d["steady_no_capture_tok_s"] = sum(h.tokens for h in cap) / max(
        1e-9, sum(h.end - h.start for h in cap)
    )
    d["capture_s"] = sum(h.end - h.start for h in history if getattr(h, "captures", 0))
    print(
        "TIMING",
        json.dumps(
            {
                k: d[k]
                for k in (
                    "steady_tokens_per_s",
                    "steady_no_capture_tok_s",
                    "steady_iterations",
                    "captures_in_run",
                    "capture_s",
                    "steady_with_capture",
                    "steady_widths",
                )
            }
        ),
        flush=True,
    )
    return d


S.steady_timing = timing
from replaylab.bench.spec_steady import model_for, run_spec_steady

m = model_for("matched", "cuda")
r = run_spec_steady(m, batches=(32,), other_k=(3,), adaptive=True, progress=False)
from replaylab.bench.provenance import provenance  # noqa: E402

r = dict(provenance=dict(provenance(), command="python " + " ".join(sys.argv)), result=r)
json.dump(r, open(sys.argv[1], "w"), default=str, indent=1)
