# %% [markdown]
# # 03 · Branching workloads and the three escape routes
#
# ## Overview
# Speculative decoding, beam search and best-of-n all need the model's memory *at an earlier
# position*. replaylab's `HybridCache` gives one API for that — `snapshot`, `restore`,
# `truncate_to`, `fork`, `reorder` — over three ways of keeping the recurrent state:
#
# | strategy | keeps | going back costs |
# |---|---|---|
# | snapshot | a copy of every state that may be restored | a copy, paid in memory up front |
# | recompute | a checkpoint every `interval` tokens | re-running the whole model from a checkpoint |
# | replay | one checkpoint + a log of each layer's scan inputs | folding the log: no matmuls |
#
# To *fold* is to apply the layer's recurrence to the checkpoint state over the logged inputs,
# which gives the state at a later position (notebook 02, section 3). This notebook runs the same workloads under all three on a tiny hybrid model and measures
# what each holds and what each restore costs.
#
# **You will** run a speculative-decoding loop, beam search, best-of-n and a tree search under
# snapshot, recompute and replay; follow one speculative round call by call; read what each holds
# and re-runs; and **write a snapshot store** for one Mamba-2 layer,
# checked against the reference scan on random advance / snapshot / restore sequences.
#
# **Time:** about 50 minutes.
#
# ## Prerequisites
# Notebooks 01 and 02.

# %% [markdown]
# ## Setup

# %%
import inspect

import plotly.graph_objects as go
import torch

from replaylab.teaching import exercises
from replaylab.cache import HybridCache
from replaylab.decoding import beam_search, best_of_n, speculative
from replaylab.teaching.experiments import compare_strategies
from replaylab.model import HybridConfig, HybridLM
from replaylab.teaching.plotting import use_notebook_renderer

torch.manual_seed(0)
use_notebook_renderer()
# a tiny hybrid whose state, like a real one, outweighs a token's worth of scan inputs
model = HybridLM(HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64,
                              n_groups=1), seed=0).eval()
prompt = torch.randint(0, 128, (1, 16))

# %% [markdown]
# ## The three strategies on one branching sequence
#
# A second branch leaves the sequence after token 3 (a beam, a best-of-n sample, or drafts after a
# rejection). Each row shows what a strategy keeps to get the state at the branch point back
# (drawn by `replaylab.teaching.diagrams`):

# %%
from replaylab.teaching.diagrams import strategies_diagram

strategies_diagram(trunk=6, branch_at=4, branch_len=3).show()

# %% [markdown]
# ## 1. A speculative-decoding loop, written against the cache
#
# Each round snapshots, verifies the pending token plus `k` drafts in one forward, and drops the
# rejected suffix with `truncate_to`. The decoder never asks which strategy is underneath:

# %%
src = inspect.getsource(speculative)
print(src[src.index("    while"):src.index("    bar.close()")])

# %% [markdown]
# ## 2. Same tokens, different costs
#
# A synthetic drafter proposes the model's own greedy tokens, each right with a set
# probability, so we can dial the acceptance rate. Every strategy must reproduce plain greedy
# decoding token for token:

# %%
# NBVAL_CHECK_OUTPUT
results = {alpha: compare_strategies(model, prompt, n_new=40, acceptance=alpha, k=4)
           for alpha in (0.5, 0.9)}
for alpha, rows in results.items():
    for r in rows:
        print(f"acceptance {alpha}: {r['strategy']:9s} same tokens as greedy: {r['same_tokens_as_greedy']}, "
              f"restores {r['restores']:2d}, peak {r['peak_bytes'] / 1024:7.1f} KiB, "
              f"recomputed tokens {r['recomputed_tokens']}")

# %% [markdown]
# Peak bytes are exact and machine-independent. Restore time is measured here on whatever
# machine runs the notebook, so it is not checked:

# %%
# NBVAL_IGNORE_OUTPUT
for alpha, rows in results.items():
    for r in rows:
        print(f"acceptance {alpha}: {r['strategy']:9s} total restore time {r['restore_seconds'] * 1e3:7.2f} ms")

# %%
fig = go.Figure()
for alpha, rows in results.items():
    fig.add_bar(name=f"acceptance {alpha}", x=[r["strategy"] for r in rows],
                y=[r["peak_bytes"] / 1024 for r in rows])
