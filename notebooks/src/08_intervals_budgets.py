# %% [markdown]
# # 08 · Checkpoint interval, state budgets and eviction
#
# ## Overview
# How often to keep a state, and what to drop when memory runs out. First the offline optimum:
# Griewank's binomial checkpointing says how few recomputations any schedule can get away with
# for a given number of kept states; a fixed interval is compared against it. Then a memory
# budget: how many sequences each strategy fits. Last, a live eviction: drop a kept state and
# pay to rebuild it.
#
# **You will** compare a fixed checkpoint interval with Griewank's optimum, count how many
# sequences each strategy fits in a memory budget, evict a state live and rebuild it; then answer
# two checked questions.
#
# **Time:** about 30 minutes.
#
# ## Prerequisites
# Notebooks 04 and 05.

# %% [markdown]
# ## Setup

# %%
import torch

from replaylab import costmodel as cm
from replaylab.teaching import exercises
from replaylab.cache import HybridCache
from replaylab.model import HybridConfig, HybridLM
from replaylab.teaching.plotting import use_notebook_renderer
from replaylab.teaching.widgets import BudgetExplorer, IntervalExplorer

torch.manual_seed(0)
use_notebook_renderer()

# %% [markdown]
# ## 1. The interval against the optimum
#
# Visit all states of an $n$-step chain in reverse (the hardest case: every rollback target
# once), keeping at most $r$ states at a time, the start included. Griewank's binomial
# checkpointing (the `revolve` schedule) needs the fewest forward steps any schedule can:
#
# $$\mathrm{cost}(n, r) = \tau\,n - \binom{r+\tau}{r+1}, \qquad
# \tau = \min\Big\{\tau : \binom{r+\tau}{r} \ge n\Big\}.$$
#
# It is the closed form of a recursion: advance $i$ steps and keep a state there, reverse the last
# $n - i$ with one state fewer, then reverse the first $i$,
#
# $$\mathrm{cost}(n, r) = \min_{1 \le i < n} \big[\, i + \mathrm{cost}(n - i, r - 1) + \mathrm{cost}(i, r) \,\big],
# \qquad \mathrm{cost}(n, 1) = \tfrac{n(n-1)}{2},$$
#
# which `cm.revolve_cost(n, r - 1)` computes (its argument counts the states besides the start).
# The closed form in four lines, against the recursion:

# %%
# NBVAL_CHECK_OUTPUT
from math import comb


def revolve_closed_form(n, r):
    tau = 0
    while comb(r + tau, r) < n:  # the smallest tau with C(r + tau, r) >= n
        tau += 1
    return tau * n - comb(r + tau, r + 1)


same = all(revolve_closed_form(n, r) == cm.revolve_cost(n, r - 1)
           for n in range(1, 129) for r in range(1, 9))
print("closed form == recursion for n <= 128, r <= 8:", same)
print("n = 64, r = 1..6:", [revolve_closed_form(64, r) for r in range(1, 7)], "forward steps")

# %% [markdown]
# A fixed interval against the optimum at its own memory: within a small factor, the
# largest in the middle of the range (exercise 1 asks where):

# %%
# NBVAL_CHECK_OUTPUT
n = 64
for interval in (2, 4, 8, 16, 32):
    t = cm.interval_tradeoff(n, interval)
    best = cm.revolve_cost(n, t["states_kept"] - 1) / n
    print(f"interval {interval:2d}: {t['states_kept']:2d} states kept, {t['steps_per_restore']:5.2f} "
          f"steps per restore; optimum with as many states {best:5.2f}")

# %%
IntervalExplorer(n=64, interval=8)

# %% [markdown]
# ## 2. How many sequences fit
#
# Nemotron-H 8B, 8K tokens of context, speculating with k=4, in 80 GB (an H100's memory; the
# slider goes up to an H200's 141 GB). The budget covers weights, KV, states, copies,
# checkpoints and logs together:

# %%
# NBVAL_CHECK_OUTPUT
budget = BudgetExplorer(budget_gb=80)
print(budget.fits())

# %%
budget

