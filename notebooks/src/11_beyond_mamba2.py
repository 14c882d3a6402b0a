# %% [markdown]
# # 11 · Beyond Mamba-2: Mamba-1 (Jamba) and Gated DeltaNet (Qwen3-Next, Qwen3.5)
#
# ## Overview
# The hybrids served today are not only Mamba-2 models. Jamba interleaves attention with
# **Mamba-1** layers, whose decay is per channel *and* per state entry. Qwen3-Next and Qwen3.5
# interleave it with **Gated DeltaNet**, a delta rule whose state transition is not diagonal at
# all. This notebook carries replay over to both: the same cache API, the same three strategies,
# and the same one-read property for outputs, by a different route for the delta rule.
#
# **You will** compare the three update rules side by side; see why Mamba-2 has a closed form for
# outputs from a checkpoint, and how the *backward query recursion* gives a delta rule the same
# one-read property; load tiny Jamba, Qwen3-Next and Qwen3.5 models from transformers and decode
# them under every strategy; count state bytes against log-entry bytes at published shapes; weigh
# a fold against a snapshot copy; find where Gated DeltaNet replay stops paying; see the log the GPU kernels keep instead (the
# *corrected update*) and their H200 numbers against flash-linear-attention; **write the
# chunked (WY / UT) fold** of a delta rule, checked against the token loop, **write the
# replay step as a Triton kernel**, checked for its traffic, and **write Mamba-1's snapshot
# step** as one too.
#
# **Time:** about 85 minutes.
#
# ## Prerequisites
# Notebooks 02 (the selective scan), 05 (recompute vs replay) and 06 (the replay kernel).

# %% [markdown]
# ## Setup

# %%
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

import replaylab  # first: without a GPU it switches Triton's interpreter on
import triton
import triton.language as tl
from replaylab import families
from replaylab.teaching.exercises_families import (check_chunked_fold, check_gdn_step_kernel,
                                                   check_s6_step_kernel)
from replaylab.teaching.plotting import use_notebook_renderer
from replaylab.results import load_bench
from replaylab.scan import (
    gdn_chunked_scan,
    gdn_replay_outputs,
    gdn_scan,
    gdn_step,
    s6_step,
    ssd_step,
)

torch.manual_seed(0)
use_notebook_renderer()

# %% [markdown]
# ## 1. Three update rules side by side
#
# One token, one layer; $S$ is the recurrent state.
#
# | family | state | update | output |
# |---|---|---|---|
# | Mamba-2 (Nemotron-H, Bamba) | $(H, P, N)$ | $S_t = a_t\,S_{t-1} + \Delta_t x_t B_t^\top$, $a_t = e^{\Delta_t A}$ **one scalar per head** | $y_t = S_t C_t + D x_t$ |
# | Mamba-1 (Jamba) | $(d_{\mathrm{in}}, N)$ | $S_t = e^{\Delta_t \odot A} \odot S_{t-1} + \Delta_t x_t B_t^\top$: **elementwise** decay over $(d_{\mathrm{in}}, N)$ | $y_t = S_t C_t + D x_t$ |
# | Gated DeltaNet (Qwen3-Next, Qwen3.5) | $(H, K, V)$ | $S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top$: a **$K \times K$ matrix** per head | $o_t = S_t^\top q_t$ |
#
# The Gated DeltaNet update first decays the state, then *corrects* what it predicts for $k_t$
# towards $v_t$ by a step $\beta_t$ (the delta rule). Its transition $\alpha_t(I - \beta_t k_t
# k_t^\top)$ is the identity minus a rank-one matrix: not diagonal. Here is one step of each, and
# the size of the transition each applies to the state:

# %%
# NBVAL_CHECK_OUTPUT
g = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731

# Mamba-2: H=4 heads of width P=8, state N=16, G=1 group
y2, S2 = ssd_step(r(1, 4, 8, 16), r(1, 4, 8), r(1, 4), -torch.rand(4), r(1, 1, 16), r(1, 1, 16),
                  dt_softplus=True)
# Mamba-1: d_in=32 channels, state N=16
y1, S1 = s6_step(r(1, 32, 16), r(1, 32), r(1, 32), -torch.rand(32, 16), r(1, 16), r(1, 16),
                 dt_softplus=True)
# Gated DeltaNet: Hk=2 key heads, H=4 value heads, K=8, V=8
q, k = F.normalize(r(1, 2, 8), dim=-1) * 8**-0.5, F.normalize(r(1, 2, 8), dim=-1)
o, Sg = gdn_step(r(1, 4, 8, 8), q, k, r(1, 4, 8), -torch.rand(1, 4), torch.rand(1, 4))

kt, beta, alpha = k[0, 0], 0.7, 0.9
transition = alpha * (torch.eye(8) - beta * torch.outer(kt, kt))
off_diagonal = int((transition - torch.diag(transition.diagonal())).abs().gt(1e-9).sum())
print(f"Mamba-2 state {tuple(S2.shape)}: transition = 1 scalar per head")
print(f"Mamba-1 state {tuple(S1.shape)}: transition = {32 * 16} scalars, one per state entry")
print(f"GDN     state {tuple(Sg.shape)}: transition = a 8x8 matrix per head, "
      f"{off_diagonal} of 56 off-diagonal entries non-zero")

# %% [markdown]
# ## 2. Outputs from a checkpoint with one read of it
#
# **Why Mamba-2 has a closed form.** Scalars commute, so unrolling $j$ steps from a checkpoint
# $S_c$ gives
#
# $$S_{c+j} = \Big(\prod_{s \le j} a_s\Big) S_c + \sum_{s \le j} \Big(\prod_{s < u \le j} a_u\Big)\,
# \Delta_s x_s B_s^\top, \qquad y_{c+j} = S_{c+j} C_{c+j} + D x_{c+j}.$$
#
# The output reads $S_c$ once, times a prefix product, plus a sum over the logged inputs: no
# state is written (notebook 06 turns this into a kernel). **Mamba-1** keeps the same form
# elementwise: every one of the $d_{\mathrm{in}} \times N$ entries has its own product of decays
# (`replaylab.scan.s6_replay_outputs`).
#
# **A delta rule** has no such product: the matrices $\alpha_s(I - \beta_s k_s k_s^\top)$ do not
# commute, and multiplying them out would build $K \times K$ matrices per token. But an output
# needs only $S_t^\top q$, a vector, and $S_t$ is linear in $S_{t-1}$:
#
# $$S_t^\top q = S_{t-1}^\top \underbrace{\alpha_t (q - \beta_t k_t (k_t^\top q))}_{q'} +
# \beta_t (k_t^\top q)\, v_t .$$
#
# So carry the *query* backward through the log, $q \leftarrow \alpha_s(q - \beta_s k_s (k_s^\top
# q))$, accumulating $\beta_s (k_s^\top q)\, v_s$ at each step, and finish with one read of the
# checkpoint: $o_t = \text{acc} + S_c^\top q$. Work $O(L(K + V))$ per head for a log of $L$
# tokens, no state written. For one head and one new token, line by line, against the forward
# recurrence that writes a state per token:

# %%
# NBVAL_CHECK_OUTPUT
g1 = torch.Generator().manual_seed(3)
K_, V_, n_log = 16, 8, 24  # key and value widths, logged tokens (the new one is the last)
rnd = lambda *s: torch.randn(*s, generator=g1, dtype=torch.float64)  # noqa: E731
S0 = rnd(K_, V_)  # the checkpoint S_c of one head
keys, vals = F.normalize(rnd(n_log + 1, K_), dim=-1), rnd(n_log + 1, V_)
alphas = torch.rand(n_log + 1, generator=g1, dtype=torch.float64)  # decays α_s
betas = torch.rand(n_log + 1, generator=g1, dtype=torch.float64)  # steps β_s
query = rnd(K_)