fig.update_layout(yaxis_title="peak KiB held (KV + state + copies/logs)", barmode="group",
                  height=350, title="What each strategy holds while speculating (k=4)")
fig.show()

# %% [markdown]
# Snapshot pays in memory: a state copy for every draft position. Recompute holds little but
# re-runs the model on every rejection. Replay holds a checkpoint and a short log, and its
# rollback is a cursor move.

# %% [markdown]
# ## 2b. One round, call by call
#
# The totals above sum many rounds. `replaylab.teaching.timeline` records a single one. It runs the round
# as `speculative` does: prefill, `snapshot`, verify the pending token and k = 4 drafts in one
# forward, `truncate_to` after the first $k_{\mathrm{acc}} = 1$ accepted draft (the drafts are the model's own greedy tokens with
# the second one made wrong), `release`, one more decode step. After every call it reads the real
# cache: its position, the copies the snapshot store keeps, the checkpoints, the replay log's
# cursor, and from `cache.stats` the tokens re-run and the logged tokens folded. Recompute keeps a
# checkpoint every 8 tokens here, and replay folds its log at 8 entries:

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.teaching.timeline import speculative_round, timeline_figure

rounds = {s: speculative_round(model, s, prompt_len=12, k=4, accepted=1, interval=8, log_length=8)
          for s in ("snapshot", "recompute", "replay")}
for s, rec in rounds.items():
    print(s)
    for st in rec.steps:
        print(f"  {st.index}. {st.event:14s} position {st.position:2d} | copies held {st.copies_held} "
              f"(made {st.copies_made}) | checkpoints at {list(st.checkpoint_positions)} | "
              f"cursor {st.log_cursor} | re-run {st.rerun_tokens} | folded {st.folded_tokens:2d} | "
              f"{st.total_bytes / 1024:5.1f} KiB")

# %%
timeline_figure({s: rec.steps for s, rec in rounds.items()}).show()

# %% [markdown]
# What each store did, checked against the round's arithmetic ($k$ drafts, $k_{\mathrm{acc}}$ of them accepted):

# %%
# NBVAL_CHECK_OUTPUT
k, k_acc = 4, 1  # drafts proposed, drafts accepted
snap, reco, repl = (rounds[s].steps for s in ("snapshot", "recompute", "replay"))
print(f"snapshot:  copies made {sum(st.copies_made for st in snap)} = k + 2 (one at snapshot(), "
      f"one after each verified token); held at the verify {snap[2].copies_held}, "
      f"after release {snap[4].copies_held}")
print(f"recompute: re-ran {reco[3].rerun_tokens} tokens = kept position {reco[3].position} - "
      f"checkpoint {reco[3].checkpoint_positions[-1]}; the checkpoint the verify made at "
      f"{reco[2].checkpoint_positions[-1]} went with the rejected drafts")
print(f"replay:    cursor {repl[2].log_cursor} -> {repl[3].log_cursor}, back by k - k_acc = "
      f"{repl[2].log_cursor - repl[3].log_cursor}; tokens re-run "
      f"{sum(st.rerun_tokens for st in repl)}; checkpoint at {repl[3].checkpoint_positions[0]} "
      f"throughout")

# %% [markdown]
# Snapshot pays during the verify: its memory peaks while the drafts are unresolved. Recompute
# pays at `truncate_to`, in model forwards. Replay pays nothing at the rollback; the "folded" count
# of its last step is the CPU reference computing the next token's outputs from checkpoint + log
# (it folds the logged tokens each time; notebook 05 measures what that costs on a CPU, and
# notebook 06 does the same step in one Triton kernel that writes no state).

# %% [markdown]
# ## 3. Beam search and best-of-n
#
# `fork` shares the prompt among branches; `reorder` follows the surviving beams. The tokens are
# again identical under every strategy:

# %%
# NBVAL_CHECK_OUTPUT
beams = {s: beam_search(model, prompt, 10, width=4, cache=s) for s in ("snapshot", "recompute", "replay")}
samples = {s: best_of_n(model, prompt, 10, n=8, seed=1, cache=s) for s in beams}
print("beam search identical:", all(torch.equal(b.tokens, beams["replay"].tokens) for b in beams.values()))
print("best-of-8 identical:  ", all(torch.equal(b.tokens, samples["replay"].tokens) for b in samples.values()))
for s in beams:
    print(f"{s:9s} peak KiB: beam {beams[s].peak_bytes / 1024:7.1f}, best-of-8 {samples[s].peak_bytes / 1024:7.1f}")

# %% [markdown]
# **Why?** Recompute holds *more* than snapshot here, although it keeps "sparse checkpoints".
# Neither workload calls `snapshot()`: `fork` and `reorder` only select rows, and the snapshot
# store's `select` drops any copy it had. So snapshot holds the live states and nothing else. The
# recompute store keeps a checkpoint every `checkpoint_interval` (16 by default) tokens whether or
# not a restore ever comes. The 16-token prompt ends on one, and `fork(n)` gathers it into n rows
# like the live state: n identical copies. Replay's checkpoint is one row that all branches read;
# per branch it keeps only a log. In state copies (one position's state and conv windows, all SSM
# layers), what each keeps besides the live states:

# %%
# NBVAL_CHECK_OUTPUT
one = HybridCache(model, 1, "snapshot")
with torch.no_grad():
    model(prompt, one)
one.snapshot()
copy_bytes = one.nbytes()["snapshots"]  # one position's state + conv windows, all SSM layers
kept = {"snapshot": "snapshots", "recompute": "checkpoints", "replay": "logs"}
for name, runs in (("beam, width 4", beams), ("best-of-8    ", samples)):
    print(f"{name}: " + ", ".join(f"{s} {r.stats.peak_by_component[kept[s]] / copy_bytes:4.2f}"
                                  for s, r in runs.items()) + " copies at the peak")

rc = HybridCache(model, 1, "recompute")
with torch.no_grad():
    model(prompt, rc)
rc.fork(4)
ckpt = rc.ssm.checkpoints  # the recompute store's checkpoints: position -> {layer: state}
print("recompute after fork(4): checkpoints at", [p for p, c in ckpt.items() if c is not None],
      "| rows per layer:", {layer: s.ssm.shape[0] for layer, s in ckpt[16].items()},
      "| all rows identical:",
      all(torch.equal(s.ssm[0], s.ssm[b]) for s in ckpt[16].values() for b in range(4)))

# %% [markdown]
# ## 3b. With a trained model and its draft model
#
# The synthetic drafter sets α by hand. `data/models/` holds a 10M-parameter hybrid trained on
# the Python standard library and a 1.4M-parameter draft model that shares its tokenizer (each
# folder has a model card). Here the draft model proposes k=4 tokens, the target verifies them,
# and the cache rolls back what was rejected, under each strategy.

# %%
# NBVAL_CHECK_OUTPUT

import json
from pathlib import Path

from transformers.utils import logging as hf_logging

from replaylab.decoding import ModelDrafter, greedy, speculative
from replaylab.generate import load_checkpoint, load_tokenizer

hf_logging.disable_progress_bar()  # no loading bars (they would be saved as widgets)
MODELS = Path("../data/models")
tok = load_tokenizer(MODELS / "replaylab-code-10m")
target = load_checkpoint(MODELS / "replaylab-code-10m")  # bf16 weights, fp32 on a CPU
draft = load_checkpoint(MODELS / "replaylab-code-draft")
measured = json.loads((MODELS / "metrics.json").read_text())["acceptance"]["summary"]

code_prompt = torch.tensor([tok.encode("import os\n\n\ndef read_lines(path):\n").ids])
plain = greedy(target, code_prompt, 32, "snapshot")
for s in ("snapshot", "recompute", "replay"):
    run = speculative(target, code_prompt, 32, ModelDrafter(draft, s), k=4, cache=s)
    print(f"{s:9s} same tokens as greedy: {torch.equal(run.tokens, plain.tokens)}; accepted "
          f"{run.accepted}/{run.proposed} = {run.acceptance_rate:.2f}; restores {run.restores}; "
          f"peak {run.peak_bytes / 1024:.0f} KiB")
print(tok.decode(code_prompt[0].tolist() + plain.tokens[0].tolist()))