# %% [markdown]
# ## 3. Live: evict a state, rebuild it
#
# The tiny model under the snapshot strategy takes two snapshots, at positions 12 and 18. The
# store also keeps a copy after each token of the last forward (so that `truncate_to` can land on
# any of them): the cell lists every copy it holds. A budget just below what it holds forces one
# out, by default the least recently used. Restoring it is still exact: the cache re-runs the
# model from the start and reports the cost.

# %%
# NBVAL_CHECK_OUTPUT
model = HybridLM(HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64,
                              n_groups=1), seed=0).eval()
cache = HybridCache(model, 1, "snapshot")
with torch.no_grad():
    model(torch.randint(0, 128, (1, 12)), cache)
    first = cache.snapshot()
    model(torch.randint(0, 128, (1, 6)), cache)
    second = cache.snapshot()
    model(torch.randint(0, 128, (1, 3)), cache)
    print("held:", cache.nbytes())
    print("copies held (key, position):", [(c.key, c.position) for c in cache.ssm.evictable()])
    cache.set_budget(cache.total_bytes() - 1)
    print("after squeezing the budget:", cache.nbytes(), "| evictions:", cache.stats.evictions)
    print("evicted (key: position):", cache.ssm.evicted)
    cache.set_budget(None)
    cache.restore(first)
    fresh = HybridCache(model, 1, "snapshot")
    model(cache.tokens, fresh)
h_restored = cache.state(0).ssm
h_fresh = fresh.state(0).ssm
print("rebuilt restores:", cache.stats.fallback_restores, "| tokens re-run:", cache.stats.recomputed_tokens)
print("state equals a fresh prefill:", torch.allclose(h_restored, h_fresh, atol=1e-5))

# %% [markdown]
# ## 4. The best log length depends on the workload
#
# Section 1 chose one interval for one workload. The best checkpoint interval is not the same for
# every workload, best-of-n and beam search in particular; for replay's log length L the reason is
# visible in three terms. Every generated token reads the checkpoint and on average L/2 log
# entries (grows with L); a fold of L entries, reading and writing the state, is paid every L
# tokens (its share falls with L). The workloads differ in what else they pay
# (`cm.log_length_cost`):
#
# * **best-of-n**: samples fork once and never reorder: $S + (L/2 + 1)\,e + (2S + Le)/L$;
# * **beam search**: every step reorders the beams and a beam takes its parent's log, about
#   L/2 entries copied (read and written): $L\,e$ more per token, so a shorter log pays;
# * **speculative**: the log is read once per round for the $1 + E[k_{\mathrm{acc}}]$ tokens the round keeps,
#   so a longer log pays.
#
# With $S$ the state's bytes and $e$ one token's log entries, the optima are
# $2\sqrt{S/e}$, $\sqrt{4S/(3e)}$ and $2\sqrt{S\,(1+E[k_{\mathrm{acc}}])/e}$. For Nemotron-H 8B's shape
# (k = 4, α = 0.8):

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.teaching.plotting import log_length_per_workload_figure
from replaylab.shapes import PUBLISHED_SHAPES

nemo = cm.model_costs(PUBLISHED_SHAPES["Nemotron-H 8B"], cm.Workload(), 8.1e9)
lengths = range(2, 257)
curves = {w: [(L, cm.log_length_cost(nemo, w, L)) for L in lengths] for w in cm.WORKLOADS}
optima = {w: cm.best_log_length(nemo, w, lengths) for w in cm.WORKLOADS}
ratio, tpr = nemo.S / nemo.log_token, 1 + cm.expected_accepted(4, 0.8)
closed = {"best-of-n": 2 * ratio**0.5, "beam search": (4 * ratio / 3) ** 0.5,
          "speculative": 2 * (ratio * tpr) ** 0.5}
for w in cm.WORKLOADS:
    at16 = cm.log_length_cost(nemo, w, 16) / cm.log_length_cost(nemo, w, optima[w])
    print(f"{w:12s} best L = {optima[w]:3d} (closed form {closed[w]:5.1f}); "
          f"{cm.log_length_cost(nemo, w, optima[w]) / 2**20:6.1f} MiB per token; L = 16 costs {at16:.2f}x that")

