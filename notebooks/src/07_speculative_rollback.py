# %% [markdown]
# # 07 · Speculative decoding and rollback
#
# ## Overview
# Speculative decoding verifies k drafted tokens in one forward and keeps the prefix the target
# agrees with. Every rejection is a rollback. This notebook uses the cost model to explore how
# acceptance and draft length decide the speedup and the rollback cost of each strategy, then
# runs the synthetic drafter on the tiny model and sets what it measured beside what the model
# predicted.
#
# **You will** compute tokens per round from the acceptance rate, explore the cost model's
# speedup and rollback cost per strategy, and compare its predictions with a live run; then
# answer two checked questions from the model.
#
# **Time:** about 25 minutes.
#
# ## Prerequisites
# Notebooks 03 and 04 (the strategies), 06 (the replay kernel's numbers).

# %% [markdown]
# ## Setup

# %%
import torch

from replaylab import costmodel as cm
from replaylab.teaching import exercises
from replaylab.teaching.experiments import speculative_vs_prediction
from replaylab.model import HybridConfig, HybridLM
from replaylab.teaching.plotting import use_notebook_renderer
from replaylab.teaching.widgets import SpeculativeExplorer

torch.manual_seed(0)
use_notebook_renderer()

# %% [markdown]
# ## 1. How many tokens a round yields
#
# If each draft is accepted with probability α and a rejection ends the round, a round keeps
# $E[k_{\mathrm{acc}}] + 1 = 1 + \sum_{i=1}^{k} \alpha^i$ tokens: the $k_{\mathrm{acc}}$ accepted drafts plus the target's own next
# token. Longer drafts stop paying once $\alpha^i$ is small:

# %%
# NBVAL_CHECK_OUTPUT
for alpha in (0.5, 0.8, 0.95):
    print(f"alpha {alpha}: tokens per round for k = 1, 2, 4, 8, 16:",
          [round(cm.expected_accepted(k, alpha) + 1, 2) for k in (1, 2, 4, 8, 16)])

# %% [markdown]
# One round under replay, drawn (`replaylab.teaching.diagrams`): the pending token $t_0$ and $k = 4$
# drafts go through the target in one forward, which appends 5 log entries and writes no state.
# The target agrees with $d_1$ and $d_2$ and emits its own token where $d_3$ stood; rolling back
# $d_3, d_4$ moves the log's cursor. Snapshot would restore a copy instead, recompute would re-run
# the model from its checkpoint.

# %%
from replaylab.teaching.diagrams import verify_round_diagram

verify_round_diagram(k=4, accepted=2).show()

# %% [markdown]
# ## 2. Explorer: acceptance, draft length, log length, batch
#
# Four panels, one bar per strategy. Top left: the cost model's expected speedup over plain
# decoding for Nemotron-H 8B's shape at the chosen batch on the H200 preset (the copy bandwidth of the engine run, `data/bench_engine.json`,
# timed both ways and the larger kept, as notebook 06 section 5b explains; the cell below prints
# it). The model is a **roofline**: a step is timed as the bytes it must move divided by the
# copy bandwidth measured on the device (and its FLOPs by the datasheet's matrix rate, labelled
# so in the line the cell below prints), the fastest
# it could run, not a measured time. Drafting is taken as free (prompt lookup), attention over the
# context is left out, so read the speedups as upper bounds and the *ordering* as the lesson:
# per-draft snapshots spend bandwidth on copies; recompute spends a forward per rollback; replay
# spends neither. The other three panels are for one sequence of the tiny model of section 3
# (three Mamba-2 layers): the SSM-side memory it holds (state and conv window, plus the copies,
# checkpoints or log a strategy keeps), restores per round, and tokens re-run per round. The
# slider L is replay's log length and recompute's checkpoint interval at once.
#
# **run live** decodes that tiny model on this CPU under each strategy, with a synthetic drafter at
# the sliders' acceptance, k and L, and puts what the cache did on the bars as black diamonds.
# Move the sliders, then press it.