# %% [markdown]
# Over 16 held-out prompts (64 new tokens each, `data/models/metrics.json`) the acceptance,
# accepted / proposed, is the number to set beside the synthetic α above. A synthetic α is the
# chance that each draft is right on its own; accepted / proposed counts a draft only if all
# before it were right too, so it is lower than the α that produces it.

# %%
# NBVAL_CHECK_OUTPUT
for name in ("draft model / replay", "prompt lookup / replay"):
    m = measured[name]
    print(f"{name:22s} accepted {m['accepted']}/{m['proposed']} = {m['acceptance']:.2f} over "
          f"{m['prompts']} held-out prompts; identical to greedy: {m['identical_to_greedy']}")

# %% [markdown]
# ## 3c. Tree search: restores that go backwards
#
# Beam search moves every branch forward together. A tree search goes back to *earlier*
# branches. `decoding.best_first_search` keeps a frontier of partial continuations scored by
# summed log-probability, always expands the best one (pushing its 3 most likely children), and
# prunes the frontier to its best 8. The cache holds one branch at a time, so expanding a node
# elsewhere in the tree means going back to where the two paths part, with `restore` of the
# handle taken there, and feeding the node's remaining tokens. For the KV cache that is a
# truncate. For the recurrent state it is the hard case, because the state at the branching
# point was overwritten long ago. A handle dies when the cache is rolled back past it, so the
# search takes a new one at each node it passes. The navigation, written against the cache only:

# %%
from replaylab.decoding import best_first_search

src = inspect.getsource(best_first_search)
print(src[src.index("        # go to"):src.index("        fed = len")])

# %% [markdown]
# The same search under the three strategies, on a 20-token prompt, 8 new tokens. The prompt
# ends between recompute's checkpoints (every 16 tokens by default), as it would in practice:

# %%
# NBVAL_CHECK_OUTPUT
tree_prompt = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(1))
trees = {s: best_first_search(model, tree_prompt, 8, branch=3, frontier=8, cache=s)
         for s in ("snapshot", "recompute", "replay")}
ref = trees["replay"]
print("same tokens under every strategy:", all(torch.equal(r.tokens, ref.tokens) for r in trees.values()))
print("same nodes expanded, same restores asked for:",
      all(r.extra["trace"] == ref.extra["trace"] for r in trees.values()))
x = ref.extra
print(f"{x['expansions']} expansions, {ref.restores} restores ({x['backward_restores']} to an earlier "
      f"position), {x['fed_tokens']} tokens fed for {x['expansions']} nodes")
kept = {"snapshot": "snapshots", "recompute": "checkpoints", "replay": "logs"}
for s, r in trees.items():
    part = kept[s]
    print(f"{s:9s} peak {r.peak_bytes / 1024:6.1f} KiB (of which {part} {r.stats.peak_by_component[part] / 1024:5.1f}), "
          f"restores {r.restores}, tokens re-run {r.recomputed_tokens:3d}, rebuilt restores {r.stats.fallback_restores}")

# %%
# NBVAL_IGNORE_OUTPUT
for s, r in trees.items():
    print(f"{s:9s} {r.seconds * 1e3:6.1f} ms for the whole search, {r.restore_seconds * 1e3:5.1f} ms in restores")

# %% [markdown]
# **Why does replay do the most scan work here, with the cheapest restores?** The times above
# are live, and on a machine shared with other jobs they move by several times between runs, so
# their order is not the lesson (replay took the longest on a quiet machine when this section
# was written; a loaded one has put recompute last); the work counted below does not move.
# Replay's extra work is not in the restores but in the forwards. On this CPU the replay cache has no kernel (`use_kernels` is off
# without CUDA), so every forward computes its outputs the reference way,
# `spec.scan(fold(checkpoint, log), new_tokens)` in `ReplayStore.advance`: it folds the whole log
# since the checkpoint again, then scans the new token. Here the log holds the path from the
# checkpoint to the node being expanded (up to 8 tokens; it is folded into a new checkpoint only
# when it reaches the cache's log length), and each of the search's 183 one-token forwards refolds that path. The
# cache counts the logged tokens folded:

