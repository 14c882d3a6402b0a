# %% [markdown]
# # 09 · Measuring a hybrid model
#
# ## Overview
# What to measure before and after changing how a hybrid model stores its state: **time per
# output token**, decode only (prefill noise hides decode regressions); **peak memory per
# sequence** (reset the peak, decode, subtract the weights, divide by the sequences); when
# speculating, the **acceptance rate** and **what a rejection costs**; on a GPU, how many
# sequences fit (the appendix, notebook 15, reads that search). Each is measured at least three times after a discarded warm-up. Live on the tiny
# model first; then the H200 runs in `data/`, read in two tables: replay's kernel cost, amortised,
# and the whole model in the decode engine against the one copy bandwidth measured in that run;
# and from those, where replay wins, per workload and batch.
#
# **You will** measure decode-only time per token, peak memory per sequence and what a rejected
# draft costs on the tiny model; read replay's amortised kernel cost and the engine's tokens/s and
# roofline fractions on an H200; say where replay wins and when a model's attention layers shrink
# its gain; answer two checked questions.
#
# **Time:** about 30 minutes.
#
# ## Prerequisites
# Notebooks 03-07; 06 section 5 introduces the kernel measurements that section 4 reads.
#
# **After the sequence, optional:** `15_appendix_measurements.ipynb` reads the rest of the H200
# runs in depth: the teaching path's decode runs, what fusing the engine bought, where its tokens
# part from the teaching model's, speculation on the engine and how many sequences fit, a second
# model shape, the cost model's floor beside the measurements, the other caveats in numbers and a
# roofline for Nemotron-H 8B. Neither short path includes it.

# %% [markdown]
# ## Setup

# %%
import torch

from replaylab import costmodel as cm
from replaylab.teaching import exercises
from replaylab.bench.decode import decode_once
from replaylab.decoding import SyntheticDrafter, greedy, speculative
from replaylab.model import HybridLM, preset
from replaylab.teaching.plotting import load_bench, use_notebook_renderer
from replaylab.shapes import PUBLISHED_SHAPES

torch.manual_seed(0)
use_notebook_renderer()
model = HybridLM(preset("tiny"), seed=0).eval()
weights = sum(p.numel() * p.element_size() for p in model.parameters())

# %% [markdown]
# ## 1. Time per output token, decode only
#
# Timing starts after the prefill; three runs after a discarded warm-up; the median. On a CPU
# the numbers depend on the machine, so they are not checked:

# %%
# NBVAL_IGNORE_OUTPUT
prompt = torch.randint(0, 128, (4, 32))
with torch.no_grad():
    for strategy in ("snapshot", "recompute", "replay"):
        decode_once(model, prompt, 16, strategy, weights)  # warm-up
        runs = sorted(decode_once(model, prompt, 16, strategy, weights)[0] for _ in range(3))
        print(
            f"{strategy:9s} {runs[1] * 1e3:6.2f} ms per token (batch 4; min {runs[0] * 1e3:.2f}, max {runs[2] * 1e3:.2f})"
        )

# %% [markdown]
# **Why is replay the slowest here?** This is the teaching path on a CPU, without the replay
# kernel: each decode step folds the whole log into a copy of the checkpoint and then scans the
# new token (`ReplayStore.advance`), so its work grows with the log, up to L scan steps per
# token where snapshot does one (notebook 05, section "Why?", splits the step into its fold
# and the rest). The decode engine on a GPU (section 4) does the opposite: one read of the
# checkpoint plus the log per token and no state write, which is what makes replay faster
# there once the state traffic matters: in plain decode it trails or ties at batch 1 and 8 and
# wins from batch 32 (section 4 has where it wins, per workload and batch).

# %% [markdown]
# ## 2. Memory per sequence
#
# On a GPU: `torch.cuda.reset_peak_memory_stats()`, decode, `max_memory_allocated() - weights`,
# divided by the batch. On a CPU we read what the cache held at its peak, which is exact:

# %%
# NBVAL_CHECK_OUTPUT
with torch.no_grad():
    for strategy in ("snapshot", "recompute", "replay"):
        _, per_seq = decode_once(model, prompt, 16, strategy, weights)
        print(f"{strategy:9s} {per_seq / 1024:6.1f} KiB per sequence at its peak")

# %% [markdown]
# **Why?** Replay holds *more* than snapshot here, although it holds a fraction of the
# per-draft snapshots in section 3 and on the H200. This is plain decoding: snapshot keeps only
# the live state (nothing to copy), recompute keeps a checkpoint every 16 tokens, replay keeps
# its log until L = 16 entries. On this tiny model a log entry is large next to the state (its
# state is small), so the log costs about as much as the state itself. The cost model's counts:

# %%
# NBVAL_CHECK_OUTPUT
tiny = cm.model_costs(cm.shape_from_config(model.cfg), cm.Workload(act_bytes=4, state_bytes=4), 0)
nemo = cm.model_costs(PUBLISHED_SHAPES["Nemotron-H 8B"], cm.Workload(), 0)
print(
    f"tiny model: state {tiny.S / 1024:.0f} KiB, one token's log entries {tiny.log_token / 1024:.1f} KiB "
    f"(state = {tiny.S / tiny.log_token:.0f} entries); 15 entries held = {15 * tiny.log_token / 1024:.0f} KiB"
)
print(
    f"Nemotron-H 8B: state {nemo.S / 2**20:.0f} MiB, one token's log entries {nemo.log_token / 1024:.0f} KiB "
    f"(state = {nemo.S / nemo.log_token:.0f} entries)"
)
print(
    f"replay holds more than recompute's two checkpoints above L = "
    f"{cm.held_crossover_interval(tiny):.0f} (tiny) / {cm.held_crossover_interval(nemo):.0f} (Nemotron-H 8B)"
)

# %% [markdown]
# ## 3. Speculative decoding and what a rejection costs

# %%
# NBVAL_CHECK_OUTPUT
one = prompt[:1]
reference = torch.cat([one, greedy(model, one, 48).tokens], 1)
runs = {
    s: speculative(model, one, 48, SyntheticDrafter(reference, 0.8, seed=0), k=4, cache=s)
    for s in ("snapshot", "recompute", "replay")
}
for s, r in runs.items():
    print(
        f"{s:9s} acceptance {r.acceptance_rate:.2f}, restores {r.restores}, tokens re-run "
        f"{r.recomputed_tokens}, peak {r.peak_bytes / 1024:.0f} KiB, "
        f"same tokens as greedy: {torch.equal(r.tokens, reference[:, 32:])}"
    )

# %%
# NBVAL_IGNORE_OUTPUT
for s, r in runs.items():
    print(
        f"{s:9s} rollback cost {r.restore_seconds / max(r.restores, 1) * 1e3:.3f} ms per rejection"
    )

# %% [markdown]
# ## 4. On an H200
#
# GPU runs from `data/`, each printed with its device, date and command: the replay kernels
# alone, on one layer of Nemotron-H 8B's shape (`data/bench_kernels.json`, the run notebook 06
# section 5 reads), and the whole model in the decode engine (`data/bench_engine.json`; the
# end of the section adds the serving engine's ragged run). Terms:
# **`ssu`** is mamba-ssm's `selective_state_update`, the usual decode kernel, which reads and
# writes the state every token; a **CUDA graph** records a step's kernel launches once and replays
# them with one call, so the host's cost per launch leaves the step; replay's decode cost is
# **amortised**, step + fold(L)/L, because every L-th step must also fold its full log into a new
# checkpoint. Quoting the step alone would leave the fold out.

# %% [markdown]
# ### The kernel, amortised
#
# Median times over CUDA-graph replays, one new token per sequence: replay's decode at each
# measured log length L against `ssu`, and `ssu`'s time over replay's amortised time (above 1:
# replay is faster). The L = 16 columns show the two parts, step and fold, that the amortised time
# adds up:

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.results import amortised_decode

