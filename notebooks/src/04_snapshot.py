# %% [markdown]
# # 04 · Snapshot: pay in memory
#
# ## Overview
# The simplest way back to an earlier state is to have copied it. This notebook measures what
# that costs while speculating (a copy per draft position), shows how the cost grows with the
# draft length, and what happens when a byte budget forces copies out: which one to evict, and
# what restoring an evicted copy costs.
#
# **You will** measure what snapshots hold while speculating and how that grows with the draft length;
# put the cache under a byte budget and compare eviction policies; and **write the cost-aware
# eviction choice** the budget uses, checked against the library's on random lists.
#
# **Time:** about 30 minutes.
#
# ## Prerequisites
# Notebook 03 (the cache API and the three strategies).

# %% [markdown]
# ## Setup

# %%
import plotly.graph_objects as go
import torch

from replaylab.teaching import exercises
from replaylab.cache import HybridCache
from replaylab.teaching.experiments import budget_outcomes, snapshot_memory_vs_draft_length
from replaylab.model import HybridConfig, HybridLM
from replaylab.teaching.plotting import use_notebook_renderer

torch.manual_seed(0)
use_notebook_renderer()
model = HybridLM(HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64,
                              n_groups=1), seed=0).eval()
prompt = torch.randint(0, 128, (1, 16))

# %% [markdown]
# ## 1. What a snapshot holds
#
# `snapshot()` under the snapshot strategy copies every SSM layer's state and conv window. While
# the drafts are verified, the cache also keeps a copy after every verified token, so that
# `truncate_to` can land on any of them. The bytes, by component:

# %%
# NBVAL_CHECK_OUTPUT
cache = HybridCache(model, 1, "snapshot")
with torch.no_grad():
    model(prompt, cache)
    print("after the prompt:   ", cache.nbytes())
    handle = cache.snapshot()
    print("after snapshot():   ", cache.nbytes())
    model(torch.randint(0, 128, (1, 5)), cache)  # verify a pending token + 4 drafts
    print("after verifying k=4:", cache.nbytes())
    cache.truncate_to(handle.position + 2)       # 1 draft accepted
    cache.release(handle)
    print("after rollback:     ", cache.nbytes())

# %% [markdown]
# ## 2. Memory grows with the draft length

# %%
# NBVAL_CHECK_OUTPUT
rows = snapshot_memory_vs_draft_length(model, prompt, n_new=24, draft_lengths=[1, 2, 4, 8])
for r in rows:
    print(f"k={r['k']}: {r['strategy']:8s} peak {r['peak_bytes'] / 1024:7.1f} KiB")

# %%
fig = go.Figure()
for strategy in ("snapshot", "replay"):
    sel = [r for r in rows if r["strategy"] == strategy]
    fig.add_scatter(x=[r["k"] for r in sel], y=[r["peak_bytes"] / 1024 for r in sel],
                    name=strategy, mode="lines+markers")
fig.update_layout(xaxis_title="draft length k", yaxis_title="peak KiB held", height=350,
                  title="Snapshot keeps a state per draft position; replay keeps a log")
fig.show()

# %% [markdown]
# Snapshot's peak grows by one copy per extra draft. Replay's moves a little, and not always
# up: its log holds the layer's inputs since the last checkpoint (one every `interval` tokens,
# the function's default), so its peak depends on where the checkpoints fall among the rounds,
# which k shifts. It never holds a copy per draft.

# %% [markdown]
# ## 3. A byte budget and what to evict
#
# Give the cache a budget below what speculation needs. Past it, the cache evicts kept copies:
# **LRU** drops the least recently used; **cost** drops the one cheapest to rebuild (the fewest
# tokens from the next older copy). A restore of an evicted copy is never wrong: it re-runs the
# model from an older copy. The tokens stay equal to greedy decoding; what changes is the cost:

# %%
# NBVAL_CHECK_OUTPUT
outcomes = budget_outcomes(model, prompt, n_new=24, budget_fractions=[0.9, 0.7, 0.5])
for r in outcomes:
    print(f"budget {r['budget_fraction']:.0%} of peak, {r['policy']:4s}: evictions {r['evictions']:3d}, "
          f"rebuilt restores {r['fallback_restores']}, tokens re-run {r['recomputed_tokens']:3d}, "
          f"same tokens as greedy: {r['same_tokens']}")

# %%
fig = go.Figure()
for policy in ("lru", "cost"):
    sel = [r for r in outcomes if r["policy"] == policy]
    fig.add_bar(x=[f"{r['budget_fraction']:.0%}" for r in sel], y=[r["recomputed_tokens"] for r in sel],
                name=policy)
fig.update_layout(title="Tokens re-run after evictions, by policy and budget",
                  xaxis_title="budget (fraction of the unbudgeted peak)",
                  yaxis_title="tokens re-run to rebuild evicted states", barmode="group", height=350)
fig.show()