S = S0.clone()  # forward: S_s = α_s (I - β_s k_s k_sᵀ) S_{s-1} + β_s k_s v_sᵀ, a state per token
for k_s, v_s, a_s, b_s in zip(keys, vals, alphas, betas):
    S = a_s * (S - b_s * torch.outer(k_s, k_s @ S)) + b_s * torch.outer(k_s, v_s)
o_forward = S.T @ query

q, acc = query.clone(), torch.zeros(V_, dtype=torch.float64)  # backward: newest token first
for k_s, v_s, a_s, b_s in zip(keys.flip(0), vals.flip(0), alphas.flip(0), betas.flip(0)):
    kq = k_s @ q
    acc += b_s * kq * v_s  # accumulate β_s (k_sᵀ q) v_s
    q = a_s * (q - b_s * kq * k_s)  # q ← α_s (q - β_s k_s (k_sᵀ q))
o_backward = acc + S0.T @ q  # the one read of the checkpoint
print("backward recursion == forward recurrence within 1e-12:",
      bool((o_backward - o_forward).abs().max() < 1e-12))


# %% [markdown]
# The library's version (`replaylab.scan.gdn_replay_outputs`, any batch, heads and number of new
# tokens), checked against the forward recurrence in float64:

# %%
# NBVAL_CHECK_OUTPUT
def gdn_inputs(T, Hk=2, H=4, K=16, V=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return dict(
        q=F.normalize(r(1, T, Hk, K), dim=-1) * K**-0.5,
        k=F.normalize(r(1, T, Hk, K), dim=-1),
        v=r(1, T, H, V),
        g=-torch.rand(1, T, H, generator=g, dtype=torch.float64),
        beta=torch.rand(1, T, H, generator=g, dtype=torch.float64),
    )


L, T_new = 24, 3
p = gdn_inputs(L + T_new)
checkpoint = torch.randn(1, 4, 16, 8, dtype=torch.float64)
forward = gdn_scan(*p.values(), initial_state=checkpoint, compute_dtype=torch.float64).y[:, L:]
log = {f: p[f][:, :L] for f in ("k", "v", "g", "beta")}
new = {f: t[:, L:] for f, t in p.items()}
version = checkpoint._version  # bumped by any in-place write
backward = gdn_replay_outputs(checkpoint, log, new, compute_dtype=torch.float64)
print("outputs of 3 new tokens after a log of 24: backward == forward within 1e-12:",
      bool((backward - forward).abs().max() < 1e-12))
print("checkpoint written:", checkpoint._version != version)

# %% [markdown]
# The library's Gated DeltaNet spec uses exactly this as its `outputs` (and Mamba-1's spec the
# closed form): with `use_kernels=True` a replay cache computes every decode and verify output
# from checkpoint + log this way. Below, tiny Jamba, Qwen3-Next and Qwen3.5 models built by
# transformers (random weights, dense MLPs) are loaded into replaylab; their logits equal
# transformers', and greedy decoding under each strategy gives transformers' own greedy tokens.

# %%
# NBVAL_CHECK_OUTPUT
from transformers import (
    JambaConfig,
    JambaForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.utils import logging as hf_logging

from replaylab.cache import CacheConfig, HybridCache
from replaylab.decoding import greedy
from replaylab.model import load_transformers_hybrid

hf_logging.set_verbosity_error()
gdn_dims = dict(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=48, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)
builders = {
    "Jamba (dense)": lambda: JambaForCausalLM(JambaConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=4, attn_layer_period=4,
        attn_layer_offset=1, num_experts=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, mamba_d_state=8, mamba_expand=2, mamba_dt_rank=8)),
    "Qwen3-Next (dense)": lambda: Qwen3NextForCausalLM(
        Qwen3NextConfig(mlp_only_layers=[0, 1, 2, 3], **gdn_dims)),
    "Qwen3.5 (text)": lambda: Qwen3_5ForCausalLM(Qwen3_5TextConfig(**gdn_dims)),
}
prompt = torch.tensor([[3, 7, 1, 3, 7, 2, 9, 3, 7]])
tiny = {}
for name, build in builders.items():
    torch.manual_seed(0)
    hf = build().eval()
    hf.generation_config.eos_token_id = None
    ours = tiny[name] = load_transformers_hybrid(hf).eval()
    with torch.no_grad():
        same_logits = torch.allclose(ours(prompt, HybridCache(ours)), hf(prompt).logits,
                                     atol=1e-5)
        want = hf.generate(prompt, max_new_tokens=12, do_sample=False)[:, 9:]
    configs = [CacheConfig(s, checkpoint_interval=4, log_length=4) for s in
               ("snapshot", "recompute", "replay")]
    configs.append(CacheConfig("replay", log_length=4, use_kernels=True))
    same = all(torch.equal(greedy(ours, prompt, 12, c).tokens, want) for c in configs)
    print(f"{name:19s} pattern {ours.cfg.pattern}: logits equal {same_logits}; "
          f"greedy tokens equal transformers' under all strategies: {same}")

# %% [markdown]
# ## 3. The fold: a chain of rank-one updates, in chunks
#
# Writing the state back (the fold, every $L$ tokens) cannot skip the $K \times V$ state. Token by
# token it is $L$ rank-one corrections, each reading the state it just wrote. The chunked
# **WY / UT form** turns a chunk of $m$ tokens into matrix products. Inside a chunk starting
# from $S_0$, with $\gamma_t = \alpha_1 \cdots \alpha_t$, the corrections
# $u_t = \beta_t (v_t - \alpha_t S_{t-1}^\top k_t)$ satisfy
#
# $$(I + M)\,U = \mathrm{diag}(\beta) V - \mathrm{diag}(\beta \gamma) K S_0, \qquad
# M_{ts} = \beta_t \tfrac{\gamma_t}{\gamma_s}\, k_t^\top k_s \;(s < t),$$
#
# ($U$, $V$, $K$: the chunk's $u_t$, $v_t$, $k_t$ as rows), one unit lower-triangular solve for all
# $m$ tokens; then $S_m = \gamma_m S_0 + \sum_s \tfrac{\gamma_m}{\gamma_s} k_s u_s^\top$ in one product. Outputs
# follow the same way. One chunk of one head, line by line, against the token loop:

# %%
# NBVAL_CHECK_OUTPUT
m = 6  # tokens in the chunk: the first m of the log above, from the state S0
Kc, Vc, a, b = keys[:m], vals[:m], alphas[:m], betas[:m]
gamma = torch.cumprod(a, 0)  # γ_t = α_1 ⋯ α_t
M = torch.tril(b[:, None] * (gamma[:, None] / gamma[None, :]) * (Kc @ Kc.T), diagonal=-1)
R = b[:, None] * Vc - (b * gamma)[:, None] * (Kc @ S0)  # diag(β) V - diag(βγ) K S_0
U = torch.linalg.solve_triangular(torch.eye(m, dtype=torch.float64) + M, R, upper=False,
                                  unitriangular=True)  # (I + M) U = R: rows u_t
S_wy = gamma[-1] * S0 + Kc.T @ ((gamma[-1] / gamma)[:, None] * U)  # S_m in one product

S = S0.clone()  # the token loop: m rank-one corrections, each reading the state just written
for k_s, v_s, a_s, b_s in zip(Kc, Vc, a, b):
    S = a_s * (S - b_s * torch.outer(k_s, k_s @ S)) + b_s * torch.outer(k_s, v_s)
print(f"WY / UT form == token loop for a chunk of {m} within 1e-12:",
      bool((S_wy - S).abs().max() < 1e-12))

# %% [markdown]
# The library's chunked scan (`replaylab.scan.gdn_chunked_scan`: outputs too, every head and
# sequence, chunk after chunk) agrees with the token loop to rounding, for any chunk size:

# %%
# NBVAL_CHECK_OUTPUT
p = gdn_inputs(37, seed=2)
start = torch.randn(1, 4, 16, 8, dtype=torch.float64)
loop = gdn_scan(*p.values(), initial_state=start, compute_dtype=torch.float64)
for chunk in (1, 5, 16, 64):
    chunked = gdn_chunked_scan(*p.values(), initial_state=start, chunk_size=chunk,
                               compute_dtype=torch.float64)
    err = max((chunked.y - loop.y).abs().max(), (chunked.state - loop.state).abs().max())
    print(f"chunk {chunk:2d}: chunked == token loop within 1e-12: {bool(err < 1e-12)}")

# %% [markdown]
# ## 4. State bytes against log-entry bytes, at published shapes
#
# Replay keeps, per layer, one checkpoint and one log entry per token since it. The shapes below
# are written in `replaylab.families.FAMILY_SHAPES`, each with its source. Entries are counted as
# replaylab's specs log them (the raw conv inputs plus the post-conv fields, bf16; the Gated
# DeltaNet log decay $g_t$ in fp32) and at their minimum (the raw conv inputs and the per-token
# projections that bypass the conv: everything else follows from them by the conv).

# %%
# NBVAL_CHECK_OUTPUT
rows = families.byte_table(L=16)
print(f"{'model':24s} {'family':7s} {'state':>9s} {'entry':>8s} {'minimal':>8s} "
      f"{'state/entry':>11s}")
for row in rows:
    print(f"{row['model']:24s} {row['family']:7s} {row['state_bytes'] / 2**10:7.0f} KiB "
          f"{row['entry_bytes'] / 2**10:6.1f} KiB {row['minimal_entry_bytes'] / 2**10:6.1f} KiB "
          f"{row['state_per_entry']:11.1f}")

# %% [markdown]
# *state/entry* is how many tokens of log cost as much as one state. Mamba-1 at Jamba's shape
# is the outlier: with only $N = 16$ state entries per channel, a state is about 11 log
# entries, against about 64 for Gated DeltaNet and 100 for Mamba-2.

# %%
fig = go.Figure()
names = [r["model"] for r in rows]
fig.add_bar(x=names, y=[r["state_bytes"] / 2**10 for r in rows], name="one state (KiB)")
fig.add_bar(x=names, y=[16 * r["entry_bytes"] / 2**10 for r in rows],
            name="16 log entries (KiB)")
fig.update_layout(barmode="group", yaxis_title="KiB per layer and sequence",
                  title="One checkpoint state vs a log of 16 tokens")
fig

# %% [markdown]
# ## 5. A fold against a snapshot copy
#
# A snapshot copies the state (read and write it: $2S$ bytes). A fold of $L$ logged tokens reads
# the state and the fields the recurrence needs of each entry, and writes the state once:
# $2S + L r$ bytes. Counted per layer at $L = 16$:

# %%
# NBVAL_CHECK_OUTPUT
for row in rows:
    print(f"{row['model']:24s} snapshot copy {row['copy_bytes'] / 2**20:5.2f} MiB   "
          f"fold of 16 {row['fold_bytes'] / 2**20:5.2f} MiB   "
          f"({row['fold_bytes'] / row['copy_bytes']:.2f}x the bytes)")

# %% [markdown]
# In bytes a fold costs little more than a copy for Mamba-2 and Gated DeltaNet; for Mamba-1 at
# Jamba's shape the 16 entries add half a state. In *time* the reference folds are compute:
# measured here (your CPU, not checked), with the Gated DeltaNet fold in the chunked form, the
# Mamba-1 fold in the closed form and the Mamba-2 fold as the token scan:

# %%
# NBVAL_IGNORE_OUTPUT
timed = families.time_fold_vs_copy(L=16, repeats=3)
for row in timed:
    print(f"{row['model']:24s} fold of 16 {row['fold_s'] * 1e3:7.2f} ms   copy "
          f"{row['copy_s'] * 1e3:6.3f} ms   fold / copy {row['fold_per_copy']:7.1f}x")

# %% [markdown]
# A copy is a memory-bound memcpy; the folds do arithmetic per state entry (and the Mamba-1 and
# Mamba-2 references materialise intermediate tensors). That is why replay folds only every $L$
# tokens, and why a GPU fold kernel (notebook 06) is written to be memory-bound.
#
# ## 6. Where Gated DeltaNet replay does not pay
#
# A current-state decode step reads and writes the state: $2S$ bytes. A replay step reads the
# checkpoint once, reads the $j$ entries logged so far and writes one entry; every $L$ tokens a
# fold reads and writes the state. Amortised over a cycle: $S + \tfrac{L-1}{2} r + e +
# \tfrac{2S + L r}{L}$ (`replaylab.families.decode_bytes`). Replay saves the state write but its
# log reads grow with $L$: it pays only between a small $L$ (the fold's write must amortise) and a
# large one (the log reads catch up with the state write).

# %%
# NBVAL_CHECK_OUTPUT
for row in rows:
    lo, hi = row["replay_pays_for_L"]
    print(f"{row['model']:24s} replay moves fewer bytes per token for {lo} <= L <= {hi}; "
          f"at L=16: {row['replay_step_bytes'] / row['current_step_bytes']:.2f}x the bytes")

# %%
lengths = list(range(1, 513))
fig = go.Figure()
for shape in families.FAMILY_SHAPES.values():
    ratio = [families.decode_bytes(shape, n)["replay"] / (2 * families.state_bytes(shape))
             for n in lengths]
    fig.add_scatter(x=lengths, y=ratio, name=shape.name, mode="lines")
fig.add_hline(y=1.0, line_dash="dot")
fig.update_layout(xaxis_type="log", xaxis_title="log length L (tokens)",
                  yaxis_title="replay bytes / current-state bytes per token",
                  title="Below 1, a replay decode step moves fewer bytes")
fig

# %% [markdown]
# Bytes are not the whole story for the delta rule: the backward recursion is $L$
# *dependent* steps per new token (each needs the query the previous one produced), while a
# current-state step is one pass over the state. Measured here at Qwen3-Next's layer shape
# (reference PyTorch, one sequence; not checked):

# %%
# NBVAL_IGNORE_OUTPUT
timed = families.time_backward_recursion(lengths=(1, 2, 4, 8, 16, 64, 256), repeats=3)
for row in timed:
    print(f"L={row['L']:3d}: backward recursion {row['backward_s'] * 1e3:6.2f} ms, "
          f"current-state step {row['step_s'] * 1e3:5.2f} ms ({row['backward_per_step']:5.1f}x)")
fig = go.Figure()
fig.add_scatter(x=[r["L"] for r in timed], y=[r["backward_s"] * 1e3 for r in timed],
                name="backward recursion (one read of S_c)", mode="lines+markers")
fig.add_scatter(x=[r["L"] for r in timed], y=[r["step_s"] * 1e3 for r in timed],
                name="current-state step (read + write S)", mode="lines+markers")
fig.update_layout(title="Gated DeltaNet: the backward recursion against a current-state step",
                  xaxis_type="log", xaxis_title="log length L", yaxis_title="ms on this CPU")
fig

# %% [markdown]
# On a CPU the recursion's Python loop costs a few small operations per logged token, so it is
# faster than a current-state step only for logs of a few tokens; beyond that the
# step wins even though it moves more bytes. A fused kernel of the recursion would keep the query in registers and stream the log, but
# the $L$ dependent steps would stay. The next section removes them by logging something else.
# Either way **Gated DeltaNet replay does not pay for long logs** (hundreds of tokens in bytes,
# far fewer in time), or when memory is not the binding constraint. It pays where the current-state
# method must *store* states: speculation and branching, where snapshot keeps a $K \times V$
# state per draft or branch and replay keeps one checkpoint and a few entries.

# %% [markdown]
# ### Mamba-1: the arithmetic binds before the bytes
#
# By bytes alone Mamba-1 replay saves the state write, as above. But its decay
# $e^{\Delta_s[d] A[d,n]}$ differs for every state element, so a replay step cannot fold the
# log into a few dot products as Mamba-2's scalar decay allows: it updates every element of
# the state once per logged entry and once for the new token, $\tfrac{L-1}{2} + 1$ updates per
# element per token on average, and the fold adds one more. mamba-ssm's
# `selective_state_update` (the snapshot step) makes one update per element and moves 8 bytes
# per element (read and write in fp32). With a bandwidth $B$ and a kernel that sustains $U$
# element updates per second, replay can only match it while
# $\tfrac{L+3}{2}\,/\,U \le 8\,/\,B$, that is for $L \le 16\,U/B - 3$: both sides scale with
# $d_{\mathrm{in}} \times N$, so **d_state cancels**. `costmodel.mamba1_replay_vs_ssu` is that model;
# the rate $U$ comes from the committed H200 benchmark of the Mamba-1 replay kernel at Jamba's
# shape (`data/bench_mamba1_kernels.json`, $d_{\mathrm{in}}$ = 8192, N = 16), at its largest
# batch and longest log:

# %%
# NBVAL_CHECK_OUTPUT
from replaylab import costmodel as cm

m1 = load_bench("data/bench_mamba1_kernels.json")
B_copy, U = m1["copy_bandwidth_gbs"] * 1e9, cm.measured_update_rate(m1)
print(f"{m1['provenance']['device']}, {m1['provenance']['date'][:10]}: copy {B_copy / 1e12:.2f} TB/s, "
      f"replay step {U / 1e12:.2f}e12 element updates/s")
print(f"break-even log length 16 U / B - 3 = {cm.mamba1_break_even(B_copy, U):.2f}: "
      "no log length of 1 or more pays")
at128 = next(r for r in m1["batches"] if r["batch"] == 128)
print("batch 128, replay / selective_state_update speed:")
for L, cell in at128["L"].items():
    model = cm.mamba1_replay_vs_ssu(128, int(L), D=8192, N=16, bandwidth=B_copy, update_rate=U)
    print(f"  L={int(L):2d}: measured {cell['amortised']['speedup_vs_ssu']:.2f}, "
          f"model {model['speedup']:.2f} ({model['replay_binds']} bind)")
for N in (4, 16, 64, 256):
    model = cm.mamba1_replay_vs_ssu(128, 16, D=8192, N=N, bandwidth=B_copy, update_rate=U)
    print(f"  model at L=16 with d_state {N:3d}: {model['speedup']:.2f}")

# %% [markdown]
# The model is a ceiling at short logs (there the kernel does not reach its sustained rate)
# and close from L = 16 on. $U$ is what *this* replay kernel sustains, not a hardware limit:
# its update is several arithmetic operations per element besides the exponential, and a
# kernel that updated elements faster would move the break-even up ($16\,U/B - 3$ grows with
# $U$). With today's kernel the answer for Jamba's shape is the snapshot step: its one update
# per element is cheaper than any replay, and replay's log pays only where the alternative is
# to *store* a state per draft or branch. Larger d_state does not change that (the last
# lines). replaylab's serving engine has that snapshot step as a kernel,
# `kernels.mamba1.state_update`, and so picks snapshot for Mamba-1 layouts when no strategy is
# named and it runs its kernels, as on a GPU (`serving.default_strategy`); section 8 times it
# against replay and mamba-ssm's update in the engine.

# %% [markdown]
# ## 7. What the GPU kernels log: the corrected update
#
# The backward recursion needs the values $v_s$ and steps $\beta_s$ in the log. Rewrite one step of
# the delta rule instead:
#
# $$S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} + \beta_t k_t v_t^\top
#       = \alpha_t S_{t-1} + k_t u_t^\top, \qquad
#   u_t = \beta_t \left(v_t - \alpha_t S_{t-1}^\top k_t\right).$$
#
# $u_t$, the **corrected update**, is what the token really adds. If the log keeps $u_s$ (and
# $k_s$, $g_s = \log \alpha_s$), the state after $j$ logged tokens is a *decayed sum*, exactly
# Mamba-2's shape with scalar decays:
#
# $$S_{c+j} = \gamma_j S_c + \sum_{s \le j} \frac{\gamma_j}{\gamma_s}\, k_s u_s^\top,
#   \qquad \gamma_j = \prod_{s \le j} \alpha_s .$$
#
# So any read $\alpha_t S_{t-1}^\top x = \gamma_t S_c^\top x + \sum_{s<t} \frac{\gamma_t}{\gamma_s}
# (k_s \cdot x)\, u_s$ is **parallel over the log**: no dependent steps. A new token needs two such
# reads from one read of $S_c$: $x = k_t$ gives its own $u_t$ (appended to the log), $x = q_t$ gives
# its output $o_t = \alpha_t S_{t-1}^\top q_t + (k_t \cdot q_t)\, u_t$. The fold is one matrix
# product per head. The price: $u_t$ depends on the state before the token, so it must be computed
# when the token is appended (a prefill gets it from the chunked scan: section 3's $U$ is exactly
# these updates). `replaylab.kernels.gdn` logs $(k_t, u_t, g_t)$ per token; vLLM's Gated DeltaNet replay port logs
# the same update. Checked here in float64 on two heads:

# %%
# NBVAL_CHECK_OUTPUT
g2 = torch.Generator().manual_seed(5)
T_, H_, K_, V_ = 12, 2, 16, 8
unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731
f64 = dict(generator=g2, dtype=torch.float64)
k_ = unit(torch.randn(1, T_, H_, K_, **f64))
q_ = unit(torch.randn(1, T_, H_, K_, **f64)) * K_**-0.5
v_ = torch.randn(1, T_, H_, V_, **f64)
g_ = -torch.rand(1, T_, H_, **f64) * 0.5
b_ = torch.rand(1, T_, H_, **f64)
S0 = torch.randn(H_, K_, V_, **f64)

# the corrected updates, token by token: S <- α S, u = β (v - Sᵀ k), S <- S + k uᵀ
S, updates = S0.clone(), []
for t in range(T_):
    S = g_[0, t].exp()[:, None, None] * S
    u = b_[0, t][:, None] * (v_[0, t] - torch.einsum("hkv,hk->hv", S, k_[0, t]))
    S = S + k_[0, t][..., None] * u[:, None, :]
    updates.append(u)
U = torch.stack(updates)  # (T, H, V)
G = g_[0].cumsum(0)  # log γ_s: (T, H)

want = gdn_scan(q_, k_, v_, g_, b_, initial_state=S0[None], compute_dtype=torch.float64)
decayed = G[-1].exp()[:, None, None] * S0 + torch.einsum(
    "sh,shk,shv->hkv", (G[-1] - G).exp(), k_[0], U
)
print("the decayed sum of the u log is the delta rule's state:",
      torch.allclose(decayed, want.state[0], atol=1e-12))


def decayed_read(x, t):
    """α_t S_{t-1}ᵀ x from S_0 and the log of tokens 0 .. t-1, for x (H, K)."""
    w = (G[t] - G[:t]).exp()  # γ_t / γ_s: (t, H)
    logged = torch.einsum("sh,sh,shv->hv", w, (k_[0, :t] * x).sum(-1), U[:t])
    return G[t].exp()[:, None] * torch.einsum("hkv,hk->hv", S0, x) + logged


t = T_ - 1
u_t = b_[0, t][:, None] * (v_[0, t] - decayed_read(k_[0, t], t))
o_t = decayed_read(q_[0, t], t) + (k_[0, t] * q_[0, t]).sum(-1)[:, None] * u_t
print("u_t from the checkpoint and the log:", torch.allclose(u_t, U[t], atol=1e-12))
print("o_t from the checkpoint and the log:", torch.allclose(o_t, want.y[0, t], atol=1e-12))

# %% [markdown]
# **Measured on an H200.** `data/bench_gdn_kernels.json` times the library's kernels beside
# flash-linear-attention's `fused_recurrent_gated_delta_rule` as a decode step (the state read and
# written every token: what snapshot runs) at Qwen3-Next / Qwen3.5's layer shape, 16 key heads, 32
# value heads, $K = V = 128$. Replay's cost per token is *amortised*: a step at log length $n$
# (averaged over the fold cycle) plus one fold of $L$ entries every $L$ tokens. Above 1 replay is
# faster (recorded, not re-run here):

# %%
# NBVAL_CHECK_OUTPUT
gpu = load_bench("data/bench_gdn_kernels.json")
p = gpu["provenance"]
print(f"{p['device']}, fla {p['versions']['fla']}, triton {p['versions']['triton']}, {p['date'][:10]}")
print("same-run check against fla: outputs differ by at most "
      f"{gpu['check']['outputs_vs_fla_recurrent']:.1e} (outputs up to {gpu['check']['outputs_scale']:.2f})")
fold_share = {r["batch"]: r["of_copy"] for r in gpu["rows"]
              if r["provider"] == "fold" and r.get("L") == 16}
print(f"{'batch':>5} {'fla step':>9} {'best L':>6} {'replay':>8} {'fla / replay':>12} "
      f"{'fold of 16 / copy bandwidth':>28}")
for batch in sorted({d["batch"] for d in gpu["decode"]}):
    best = min((d for d in gpu["decode"] if d["batch"] == batch), key=lambda d: d["amortised_us"])
    print(f"{batch:5d} {best['fla_step_us']:7.1f}us {best['L']:6d} "
          f"{best['amortised_us']:6.1f}us {best['vs_fla']:12.2f} {fold_share[batch]:28.0%}")
ncu = load_bench("data/ncu_summary.json")  # Nsight Compute, one launch each, batch 128
for label, name in (("copy_gdn_state_b128", "a copy of the states"),
                    ("gdn_fold_default_b128", "the fold of 16")):
    r = ncu[label]
    print(f"{name:20s} DRAM {r['dram_pct']:4.1f}% of peak, {r['registers']:3.0f} registers a "
          f"thread, {r['achieved_occupancy_pct']:4.1f}% of the warp slots occupied")

# %%
fig = go.Figure()
for batch in sorted({d["batch"] for d in gpu["decode"]}):
    rows_b = [d for d in gpu["decode"] if d["batch"] == batch]
    fig.add_scatter(x=[d["L"] for d in rows_b], y=[d["vs_fla"] for d in rows_b],
                    name=f"batch {batch}", mode="lines+markers")
fig.add_hline(y=1, line_dash="dot", annotation_text="as fast as fla's step")
fig.update_layout(xaxis_type="log", xaxis_title="log length L (fold every L tokens)",
                  yaxis_title="fla step time / replay amortised time",
                  title="Gated DeltaNet replay against fla's decode step (H200)")
fig

# %% [markdown]
# At batch 1 the state (2 MiB per sequence and layer) is too small to keep the GPU busy and
# fla's single pass wins; from batch 8 replay's one read plus a fold every $L$ tokens beats fla's
# read and write, best near $L = 16$. Short logs fold too often, long logs make every step read
# more of the log: the same trade-off as notebook 06's Mamba-2 kernel. From batch 8 the fold
# itself stays well short of the copy bandwidth (last column). The hardware counters (last
# lines above) are consistent with one reason: its $128 \times 64$ tile and accumulator hold
# most of a thread's registers, so few programs fit on a multiprocessor at once, and fewer
# reads are in flight than a copy keeps.

# %% [markdown]
# ## 8. The families in the serving engine, on an H200
#
# The serving engine (notebook 13) serves these layouts on its *reference path*: the modules of
# this notebook run over the engine's preallocated pools, and under replay each recurrent layer's
# outputs come from its family's Triton kernel, for the whole batch in one launch. Speculation
# there is lossless only if a verify of $k + 1$ tokens rounds each token exactly as a one-token
# decode step would. A GPU's matrix-product library picks its kernel by the number of rows, and a
# verify has $k + 1$ times the rows of a decode step, so on the first H200 run
# (`data/bench_engine_families_cublas.json`) speculative tokens parted from greedy ones. Since then, on a GPU, the engine sends every linear layer, every sum
# over the last dimension (the norms) and attention through kernels whose rows do not depend on
# the row count (`replaylab.serving.invariant`).
#
# `tools/row_invariance_probe.py` found which modules parted: it runs one step of 4 tokens and,
# in a second engine, the same 4 tokens one at a time, and compares every module's output row by
# row (recorded, not re-run here):

# %%
# NBVAL_CHECK_OUTPUT
for name in ("row_invariance_probe_cublas", "row_invariance_probe", "row_invariance_probe_jamba"):
    probe = load_bench(f"data/{name}.json")
    p = probe["provenance"]
    print(f"{name}.json: {p['device']}, {p['date'][:10]}")
    for r in probe["results"]:
        if name.endswith("cublas") and r["matmul"] != "torch":
            continue  # that run's row-invariant rows predate the row sums
        first = r["differs"][0]["module"] if r["differs"] else "-"
        print(f"  {r['preset']:22s} {r['matmul']:13s} {r['strategy']:8s} batch {r['batch']:3d}: "
              f"{len(r['differs']):2d} of {r['checked']} modules part; first: {first}")

# %% [markdown]
# With the library's matrix products (`torch`) every preset parts within its first block at
# batch 32, and most of them at batch 8 too. The row-invariant arithmetic agrees everywhere in
# the second run except Jamba's replay, where the first module to part is the Mamba-1 replay
# kernel itself (`advance[0]`): the compiler had fused a multiply and an add into one rounding
# in the single step but not in the verify's loop. Launched without that contraction
# (`enable_fp_fusion=False`), the third run finds no module parting there either.
#
# The engine's decode and speculative throughput per family, every step one CUDA graph replay
# (the reference path reads no host value during a step, so it can be captured), with each
# row's share of the bytes roofline (`step_bytes` over the copy bandwidth measured in the same
# run) and whether every speculative token equals the engine's own greedy token
# (`spec = greedy`, the contract):

# %%
# NBVAL_CHECK_OUTPUT
fam = load_bench("data/bench_engine_families.json")
v = fam["versions"]
print(f"{fam['device']}, torch {v['torch']}, triton {v['triton']}, fla {v['fla']}, {fam['date'][:10]}, "
      f"copy {fam['copy_gbs']:,.0f} GB/s")
print(f"{'preset':22s} {'strategy':12s} {'batch':>5s} {'decode tok/s':>12s} {'roofline':>8s} "
      f"{'spec tok/s':>10s} {'spec = greedy':>13s}")
for r in fam["rows"]:
    spec = r.get("speculative_tokens_per_s")
    spec = "-" if spec is None else f"{spec:,.0f}"
    print(f"{r['preset']:22s} {r['strategy']:12s} {r['batch']:5d} {r['decode_tokens_per_s']:12,.0f} "
          f"{r['roofline_fraction']:8.0%} {spec:>10s} {str(r.get('speculative_equal_greedy', '-')):>13s}")
for label, path in (("with graphs", "bench_engine_families"),
                    ("un-graphed, row-invariant", "bench_engine_families_ungraphed"),
                    ("un-graphed, cuBLAS", "bench_engine_families_cublas")):
    rows = load_bench(f"data/{path}.json")["rows"]
    same = [r["speculative_equal_greedy"] for r in rows if "speculative_equal_greedy" in r]
    print(f"{label:26s}: speculative tokens equal greedy ones in {sum(same)} of {len(same)} rows")
for q in fam["ratios"]:
    if q["batch"] in (32, 128):
        fla = q["replay_over_fla_snapshot"]
        print(f"{q['preset']:22s} batch {q['batch']:3d}: replay / snapshot decode "
              f"{q['replay_over_snapshot']:.2f}x" + (f", / fla snapshot {fla:.2f}x" if fla else "")
              + f"; replay speculation / best decode {q['replay_speculative_over_best_decode']:.2f}x")

# %% [markdown]
# What the graphs change: the same run's rows at batch 32, each strategy without and with them
# (`bench_engine_families_arms.json`):

# %%
# NBVAL_CHECK_OUTPUT
arms = load_bench("data/bench_engine_families_arms.json")
by = {(r["preset"], r["strategy"], r["graphs"]): r for r in arms["rows"] if r["batch"] == 32}
for (preset, strategy, graphed), r in by.items():
    if graphed:
        plain = by[preset, strategy, False]
        print(f"{preset:22s} {strategy:12s} batch 32: {plain['decode_tokens_per_s']:7,.0f} -> "
              f"{r['decode_tokens_per_s']:7,.0f} tok/s "
              f"({r['decode_tokens_per_s'] / plain['decode_tokens_per_s']:.1f}x with graphs)")

# %% [markdown]
# A later run (`bench_engine_families_roofline.json`) records, for every row, the two-term
# roofline: the larger of the step's bytes over the copy bandwidth and its matrix FLOPs over
# the matrix rate, both measured at the start of the run, as a share of the step time, with the
# term that binds. It also records the profiler's busy fraction: device time over 8 steps' wall
# time. A third run (`bench_engine_families_ssu.json`) puts mamba-ssm's `selective_state_update`
# in the Jamba-class snapshot step (`ssu snapshot`), the peer that section 6's cost model
# compares replay with:

# %%
# NBVAL_CHECK_OUTPUT
roof = load_bench("data/bench_engine_families_roofline.json")
print(f"data/bench_engine_families_roofline.json, {roof['device']}, {roof['date'][:10]}: copy "
      f"{roof['copy_gbs']:,.0f} GB/s, matrix {roof['matrix_tflops']:.0f} TFLOP/s at its start")
for r in roof["rows"]:
    if r["strategy"] == "replay" and "error" not in r:
        t = r["roofline"]
        print(f"{r['preset']:22s} replay batch {r['batch']:3d}: {r['decode_tokens_per_s']:7,.0f} tok/s, "
              f"{t['share']:4.0%} of the roofline ({t['binds']} bind), device busy {r['gpu_busy']:4.0%}")
ssu = load_bench("data/bench_engine_families_ssu.json")
for q in ssu["ratios"]:
    print(f"{q['preset']:22s} batch {q['batch']:3d}: replay / ssu snapshot "
          f"{q['replay_over_ssu_snapshot']:.2f}x, replay / snapshot {q['replay_over_snapshot']:.2f}x")

# %% [markdown]
# Read it with care:
#
# * Without graphs the host's Python (one call per module and per kernel) set the time: a step
#   took 8-19 ms at batch 8, 32 and 128 alike (`bench_engine_families_ungraphed.json`). With
#   them the bytes decide more: replay reads the checkpoint and a short log where snapshot reads
#   and writes the state, and from batch 32 replay is the fastest plain decode for every family
#   (against that run's token-loop snapshot),
#   ahead of `fla snapshot` (flash-linear-attention's recurrent kernel in the snapshot step, the
#   baseline a user would get) too.
# * Snapshot and recompute here run the spec's PyTorch token loop, not a fused kernel, so replay
#   against them is also kernels against PyTorch operations; `fla snapshot` is the fair one
#   (each family's snapshot step is a kernel of the engine's since; the H100 rows below).
# * The roofline shares stay far from 100%: the reference path runs each module's operations as
#   separate kernels, which the fused path (notebook 13: NemotronH layouts, and Bamba's,
#   Jamba's, Qwen3-Next's and Qwen3.5's when asked for with `fused=True`) folds together, and the device
#   sits idle for part of each step.
# * With mamba-ssm's update in its snapshot step, Jamba-class snapshot decodes as fast as replay
#   in this engine, though the kernel alone is several times replay's (section 6). Overhead
#   both arms share would only dilute that gap, so the peer's arm must pay something of its own
#   in the engine; the run did not profile what.
# * Speculation pays at batch 1 and 8, gains little at batch 32 (Bamba's loses) and loses at 128.
#   A round costs a verify of $k + 1 = 5$ tokens per sequence, then the host's drafting,
#   acceptance and rollback. A profile of the rounds at batch 32 (Qwen3.5-class, replay; another
#   run of the same configuration as the table's, and below 1x this time: the ratio moves from
#   run to run) splits a round.

# %%
# NBVAL_CHECK_OUTPUT
prof = load_bench("data/spec_round_profile.json")
print(f"{prof['preset']}, batch {prof['batch']}, k = {prof['k']}, acceptance {prof['acceptance']}: "
      f"decode step {prof['decode_ms_per_step']:.2f} ms, round {prof['round_ms']:.2f} ms "
      f"({prof['round_in_decode_steps']:.2f} steps)")
for phase, ms in prof["phases_ms_per_round"].items():
    print(f"  {phase:40s} {ms:5.2f} ms a round")
geometric = sum(prof["acceptance"] ** i for i in range(prof["k"] + 1))
print(f"tokens a round per sequence {prof['tokens_per_round'] / prof['batch']:.2f} "
      f"(the drafter's acceptance alone: {geometric:.2f}); the batch ran {prof['rounds']} rounds")
print(f"speculation / decode {prof['speculative_tokens_per_s'] / prof['decode_tokens_per_s']:.2f}x")

# %% [markdown]
# The verify alone costs more than a decode step (five tokens' rows through every linear layer,
# and the Gated DeltaNet step over five queries), and the phases around it add most of another
# step. A round also gives fewer tokens than the drafter's acceptance would: a round just
# before a fold proposes fewer drafts, and a batch that runs until its slowest sequence is done
# spends its last rounds on a few sequences. A server that admits a new request into each
# finished slot loses no rounds to that tail; the verify and the host's phases remain.

# %% [markdown]
# Section 6 predicted that at Jamba's shape the snapshot step, one update per state element,
# beats any replay. Until `kernels.mamba1.state_update` the engine's Mamba-1 snapshot ran the
# PyTorch token loop, and replay won in the engine only because it had a kernel. One H100 call
# timed the Jamba-class stack on the tree with the kernel and on the tree before it: the
# kernel alone against mamba-ssm's `selective_state_update`, then decode in the engine (CUDA
# graphs; `ssu snapshot` puts mamba-ssm's update in the old token loop).

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.bench.families import load_preset
from replaylab.serving import default_strategy

m1_update = load_bench("data/bench_mamba1_kernels_update_h100.json")
for e in m1_update["batches"]:
    print(f"batch {e['batch']:3d}: state_update {e['update']['us']:6.1f} us, "
          f"selective_state_update {e['ssu']['us']:6.1f} us, replay amortised (L = 16) "
          f"{e['L']['16']['amortised']['us']:6.1f} us")
after = load_bench("data/bench_engine_families_jamba_state_update_h100.json")
before = load_bench("data/bench_engine_families_jamba_token_loop_h100.json")
decode = {(tree, r["strategy"], r["batch"]): r["decode_tokens_per_s"]
          for tree, run in (("before", before), ("after", after)) for r in run["rows"]}
for b in (8, 32, 128):
    snap = decode["after", "snapshot", b]
    print(f"{after['device']}, Jamba-class, batch {b:3d}: snapshot {snap:7,.0f} tok/s, "
          f"{snap / decode['before', 'snapshot', b]:.2f}x the token loop, "
          f"{snap / decode['after', 'replay', b]:.2f}x replay, "
          f"{snap / decode['after', 'ssu snapshot', b]:.2f}x ssu snapshot")
print("the engine's strategy when none is named, Jamba-class, with its kernels:",
      default_strategy(load_preset("jamba-1.5-mini-layers")[1], use_kernels=True))

# %% [markdown]
# The kernel runs at mamba-ssm's speed, and in the engine the snapshot step now decodes
# faster than replay at every batch timed, as the cost model said. Replay still holds the
# smaller pools (no state copy per draft), so under a tight memory budget it keeps more
# sequences; the default follows speed.
#
# Gated DeltaNet's and Mamba-2's snapshot steps became kernels the same way
# (`kernels.gdn.state_update`; `kernels.decode.state_update` on Bamba's reference path, the
# fused path's kernel). A later call timed the Qwen3.5- and Bamba-class stacks with the token
# loop and with the kernels, in one tree:

# %%
# NBVAL_CHECK_OUTPUT
on = load_bench("data/bench_engine_families_snapshot_kernels_state_update_h100.json")
off = load_bench("data/bench_engine_families_snapshot_kernels_token_loop_h100.json")
tps = {(arm, r["preset"], r["strategy"], r["batch"]): r["decode_tokens_per_s"]
       for arm, run in (("off", off), ("on", on)) for r in run["rows"]}
mib = {(m["preset"], m["strategy"]): m["pool_bytes_per_slot"] / 2**20 for m in on["memory"]}
for preset in ("qwen3.5-9b-layers", "bamba-9b-layers"):
    for b in (8, 32, 128):
        snap = tps["on", preset, "snapshot", b]
        fla = tps.get(("on", preset, "fla snapshot", b))
        vs_fla = "" if fla is None else f", {snap / fla:.2f}x fla snapshot"
        print(f"{preset:18s} batch {b:3d}: snapshot {snap:7,.0f} tok/s, "
              f"{snap / tps['off', preset, 'snapshot', b]:.2f}x the token loop, "
              f"{snap / tps['on', preset, 'replay', b]:.2f}x replay{vs_fla}")
    print(f"{preset:18s} pools a slot: snapshot {mib[preset, 'snapshot']:.1f} MiB, "
          f"replay {mib[preset, 'replay']:.1f} MiB")

# %% [markdown]
# Here snapshot and replay decode at about the same speed, and replay's pools are about a
# third of snapshot's: for these layouts the engine keeps replay as its default, and the
# kernels make snapshot and recompute the fair peers (fla's recurrent step in the old token
# loop is slower than either).
#
# Mamba-2's step kernel came with a catch. Its launch was tuned per batch (a block of 8 rows of
# P up to batch 32, 64 beyond), and the compiler may round the state update differently in the
# two (a newer Triton's PTX for the H100 contracts it into an FMA differently; the Triton of
# the measurements here, on an H100, happened to round every launch alike), so a sequence's bits
# could depend on how many others shared its step. The engine now launches
# it alike at every batch (under `batch_invariant`, its default), and the kernel became the
# default for Mamba-2 too. The next call timed the Bamba-class stack three ways: the token loop,
# the tuned launch (the previous tree) and the pinned one:

# %%
# NBVAL_CHECK_OUTPUT
arms = {arm: load_bench(f"data/bench_engine_families_bamba_step_{arm}_h100.json")
        for arm in ("token_loop", "tuned", "pinned")}
row = {(arm, r["fused"], r["batch"]): r for arm, run in arms.items() for r in run["rows"]}
for fused in (False, True):
    for b in (8, 32, 128):
        pin, tuned = row["pinned", fused, b], row["tuned", fused, b]
        loop = row.get(("token_loop", fused, b))
        vs_loop = "" if loop is None else (
            f", {pin['decode_tokens_per_s'] / loop['decode_tokens_per_s']:.2f}x the token loop")
        print(f"{'fused' if fused else 'reference'} path, batch {b:3d}: pinned "
              f"{pin['decode_tokens_per_s']:6,.0f} tok/s ({pin['decode_tokens_per_s'] / tuned['decode_tokens_per_s']:.2f}x tuned"
              f"{vs_loop}); speculation {pin['speculative_tokens_per_s']:6,.0f} tok/s "
              f"({pin['speculative_tokens_per_s'] / tuned['speculative_tokens_per_s']:.2f}x tuned)")

# %% [markdown]
# Up to batch 32 the two launches are the same kernel. At batch 128 the pinned one is a little
# faster in decode and five to six times faster in speculation (the two paths' rows): with
# blocks of 64 rows, the tuned launch's verify was the slow part of its rounds. A launch chosen
# for one token at a time can be
# the wrong one for a verify; here the launch that keeps the bits also keeps the speed.
#
# Back to the fused path and speculation: later runs on one H100 take up the roofline and the
# speculation rounds above. The fused path now serves the Gated DeltaNet
# layouts too (`fused=True`): the residual and the next norm in one kernel, gated attention
# through the attention and RoPE kernels, the Gated DeltaNet layer's conv, L2 norms and gates in
# one launch (`kernels/gdn_inputs.py`), then the same strategy step as the reference path, then
# its norm and output gate in one kernel. The first rows below are three trees: before those two
# kernels, with the first, with both (two calls: each file's ratio is over the graphed
# reference path measured in the same call). The last two lines come from a scheduler that admits a new request into each finished
# slot (`replaylab bench spec-steady`, the weight-matched Nemotron-H model, replay), over the
# iterations where every slot runs: the tree before the host's share of a round was cut (the
# drafter's contexts rebuilt per request and round), then the tree after it.

# %%
# NBVAL_CHECK_OUTPUT
for name, label in (("inputs_before", "before"), ("inputs", "inputs kernel"),
                    ("norm", "+ norm kernel")):
    run = load_bench(f"data/bench_engine_families_fused_gdn_{name}_h100.json")
    for q in (q for q in run["ratios"] if q["graphs"] == "fused"):
        fused = next(r for r in run["rows"] if r["fused"] and r["batch"] == q["batch"])
        print(f"{run['device']}, {fused['preset']}, {label:>13}, batch {q['batch']:3d}: "
              f"fused {fused['decode_tokens_per_s']:7,.0f} tok/s, "
              f"{q['fused_replay_over_graphed_reference']:.2f}x the graphed reference path, "
              f"{fused['roofline']['share']:.0%} of the roofline")
for tree in ("96028da", "ed17032"):
    run = load_bench(f"data/bench_spec_steady_h100_{tree}.json")
    ratios = ", ".join(f"batch {r['batch']} {r['steady_speculation_over_decode']:.2f}x"
                       for r in run["rows"])  # fmt: skip
    print(f"speculation / plain decode, every slot busy, tree {tree}: {ratios}")

# %% [markdown]
# ## Summary
# * Mamba-2's closed form rests on scalar decays that commute; Mamba-1 keeps it elementwise.
# * A delta rule's transitions do not commute, but outputs are linear in the state: carrying the
#   query backward through the log gives any output from **one read** of the checkpoint, with no
#   state written, in $O(L(K+V))$ per head.
# * The fold is a chain of rank-one updates; the chunked WY / UT form does a chunk with one
#   triangular solve and a few matrix products.
# * Logging the corrected update $u_t = \beta_t(v_t - \alpha_t S_{t-1}^\top k_t)$ instead of
#   $(v_t, \beta_t)$ makes the delta rule's log a decayed sum: reads parallel over the log, a fold
#   that is one matrix product. On an H200 that beats fla's decode step from batch 8.
# * A state costs about 11 log entries for Jamba's Mamba-1, 64 for Qwen3-Next's and Qwen3.5's
#   Gated DeltaNet, 100 for Nemotron-H's Mamba-2 (section 4). Replay moves fewer bytes per decode
#   step for $3 \le L \le 25$ (Jamba), $\le 327$ (Gated DeltaNet), $\le 441$ (Mamba-2); at
#   $L = 16$ a fold moves 1.04x (Mamba-2) and 1.05x (Gated DeltaNet) to 1.5x (Mamba-1) the
#   bytes of a snapshot copy.
# * In the serving engine these layouts speculate losslessly on a GPU only with arithmetic whose
#   rows do not depend on the row count (matrix products, norms, attention); section 8 shows
#   which modules parted before, and that with CUDA graphs replay decodes fastest from batch 32
#   where snapshot runs a PyTorch token loop. With each family's snapshot step a kernel,
#   Mamba-1's beats replay in the engine, as section 6's break-even said (the engine's
#   default for Jamba layouts is snapshot); for Gated DeltaNet and Mamba-2 the two decode
#   about alike and replay keeps the smaller pools.

# %% [markdown]
# ## Exercises
#
# **1. The chunked fold.** Write `chunked_fold(state, k, v, g, beta, chunk_size)`: the state after
# the $T$ logged tokens, from `state` (batch, H, K, V), with keys `k` (batch, T, Hk, K) (unit
# norm; each key head serves H / Hk value heads: `repeat_interleave`), values `v`
# (batch, T, H, V), log decays `g` and steps `beta` (batch, T, H). Use the WY / UT form of
# section 3 per chunk of `chunk_size` tokens (the last chunk may be shorter):
# `torch.linalg.solve_triangular(..., upper=False, unitriangular=True)` solves $(I + M) X = R$; section 3's lines do one chunk of one head.

# %% exercise="chunked_fold" tags=["exercise"]
def chunked_fold(state, k, v, g, beta, chunk_size):
    """The Gated DeltaNet state after the T tokens (see the spec above)."""
    raise NotImplementedError


# %%
check_chunked_fold(chunked_fold);


# %% [markdown]
# **2. The replay step in Triton.** Write the kernel of section 7 for one new token:
# `gdn_step_kernel[(batch, H)](S, log_k, log_u, log_g, q, k, v, g, beta, o, u, n, H, K, V)`.
# Program `(b, h)` = `(tl.program_id(0), tl.program_id(1))` owns head `h` of sequence `b`: the
# $(K, V)$ tile `S[b, h]` of the checkpoint (fp32, contiguous: `S[b, h, i, j]` at
# `S + ((b * H + h) * K + i) * V + j`), the head's column of the log of `n` tokens
# (`log_k[b, s, h]` (K,) at `log_k + ((b * n + s) * H + h) * K`, `log_u[b, s, h]` (V,), `log_g[b, s, h]`
# at `log_g + (b * n + s) * H + h`), and the new token `q[b, h]`, `k[b, h]` (K,), `v[b, h]` (V,),
# `g[b, h]`, `beta[b, h]`. It writes the output `o[b, h]` and the corrected update `u[b, h]` (V,).
# Keys are one per value head here (no key-head sharing), `K` and `V` are `tl.constexpr` powers of
# two (`tl.arange(0, K)` needs no mask), and everything is fp32.
#
# **Target traffic:** the checkpoint read once and never written; `o` and `u` written once; the
# log and the token only read. Hint: accumulate the two reads of section 7 in one loop over the
# log (`for s in range(n)`), with $\gamma_t$ from a first loop over `log_g`; use the tile at the end.

# %% exercise="gdn_step_kernel" tags=["exercise"]
@triton.jit
def gdn_step_kernel(S, log_k, log_u, log_g, q, k, v, g, beta, o, u, n, H,
                    K: tl.constexpr, V: tl.constexpr):
    """Program (b, h): o[b, h] and u[b, h] of the new token from S[b, h] and the n logged
    tokens (see the spec above). S is read once and never written."""
    pass  # your kernel here


# %%
check_gdn_step_kernel(gdn_step_kernel);

# %% [markdown]
# **3. Mamba-1's snapshot step in Triton.** Section 6 found that at Jamba's shape the snapshot
# step wins: one update per state element, where replay makes $\tfrac{L+3}{2}$ (its step and
# fold). Write it for one token: `s6_step_kernel[(batch, D)](S, x, delta, A, B, C, Dskip, y, D,
# N)`. Program `(b, d)` owns channel `d` of sequence `b`: the row `S[b, d]` (N,) of the state
# (every tensor fp32 and contiguous: `S[b, d, n]` at `S + (b * D + d) * N + n`), `x[b, d]` and
# `delta[b, d]` (Δ, already through
# the dt projection and softplus), the row `A[d]` (N,) of A (D, N), and the token's `B[b]`,
# `C[b]` (N,) and `Dskip[d]`. It updates the row in place,
# $S \leftarrow e^{\Delta A[d]} \odot S + \Delta\, x\, B$ (every element its own decay), and
# writes `y[b, d]` $= S \cdot C + D_{\text{skip}}\, x$ from the **new** state. `N` is a
# `tl.constexpr` power of two.
#
# **Target traffic:** S read once and written once (mamba-ssm's `selective_state_update` moves
# the same 8 bytes per element); y written once; the token's inputs only read. `B` and `C` are
# read by each of a sequence's D programs: N values each, small beside the state.

# %% exercise="s6_step_kernel" tags=["exercise"]
@triton.jit
def s6_step_kernel(S, x, delta, A, B, C, Dskip, y, D, N: tl.constexpr):
    """Program (b, d): channel d of sequence b through one token (see the spec above); its row
    of S is updated in place and y[b, d] written from the new state."""
    pass  # your kernel here


# %%
check_s6_step_kernel(s6_step_kernel);

# %% [markdown]
# **4.** *Discussion*: section 6 measured the backward recursion for one new token. A
# speculative verify step has $k + 1$ new tokens; how does the recursion's work grow with $k$,
# and what would a kernel share between the $k + 1$ queries? With the $u$ log of section 7,
# what must a verify of $k + 1$ tokens do before token $i$'s output can be computed?
#
# ## References
# * S. Yang, J. Kautz, A. Hatamizadeh, *Gated Delta Networks: Improving Mamba2 with Delta Rule*
#   (ICLR 2025): the gated delta rule and its chunked WY form.
# * S. Yang et al., *Parallelizing Linear Transformers with the Delta Rule over Sequence Length*
#   (NeurIPS 2024): the WY / UT representation of a chain of rank-one updates.
# * A. Gu, T. Dao, *Mamba* (2023) and T. Dao, A. Gu, *Transformers are SSMs* (Mamba-2, 2024).
# * O. Lieber et al., *Jamba: A Hybrid Transformer-Mamba Language Model* (2024).
# * Qwen team, Qwen3-Next (2025) and Qwen3.5 (2026) model cards; transformers' `qwen3_next`,
#   `qwen3_5` and `jamba` modeling code (the oracles of `tests/test_gated_deltanet.py` and
#   `tests/test_mamba1.py`).
# * flash-linear-attention (`fla`): `naive_recurrent_gated_delta_rule`,
#   `naive_chunk_gated_delta_rule` (an optional oracle of the tests).
