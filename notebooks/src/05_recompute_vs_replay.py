# %% [markdown]
# # 05 · Recompute vs replay: the same `restore(p)`, different costs
#
# ## Overview
# Both strategies keep little: recompute keeps a state every `interval` tokens, replay keeps one
# checkpoint and a log of each SSM layer's scan inputs. Both can go back to any position. What
# differs is the work: recompute re-runs **the whole model** (attention, MLPs, projections) from
# the last checkpoint; replay folds **only the SSM recurrences** over logged inputs. This
# notebook measures both on the same model, at every distance from the checkpoint.
#
# **You will** measure recompute's and replay's restores by distance and interval; see, for
# Nemotron-H 8B, the bytes of one state against one log entry and the log length at which they
# break even; and **write a recompute store and a replay log** for one Mamba-2 layer, each checked
# against the reference scan on random sequences.
#
# **Time:** about 50 minutes.
#
# ## Prerequisites
# Notebooks 02 (the scan) and 03 (the cache API).

# %% [markdown]
# ## Setup

# %%
import plotly.graph_objects as go
import torch

from replaylab import costmodel as cm
from replaylab.teaching import exercises
from replaylab.teaching.experiments import compare_strategies, restore_cost_vs_distance
from replaylab.model import HybridConfig, HybridLM
from replaylab.teaching.plotting import use_notebook_renderer
from replaylab.shapes import PUBLISHED_SHAPES

torch.manual_seed(0)
use_notebook_renderer()
model = HybridLM(HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64,
                              n_groups=1), seed=0).eval()

# %% [markdown]
# ## 1. Work per restore, by distance
#
# **Two ways back to position $p = c + j$.** Recompute re-runs the model from its checkpoint at
# $c$: the tokens $c+1, \dots, p$ go through *every* layer again, since an SSM layer's inputs
# are the outputs of the layers below it. Replay has each SSM layer's scan inputs logged already,
# so it only folds them into the checkpoint state:
#
# $$S_{c+j} = \mathrm{fold}(S_c, \mathrm{log}[:j]):\qquad a_s = e^{\Delta_s A},\qquad
# S \leftarrow a_s\,S + \Delta_s\,x_s B_s^\top \quad (s = 1, \dots, j).$$
#
# The fold for one layer, line by line, against the reference scan from the same checkpoint:

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.scan import ssd_scan

H_, P_, N_, G_, j = 8, 16, 64, 1, 5  # one layer of the model above; j logged tokens
g = torch.Generator().manual_seed(1)
S_c = torch.randn(1, H_, P_, N_, generator=g)  # the checkpoint
A = -torch.rand(H_, generator=g)  # decay rate per head
log = dict(x=torch.randn(1, j, H_, P_, generator=g), dt=torch.rand(1, j, H_, generator=g),
           B=torch.randn(1, j, G_, N_, generator=g), C=torch.randn(1, j, G_, N_, generator=g))