# %%
explorer = SpeculativeExplorer(acceptance=0.8, k=4)
explorer

# %%
# NBVAL_CHECK_OUTPUT
hw = explorer.hardware
print(f"{hw.name}: copy {hw.bandwidth / 1e9:.0f} GB/s, {hw.source}")
for name, (speedup, rollback_us) in explorer.predictions().items():
    print(f"{name:9s} predicted speedup {speedup:4.2f}x, rollback {rollback_us:7.1f} µs")

# %% [markdown]
# What the button does, in code: `run_live()` decodes, and the figure above gets its
# diamonds. Memory is predicted from the same byte counts the cache allocates, at its peak:
# snapshot's and recompute's copies are all there after the first round, while replay's log
# peaks at L - 1 entries, which a run this short need not reach (its held bytes can fall short of
# the prediction). Restores and re-run tokens per round are expectations, and a run of a dozen
# rounds scatters around them.

# %%
# NBVAL_CHECK_OUTPUT
live = explorer.run_live()
predicted = explorer.counts()
print(f"tiny model, {explorer.n_new} tokens, k={explorer.k}, acceptance {explorer.acceptance}, "
      f"L={explorer.interval}: measured (predicted)")
for name, m in live.items():
    p = predicted[name]
    print(f"{name:9s} held {m['held_bytes'] / 1024:6.1f} KiB ({p['held_bytes'] / 1024:6.1f}), "
          f"restores per round {m['restores_per_round']:.2f} ({p['restores_per_round']:.2f}), "
          f"re-run tokens per round {m['rerun_tokens_per_round']:5.2f} "
          f"({p['rerun_tokens_per_round']:5.2f}); same tokens as greedy: {m['same_tokens_as_greedy']}")

# %%
# the explorer after the live run, as a plain figure saved with the notebook (the
# explorer itself needs a live kernel)
explorer.static_figure().show()

# %% [markdown]
# **Why is accepted / proposed below the slider's acceptance?** The slider sets α, the
# probability that *each* draft would pass on its own. Verification keeps drafts only up to the
# first rejection: draft i counts only if drafts 1..i all pass, which happens with probability
# $\alpha^i$. So a round accepts on average $E[k_{\mathrm{acc}}] = \sum_{i=1}^{k} \alpha^i$ of its k proposed
# drafts, and accepted / proposed $= E[k_{\mathrm{acc}}] / k$: below α for every k > 1, because the later drafts
# are the ones lost. The live run above has a dozen rounds, so its ratio scatters around that
# expectation; the same coin flips over many rounds (one per draft, as `SyntheticDrafter` draws
# them; no model needed) settle on it. Section 4 runs this relation backwards, from a measured
# accepted / proposed to α, for the trained draft model.

# %%
# NBVAL_CHECK_OUTPUT
a, k = explorer.acceptance, explorer.k
kept = [a**i for i in range(1, k + 1)]  # draft i survives only if drafts 1..i all pass
print(f"slider: acceptance {a:.2f} per draft, k = {k}")
print("probability that draft i is kept:", ", ".join(f"{p:.2f}" for p in kept))
print(f"expected accepted / proposed = {sum(kept):.2f} / {k} = {sum(kept) / k:.2f} "
      f"(cm.expected_accepted(k, a) / k = {cm.expected_accepted(k, a) / k:.2f})")
m = live["replay"]
print(f"measured in the live run: {m['accepted']}/{m['proposed']} = "
      f"{m['accepted'] / m['proposed']:.2f} over {m['rounds']:.0f} rounds")
coins = torch.rand(20_000, k, generator=torch.Generator().manual_seed(0)) < a
accepted = coins.int().cumprod(1).sum(1)  # a round stops at its first rejection
print(f"20,000 simulated rounds: {accepted.sum() / coins.numel():.3f}")

# %% [markdown]
# ## 3. The model against a live run
#
# The tiny model, 120 tokens, synthetic drafts. Counts of rounds and restores are random
# (a few dozen rounds), so they agree with the expectation up to sampling noise; the bytes the
# cache holds are predicted exactly.