# %%
# NBVAL_CHECK_OUTPUT
n_ssm = model.cfg.pattern.count("M")
fed = ref.extra["fed_tokens"]
for s, r in trees.items():
    print(f"{s:9s} logged tokens folded {r.stats.folded_tokens:4d}: "
          f"{1 + r.stats.folded_tokens / n_ssm / fed:.1f} scan steps per SSM layer per fed token")

# %% [markdown]
# So each token the search feeds costs replay several scan steps per SSM layer where snapshot and
# recompute run one; where that outweighs recompute's re-runs and snapshot's copies, replay is
# the slowest of the three. On a GPU the
# `replay_step` kernel (notebook 06) reads the checkpoint and the log in one pass instead of
# folding them, and the same search would pay replay's cheap restores without this overhead.

# %%
from plotly.subplots import make_subplots

# the cache's position after each call: a restore (a drop), then one forward per token fed
calls, pos = [], tree_prompt.shape[1]
for t in ref.extra["trace"]:
    if t["restored_to"] is not None:
        pos = t["restored_to"]
        calls.append(("restore", pos))
    for _ in range(t["fed"]):
        pos += 1
        calls.append(("feed", pos))
fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35], horizontal_spacing=0.12,
                    subplot_titles=("the cache's position, call by call (identical for all three)",
                                    "peak KiB held, by component"))
fig.add_scatter(x=list(range(len(calls))), y=[p for _, p in calls], mode="lines", name="position",
                line=dict(color="#7f7f7f"), row=1, col=1)
fig.add_scatter(x=[i for i, (kind, _) in enumerate(calls) if kind == "restore"],
                y=[p for kind, p in calls if kind == "restore"], mode="markers", name="restore to",
                marker=dict(color="#d62728", size=7), row=1, col=1)
parts = {"kv": "#7f7f7f", "ssm_state": "#1f77b4", "conv_state": "#17becf", "snapshots": "#d62728",
         "checkpoints": "#ff7f0e", "logs": "#2ca02c"}
for part, colour in parts.items():
    fig.add_bar(x=list(trees), y=[r.stats.peak_by_component.get(part, 0) / 1024 for r in trees.values()],
                name=part, marker_color=colour, row=1, col=2)
fig.update_yaxes(title_text="position (tokens)", range=[tree_prompt.shape[1] - 1, tree_prompt.shape[1] + 9], row=1, col=1)
fig.update_yaxes(title_text="KiB (each component at its own peak)", row=1, col=2)
fig.update_xaxes(title_text="call", row=1, col=1)
fig.update_layout(barmode="stack", height=380)
fig.show()

# %% [markdown]
# The untrained model's next-token distributions are flat: every token costs about the same
# log-probability, so deeper nodes score lower and the search works nearly level by level, with
# most expansions jumping back near the root. Every strategy is asked for the same restores. What they cost differs:
# * **snapshot** keeps a copy at every node on the current path (the handles) and so holds the
#   most. Restores cost nothing.
# * **recompute** keeps one checkpoint, and every restore re-runs the model from it to the
#   branching point. Its re-run tokens count only those forwards: the search re-feeds the
#   node's own tokens under every strategy.
# * **replay** keeps one log. Every branching point lies after its checkpoint, so each restore is
#   a cursor move, with no copy and no re-run.

# %% [markdown]
# ## 4. Build it: a snapshot store for one layer
#
# *On the 3-hour path: read this cell and the next (05's exercise uses the layer they show),
# skip the exercise. The 1-day path writes it.*
#
# The cache above keeps every SSM layer of a model. Strip that to the core: **one** Mamba-2
# layer, its recurrence only. `exercises.mini_layer()` gives such a layer with fixed parameters
# ($A$, $D$, the dt bias); `layer.scan(state, inputs)` runs `replaylab.scan.ssd_scan` from a state
# over `ScanInputs` (x, dt, B, C of T tokens) and returns the outputs `y` and the new state:

# %%
# NBVAL_CHECK_OUTPUT
layer = exercises.mini_layer()
demo = layer.random_inputs(2, 5, torch.Generator().manual_seed(0))  # batch 2, 5 tokens
out = layer.scan(layer.zero_state(2), demo)
print("H, P, N, G =", (layer.H, layer.P, layer.N, layer.G))
print("inputs: x", tuple(demo.x.shape), "dt", tuple(demo.dt.shape), "B", tuple(demo.B.shape),
      "| y", tuple(out.y.shape), "| state", tuple(out.state.shape))