kb = load_bench()  # data/bench_kernels.json
print(kb["device"], "|", kb["date"], "|", kb["command"])
table = {(r["batch"], r["L"]): r for r in amortised_decode(kb)}
kernel_batches = sorted({b for b, _ in table})
lengths = sorted({L for _, L in table})
print(
    "batch |  ssu µs | L = 16: step µs + fold µs / 16 = decode µs | ssu / replay decode at L = "
    + ", ".join(map(str, lengths))
)
for b in kernel_batches:
    r = table[b, 16]
    ratios = "  ".join(f"{table[b, L]['speedup']:5.2f}x" for L in lengths)
    print(
        f"{b:5d} | {r['ssu_us']:7.1f} | {r['step_us']:15.1f} + {r['fold_us']:8.1f} / 16 = "
        f"{r['amortised_us']:9.1f} | {ratios}"
    )
best_L = {b: max(lengths, key=lambda L: table[b, L]["speedup"]) for b in kernel_batches}
kernel_wins = [b for b in kernel_batches if table[b, best_L[b]]["speedup"] > 1]
print(f"replay's amortised decode beats ssu at batch {kernel_wins}; the best L per batch: {best_L}")

# %% [markdown]
# At batch 1 the GPU is mostly idle and fixed costs set the time: `ssu` is faster. From batch 8 the
# state write that replay skips is the larger cost, and with its share of the fold replay's decode
# beats `ssu`; a longer log (L = 64) makes every step walk more entries and eats the gain. These
# are times: 06 section 5b reads the same run as fractions of its own copy bandwidth.

# %% [markdown]
# ### The whole model: the decode engine
#
# A decode step is more than the state kernel: it reads every weight once, attends over the KV
# cache and runs every layer. The library's teaching path (Python over growing caches) leaves an
# H200 mostly idle, waiting for the host, so there the state storage barely shows (its runs are in
# the appendix, notebook 15). `replaylab.serving.DecodeEngine` runs the same model over
# preallocated state, conv, log and KV pools, each decode step one CUDA-graph replay, and on a GPU
# it runs *fused*: one Triton kernel for each group of element-wise operations, a fused state
# update for snapshot and, for replay, a step that also appends to its own log
# (`replaylab.kernels.decode`). `replaylab bench engine --presets 8b-layers` (Nemotron-H 8B's
# layer shapes, seven blocks, random bf16 weights) wrote `data/bench_engine.json`; in the same run:
# mamba-ssm's own CUDA-graphed decode loop on the same layer shapes (its model carries one more
# MLP block) and transformers `generate`.
#
# **One bandwidth.** The run timed a 2 GiB device copy two ways (replayed from a CUDA graph, and
# launched between CUDA events) and keeps the larger; every fraction below divides by it. A row's
# **roofline fraction** is the time its bytes would take at that bandwidth (weights, state
# traffic, KV, log: what a step must move) over the measured step time; **busy** is the share of
# the wall time the GPU spent in kernels while torch.profiler watched, where the run profiled.
# While no kernel moves bytes faster than the copy, a step cannot reach a larger share of its
# roofline than its share of time on the GPU; where busy reads lower, the lines below the table
# say why both hold:

# %%
# NBVAL_CHECK_OUTPUT
eng = load_bench("data/bench_engine.json")
print(eng["device"], "|", eng["date"], "|", eng["command"])
print(
    f"copy bandwidth {eng['copy_bandwidth_gbs']:.0f} GB/s (the larger of: "
    + ", ".join(f"{m} {v:.0f}" for m, v in eng["copy_bandwidth_methods_gbs"].items())
    + ")"
)
erows = [r for r in eng["rows"] if r.get("preset") == "8b-layers" and "seconds_per_token" in r]


def tok_s(r):
    return r["batch"] / r["seconds_per_token"]["median"]