# %%
# NBVAL_CHECK_OUTPUT
model = HybridLM(HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64,
                              n_groups=1), seed=0).eval()
prompt = torch.randint(0, 128, (1, 16))
for alpha in (0.5, 0.8, 0.95):
    for strategy in ("snapshot", "replay"):
        for r in speculative_vs_prediction(model, prompt, 120, k=4, acceptance=alpha, strategy=strategy):
            print(f"alpha {alpha} {strategy:8s} {r['quantity']:26s} predicted {r['predicted']:10.2f} "
                  f"measured {r['measured']:10.2f}  x{r['factor']:.2f}")

# %% [markdown]
# ## 4. A real draft model
#
# The sweeps above use a synthetic α. The trained pair in `data/models/` gives a measured
# acceptance (accepted / proposed) on held-out text. Under the model of section 1, which α gives
# the same accepted / proposed at k=4, and how many tokens per round does that predict? The
# measured tokens per round are 1 + accepted / rounds.
#
# On the prompts α was fitted on, that prediction is not a test: with k = 4 drafts a round,
# tokens per round = 1 + 4 x accepted / proposed both ways, so it equals the measurement by
# construction. So α is fitted on half of the 16 held-out files and the prediction is compared
# on the other half; then the α of all 16 predicts a live run on a prompt none of them contains
# (the next cell after), where restores per round ($1 - \alpha^k$, a rejection in the round) are
# a second quantity the fit never saw.

# %%
# NBVAL_CHECK_OUTPUT

import json
from pathlib import Path

from transformers.utils import logging as hf_logging

from replaylab.decoding import ModelDrafter, PromptLookupDrafter, greedy, speculative
from replaylab.generate import load_checkpoint, load_tokenizer

hf_logging.disable_progress_bar()  # no loading bars (they would be saved as widgets)
MODELS = Path("../data/models")
tok = load_tokenizer(MODELS / "replaylab-code-10m")
target = load_checkpoint(MODELS / "replaylab-code-10m")  # bf16 weights, fp32 on a CPU
draft = load_checkpoint(MODELS / "replaylab-code-draft")
measured = json.loads((MODELS / "metrics.json").read_text())["acceptance"]["summary"]

