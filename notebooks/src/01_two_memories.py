# %% [markdown]
# # 01 · The two memories of a hybrid model
#
# ## Overview
# A hybrid language model mixes attention layers with state-space (Mamba) layers. While it
# decodes, each kind keeps a different memory of the past:
#
# * an **attention layer** keeps a *KV cache*: one row of keys and values per token. It grows
#   with the context, and because every row belongs to one position, it can be cut, shared and
#   trimmed like a list;
# * a **state-space layer** keeps a *recurrent state* of fixed size. Token *t* overwrites the
#   state of token *t − 1*: there is no row for "position 3" to go back to.
#
# This notebook puts the two side by side on small real tensors, measures what each costs per
# sequence for published hybrid models, and shows why branching (beam search, speculative
# decoding, best-of-n) is cheap for the first and expensive for the second.
#
# **Time:** about 20 minutes.
#
# ## Prerequisites
# Python and a little PyTorch (tensors, shapes). No GPU needed; everything runs in seconds.

# %% [markdown]
# ## Setup

# %%
import torch

from replaylab.kv import LayerKV
from replaylab.scan import ssd_step
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence, snapshot_in_kv_tokens
from replaylab.teaching.plotting import use_notebook_renderer, memory_vs_context_figure
from replaylab.teaching import exercises

torch.manual_seed(0)
use_notebook_renderer()

# %% [markdown]
# ## 1. A KV cache is a list you can edit
#
# `LayerKV` holds the keys and values of one attention layer for a batch of *branches*.
# Appending a token adds one row per branch; truncating drops a suffix; forking makes each
# branch into several that **share** the prefix instead of copying it.

# %%
# NBVAL_CHECK_OUTPUT
kv = LayerKV(batch=1, kv_heads=2, head_dim=8, block=8)
for _ in range(6):  # six tokens of a prompt, one at a time
    kv.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
print("positions held:", kv.length, "| bytes allocated:", kv.nbytes())

kv.truncate_to(4)  # a rejected draft: drop positions 4 and 5
print("after truncate_to(4):", kv.length)

kv.fork(3)  # three continuations of one prefix: the prefix is stored once
print("after fork(3): branches", kv.batch, "| bytes allocated:", kv.nbytes())

kv.append(torch.randn(3, 2, 1, 8), torch.randn(3, 2, 1, 8))  # each branch writes its own token
keys, values = kv.keys_values()
print("keys as attention sees them:", tuple(keys.shape))

# %% [markdown]
# Each operation above is bookkeeping: a length changes, a row map is shared. The
# attention layer never loses information, because every past position still has its row.

# %% [markdown]
# ## 2. A recurrent state is overwritten
#
# A Mamba-2 layer keeps a state $S$ of shape `(H, P, N)` per sequence and updates it with
# every token: $S_t = e^{\Delta_t A} S_{t-1} + \Delta_t\, x_t B_t^\top$. After the update the
# old state is gone. Side by side with the KV cache of section 1 (a diagram, drawn by
# `replaylab.teaching.diagrams`):

# %%
from replaylab.teaching.diagrams import memory_diagram

memory_diagram(steps=(2, 4, 8)).show()

# %% [markdown]
# The KV cache can be cut back to any row; the state block has no rows to cut. Let us decode
# six tokens and try to get back to position 4.

# %%
H, P, N, G = 4, 8, 16, 2
A = -torch.rand(H)
state = torch.zeros(1, H, P, N)
inputs = [dict(x=torch.randn(1, H, P), dt=torch.rand(1, H), B=torch.randn(1, G, N),
               C=torch.randn(1, G, N)) for _ in range(6)]
kept = []
for token in inputs:
    y, state = ssd_step(state, A=A, **token)
    kept.append(state.clone())  # only because we *chose* to copy it

# %%
# NBVAL_CHECK_OUTPUT
print("state shape:", tuple(state.shape), "- the same after 6 tokens as after 1")
print("state after 6 tokens equals state after 4?", torch.equal(state, kept[3]))
print("bytes of one state copy:", state.numel() * state.element_size())