def pick(batch, strategy=None, provider=None):
    # one plain decode row (no workload): the fused engine under a strategy, or a provider
    return next(
        (
            r
            for r in erows
            if r["batch"] == batch
            and "workload" not in r
            and r.get("strategy") == strategy
            and r.get("provider") == provider
            and (provider is not None or r.get("fused", True))
        ),
        None,
    )


def cell_(r, roof=True):
    if r is None:
        return "-"
    busy = f", busy {r['gpu_busy']:.0%}" if r.get("gpu_busy") is not None else ""
    return f"{tok_s(r):.0f} ({r['roofline_fraction']:.0%}{busy})" if roof else f"{tok_s(r):.0f}"


batches = sorted({r["batch"] for r in erows if "workload" not in r})
print(
    f"{'batch':>5s} | {'replay tok/s (roofline)':>27s} | {'snapshot tok/s (roofline)':>27s} | "
    f"{'replay/snap':>11s} | {'mamba-ssm cg (roofline)':>23s} | {'replay/mamba':>12s} | transformers tok/s"
)
for b in batches:
    rep, snap = pick(b, "replay"), pick(b, "snapshot")
    mam, hf = (
        pick(b, provider="mamba-ssm generate(cg=True)"),
        pick(b, provider="transformers generate"),
    )
    vs_mam = f"{tok_s(rep) / tok_s(mam):.2f}x" if mam else "-"
    print(
        f"{b:5d} | {cell_(rep):>27s} | {cell_(snap):>27s} | {tok_s(rep) / tok_s(snap):10.2f}x | "
        f"{cell_(mam):>23s} | {vs_mam:>12s} | {cell_(hf, roof=False):>10s}"
    )
# a row busy for less of the time than its roofline fraction: the profile says how both hold
for r in erows:
    if "workload" in r or not r.get("profile") or r.get("gpu_busy") is None:
        continue
    if r["gpu_busy"] >= r["roofline_fraction"] or not r.get("fused", True):
        continue
    kernel_s, step_s = r["profile"]["device_us_per_step"] * 1e-6, r["seconds_per_token"]["median"]
    print(
        f"batch {r['batch']} {r['strategy']}: {r['roofline_fraction']:.0%} of the roofline yet busy "
        f"{r['gpu_busy']:.0%}, because busy was measured under torch.profiler, which slows the host "
        f"and so stretches the step; the same profile's kernels take {kernel_s * 1e6:.0f} µs a step, "
        f"{kernel_s / step_s:.0%} of the unprofiled step ({step_s * 1e6:.0f} µs), which leaves room "
        f"for {r['roofline_fraction']:.0%}"
    )

# %%
from replaylab.teaching.plotting import engine_decode_figure

engine_decode_figure(eng).show()

# %% [markdown]
# **Where replay wins, per workload and batch.** The one statement the other notebooks quote:
# replay's tokens/s over the fastest other strategy *in the same run*, from the two engine runs of
# the `8b-layers` preset on the H200: `data/bench_engine.json` (the fused engine, every prompt
# the same length; its other fused strategy is snapshot) and `data/bench_serve_ragged.json`
# (every slot at its own position; a row-invariant matmul, whose rows have the same bits whatever
# the number of rows, so a verify rounds as decode steps do; snapshot and recompute). Speculative
# rows are at per-draft acceptance 0.8, k = 4. Within 3% either way counts as a tie
# (`replaylab.results.replay_wins`):

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.results import replay_wins, replay_wins_summary

for line in replay_wins_summary(replay_wins(eng, load_bench("data/bench_serve_ragged.json"))):
    print(line)

# %% [markdown]
# In words: **plain decode** trails or ties at batch 1 and 8 and wins from batch 32 (the ragged
# run, which has no batch 32, from 64); **batched speculation** (k = 4 verify rounds) wins from
# batch 64; **speculation at batch 1** trails per-draft snapshots, whose copies of one sequence's
# state are cheap. The kernel alone wins earlier (the kernel table above, the same as 06 section 5's:
# the amortised decode from batch 8), because at small batch the weights, not the state, are most
# of a step's bytes.