def fold(S, log, A):
    for s in range(log["x"].shape[1]):
        delta = log["dt"][:, s]  # Δ_s, per head (already positive here: no softplus)
        a = torch.exp(delta * A)  # a_s = e^{Δ_s A}
        B = log["B"][:, s].repeat_interleave(H_ // G_, dim=1)  # B_s, each group to its heads
        S = a[:, :, None, None] * S + (delta[:, :, None] * log["x"][:, s])[..., None] * B[:, :, None]
    return S  # a_s S + Δ_s x_s B_sᵀ, j times; no matmul, no conv, no attention


reference = ssd_scan(log["x"], log["dt"], A, log["B"], log["C"], initial_state=S_c).state
print(f"fold(S_c, log[:{j}]) equals the reference scan from S_c:",
      torch.allclose(fold(S_c, log, A), reference, atol=1e-5))

# %% [markdown]
# Now the whole model. Decode 32 tokens (a checkpoint at 32), then 16 more (at interval 16, another
# checkpoint lands at 48); go back to `32 + d` and take one step.
# Recompute re-runs `d` tokens through every layer. Replay re-runs nothing; its next step folds
# the `d` logged tokens of each of the 3 SSM layers (the cursor move itself is free):

# %%
# NBVAL_CHECK_OUTPUT
rows = {s: restore_cost_vs_distance(model, s, interval=16) for s in ("recompute", "replay")}
for a, b in zip(rows["recompute"], rows["replay"]):
    print(f"distance {a['distance']:2d}: recompute re-runs {a['recomputed_tokens']:2d} tokens "
          f"(all layers); replay re-runs {b['recomputed_tokens']} and folds {b['folded_tokens']:2d} "
          f"logged SSM inputs")

# %% [markdown]
# Time on this machine (not checked: it depends on the CPU). The reference fold is a Python
# loop over tokens, so on a CPU its advantage is the matmuls it skips; on a GPU the Triton fold
# (notebook 06) makes it a memory-bound pass.

# %%
# NBVAL_IGNORE_OUTPUT
fig = go.Figure()
for strategy, sel in rows.items():
    fig.add_scatter(x=[r["distance"] for r in sel], y=[r["seconds"] * 1e3 for r in sel],
                    name=strategy, mode="lines+markers")
fig.update_layout(title="Restore cost against the distance from the checkpoint",
                  xaxis_title="distance from the checkpoint (tokens)",
                  yaxis_title="ms for restore + one step", height=350)
fig.show()

# %% [markdown]
# **Why?** On a CPU, replay's decode step is *slower* than snapshot's (notebook 09 times it
# too). A GPU tells another story, in the library's **decode engine** (`serving.DecodeEngine`,
# notebook 13: the serving loop that decodes many sequences together from memory allocated once
# up front): there replay trails or ties at batch 1 and 8 and wins from batch 32 (the end of this
# section reads that from the engine runs in `data/`). Without kernels (`use_kernels`, the
# switch to notebook 06's Triton kernels, is off on a
# CPU) the replay store computes a step's outputs the reference way, in `ReplayStore.advance`
# (`replaylab/strategies/replay.py`): `spec.scan(fold(checkpoint, log), new_tokens)`. It folds
# every logged token again at every step, a per-token loop of small tensor operations. With n
# tokens in the log, a step runs n + 1 scan steps per SSM layer where snapshot runs 1. On a GPU,
# the `replay_step` kernel (notebook 06) reads the checkpoint and the log in one pass and writes
# no state. Its gain is memory traffic, which this CPU at these sizes does not show: here the time
# goes into per-operation overhead. Decode 32 tokens under each, and time the fold inside
# replay's steps:

# %%
# NBVAL_IGNORE_OUTPUT
import time

from replaylab.cache import HybridCache


@torch.no_grad()
def decode_steps(strategy, n=32, log_length=16):
    """n greedy steps after a 16-token prompt; per step: seconds, seconds inside replay's
    fold, logged tokens folded (cache.stats)."""
    cache = HybridCache(model, 1, strategy, log_length=log_length)
    in_fold = [0.0]
    if strategy == "replay":  # wrap the store's fold to time it; it computes the same
        fold = cache.ssm._fold

        def timed_fold(layer, upto):
            t0 = time.perf_counter()
            out = fold(layer, upto)
            in_fold[0] += time.perf_counter() - t0
            return out

        cache.ssm._fold = timed_fold
    logits = model(cpu_prompt, cache)
    steps = []
    for _ in range(n):
        fold0, folded0, t0 = in_fold[0], cache.stats.folded_tokens, time.perf_counter()
        logits = model(logits[:, -1:].argmax(-1), cache)
        steps.append(dict(seconds=time.perf_counter() - t0, fold=in_fold[0] - fold0,
                          folded=cache.stats.folded_tokens - folded0))
    return steps


cpu_prompt = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
for s in ("snapshot", "replay"):
    decode_steps(s)  # warm-up
steps = {s: decode_steps(s) for s in ("snapshot", "replay")}
mean_ms = {s: 1e3 * sum(st["seconds"] for st in v) / len(v) for s, v in steps.items()}
fold_ms = 1e3 * sum(st["fold"] for st in steps["replay"]) / len(steps["replay"])
print(f"mean ms per decode step: snapshot {mean_ms['snapshot']:.2f}, replay {mean_ms['replay']:.2f} "
      f"({mean_ms['replay'] / mean_ms['snapshot']:.1f}x)")
print(f"replay's step: {fold_ms:.2f} ms in the fold, {mean_ms['replay'] - fold_ms:.2f} ms the rest "
      f"(snapshot's whole step: {mean_ms['snapshot']:.2f} ms)")

# %% [markdown]
# The work itself is exact and the same on any machine: the logged tokens each step folds (all
# SSM layers together; once every 16 steps the full log is also folded into a new checkpoint):

# %%
# NBVAL_CHECK_OUTPUT
n_ssm = model.cfg.pattern.count("M")
folded = [st["folded"] for st in steps["replay"]]
print(f"replay, tokens folded per step ({n_ssm} SSM layers):", folded)
print("snapshot, tokens folded in all steps:", sum(st["folded"] for st in steps["snapshot"]))
print(f"scan steps per SSM layer per decode step: snapshot 1, replay "
      f"{1 + sum(folded) / n_ssm / len(folded):.2f} on average")

# %% [markdown]
# **And on a GPU?** There the replay step is one Triton kernel (notebook 06) and the decode engine
# runs each step of the whole model as one **CUDA graph**: the step's GPU kernel launches,
# recorded once and replayed with a single call, so the host's cost per launch drops out
# (notebook 09, section 4). Where replay wins there, per workload and batch, from the two engine
# runs of the 8B-shaped preset on an H200: `data/bench_engine.json`, every prompt the same
# length, and **the ragged run**, `data/bench_serve_ragged.json`, where every sequence sits at its
# own position as in a server (replay's tokens/s over the fastest other strategy in the same run;
# within 3% is a tie): plain decode trails or ties at batch 1 and 8 and wins from batch 32 (the
# ragged run, which has no batch 32, from 64); batched speculation wins from batch 64.

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.results import replay_wins_summary

for line in replay_wins_summary():
    print(line)

# %% [markdown]
# ## 2. The interval trade-off
#
# A shorter interval makes recompute's restores cheaper and its memory larger (more
# checkpoints); replay's log length `L` plays the same role for its fold. Speculating at
# acceptance 0.5 with k=4:

# %%
# NBVAL_CHECK_OUTPUT
prompt = torch.randint(0, 128, (1, 16))
for interval in (2, 8, 32):
    for r in compare_strategies(model, prompt, n_new=32, acceptance=0.5, k=4, interval=interval,
                                strategies=("recompute", "replay")):
        print(f"interval {interval:2d}: {r['strategy']:9s} peak {r['peak_bytes'] / 1024:6.1f} KiB, "
              f"tokens re-run {r['recomputed_tokens']:3d}, same tokens: {r['same_tokens_as_greedy']}")

# %% [markdown]
# **Why?** At interval 32, replay holds *more* than recompute. `compare_strategies` gives
# replay a log length equal to the interval, so replay keeps up to 32 log entries (one per token,
# per SSM layer) before it folds, while recompute keeps one state per 32 tokens. For this small
# model a log entry is not small next to a state. The first line below says after how many
# entries a log outweighs one state copy; past that, a longer log holds more than a checkpoint.
# For Nemotron-H 8B, section 3 computes the same break-even.

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.cache import CacheConfig
from replaylab.decoding import SyntheticDrafter, greedy, speculative

probe = HybridCache(model, 1, "replay")
with torch.no_grad():
    model(prompt[:, :1], probe)  # one token logged, nothing folded yet
held = probe.nbytes()
entry_bytes = held["logs"]  # one token's log entry, all SSM layers
copy_bytes = held["ssm_state"] + held["conv_state"]  # one state and conv window, all SSM layers
print(f"one log entry {entry_bytes:,} B, one state copy {copy_bytes:,} B: a log outweighs a copy "
      f"past {copy_bytes / entry_bytes:.1f} entries")
# the interval-32 runs of the cell above, as compare_strategies makes them
full = torch.cat([prompt, greedy(model, prompt, 32, "recompute").tokens], 1)
for s, part in (("recompute", "checkpoints"), ("replay", "logs")):
    run = speculative(model, prompt, 32, SyntheticDrafter(full, 0.5, 0), k=4,
                      cache=CacheConfig(s, checkpoint_interval=32, log_length=32))
    kept = run.stats.peak_by_component[part]
    print(f"{s:9s} peak {run.peak_bytes / 1024:5.1f} KiB; its {part} at their peak: "
          f"{kept / copy_bytes:.2f} state copies" + (f" = {kept // entry_bytes} log entries" if s == "replay" else ""))

# %% [markdown]
# ## 3. One state against one log entry
#
# What makes replay cheap to hold: per token it logs a layer's *inputs*, not its state. For one
# Mamba-2 layer of Nemotron-H 8B (`replaylab.shapes.PUBLISHED_SHAPES`), the fp32 state is
# $H \cdot P \cdot N$ values; a log entry keeps, in bf16, the raw conv input (`xBC`: each layer first
# runs a short causal convolution over its last few tokens' inputs, so a restore needs that
# window back) and the scan inputs x, dt, B and C:

# %%
# NBVAL_CHECK_OUTPUT
shape = PUBLISHED_SHAPES["Nemotron-H 8B"]
H, P, N, G = shape.ssm_heads, shape.ssm_head_dim, shape.d_state, shape.n_groups
state_bytes = H * P * N * 4  # fp32, one layer, one sequence
entry = {"xBC (conv input)": shape.conv_channels, "x": H * P, "dt": H, "B and C": 2 * G * N}
entry_bytes = sum(entry.values()) * 2  # bf16, one layer, one token
print(f"H={H}, P={P}, N={N}, G={G}; one log entry holds " +
      ", ".join(f"{k}: {v}" for k, v in entry.items()) + " values")
print(f"one state:     {state_bytes:>9,} bytes ({state_bytes / 2**20:.2f} MiB)")
print(f"one log entry: {entry_bytes:>9,} bytes ({entry_bytes / 2**10:.2f} KiB)")
print(f"state : entry = {state_bytes / entry_bytes:.1f} : 1")
# the cost model (notebooks 07-08) counts the same bytes, over all the model's SSM layers
costs = cm.model_costs(shape, cm.Workload(), n_params=8e9)
print("same as replaylab.costmodel:",
      costs.S == shape.n_ssm * state_bytes and costs.log_token == shape.n_ssm * entry_bytes)

# %% [markdown]
# The **break-even log length** is where the log has grown as large as the state it replaces:
# $L^* = \text{state bytes} / \text{entry bytes}$. Below it, a replay log costs less memory than a
# single snapshot. While speculating, snapshot keeps a copy per verified position, replay a log
# entry per verified token:

# %%
# NBVAL_CHECK_OUTPUT
break_even = state_bytes / entry_bytes
print(f"break-even log length: {break_even:.1f} tokens")
for L in (4, 16, 64):
    print(f"a log of {L:2d} tokens holds {L * entry_bytes / state_bytes:6.1%} of one state's bytes")
k = 4  # drafts per round; snapshot: the round's handle + a copy per verified token (notebook 04)
print(f"one round of k={k}, per layer: snapshot copies {(k + 2) * state_bytes:,} bytes, "
      f"replay logs {(k + 1) * entry_bytes:,}")


# %% [markdown]
# ## 4. Build it: a recompute store
#
# *Optional on the 3-hour path (read this first paragraph: section 5 uses `exercises.mini_layer()` too); the 1-day path writes it.*
#
# `exercises.mini_layer()` is one Mamba-2 layer's recurrence (notebook 03, section 4).
# Recompute keeps a checkpoint every `interval` tokens and the inputs since position 0; to go back
# to position $p$ it takes the latest checkpoint $c \le p$ and re-runs the inputs $[c, p)$. In a
# model, "re-run" means the whole model from the tokens; for one layer it means `layer.scan` over
# the kept inputs. `ScanInputs.cat([...])` joins pieces and `inputs[a:b]` selects tokens.

# %% exercise="recompute_store" tags=["exercise"]
class MyRecomputeStore:
    """The recompute strategy for one Mamba-2 layer and a batch of sequences.

    MyRecomputeStore(layer, batch, interval)  position 0, state layer.zero_state(batch)
    .state, .position        as in the snapshot store of notebook 03
    .checkpoints             dict position -> state (batch, H, P, N): the states at
                             0, interval, 2*interval, ... up to .position, and no others
    .advance(inputs) -> y    scan from .state (T tokens, y (batch, T, H, P)); keep the inputs;
                             keep a copy of the state at every multiple of interval it crosses
                             (layer.scan(..., return_states=True).states[:, j] is the state
                             after token j of the call)
    .restore(p) -> int       back to position p (0 <= p <= position): from the latest
                             checkpoint c <= p, re-run the kept inputs [c, p); forget the
                             checkpoints and inputs past p; return p - c, the tokens re-run
    """

    def __init__(self, layer, batch, interval):
        raise NotImplementedError

    def advance(self, inputs):
        raise NotImplementedError

    def restore(self, p):
        raise NotImplementedError


# %%
exercises.check_recompute_store(MyRecomputeStore);

# %% [markdown]
# ## 5. Build it: a replay log
#
# *Both short paths write this one.*
#
# Replay keeps one checkpoint $S_c$ and appends each token's inputs to a log. A rollback to
# $c + j$ is `truncate_to(j)`: a cursor move (the entries past $j$ are dropped: the next append
# goes at $j$). The state at $c + j$ is a *fold*: the scan of the
# first $j$ entries from $S_c$, $S_{c+j} = \mathrm{fold}(S_c, \mathrm{log}[:j])$. The log must hold
# inputs, not states: the check rejects a log that keeps any state besides its checkpoint, in
# any shape at the state's precision (it cuts every tensor the log holds into rows of
# $H \cdot P \cdot N$ values and looks for the states along the branch), or that writes into the
# checkpoint.

# %%
from replaylab.teaching.diagrams import replay_log_diagram

replay_log_diagram(L=8, filled=6, cursor=4).show()


# %% [markdown]
# In the picture: six tokens logged since $c$, room for $L = 8$; the state the cache reads is
# $\mathrm{fold}(S_c, \mathrm{log}[:4])$. Rolling back two tokens moves the cursor; the two entries
# after it no longer count (the library overwrites them at the next append; your log below may
# simply drop them: its `len` must be the cursor's position). Your log does this for one layer.

# %% exercise="replay_log" tags=["exercise"]
from replaylab.teaching.exercises import ScanInputs  # inputs[a:b], len(inputs), ScanInputs.cat([...])


class MyReplayLog:
    """One Mamba-2 layer's replay memory: a checkpoint state and the inputs logged since.

    MyReplayLog(layer, checkpoint)  checkpoint (batch, H, P, N): S_c, never modified; empty log
    len(log)                        logged tokens
    .append(inputs)                 add the T tokens of inputs (ScanInputs) at the end
    .truncate_to(j)                 keep the first j logged tokens (0 <= j <= len(log)); len(log)
                                    is j right after it
    .state(j=None) -> S_{c+j}       fold: the state after the first j logged tokens (all of
                                    them when j is None), by layer.scan(checkpoint, inputs).state
                                    (03 section 4 shows the call); a new tensor each time, so a
                                    caller that changes it cannot change the log

    Hint: the logged dt is raw (before its bias and softplus); layer.scan applies them, so a
    fold written by hand from section 1's formula must too.
    """

    def __init__(self, layer, checkpoint):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError

    def append(self, inputs):
        raise NotImplementedError

    def truncate_to(self, j):
        raise NotImplementedError

    def state(self, j=None):
        raise NotImplementedError


# %%
exercises.check_replay_log(MyReplayLog);

# %% [markdown]
# The library's versions, `RecomputeStore` and `ReplayStore` in `replaylab/strategies/`, do
# this for every SSM layer of a model: recompute re-runs the *model* through the cache's
# `rerun` callback, replay folds each layer's log (with the Triton `fold` kernel of notebook 06
# when kernels are on). Sections 1-2 used them; nothing here depends on your classes.
#
# ## Summary
# * Recompute's restore cost grows with the distance to the checkpoint and includes every layer.
# * Replay's restore is a cursor move; the fold it defers touches only the SSM inputs.
# * Recompute trades memory for work through its interval; replay keeps its log short by folding.
# * A log entry of an 8B-class Mamba-2 layer is a small fraction of its state: a log stays
#   cheaper than one snapshot up to the break-even length computed in section 3.
#
# ## Exercises
# **1.** *(Optional on the 3-hour path.)* In section 1, at which of the distances visited does recompute re-run no token at all?
# Give the list (compute it from `rows`).

# %% exercise="zero_rerun" tags=["exercise"]
zero_rerun_answer = None  # your answer: a list of distances

# %%
exercises.check_zero_rerun_distances(zero_rerun_answer, model);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): why those distances?
#
# **2.** *(Optional on both short paths.)* *Discussion* (model answer in `INSTRUCTORS.md`): change the model's pattern to
# `"M*M*M*"` (more attention). Which strategy's restore gets more expensive, and why does the
# other's not?
#
# ## References
# * *The Mamba in the Llama* (2024): recomputing accepted steps from cached x, dt, B.
# * ReplaySSM (2026): cache SSM inputs, not state.
