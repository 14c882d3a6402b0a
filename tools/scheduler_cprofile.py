"""cProfile of a scheduler serving bench spec-steady's workload on the matched model (GPU): plain
decode, then k drafts a round (one PromptKeyedDrafter, acceptance 0.8), 2 x batch requests of
48-144 new tokens; per run the timings, each steady and admitting iteration's milliseconds
(inflated by the profiler) and the functions by own and cumulative time.

    python tools/scheduler_cprofile.py OUT.json BATCH K    (a GPU)
"""

import cProfile
import io
import json
import pstats
import sys

import torch

from replaylab.bench import spec_steady as S
from replaylab.bench.serve import random_prompts
from replaylab.serving import DecodeEngine

out = sys.argv[1]
batch = int(sys.argv[2])
k = int(sys.argv[3])
m = S.model_for("matched", "cuda")
n = 2 * batch
g = torch.Generator().manual_seed(7 + batch)
lengths = (96 * (0.5 + torch.rand(n, generator=g))).round().long().clamp(min=2)
prompts = random_prompts(n, m.cfg.vocab_size, seed=7 + batch)
eng = DecodeEngine(m, batch, 40 + int(lengths.max()) + k + 2, "replay", 16, max_verify=k + 1)
warm = [min(int(x), 16 + k + 2) for x in lengths[:batch]]
S.serve_all(eng, S.waiting_requests(prompts[:batch], warm), 0, None)
plain, h0 = S.serve_all(eng, S.waiting_requests(prompts, lengths.tolist()), 0, None)
refs = [torch.cat([p, torch.tensor(r.tokens)]) for p, r in zip(prompts, plain)]
dr = S.PromptKeyedDrafter(prompts, refs, 0.8, seed=7)
S.serve_all(eng, S.waiting_requests(prompts[:batch], warm), k, dr)
res = {}
for name, kk, d in (("plain", 0, None), (f"k={k}", k, dr)):
    pr = cProfile.Profile()
    pr.enable()
    got, h = S.serve_all(eng, S.waiting_requests(prompts, lengths.tolist()), kk, d)
    pr.disable()
    st = [x for x in h if x.running == batch and not x.admitted and not x.prefilled]
    adm = [x for x in h if x.admitted]
    res[name] = dict(
        timing=S.steady_timing(h, batch),
        steady_ms=[1e3 * (x.end - x.start) for x in st][:50],
        steady_step_ms=[1e3 * x.step_s for x in st][:50],
        steady_rollback_ms=[1e3 * x.rollback_s for x in st][:50],
        admit_ms=[1e3 * (x.end - x.start) for x in adm][:50],
        admitted=[len(x.admitted) for x in adm][:50],
    )
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
    res[name]["tottime"] = s.getvalue()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60)
    res[name]["cumtime"] = s.getvalue()
    t = res[name]["timing"]
    import statistics as sts

    print(
        name,
        "steady tok/s {:.0f}".format(t["steady_tokens_per_s"]),
        "steady it",
        t["steady_iterations"],
        "med steady ms {:.2f}".format(sts.median(res[name]["steady_ms"])),
        "med step_s ms {:.2f}".format(sts.median(res[name]["steady_step_ms"])),
        "med admit-iter ms {:.2f}".format(sts.median(res[name]["admit_ms"])),
        "share {:.2f}".format(t["steady_share"]),
        flush=True,
    )
from replaylab.bench.provenance import provenance  # noqa: E402

res = dict(provenance=dict(provenance(), command="python " + " ".join(sys.argv)), **res)
json.dump(res, open(out, "w"), indent=1, default=str)