# %% [markdown]
# To return to position 4 (the state after 4 tokens, `kept[3]`) we needed a copy taken there
# (a *snapshot*), or an older kept state and the tokens since it, to run the recurrence again
# from there (*recompute*; from the zero state that is tokens 1-4), or the small per-token
# inputs of the layer since a checkpoint (*replay*). The rest of the sequence
# is about those three choices.

# %% [markdown]
# ## 3. What each memory costs per sequence
#
# The dimensions of four published hybrids, written from their configurations (the
# `source` field names where each comes from):

# %%
# NBVAL_CHECK_OUTPUT
MIB = 2**20
for shape in PUBLISHED_SHAPES.values():
    m = memory_per_sequence(shape, context_len=8192)
    print(f"{shape.name:14s} {shape.n_attn:2d} attention + {shape.n_ssm:2d} {shape.ssm_form} layers | "
          f"at 8K tokens: KV {m['kv'] / MIB:6.1f} MiB, SSM state {m['ssm_state'] / MIB:6.1f} MiB, "
          f"conv state {m['conv_state'] / MIB:4.2f} MiB")

# %%
memory_vs_context_figure([256, 1024, 4096, 16384, 65536, 262144]).show()

# %% [markdown]
# The recurrent state is a fixed cost per sequence: its column is the same at any context.
# In steady decoding that is the strength of these models: where only a few layers attend
# (Nemotron-H, Bamba, Jamba) the KV grows slowly, and the state does not grow at all. At 8K
# tokens the KV already outweighs the state in all but Bamba, and Falcon-H1, with an attention
# layer beside every Mamba layer, holds over two and a half times as much KV as state. The state's
# weight shows when it has to be copied (section 4).

# %% [markdown]
# ## 4. Why branching hurts the recurrent state
#
# Branching needs *the state at an earlier position*. For the KV cache that is a length. For
# the recurrent state it is a full copy. How many tokens of KV cost as much as **one** copy
# of a sequence's recurrent state (fp32 state, bf16 KV)?

# %%
# NBVAL_CHECK_OUTPUT
for shape in PUBLISHED_SHAPES.values():
    print(f"{shape.name:14s} one state snapshot = {snapshot_in_kv_tokens(shape):7,.0f} tokens of KV")


# %% [markdown]
# Speculative decoding with 4 drafts that keeps a state per draft, or beam search with 4
# beams that each keep their own state, multiplies that copy. For Nemotron-H 8B a single
# snapshot weighs as much as six thousand tokens of KV cache: branching makes the smallest
# memory of the model the most expensive one to keep.

# %% [markdown]
# ## Summary
# * The KV cache is addressable by position: truncate, share and fork are bookkeeping.
# * The recurrent state is fixed-size and overwritten each token; rolling it back needs a copy,
#   a recomputation, or a log of inputs.
# * Per sequence, one state copy of a published hybrid costs as much as hundreds to thousands of
#   tokens of KV (section 4's table: Jamba's Mamba-1 state is the small one).
#
# ## Exercises
# **1.** *(Optional on the 3-hour path.)* Compute by hand the bytes of Nemotron-H 8B's conv state per sequence (bf16, all SSM
# layers). The conv state keeps the last `d_conv - 1` inputs of each conv channel; a Mamba-2
# conv runs over `H*P + 2*G*N` channels. Use `PUBLISHED_SHAPES["Nemotron-H 8B"]`.

# %%
def conv_state_bytes():
    shape = PUBLISHED_SHAPES["Nemotron-H 8B"]
    return None  # your answer here

exercises.check_conv_state_bytes(conv_state_bytes());


# %% [markdown]
# **2.** *(Optional on the 3-hour path.)* Write `truncate(keys, p)` for a plain key tensor `(batch, Hkv, T, Dh)` that keeps
# positions `[0, p)`. (It is one line; that is the point.)

# %%
def truncate(keys, p):
    return None  # your answer here

exercises.check_kv_truncate(truncate);

# %% [markdown]
# ## References
# * Mamba-2 and the SSD form: Dao & Gu, *Transformers are SSMs* (2024).
# * Model shapes: the published configurations of NVIDIA Nemotron-H 8B, IBM Bamba 9B,
#   TII Falcon-H1 7B and AI21 Jamba v0.1 (see `replaylab.shapes`).
# * Next: `02_selective_scan.ipynb` builds the recurrence from scratch.