# %% [markdown]
# ## 5. A caveat: the ratio of attention to recurrent layers
#
# Replay saves state traffic; the more of a model's per-token memory traffic is KV cache, the less
# that matters. The share of the state in a sequence's decode memory at 8K tokens of context, for
# published hybrids (bytes from their configs, `replaylab.shapes.memory_per_sequence`):

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.shapes import memory_per_sequence

for shape in PUBLISHED_SHAPES.values():
    m = memory_per_sequence(shape, 8192)
    share = m["ssm_state"] / sum(m.values())
    print(
        f"{shape.name:14s} {shape.n_attn:2d} attention / {shape.n_ssm:2d} SSM layers: state is {share:.0%} "
        f"of per-sequence memory at 8K tokens"
    )

# %% [markdown]
# The other caveats the measurements put numbers on (replay's gain as the share of attention
# grows, measured live; where a longer log stops paying; best-of-n against beam search) are in the
# appendix, notebook 15, with the cost model beside the measurements and a roofline for Nemotron-H
# 8B.

# %% [markdown]
# ## Summary
# * Measure decode only: time per output token after the prefill, the median of three runs after a
#   warm-up; peak memory per sequence; when speculating, the acceptance rate and what a rejection
#   costs (sections 1-3). On this CPU, without the replay kernel, replay is the slowest strategy and
#   its log makes it hold more than snapshot in plain decoding: neither says anything about a GPU.
# * Quote replay's decode amortised, step + fold(L)/L: on an H200 the kernel beats
#   `selective_state_update` from batch 8, and loses at batch 1 (section 4).
# * In the whole model the weights are most of a step's bytes at small batch. The fused,
#   CUDA-graphed engine runs close to its roofline against the run's one copy bandwidth, faster than
#   transformers' `generate` and mamba-ssm's graphed loop at every batch measured, and replay's
#   lead over the fused snapshot grows with the batch: in plain decode it trails or ties at batch 1
#   and 8 and wins from batch 32; batched speculation wins from batch 64 (section 4, the statement
#   the other notebooks quote).
# * Replay pays where state traffic binds: the more attention a model has, the smaller the state's
#   share of what a sequence holds (section 5).
# * The rest of the H200 runs, read in depth: notebook 15 (optional).
#
# ## Exercises
# **1.** *(Optional on both short paths.)* What share of one sequence's decode memory is the
# recurrent state for Falcon-H1 7B at 64K tokens (65536) of context, and is that share `"more"` or
# `"less"` than Nemotron-H 8B's at the same length? (Use `memory_per_sequence` as in section 5.)

# %% exercise="state_share" tags=["exercise"]
state_share_answer = None  # your answer: (share as a fraction, "more" or "less")

# %%
exercises.check_state_share(state_share_answer);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): does replay matter more or less for that model
# at that length, and what else would you measure before deciding?
#
# **2.** *(Optional on both short paths.)* Re-run section 3's speculative loop under recompute at acceptance 0.5
# (`SyntheticDrafter(reference, 0.5, seed=0)`). How many restores, and how many tokens re-run?

# %% exercise="recompute_half" tags=["exercise"]
recompute_half_answer = None  # your answer: (restores, tokens re-run)

# %%
exercises.check_recompute_at_acceptance(recompute_half_answer, model, one);

# %% [markdown]
# ## References
# * "ReplaySSM: Cache SSM Inputs, Not State" (Dao AI Lab with NVIDIA, 2026), and its vLLM pull
#   requests #48018, #49847, #49887: replay in a serving engine, measured per batch.
# * Marconi (MLSys 2025) and SGLang's `MambaRadixCache`: which recurrent states to keep under a
#   memory budget.
# * Notebook 15 (optional): the appendix that reads the measurements in depth.