def alpha_for(rate, k=4):
    """The per-draft α whose expected accepted / proposed at draft length k equals ``rate``."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cm.expected_accepted(k, mid) / k < rate else (lo, mid)
    return (lo + hi) / 2


metrics = json.loads((MODELS / "metrics.json").read_text())["acceptance"]
files = sorted({r["prompt"] for r in metrics["rows"]})
fit_files, test_files = files[::2], files[1::2]  # alternate files: fit on one half, test on the other


def totals(drafter, names):
    rows = [r for r in metrics["rows"]
            if r["drafter"] == drafter and r["strategy"] == "replay" and r["prompt"] in names]
    return sum(r["accepted"] for r in rows), sum(r["proposed"] for r in rows)


print(f"{len(files)} held-out files: alpha fitted on {len(fit_files)}, tested on the other "
      f"{len(test_files)}")
alphas = {}
for drafter in ("draft model", "prompt lookup"):
    acc_fit, prop_fit = totals(drafter, fit_files)
    acc_test, prop_test = totals(drafter, test_files)
    alpha = alpha_for(acc_fit / prop_fit)
    alphas[drafter] = alpha_for(measured[f"{drafter} / replay"]["acceptance"])  # all 16 files
    print(f"{drafter:13s} fit half: accepted / proposed {acc_fit / prop_fit:.2f} -> alpha "
          f"{alpha:.2f}; other half: predicted {cm.expected_accepted(4, alpha) + 1:.2f} tokens per "
          f"round, measured {1 + acc_test / (prop_test / 4):.2f}")


# %% [markdown]
# The explorer's default α = 0.8 sits close to the trained draft model. A live run of the trained
# pair, with the draft model and with prompt lookup, under snapshot and replay, each beside what
# the α of the 16 held-out files predicts for it (out of sample: one prompt, 48 tokens, a dozen or
# so rounds, so expect sampling noise):

# %%
# NBVAL_CHECK_OUTPUT
code_prompt = torch.tensor([tok.encode("class Stack:\n    def __init__(self):\n").ids])
for s in ("snapshot", "replay"):
    for label, drafter in (("draft model", ModelDrafter(draft, s)),
                           ("prompt lookup", PromptLookupDrafter())):
        run = speculative(target, code_prompt, 48, drafter, k=4, cache=s)
        rounds = run.proposed / 4
        a = alphas[label]  # fitted on all 16 held-out files, none of them this prompt
        print(f"{s:9s} {label:13s} accepted {run.accepted:2d}/{run.proposed} = "
              f"{run.acceptance_rate:.2f}, {1 + run.accepted / rounds:.2f} tokens per round "
              f"(predicted {cm.expected_accepted(4, a) + 1:.2f}), {run.restores / rounds:.2f} "
              f"restores per round (predicted {1 - a**4:.2f})")

# %% [markdown]
# Out of sample the model is a guide, not a fit. Tokens per round carry over from one half of the
# files to the other closely for the draft model and poorly for prompt lookup: how often a file
# repeats itself varies much more from file to file than how well a draft model guesses. And the
# live runs restore less often than $1 - \alpha^4$ says: the model takes every draft as an
# independent coin, while real acceptances come in runs (an easy stretch of code accepts all four
# drafts, a hard one rejects early), so fewer rounds hold a rejection than independent coins of the
# same average would.

# %% [markdown]
# ## Summary
# * Tokens per round saturate with k; the speedup depends on α far more than on k beyond ~4.
# * Snapshot pays a copy per draft and a copy per rollback; recompute pays a forward of the
#   tokens from its last checkpoint to the kept position; replay pays neither, only a read of the
#   checkpoint per round.
# * The cost model predicts the peak the cache holds exactly (over a run long enough to reach
#   it) and the per-round counts within sampling noise.
#
# ## Exercises
# **1.** *(Optional on the 3-hour path.)* With the explorer's defaults (Nemotron-H 8B, batch 32, H200) at draft length `k=12`, what
# is the highest acceptance on the slider's grid (0.00, 0.05, ..., 1.00) at which recompute's
# predicted speedup is below 1? Find it with the sliders, or in code as
# `explorer.predictions` does it (at the explorer's starting batch 32 and L = 16): `cm.Workload(batch=explorer.batch, k=12,
# acceptance=..., interval=explorer.interval)`, then `cm.plain_decode_seconds_per_token` and
# `cm.predict` with `explorer.shape`, `explorer.hardware`, `explorer.n_params`.

# %% exercise="recompute_break_even" tags=["exercise"]
break_even_answer = None  # your answer: an acceptance on the 0.05 grid

# %%
exercises.check_recompute_break_even(break_even_answer);

# %% [markdown]
# **2.** *(Optional on both short paths.)* Acceptance often falls along the draft. If draft $i$ is accepted with probability
# $p_i$ = (0.9, 0.8, 0.6, 0.3) and a rejection ends the round, how many tokens does a round yield
# on average (the accepted drafts plus the target's own token)? Compute it without
# `cm.expected_accepted` (three decimals are enough); the check compares with it.

# %% exercise="tokens_per_round" tags=["exercise"]
tokens_per_round_answer = None  # your answer: a number

# %%
exercises.check_tokens_per_round(tokens_per_round_answer);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): with a falling acceptance like this, is a
# longer draft worth it? What would you measure to decide?
#
# ## References
# * Leviathan et al. (2023); Chen et al. (2023): speculative sampling.
# * "ReplaySSM: Cache SSM Inputs, Not State" (Dao AI Lab with NVIDIA, 2026): 1.87-1.96x
#   speculative decode reported in vLLM (vLLM pull requests #48018, #49847, #49887).