# %%
log_length_per_workload_figure(curves, optima).show()  # each curve / its own minimum

# %% [markdown]
# **Why can replay hold more than recompute?** Replay holds up to L - 1 log entries; recompute
# holds about two checkpoints (state and conv window each). Replay holds more once (L - 1) e
# exceeds that: above L = 2 (S + W) / e + 1. The ratio S / e sets it: large for a real model,
# small for the tiny one, whose state is small next to a log entry. So on the tiny model replay
# catches up with recompute at small L (notebook 05 measures L = 32, where replay already holds
# more: recompute's peak there held one checkpoint, not the two this bound allows), while
# Nemotron-H 8B's log would need about 200 entries to hold as much as two checkpoints:

# %%
# NBVAL_CHECK_OUTPUT
tiny = cm.model_costs(cm.shape_from_config(model.cfg), cm.Workload(act_bytes=4), 0)
for name, m in (("Nemotron-H 8B", nemo), ("this notebook's tiny model (fp32)", tiny)):
    print(f"{name:34s} state / one token's log = {m.S / m.log_token:5.1f}; replay holds more than two "
          f"checkpoints above L = {cm.held_crossover_interval(m):.0f}")

# %% [markdown]
# ## Summary
# * A fixed interval is within a small factor of the offline optimum at equal memory.
# * Under one memory budget, replay fits the most sequences while speculating: it keeps one
#   state and a log, not a copy per draft.
# * The best log length is a property of the workload, not of the model alone: beam search
#   wants a shorter log than best-of-n, speculative decoding a longer one (section 4).
# * Eviction never yields a wrong state: an evicted copy is rebuilt by re-running the model,
#   and the cache counts what that cost.
#
# ## Exercises
#
# *Both short paths (00, *Time budgets and two short paths*) skip this notebook: these exercises are optional there.*
# **1.** Of the intervals in section 1's table (2, 4, 8, 16, 32), at which is the fixed schedule's
# steps per restore the *largest multiple* of the optimum with as many states kept? Compute the
# ratios with `cm.interval_tradeoff` and `cm.revolve_cost`.

# %% exercise="worst_interval" tags=["exercise"]
worst_interval_answer = None  # your answer: one of 2, 4, 8, 16, 32

# %%
exercises.check_worst_interval(worst_interval_answer);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): why is the fixed interval furthest from the
# optimum there, and not at the smallest or the largest interval?
#
# **2.** Re-run section 3 with `HybridCache(model, 1, CacheConfig("snapshot", eviction="cost"))`
# (`from replaylab.cache import CacheConfig`). At which position is the copy the cost policy
# evicts (`cache.ssm.evicted`), and how many tokens does `restore(first)` re-run?

# %% exercise="cost_eviction_scenario" tags=["exercise"]
eviction_answer = None  # your answer: {"evicted_position": an integer, "tokens_rerun": an integer}

# %%
exercises.check_cost_eviction_scenario(eviction_answer, model);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): why does the cost policy not evict either
# snapshot, and what does that save `restore(first)`?

# %% [markdown]
# **3.** For Bamba 9B's shape (`PUBLISHED_SHAPES["Bamba 9B"]`), what log length makes beam
# search cheapest (section 4's `cm.best_log_length` over L = 2..256)? Is it `"longer"` or
# `"shorter"` than Nemotron-H 8B's? (Compare `m.S / m.log_token` of the two.)

# %% exercise="beam_log_length" tags=["exercise"]
beam_log_length_answer = None  # your answer: (L, "longer" or "shorter")

# %%
exercises.check_beam_log_length(beam_log_length_answer);

# %% [markdown]
# ## References
# * Griewank (1992), *Achieving logarithmic growth of temporal and spatial complexity in reverse
#   automatic differentiation*; Griewank & Walther (2000), *revolve*.
# * Marconi (2025); SGLang MambaRadixCache: admission and eviction of SSM states.