print("tokens 2..4 of the same inputs:", len(demo[2:5]))


# %% [markdown]
# **Your turn.** A snapshot store keeps the current state and, on `snapshot()`, a *copy* of it
# with its position; `restore(handle)` makes that copy current again. Fill in the four methods
# (about a dozen lines). The check below runs random sequences of advances, snapshots and
# restores (a handle may be restored twice) and compares every output and state with one
# reference scan over the tokens of the current branch.

# %% exercise="snapshot_store" tags=["exercise"]
class MySnapshotStore:
    """The snapshot strategy for one Mamba-2 layer and a batch of sequences.

    MySnapshotStore(layer, batch)  position 0, state layer.zero_state(batch)
    .state      (batch, H, P, N) the current state;  .position  tokens seen so far
    .advance(inputs) -> y          run layer.scan from .state over inputs (T tokens); keep the
                                   new state, position += T; return y (batch, T, H, P)
    .snapshot() -> handle          keep a copy of the current state and position; return any
                                   hashable handle
    .restore(handle)               make that copy current again; the copy stays restorable
    """

    def __init__(self, layer, batch):
        raise NotImplementedError

    def advance(self, inputs):
        raise NotImplementedError

    def snapshot(self):
        raise NotImplementedError

    def restore(self, handle):
        raise NotImplementedError


# %%
exercises.check_snapshot_store(MySnapshotStore);

# %% [markdown]
# The library's `SnapshotStore` (`replaylab/strategies/snapshot.py`) does the same for every SSM
# layer of a model, conv window included, plus a copy after every verified draft; the cache in
# sections 1-3 used it. Nothing below depends on your class.
#
# ## Summary
# * One cache API serves every branching workload; the strategy is a constructor argument.
# * All three strategies give identical tokens; they differ in what they hold and what a
#   restore costs.
# * With a state that outweighs its inputs, replay holds the least while speculating.
# * Call by call, snapshot pays during the verify (a copy per verified token), recompute at
#   the rollback (re-run tokens), replay at neither (a cursor move).
# * A tree search restores *backwards*, to earlier branching points: snapshot holds a copy
#   per node on the path, recompute re-runs from its checkpoint, replay moves a cursor.
# * A snapshot store is a dictionary of state copies: restore is a copy, memory grows with every
#   handle kept.
#
# ## Exercises
# **1.** *(Optional on both short paths.)* Run `compare_strategies(model, prompt, n_new=24, acceptance=0.0, k=4)` (every draft
# rejected). Which strategy re-runs tokens through the model on its restores? Set the answer to
# `"snapshot"`, `"recompute"` or `"replay"`.

# %% exercise="rollback_work" tags=["exercise"]
rollback_work_answer = None  # your answer: "snapshot", "recompute" or "replay"

# %%
exercises.check_rollback_work(rollback_work_answer, model, prompt);

# %% [markdown]
# *Discussion* (no single answer; model answer in `INSTRUCTORS.md`): why does that strategy's
# restore *time* grow when every draft is rejected, while the others' stays flat?
#
# **2.** *(Optional on both short paths.)* `compare_strategies` takes `interval` (recompute's checkpoint interval). Run it with
# `n_new=40, acceptance=0.5, k=4, strategies=("recompute",)` at `interval=2` and at `interval=32`.
# Going from 2 to 32, do recompute's peak bytes go `"up"` or `"down"`? Its recomputed tokens?

# %% exercise="interval_effect" tags=["exercise"]
interval_effect_answer = None  # your answer: {"peak_bytes": "up" or "down", "recomputed_tokens": "up" or "down"}

# %%
exercises.check_interval_effect(interval_effect_answer, model, prompt);

# %% [markdown]
# ## References
# * Leviathan et al., *Fast Inference from Transformers via Speculative Decoding* (2023).
# * ReplaySSM: cache SSM inputs, not state (Dao AI Lab with NVIDIA, 2026) — the replay idea.
# * Griewank & Walther, *revolve* (2000) — optimal checkpointing for recomputation.
