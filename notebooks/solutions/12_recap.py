# Reference answers for notebook 12 (format: see 03_branching_strategies.py). Numeric answers
# are computed here from the library or from data/, the way a learner would, not copied from
# replaylab.teaching.quiz: the grader computes its own and compares.

# %% quiz_answers
import math

from replaylab.bench.mamba2_kernels import amortised_decode
from replaylab.cache import HybridCache
from replaylab.teaching.experiments import compare_strategies
from replaylab.families import FAMILY_SHAPES, entry_bytes, state_bytes
from replaylab.scan import ssd_step

# state_bytes: H x P x N fp32 values of one layer, read from the model's config
cfg = model.cfg
layer_state = cfg.ssm_heads * cfg.ssm_head_dim * cfg.d_state * 4
live = HybridCache(model, 1, "replay")
with torch.no_grad():
    model(prompt[:, :4], live)
assert live.nbytes()["ssm_state"] == layer_state * len(cfg.ssm_layers)  # the cache agrees

# scan_step: a = exp(dt A); S' = a S + dt x B; y = S' C + D x
c = quiz.SCAN_CASE
y_by_hand = (math.exp(c["dt"] * c["A"]) * c["state"] + c["dt"] * c["x"] * c["B"]) * c["C"] + c[
    "D"
] * c["x"]
one = lambda v, *s: torch.full(s, float(v), dtype=torch.float64)  # noqa: E731
y_lib, _ = ssd_step(
    one(c["state"], 1, 1, 1, 1),
    one(c["x"], 1, 1, 1),
    one(c["dt"], 1, 1),
    one(c["A"], 1),
    one(c["B"], 1, 1, 1),
    one(c["C"], 1, 1, 1),
    one(c["D"], 1),
)
assert abs(float(y_lib.reshape(-1)[0]) - y_by_hand) < 1e-6 * abs(y_by_hand)

# rerun_tokens: the live run the question names
rerun = compare_strategies(
    model, prompt, n_new=24, acceptance=0.0, k=4, interval=8, strategies=("recompute",)
)[0]["recomputed_tokens"]

# best_log_length: amortised cost step + fold(L)/L at batch 128, from data/bench_kernels.json
at_128 = [r for r in amortised_decode(load_bench()) if r["batch"] == 128]
best_L = min(at_128, key=lambda r: r["step_us"] + r["fold_us"] / r["L"])["L"]

# tokens_per_round: 1 + sum of alpha^i, i = 1..k
tokens_per_round = 1 + sum(0.7**i for i in range(1, 6))

# interval_optimum: the optimum with as many states as interval 16 keeps on 64 steps
kept = cm.interval_tradeoff(64, 16)["states_kept"]
optimum = cm.revolve_cost(64, kept - 1) / 64

# eviction_choice: tokens back to the next older kept copy (0 if none); ties: least recently used
positions = sorted(item.position for item in quiz.EVICTION_ITEMS)


def rebuild_cost(item):
    older = [p for p in positions if p < item.position]
    return (item.position - (older[-1] if older else 0), item.last_used)


victim = min(quiz.EVICTION_ITEMS, key=rebuild_cost)
eviction_letter = "abcd"[quiz.EVICTION_ITEMS.index(victim)]

# roofline_fraction: bytes a step must move / copy bandwidth / measured seconds per step
eng = load_bench("data/bench_engine.json")
row = next(
    r
    for r in eng["rows"]
    if r.get("preset") == "8b-layers"
    and r.get("strategy") == "replay"
    and r.get("provider") is None
    and "workload" not in r
    and r["batch"] == 64
)
roofline = (
    row["bytes_per_step"] / (eng["copy_bandwidth_gbs"] * 1e9) / row["seconds_per_token"]["median"]
)

# mamba1_entries: one state over one log entry, for the Mamba-1 shape
jamba = next(s for s in FAMILY_SHAPES.values() if s.family == "mamba1")
mamba1_ratio = state_bytes(jamba) / sum(entry_bytes(jamba).values())

answers = {
    "kv_vs_ssm": "b",
    "state_bytes": layer_state,
    "scan_step": y_by_hand,
    "what_is_kept": "b",
    "rerun_tokens": rerun,
    "one_read": "b",
    "best_log_length": best_L,
    "tokens_per_round": tokens_per_round,
    "interval_optimum": optimum,
    "eviction_choice": eviction_letter,
    "roofline_fraction": roofline,
    "gpu_busy": "b",
    "mamba1_entries": mamba1_ratio,
    "delta_rule": "c",
}