# %% [markdown]
# At 70% and 50% LRU evicts the copies it just made, exactly the ones a speculative round
# restores next; the cost-aware policy evicts copies that a neighbour can rebuild in a token or two.
#
# **Why does the cost-aware policy rebuild 2 copies at 90% where LRU rebuilds none?** A round
# keeps its snapshot handle (taken before the verify) and one copy per verified position, all
# touched by the verify forward *after* the handle. At 90% one eviction per round is enough.
# LRU drops the least recently touched copy, the round's handle, and the rounds here roll back
# with `truncate_to` to a per-position copy (at least the pending token is kept), never to the
# handle: nothing it dropped is asked for. The cost policy scores a copy by the tokens from the
# next older copy (`cache.choose_victim`): the copy one position after the handle scores 1, the
# lowest, so it goes first. In the rounds where every draft was rejected, that is exactly the
# position the round rolls back to, and the cache re-runs one token from the handle: twice here,
# one token each. Cheapest to rebuild is not the same as least likely to be needed.
#
# ## 4. Build it: the cost-aware choice
#
# *Optional on both short paths (the 3-hour path skips 04, the 1-day path stops after section 3).*
#
# When the budget is exceeded, the cache asks its store for the copies it may drop, each an
# `EvictionItem(key, position, nbytes, last_used)`, and picks one. A list of that kind:

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.strategies.base import EvictionItem

# equal sizes: the choice depends on positions and recency only
example = [EvictionItem("copy@16", 16, 1, 3), EvictionItem("copy@17", 17, 1, 5),
           EvictionItem("copy@18", 18, 1, 4), EvictionItem("copy@12", 12, 1, 1)]
for item in example:
    print(item)


# %% [markdown]
# **Your turn.** Write the "cost" policy: evict the copy that is cheapest to rebuild, i.e. with the
# fewest tokens between its position and the next *older* kept copy (from position 0 when none is
# older: a rebuild re-runs the model from there). Break ties by evicting the least recently used
# (smallest `last_used`). Return the item's `key`.

# %% exercise="cost_eviction" tags=["exercise"]
def cheapest_to_rebuild(items):
    """items: a list of EvictionItem(key, position, nbytes, last_used), positions distinct.
    Returns the key of the item with the fewest tokens back to the next older kept position
    (0 if none is older); ties: the smallest last_used."""
    raise NotImplementedError


# %%
exercises.check_cost_eviction(cheapest_to_rebuild);

# %% [markdown]
# The library's version is `replaylab.cache.choose_victim(items, "cost")`; the budget runs of
# section 3 used it, and nothing below depends on yours. On the example list it evicts:

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.cache import choose_victim

print(choose_victim(example, "cost"))

# %% [markdown]
# copy@17 and copy@18 are each one token from an older copy: the tie goes to copy@18, used
# less recently.
#
# ## Summary
# * A snapshot costs a full state copy per SSM layer; speculation keeps one per draft position.
# * Memory grows linearly with the draft length; restoring is a copy.
# * Under a budget, the eviction policy decides how much recomputation the budget costs: the
#   cheapest copy to drop is the one a neighbour rebuilds in the fewest tokens.
#
# ## Exercises
# **1.** *(Optional on both short paths.)* `budget_outcomes` takes `acceptance=`. Run it with `n_new=24,
# budget_fractions=[0.9, 0.7, 0.5], acceptance=0.9`. What is the largest number of evictions any
# policy makes at any of these budgets, and the largest number of tokens any policy re-runs?

# %% exercise="rerun_high_acceptance" tags=["exercise"]
rerun_answer = None  # your answer: a pair of integers (evictions, tokens re-run)

# %%
exercises.check_rerun_at_high_acceptance(rerun_answer, model, prompt);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): compare with the acceptance 0.5 rows of
# section 3. The cache still evicts at acceptance 0.9: why does a high acceptance make the
# choice of policy matter so much less?
#
# **2.** *(Optional on both short paths.)* How many bytes does one snapshot of one sequence cost for this model? Compute it from
# `model.cfg` (`ssm_layers`, `ssm_heads`, `ssm_head_dim`, `d_state`, `n_groups`, `d_conv`): every
# SSM layer's fp32 state plus its conv window of `d_conv - 1` inputs over `H*P + 2*G*N` channels
# in the model's dtype (`model.cfg` holds no dtype: `next(model.parameters()).element_size()`
# gives its bytes a value). `cfg.ssm_layers` is a list of layer indices: count it with `len`.
# Compare with the numbers of section 1.

# %% exercise="copy_bytes" tags=["exercise"]
copy_bytes_answer = None  # your answer: an integer number of bytes

# %%
exercises.check_snapshot_copy_bytes(copy_bytes_answer, model);

# %% [markdown]
# ## References
# * Marconi (2025) and SGLang's MambaRadixCache: which SSM states to keep under a budget.
# * Griewank & Walther, *revolve*: optimal checkpoint placement.
