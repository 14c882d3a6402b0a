# %% [markdown]
# # 06 · The replay kernel
#
# ## Overview
# Replay keeps, per SSM layer, one checkpoint state $S_c$ and a short log of the layer's scan
# inputs since it. This notebook derives the output of a new token from $S_c$ and the log without
# ever writing a state, reads the Triton kernel that does it, runs it on this machine (through
# Triton's interpreter when there is no GPU) against the PyTorch reference, and shows what it
# measured on an NVIDIA H200 against mamba-ssm, flash-linear-attention and a snapshot copy.
#
# **You will** derive a new token's output from the checkpoint and the log in six lines of PyTorch;
# **climb a ladder of six Triton kernels**, from a load and a store (copy a state tile) through a
# reduction and a 2-D state update to the output from the checkpoint, the fold and the replay step
# itself, each checked against the reference and scored by the bytes it actually loads and stores;
# then read the library's kernels and their H200 measurements, and end with an open challenge:
# beat the library's batch-1 replay step.
#
# **Time:** about 125 minutes (the six puzzles about 65 of them; new to Triton, allow more).
#
# ## Prerequisites
# Notebooks 02 (the recurrence) and 03 (why restores matter). No GPU needed: the GPU numbers come
# from `data/bench_kernels.json`, measured with `python -m replaylab.bench kernels`.

# %% [markdown]
# ## Setup

# %%
import inspect
import math

import torch

import replaylab  # first: without a GPU it switches Triton's interpreter on
import triton
import triton.language as tl
from replaylab import assert_close
from replaylab.teaching import exercises, puzzles
from replaylab.bench.mamba2_kernels import summary
from replaylab.teaching.diagrams import puzzle_access_diagram
from replaylab.kernels import mamba2 as replay  # Mamba-2's replay kernels
from replaylab.teaching.plotting import (
    fold_vs_copy_figure,
    kernel_bandwidth_figure,
    kernel_time_vs_batch_figure,
    load_bench,
    use_notebook_renderer,
)
from replaylab.teaching.widgets import LogLengthExplorer

torch.manual_seed(0)
use_notebook_renderer()


# %% [markdown]
# ## 1. One read of the checkpoint is enough
#
# Unroll the recurrence $S_t = a_t S_{t-1} + \Delta_t x_t B_t^\top$ from the checkpoint $S_c$. With
# $\mathrm{cum}_t = \sum_{s\le t} \Delta_s A$ (log-decay accumulated since the checkpoint):
#
# $$S_t = e^{\mathrm{cum}_t} S_c + \sum_{s\le t} e^{\mathrm{cum}_t-\mathrm{cum}_s}\,\Delta_s\,x_s B_s^\top,
# \qquad
# y_t = S_t C_t + D x_t = e^{\mathrm{cum}_t}\,(S_c C_t) + \sum_{s\le t} e^{\mathrm{cum}_t-\mathrm{cum}_s}\,\Delta_s\,(B_s\!\cdot C_t)\,x_s + D x_t .$$
#
# The first term reads the state once; the sum touches only logged vectors ($x_s$, $B_s$, small).
# So a decode step reads $S_c$ and never writes a state; verifying $k$ drafts is the same with
# $T=k+1$ new tokens; rolling back rejected drafts only shortens the log. The state is written
# (folded) when the log is full or a branch needs its own copy: that is the second kernel.

# %% [markdown]
# ### The three terms, in PyTorch
#
# For one head, with Δ already processed and the new token appended as the last row of the log,
# each term of $y_t$ is one line:

# %%
def y_from_checkpoint(S_c, xs, deltas, Bs, C_t, A, D):
    """One head. S_c (P, N) checkpoint; xs (t, P), deltas (t,), Bs (t, N): the logged tokens
    followed by the new one; C_t (N,); A, D scalars. Returns y_t (P,)."""
    cum = torch.cumsum(deltas * A, 0)  # cum_s for s = 1..t
    state_term = torch.exp(cum[-1]) * (S_c @ C_t)  # e^{cum_t} S_c C_t: the one read of S_c
    weights = torch.exp(cum[-1] - cum) * deltas * (Bs @ C_t)  # e^{cum_t - cum_s} Δ_s (B_s·C_t)
    input_term = weights @ xs  # Σ_s weights_s x_s
    return state_term + input_term + D * xs[-1]  # + the skip D x_t


# %%
# NBVAL_CHECK_OUTPUT
case = puzzles.make_case(seed=1)  # the puzzles' inputs: see replaylab.teaching.puzzles
b, h = 1, 2
xs = torch.cat([case["log_x"][b, :, h], case["x"][b, h][None]])
deltas = torch.cat([case["log_dt"][b, :, h], case["dt"][b, h][None]])
Bs = torch.cat([case["log_B"][b, :, h], case["B"][b, h][None]])
mine = y_from_checkpoint(
    case["S"][b, h], xs, deltas, Bs, case["C"][b, h], case["A"][h], case["D"][h]
)
ref = puzzles.log_output_ref(case)[b, h]  # fold by replaylab.scan.ssd_scan, then one ssd_step
print("agrees with the reference scan:", assert_close(mine, ref, name="y_t") < 1e-5)

# %% [markdown]
# ## 2. A ladder of six Triton puzzles
#
# *The 3-hour path skips sections 2-4 (it reads sections 1 and 5); the 1-day path does puzzles 1, 2, 4
# and 6 (3 and 5 optional).*
#
# Now the same in Triton, one rung at a time; each puzzle uses what the one before taught:
#
# | puzzle | kernel | teaches | traffic target |
# |---|---|---|---|
# | 1 | copy a state tile | program ids, pointer offsets from strides, masks | S read once, the copy written once |
# | 2 | $S_c C_t$ | a reduction over N in one program | S read once |
# | 3 | one token's state update | a 2-D tile, an outer product, a scalar per head broadcast | S read once *and written once*: the snapshot write |
# | 4 | the output from the checkpoint | the three terms of $y_t$, no state write | S read once, never written |
# | 5 | the fold | a loop over the log, the tile kept in registers | S read once, the new state written once |
# | 6 | the replay step | carrying $S_s C_t$ through the log | S and the log read once, no state written |
#
# Each puzzle has its spec (shapes and the paper's symbols), a diagram of what one program loads
# and stores, one or two hints, a stub and its check. **The reference answers are in
# `notebooks/solutions/06_replay_kernel.py`** (one section `# %% puzzle_...` per puzzle, in this
# order); try a puzzle before you read its section.
#
# Without a GPU the kernels run through Triton's
# interpreter (switched on by `import replaylab`): each program instance runs as Python over numpy
# arrays, so the sizes are tiny. Two rules of the interpreter: tensors here are fp32 (bf16
# *arithmetic* is silently wrong there: load, `.to(tl.float32)`, compute in fp32), and `tl.exp`
# needs fp32.
#
# Every `check_*` launches your kernel on random inputs, compares with a PyTorch reference built
# on `replaylab.scan`, and prints a **traffic score**: while your kernel runs, every `tl.load` and
# `tl.store` of the interpreter is intercepted and the element addresses it really touches are
# attributed to the tensors (`replaylab.teaching.puzzles.count_traffic`). "read 2.00x" means your kernel
# read that tensor twice. On a GPU (compiled kernels) traffic is not counted; instead every check
# that passes times your kernel with `triton.testing.do_bench` at one sequence of Nemotron-H 8B's
# layer (`puzzles.TIMING_SIZES`) and prints µs per launch. Without a GPU it prints nothing about
# time. The shapes (Δ already processed, B and C per head):

# %%
# NBVAL_CHECK_OUTPUT
print("puzzle sizes:", puzzles.PUZZLE_SIZES)
print({k: tuple(v.shape) for k, v in case.items()})
print("puzzle 1 (the copy):", puzzles.COPY_SIZES, "| timed on a GPU at:", puzzles.TIMING_SIZES)

# %% [markdown]
# ### Puzzle 1: copy a state tile
#
# The smallest kernel that does something: program `(b, h)` loads the (P, N) tile `S[b, h]` and
# stores it, unchanged, at `out[b, h]`. No arithmetic; what it teaches is *where* a program reads.
#
# **Program ids.** The grid is `(batch, H)`: `b, h = tl.program_id(0), tl.program_id(1)`, one
# program per head of each sequence.
#
# **Strides.** `S[b, h, p, n]` sits at `S + b * stride_b + h * stride_h + p * stride_p + n * stride_n`,
# with the strides the check passes (a tensor's `.stride()`, in elements). Here `S` is stored
# n-major, like a tensor that was transposed without `.contiguous()`: its strides are
# (H·P·N, P·N, 1, P), not the contiguous (H·P·N, P·N, N, 1), so an offset formula that assumes
# contiguity reads the wrong elements. `out` is contiguous: `out[b, h, p, n]` at
# `out + ((b * H + h) * P + p) * N + n`.
#
# **Masks.** `tl.arange` needs a power of two, and P and N here are not (5 and 6,
# `puzzles.COPY_SIZES`), so the check passes `BLOCK_P` and `BLOCK_N` (8 and 8), the powers of two
# above them; lanes `p >= P` or `n >= N` must neither load nor store.
#
# **Hint 1.** A 2-D block of pointers is a column of row offsets plus a row of column offsets:
# `p[:, None] * stride_p + n[None, :] * stride_n` is (BLOCK_P, BLOCK_N).
#
# **Hint 2.** `mask = (p[:, None] < P) & (n[None, :] < N)` is (BLOCK_P, BLOCK_N); give it to both
# `tl.load(..., mask=mask)` and `tl.store(..., mask=mask)`.
#
# **Target traffic:** S read once; out written once; nothing outside the two tensors touched.

# %%
puzzle_access_diagram(1).show()


# %% exercise="puzzle_copy" tags=["exercise"]
@triton.jit
def copy_kernel(
    S, out, stride_b, stride_h, stride_p, stride_n, H, P, N,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Program (b, h): out[b, h] = S[b, h]. S: (batch, H, P, N) at the strides given (here
    n-major); out: (batch, H, P, N) contiguous; BLOCK_P >= P, BLOCK_N >= N powers of two."""
    pass  # your kernel here


# %%
puzzles.check_copy_kernel(copy_kernel);

# %% [markdown]
# ### Puzzle 2: a reduction, $S_c C_t$
#
# $y = S_c\,C_t$, i.e. $y_p = \sum_n S_{c,pn}\, C_{t,n}$: the state term of the output, a (P, N)
# tile times an N-vector. Every head's state is read by exactly one program, which sums over n in
# registers. From here on every tensor is contiguous and P, N are powers of two (4 and 8): no masks.
#
# **What one program owns.** Program `(b, h)` reads the tile `S[b, h]` at
# `S + ((b * H + h) * P + p) * N + n`, the vector `C[b, h]` (N,) at `C + (b * H + h) * N + n`, and
# writes `y[b, h]` (P,) at `y + (b * H + h) * P + p`.
#
# **Hint.** `C_t[None, :]` broadcasts the N-vector over the P rows of the tile; `tl.sum(x, axis=1)`
# sums a (P, N) block over n and leaves a (P,) vector (axis 0 would sum over p).
#
# **Target traffic:** S read once, C read once, y written once.

# %%
puzzle_access_diagram(2).show()


# %% exercise="puzzle_reduce" tags=["exercise"]
@triton.jit
def reduce_kernel(S, C, y, H, P: tl.constexpr, N: tl.constexpr):
    """Program (b, h): y[b, h] = S[b, h] @ C[b, h], i.e. y[b, h, p] = sum_n S[b, h, p, n] C[b, h, n].
    S: (batch, H, P, N); C: (batch, H, N); y: (batch, H, P); all contiguous."""
    pass  # your kernel here


# %%
puzzles.check_reduce_kernel(reduce_kernel);

# %% [markdown]
# ### Puzzle 3: one token's state update, a 2-D tile
#
# *Optional on both short paths.*
#
# $S_t = e^{\Delta_t A}\, S_{t-1} + \Delta_t\, x_t B_t^\top$ (notebook 02's step without its
# output), in place: program `(b, h)` reads its tile, scales it by one scalar per head,
# $a_t = e^{\Delta_t A}$, adds the outer product of the P-vector $\Delta_t x_t$ and the N-vector
# $B_t$, and writes the tile back over `S[b, h]`.
#
# **This is the write replay avoids.** A snapshot cache, and mamba-ssm's `selective_state_update`,
# do exactly this every token: the whole state is read *and written*, and the traffic line below
# shows "written 1.00x". Puzzles 4 and 6 produce the same token's output with the state read once
# and never written.
#
# **What one program owns.** The tile `S[b, h]` as in puzzle 2; `x[b, h]` (P,) at
# `x + (b * H + h) * P + p`; `B[b, h]` (N,) at `B + (b * H + h) * N + n`; the scalars `dt[b, h]` at
# `dt + b * H + h` and `A[h]` at `A + h`.
#
# **Hint 1.** `tl.load` of a single address gives a scalar; multiplying the (P, N) tile by it
# broadcasts it over every element. `tl.exp` needs fp32 (it is, here).
#
# **Hint 2.** The outer product $x B^\top$ is `x_t[:, None] * B_t[None, :]`: (P, 1) times (1, N) is
# (P, N). Decay first, then add: the new token's own input enters undecayed.
#
# **Target traffic:** S read once and written once; x, dt, B and A read once, not written.

# %%
puzzle_access_diagram(3).show()


# %% exercise="puzzle_update" tags=["exercise"]
@triton.jit
def state_update_kernel(S, x, dt, B, A, H, P: tl.constexpr, N: tl.constexpr):
    """Program (b, h), in place: S[b, h] <- exp(dt[b, h] A[h]) S[b, h] + dt[b, h] x[b, h] B[b, h]^T.
    S: (batch, H, P, N); x: (batch, H, P); dt: (batch, H); B: (batch, H, N); A: (H,)."""
    pass  # your kernel here


# %%
puzzles.check_state_update_kernel(state_update_kernel);

# %% [markdown]
# ### Puzzle 4: the output from the checkpoint, empty log
#
# $y_t = e^{\Delta_t A}\,(S_c C_t) + \Delta_t\,(B_t\cdot C_t)\,x_t + D\,x_t$: the first token after
# a checkpoint, without writing the state $S_t$.
#
# **What one program owns.** The grid is `(batch, H)`; program `(b, h)` =
# `(tl.program_id(0), tl.program_id(1))` owns head `h` of sequence `b`: it reads the (P, N) tile
# `S[b, h]`, the vectors `x[b, h]` (P,), `B[b, h]`, `C[b, h]` (N,), the scalars `dt[b, h]`, `A[h]`,
# `D[h]`, and writes `y[b, h]` (P,). Tensors are contiguous: `S[b, h, p, n]` sits at
# `S + ((b * H + h) * P + p) * N + n`, `x[b, h, p]` at `x + (b * H + h) * P + p`. `P` and `N` are
# `tl.constexpr` powers of two: `tl.arange(0, P)` needs no mask.
#
# **Hint.** The first term is puzzle 2's reduction times the scalar $e^{\Delta_t A}$; $B_t\cdot C_t$
# is `tl.sum(B_t * C_t)`, a scalar; the state is never stored, only `y`.
#
# **Target traffic:** checkpoint read once, written 0 times; y written once.

# %%
puzzle_access_diagram(4).show()


# %% exercise="puzzle_output" tags=["exercise"]
@triton.jit
def output_kernel(S, x, dt, B, C, A, D, y, H, P: tl.constexpr, N: tl.constexpr):
    """Program (b, h): y[b, h] = exp(dt[b, h] A[h]) (S[b, h] @ C[b, h])
    + dt[b, h] (B[b, h] . C[b, h]) x[b, h] + D[h] x[b, h]. S: (batch, H, P, N) read once, never
    written; x, y: (batch, H, P); dt: (batch, H); B, C: (batch, H, N); A, D: (H,)."""
    pass  # your kernel here


# %%
puzzles.check_output_kernel(output_kernel);

# %% [markdown]
# ### Puzzle 5: the fold
#
# *Optional on both short paths.*
#
# When the log is full, or a branch needs its own state, replay writes the state after the log
# (notebook 05, section 1 has the same loop in PyTorch):
#
# $$S_{c+L} = \mathrm{fold}(S_c, \mathrm{log}[:L]):\qquad S \leftarrow e^{\Delta_s A}\, S + \Delta_s\,x_s B_s^\top
# \quad \text{for each logged token } s = 1, \dots, L .$$
#
# In the kernel the loop body is these two terms on the (P, N) tile a program owns: scale the
# tile by the scalar $e^{\Delta_s A}$, add the outer product of the P-vector $\Delta_s x_s$ and the
# N-vector $B_s$.
#
# **What one program owns.** Grid `(batch, H)`: program `(b, h)` owns the (P, N) tile of head `h`
# of sequence `b`: it reads `S[b, h]` and the head's column of the log, `log_x[b, s, h]` (P,) at
# `log_x + ((b * L + s) * H + h) * P`, `log_dt[b, s, h]` at `log_dt + (b * L + s) * H + h`,
# `log_B[b, s, h]` (N,) at `log_B + ((b * L + s) * H + h) * N`, for `s in range(L)`, and writes
# `out[b, h]` (same layout as `S`).
#
# **Hint.** Puzzle 3's update inside `for s in range(L):`, with log entry `s` of head `h` in place
# of the new token. Load the tile before the loop and store it after: the state stays in registers
# across the log.
#
# **Target traffic:** checkpoint read once, never written; `out` written once, never read back; each
# log entry read once (1.00x is the fewest possible; the check requires the first three).

# %%
puzzle_access_diagram(5).show()


# %% exercise="puzzle_fold" tags=["exercise"]
@triton.jit
def fold_kernel(S, log_x, log_dt, log_B, A, out, L, H, P: tl.constexpr, N: tl.constexpr):
    """Program (b, h): out[b, h] = the state after folding the L logged tokens into S[b, h].
    S, out: (batch, H, P, N); log_x (batch, L, H, P); log_dt (batch, L, H);
    log_B (batch, L, H, N); A (H,)."""
    pass  # your kernel here


# %%
puzzles.check_fold_kernel(fold_kernel);

# %% [markdown]
# ### Puzzle 6: the replay step
#
# The top rung: what the library's `replay_step` does for one new token (T = 1), the kernel a
# replay cache runs at every decode step.
#
# Now $L$ tokens were logged since the checkpoint. The output of the new token is
# $y_t = S_t C_t + D x_t$ with $S_t$ the state after the log and the new token, but the state must
# still not be written, and the checkpoint read once.
#
# **What one program owns.** The same grid `(batch, H)`: program `(b, h)` reads the tile
# `S[b, h]`, the head's column of the log, `log_x[b, s, h]` (P,) at
# `log_x + ((b * L + s) * H + h) * P`, `log_dt[b, s, h]` at `log_dt + (b * L + s) * H + h`,
# `log_B[b, s, h]` (N,) at `log_B + ((b * L + s) * H + h) * N`, for `s in range(L)` (the log as in
# puzzle 5), and the new token as in puzzle 4; it writes `y[b, h]`.
#
# **Hint.** The recurrence is linear in $S$, and only $S_t C_t$ is needed. With
# $v_s = S_s C_t$ (a P-vector): $v_s = e^{\Delta_s A} v_{s-1} + \Delta_s (B_s\cdot C_t)\,x_s$. One
# pass over the log, no (P, N) update per token: $v$ starts as puzzle 2's $S_c C_t$, and the new
# token is one more step of the same recurrence.
#
# **Target traffic:** checkpoint read once, written 0 times; y written once; each log entry read
# once (1.00x is the fewest possible; the check requires the first three).

# %%
puzzle_access_diagram(6).show()


# %% exercise="puzzle_log" tags=["exercise"]
@triton.jit
def log_output_kernel(
    S, log_x, log_dt, log_B, x, dt, B, C, A, D, y, L, H, P: tl.constexpr, N: tl.constexpr
):
    """Program (b, h): y[b, h] of the new token after the L logged tokens log_x (batch, L, H, P),
    log_dt (batch, L, H), log_B (batch, L, H, N); other arguments as in puzzle 4. S is read
    once and never written."""
    pass  # your kernel here


# %%
puzzles.check_log_output_kernel(log_output_kernel);

# %% [markdown]
# The library's versions of puzzles 4-6 follow.
#
# ## 3. The library's kernels
#
# `replaylab.kernels.mamba2` holds the same two operations at full size, each beside a PyTorch
# reference with the same signature (`replay_step` / `replay_step_ref`, `fold` / `fold_ref`).
#
# **What one program owns.** Both kernels launch the grid `(batch, H, cdiv(P, BLOCK_P))`:
# program `(b, h, pid_p)` owns rows `pid_p * BLOCK_P ...` of head `h` of sequence `b`, a
# (BLOCK_P, N) slice of the state (the block sizes per kernel are in `replay.LAUNCH`).
# Each reads its sequence's checkpoint slot (`slots[b]`: forked branches share one) and a ragged
# log (`log_len[b]` entries). `_replay_step_kernel` is puzzles 4 and 6 for T new tokens (the decay
# factors are computed from a running log-sum instead of products); `_fold_kernel` is puzzle 5,
# `BLOCK_L` logged tokens at a time as one matrix product:

# %%
print(inspect.getsource(replay._replay_step_kernel.fn))

# %%
print(inspect.getsource(replay._fold_kernel.fn))

# %% [markdown]
# ## 4. Run it here, check it against the reference
#
# Small, awkward sizes (P, N and H not powers of two), a ragged batch (log lengths 0, 5 and 11)
# and two sequences sharing one checkpoint slot, as forked branches do:

# %%
# NBVAL_CHECK_OUTPUT
batch, H, P, N, G, Lmax, T = 3, 6, 5, 7, 3, 16, 2
case = dict(
    states=torch.randn(2, H, P, N),
    slots=torch.tensor([1, 0, 1], dtype=torch.int32),
    log_x=torch.randn(batch, Lmax, H, P),
    log_dt=torch.randn(batch, Lmax, H) - 1,
    log_B=torch.randn(batch, Lmax, G, N),
    log_C=torch.randn(batch, Lmax, G, N),
    log_len=torch.tensor([0, 5, 11], dtype=torch.int32),
    x=torch.randn(batch, T, H, P),
    dt=torch.randn(batch, T, H) - 1,
    B=torch.randn(batch, T, G, N),
    C=torch.randn(batch, T, G, N),
    A=-torch.rand(H) * 3,
    D=torch.randn(H),
    dt_bias=torch.rand(H) - 0.5,
)
device = exercises.kernel_device()  # "cuda" for a compiled kernel, "cpu" under the interpreter
case = {k: v.to(device) for k, v in case.items()}
tri_case = {k: v.clone() for k, v in case.items()}
ref_case = {k: v.clone() for k, v in case.items()}
tri_y = replay.replay_step(**tri_case)
ref_y = replay.replay_step_ref(**ref_case)
err = assert_close(tri_y, ref_y, name="y")
print("outputs within fp32 tolerance:", err < 1e-4)
print("log lengths after appending the new tokens:", tri_case["log_len"].tolist())
print("checkpoint states untouched:", torch.equal(tri_case["states"], case["states"]))

# %% [markdown]
# The same traffic counter on the library's decode kernel (one new token, a full log of 8, one
# P block per head), the counts for one launch:

# %%
# NBVAL_CHECK_OUTPUT
g = torch.Generator().manual_seed(2)
bt, Ht, Pt, Nt, Gt, Lt = 2, 3, 4, 8, 3, 8
lib = dict(
    states=torch.randn(bt, Ht, Pt, Nt, generator=g),
    slots=torch.arange(bt, dtype=torch.int32),
    log_x=torch.randn(bt, Lt, Ht, Pt, generator=g),
    log_dt=torch.randn(bt, Lt, Ht, generator=g),
    log_B=torch.randn(bt, Lt, Gt, Nt, generator=g),
    log_C=torch.randn(bt, Lt, Gt, Nt, generator=g),
    log_len=torch.full((bt,), Lt, dtype=torch.int32),
    x=torch.randn(bt, 1, Ht, Pt, generator=g),
    dt=torch.randn(bt, 1, Ht, generator=g),
    B=torch.randn(bt, 1, Gt, Nt, generator=g),
    C=torch.randn(bt, 1, Gt, Nt, generator=g),
)
A_lib = -torch.rand(Ht, generator=g)
if puzzles.interpreting():
    names = ("states", "log_x", "log_dt", "log_B", "log_C")
    with puzzles.count_traffic(**{k: lib[k] for k in names}) as traffic:
        replay.replay_step(**lib, A=A_lib, append=False, check=False)
    for line in traffic.lines():
        print(line)
else:
    print("compiled kernels on a GPU: traffic is counted only under the interpreter")

# %% [markdown]
# The checkpoint is read once and never written. The log's `dt` is read twice: once for the total
# decay of the log, once inside the loop. And `log_C` is untouched: a logged token's C only shaped
# outputs that were already produced, which is why a fold never needs it.

# %% [markdown]
# ## 5. On an H200
#
# Terms for the table below. **`ssu`** is mamba-ssm's `selective_state_update`, the
# usual decode kernel: it reads the state, updates it and writes it back, every token. Every time
# is a median over repeats of a **CUDA graph**: the kernel launches recorded once and replayed
# with one call, so the host's few microseconds per launch do not hide a kernel's own time.
# Replay's decode time is **amortised**: a decode step costs the step plus its share of the fold,
# step + fold($L$)/$L$, because every $L$-th step must also fold the full log into a new
# checkpoint. Quoting the step alone would leave the fold out.

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.bench.mamba2_kernels import amortised_decode

bench = load_bench()  # data/bench_kernels.json
print(bench["device"], "|", bench["date"], "|", bench["command"])
table = amortised_decode(bench)
print("decode, amortised: replay step (log of L) + fold(L) / L against selective_state_update")
for batch in sorted({r["batch"] for r in table}):
    rows = [r for r in table if r["batch"] == batch]
    best = max(rows, key=lambda r: r["speedup"])
    cells = ", ".join(f"L={r['L']}: {r['speedup']:.2f}x" for r in rows)
    print(
        f"batch {batch:3d}: {cells}  (best L={best['L']}, {best['amortised_us']:.1f} us vs "
        f"{best['ssu_us']:.1f} us)"
    )
best_per_batch = {
    batch: max((r for r in table if r["batch"] == batch), key=lambda r: r["speedup"])
    for batch in sorted({r["batch"] for r in table})
}
print(
    "replay's amortised decode faster than selective_state_update at batch",
    [batch for batch, r in best_per_batch.items() if r["speedup"] > 1],
    "| best L per batch:",
    sorted({r["L"] for r in best_per_batch.values()}),
)

# %% [markdown]
# Counted with its share of the fold, replay's decode beats `selective_state_update`, which
# reads *and writes* the state every token, from batch 8 up (most at batch 128, with L = 16 best
# at every batch), and loses at batch 1, where fixed costs, not bytes, set the time.

# %% [markdown]
# ### 5b. Optional: the measurements in depth
#
# *Optional on both short paths: the 3-hour path stops at the sentence above.* The rest of this
# section reads the same run and three later ones in detail: how the copy bandwidth was timed
# (and why some fractions of it exceed 1), the figures, every ratio the project set as a target,
# the verify kernel, an explorer for the log length, and the engine's kernels at every launch
# configuration.
#
# **Copy bandwidth, and how it was timed.** A kernel's *fraction of copy bandwidth* is its bytes
# per second over that of a device copy (2 GiB, read + write bytes) timed in the same run
# (`replaylab.bench.timing.copy_bandwidth_gbs`). The copy can be timed two ways, and on an H200
# they differ: replayed from a CUDA graph, and launched back to back between CUDA events (the
# graph-timed copy reads about two thirds of the event-timed one). This run (`data/bench_kernels.json`) timed it the first way only; every later run (the
# launch sweep at the end of this section, the engine runs of 07 and 09) times it both ways and
# keeps the larger. So each table below divides by its own run's figure, printed with it, and
# fractions are compared within one run only. The next cell prints both runs' copies.

# %%
# NBVAL_CHECK_OUTPUT
print({k: bench["versions"][k] for k in ("torch", "triton", "mamba_ssm", "fla")})
eng = load_bench("data/bench_engine.json")  # a later run on the same kind of GPU
copy_graph = bench["copy_bandwidth_gbs"]
copy_both = eng["copy_bandwidth_methods_gbs"]
print(f"this run's copy: {copy_graph:.0f} GB/s (CUDA-graph replay, the only way it was timed)")
print(
    f"the engine run's copy ({eng['date'][:10]}): "
    + ", ".join(f"{m} {v:.0f} GB/s" for m, v in copy_both.items())
    + f"; it keeps the larger, {eng['copy_bandwidth_gbs']:.0f} GB/s"
)
print(
    f"against the larger copy every fraction of this run would be "
    f"{copy_graph / eng['copy_bandwidth_gbs']:.2f}x as large as printed here"
)
sh = bench["shape"]
print(
    f"one sequence's state (H x P x N fp32): {sh['H'] * sh['P'] * sh['N'] * 4 / 2**20:.0f} MiB; "
    f"batch 8: {8 * sh['H'] * sh['P'] * sh['N'] * 4 / 1e6:.0f} MB, inside the H200's 50 MB L2 cache"
)

# %%
kernel_time_vs_batch_figure(bench, T=1, log_len=16).show()

# %%
kernel_time_vs_batch_figure(bench, T=4, log_len=16).show()

# %%
kernel_bandwidth_figure(bench).show()

# %%
fold_vs_copy_figure(bench).show()

# %% [markdown]
# The ratios the project set as targets, side by side from that one run:

# %%
# NBVAL_CHECK_OUTPUT
for line in summary(bench):
    print(line)

# %% [markdown]
# For T > 1 there is a second kernel, `_replay_verify_kernel`, that computes all T outputs at
# once as small matrix products on tensor cores (`tf32x3`: each fp32 operand is split into a
# TF32 part and a TF32 remainder, and three TF32 products give close to fp32 accuracy). Measured in a later
# run (`data/bench_kernels_verify.json`), against the same peers: it keeps the time nearly flat
# from T = 4 to T = 8, which is why `replay_step` uses it from T = 8 on.

# %%
# NBVAL_CHECK_OUTPUT
verify = load_bench("data/bench_kernels_verify.json")
vrows = [r for r in verify["rows"] if "us" in r]
vget = lambda **k: next(r for r in vrows if all(r[a] == v for a, v in k.items()))  # noqa: E731
for b in (1, 32, 128):
    for T in (4, 8):
        ours = vget(provider="replay_step", batch=b, log_len=16, T=T)["us"]
        print(
            f"batch {b:3d} T={T}: verify kernel {ours:7.1f} us; vs chunk_simple_gla "
            f"{vget(provider='fla_chunk', batch=b, log_len=16, T=T)['us'] / ours:.2f}x, vs per-draft "
            f"selective_state_update {vget(provider='ssu', batch=b, T=T)['us'] / ours:.2f}x"
        )

# %% [markdown]
# #### Explorer: choosing the log length
#
# The table as a figure, one batch at a time, with the cost model beside the measurements. Left,
# per decode step of the whole batch: the measured amortised time of replay (green dots: a step over
# a log of L entries plus its share of the fold, fold(L) / L) and mamba-ssm's
# `selective_state_update` (purple line: it reads and writes the state every token, so L does not
# matter to it). Dashed, in lighter colours: the cost model, the bytes each kernel must move
# (`costmodel.kernel_bytes`) over the device-copy bandwidth measured in the same run. Stars: the
# best L, measured (of the four measured lengths) and modelled. Right: replay's speedup over
# `selective_state_update`. Move L and the batch: the axes stay put, so what moves is the cost.
#
# Read it for three things: where the model and the GPU agree (from batch 8 up and L up to 16,
# within about a third) and where they do not (batch 1: fixed costs the bytes do not see; L = 64,
# most at small batches: the step's loop over the log costs more than its bytes); why the curve has a minimum (a longer log spreads
# the fold's state write over more tokens, but every step reads the whole log); and why the
# model's best L is the same at every batch (both terms grow with it).

# %%
log_explorer = LogLengthExplorer(bench, batch=32, L=16)
log_explorer

# %%
# the explorer saves its starting view as an image with the notebook (the controls need a
# live kernel); the bandwidth its cost model divides by:
print(
    f"cost model: bytes / {log_explorer.bandwidth / 1e9:.0f} GB/s, the device-copy "
    f"bandwidth measured in the same run ({bench['device']}; CUDA-graph replay, as above)"
)

# %% [markdown]
# #### The engine's kernels, one launch configuration at a time
#
# A later run (`replaylab bench sweep`, `data/bench_kernels_sweep.json`) timed the kernels the decode
# engine uses at every block size and warp count they allow: replay's step over a log of 16
# entries, the snapshot engine's own fused `state_update` (one read and one write of the state),
# mamba-ssm's `selective_state_update` (the same job, its launch fixed by mamba-ssm) and the fold.
# The table keeps each kernel's fastest launch per batch. Replay's decode is quoted amortised, step
# + fold(16)/16, from the same run's fold of 16 entries; the step alone is printed beside it only to
# show how much the fold adds. The fractions are of the device-copy bandwidth measured in the same
# run, timed both ways and the larger kept (the event-timed copy):

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.teaching.plotting import SWEEP_KERNELS, best_launch, kernel_sweep_figure

sweep = load_bench("data/bench_kernels_sweep.json")
print(sweep["device"], "|", sweep["date"], "|", sweep["command"])
print(f"copy bandwidth {sweep['copy_bandwidth_gbs']:.0f} GB/s (the larger of CUDA-graph and event timing)")
fastest = best_launch(sweep)
step_k, ours_k, ssu_k, fold_k = (
    "replay_step T=1 L=16",
    "state_update T=1",
    "mamba-ssm selective_state_update T=1",
    "fold L=16",
)
folds = [k for k in ("fold L=16", "fold L=16 streaming") if any(key[0] == k for key in fastest)]


def decode_us(b):
    """replay's amortised decode at batch b: the step over a log of 16 plus fold(16) / 16"""
    return fastest[(step_k, b)]["us"] + fastest[(fold_k, b)]["us"] / 16


print(
    "batch  step µs  step + fold/16 µs  state_update µs  selective_state_update µs  "
    "ssu / replay decode  state_update / replay decode  (ssu / step alone)  "
    + "  ".join(f"{k}: µs (copy)" for k in folds)
)
for b in sorted({b for _, b in fastest}):
    step, ours, ssu = (fastest[(k, b)]["us"] for k in (step_k, ours_k, ssu_k))
    dec = decode_us(b)
    fold_cells = "  ".join(
        f"{fastest[(k, b)]['us']:9.1f} ({fastest[(k, b)]['copy_fraction']:.0%})"
        for k in folds
        if (k, b) in fastest
    )
    print(
        f"{b:5d}  {step:7.1f}  {dec:17.1f}  {ours:15.1f}  {ssu:25.1f}  {ssu / dec:18.2f}x  "
        f"{ours / dec:27.2f}x  {ssu / step:17.2f}x  {fold_cells}"
    )
missing = [SWEEP_KERNELS[k][0] for k in SWEEP_KERNELS if not any(key[0] == k for key in fastest)]
print("not in this run:", ", ".join(missing) or "none")

# %%
kernel_sweep_figure(sweep).show()

# %%
# NBVAL_CHECK_OUTPUT
from replaylab.bench.mamba2_kernels import SHAPE  # the layer shape the sweep timed: Nemotron-H 8B's

b1 = min(b for _, b in fastest)
launch = fastest[(step_k, b1)]
programs = SHAPE["H"] * -(-SHAPE["P"] // launch["block_p"])
print(
    f"batch {b1}: the step alone {launch['us']:.1f} µs vs selective_state_update "
    f"{fastest[(ssu_k, b1)]['us']:.1f} µs; its best launch (block_p {launch['block_p']}, "
    f"{launch['num_warps']} warps) runs {SHAPE['H']} heads x {programs // SHAPE['H']} P blocks = "
    f"{programs} programs at {launch['copy_fraction']:.0%} of the copy bandwidth"
)
for rival in (ssu_k, ours_k):
    wins = sorted(b for k, b in fastest if k == step_k and decode_us(b) < fastest[(rival, b)]["us"])
    print(f"replay decode (step + fold/16) faster than {rival.removesuffix(' T=1')} at batch: {wins}")
# the whole decode step of the engine (weights, attention, every layer), from its two runs
from replaylab.results import replay_wins_summary

print("end to end, the engine (notebook 09):", replay_wins_summary()[0])

# %% [markdown]
# **Why does the step lose at batch 1?** For each new token a program walks its head's log
# entry by entry, each entry's decay depending on the one before: a serial chain of loads and
# exponentials whose latency, not the bytes, sets the time, and one sequence's heads make too few
# programs to hide it. With more sequences in flight that latency is covered, and the state write
# replay skips becomes the larger cost; against our own fused `state_update`, which moves the
# state faster than mamba-ssm's kernel, the step needs a larger batch before it wins (the two
# lines above).
#
# **Why is the engine's gain end-to-end only at larger batch?** At batch 1 a decode step reads
# every weight once, and the state kernels are a small part of that, so microseconds won or lost
# on them barely move the step. Only where the batch makes state traffic rival the weights does
# the kernel's advantage show up in tokens per second: the last line above, the engine's decode
# against its fused snapshot, trails or ties at batch 1 and 8 (0.96x, 1.01x) and wins from
# batch 32 (notebook 09, section
# 4, has it per workload and batch).

# %% [markdown]
# #### What the numbers say
#
# * **Decode**, counted honestly as step + fold(L)/L (the table above: a full log forces a fold),
#   beats `selective_state_update`, which reads *and writes* the state every token, from batch 8
#   up, most at batch 128, with L = 16 best at every batch; at batch 1 it loses. A step alone,
#   without its share of the fold, looks faster than it is: quote the amortised figure. With a
#   64-entry log the per-token work over the log eats the gain up to batch 32 and most of it
#   above: fold more often.
# * **Verification** of 4 drafts plus rollback (the `verify ... T=4` rows) is 1.59x faster than
#   keeping a state per draft at batch 1, and 3.90-5.02x from batch 8 to 128; it holds one state
#   instead of four.
# * **Fold** costs about a copy at batch 128, 1.5x a copy at batch 32-64: the restore is as cheap
#   as a snapshot's while holding a checkpoint and a log instead of every snapshot.
# * Against the **chunked-scan peers** replaying the same log: the per-token kernel is faster at
#   T = 1 on every shape and at T = 4 from batch 8 on, but loses at T = 8 to
#   flash-linear-attention's `chunk_simple_gla` (tensor cores). The verify kernel above wins
#   back T = 8 from batch 32 on (1.11-1.12x); at batch 1 `chunk_simple_gla` stays faster (the
#   verify kernel runs at 0.87-0.90x of its speed there).
# * At **batch 1** the GPU is mostly idle and fixed costs dominate: mamba-ssm's decode step is faster.
# * "Fraction of copy bandwidth" above 1 does not mean a kernel beat the memory. In the first run
#   (`data/bench_kernels.json`, the figures of this section) the copy was timed only from a CUDA
#   graph, which reads about two thirds of the event-timed copy (the cell just before the
#   section's figures prints both): against that smaller figure even a plain copy of the state shows
#   fractions above 1. And at batch 1 and 8 one batch's state (4 MiB a sequence here) fits in the
#   H200's 50 MB L2 cache, so a kernel replayed back to back reads much of it from the cache, not
#   from HBM: there a fraction is not DRAM efficiency, in any run (the launch sweep, which divides
#   by the larger copy, has one above 1: the fused `state_update` at batch 8).
#
# ## Summary
# * Outputs of new tokens need one read of the checkpoint and the log, no state write: three
#   terms, six lines of PyTorch, and a one-pass Triton loop that carries $S_s C_t$ instead of the
#   state.
# * A ladder of six kernels, from a masked copy to the replay step: the snapshot update (puzzle 3)
#   reads and writes the state every token; the replay step reads it once and writes nothing.
# * The fold keeps the state tile in registers across the log: one read, one write.
# * The library's kernels agree with the reference scan to fp32 rounding, here and on the GPU.
# * On an H200 they win where state traffic dominates: the decode kernel from batch 8 up with the
#   fold included, and verification; at batch 1 mamba-ssm's step is faster. In the whole engine,
#   where the weights are most of a step, replay trails or ties at batch 1 and 8 and wins from batch 32
#   (notebook 09, section 4).
#
# ## Exercises
# **1.** *(Optional on both short paths.)* From the JSON rows of `bench` (section 5), find the largest log length at which
# `replay_step`'s step alone (T=1, its share of the fold left out) is still faster than
# `selective_state_update` (`provider="ssu"`) at
# batch 32. (Hint: `[r for r in bench["rows"] if "us" in r and r["batch"] == 32 and ...]`.)

# %% exercise="winning_log" tags=["exercise"]
winning_log_answer = None  # your answer: a log length from the rows

# %%
exercises.check_largest_winning_log(winning_log_answer);

# %% [markdown]
# **2.** *(Optional on both short paths.)* In section 4, the logs have capacity `Lmax = 16` and `T = 2` new tokens are appended.
# What is the largest `log_len` a sequence may have so that `replay_step` accepts the call? (The
# check calls `replay_step` with your value, which must work, and with one more, which must be
# refused.)

# %% exercise="log_room" tags=["exercise"]
log_room_answer = None  # your answer: an integer

# %%
exercises.check_largest_log_len(log_room_answer);

# %% [markdown]
# *Discussion* (model answer in `INSTRUCTORS.md`): why must the caller keep that room, instead
# of the kernel folding the log itself when it is full?
#

# %% [markdown]
# **3.** *(Optional on both short paths.)* At batch 8: which of the measured log lengths gives the lowest amortised decode time
# (`table` above), and which integer L from 1 to 64 minimises the cost model's amortised bytes per
# step, `kernel_bytes("replay_step", 8, L, 1, ...) + kernel_bytes("fold", 8, L, 0, ...) / L` with the
# benchmark's layer shape `bench["shape"]` (`from replaylab.costmodel import kernel_bytes`)?
# Answer `(measured_L, model_L)`. The explorer's stars show both; compute them.

# %% exercise="best_log" tags=["exercise"]
best_log_answer = None  # your answer: (measured_L, model_L)

# %%
exercises.check_best_log_length(best_log_answer);

# %% [markdown]
# ## Open challenge: beat the batch-1 replay step
#
# *Open-ended, no check; optional on every path.* At batch 1 the library's replay step loses to
# mamba-ssm's `selective_state_update`, although it moves fewer bytes (section 5: a serial chain of
# loads and exponentials over the log, and one sequence's heads make too few programs to hide it).
# The launch sweep's numbers, at Nemotron-H 8B's layer shape, one new token, a log of 16:

# %%
# NBVAL_CHECK_OUTPUT
challenge = load_bench("data/bench_kernels_sweep.json")
best = best_launch(challenge)
step_b1 = best[("replay_step T=1 L=16", 1)]
ssu_b1 = best[("mamba-ssm selective_state_update T=1", 1)]
fold_b1 = best[("fold L=16", 1)]
print(challenge["device"], "|", challenge["date"])
print(
    f"batch 1: replay step {step_b1['us']:.2f} µs (block_p {step_b1['block_p']}, "
    f"{step_b1['num_warps']} warps), selective_state_update {ssu_b1['us']:.2f} µs: the step runs "
    f"at {ssu_b1['us'] / step_b1['us']:.2f}x of selective_state_update's speed"
)
amortised_b1 = step_b1["us"] + fold_b1["us"] / 16
print(
    f"amortised, step + fold(16)/16: {amortised_b1:.2f} µs, "
    f"{ssu_b1['us'] / amortised_b1:.2f}x of selective_state_update's speed"
)
print("the targets: a step under", f"{ssu_b1['us']:.2f} µs, and step + fold(16)/16 under it too")

# %% [markdown]
# **The challenge.** Write a replay step, like puzzle 6, that beats `selective_state_update` at
# batch 1 on a GPU, first the step alone, then counted honestly with its share of the fold. On a
# GPU, `puzzles.check_log_output_kernel` times your puzzle-6 kernel at this shape (batch 1,
# H = 128, P = 64, N = 128, L = 16: `puzzles.TIMING_SIZES`); `replaylab bench sweep` times the
# library's kernels and mamba-ssm's side by side (`data/bench_kernels_sweep.json`). Puzzle 6's
# kernel has B and C per head and Δ processed; the library's `_replay_step_kernel` (section 3)
# also expands groups, applies softplus, reads ragged logs and checkpoint slots.
#
# Ideas to try, none of them known to win: split P across more programs (the sweep's `block_p`)
# or give each program fewer warps; load a head's whole log as one (L, P) and one (L, N) block
# instead of entry by entry; break the serial chain of decays with a cumulative sum
# (`tl.cumsum` of $\Delta_s A$) so every log entry's weight is computed at once. In
# the spirit of Sasha Rush's *Mamba: The Hard Way*: measure, change one thing, measure again. The
# reference answers of the puzzles are in `notebooks/solutions/06_replay_kernel.py`; this one
# has none.

# %% [markdown]
# ## References
# * ReplaySSM: cache SSM inputs, not state (Dao AI Lab with NVIDIA, 2026).
# * Dao & Gu, *Transformers are SSMs* (2024): the SSD form used in the derivation.
# * mamba-ssm `selective_state_update`, `mamba_chunk_scan_combined`; flash-linear-attention
#   `chunk_simple_gla`, `fused_recurrent_simple_gla`: the peers.
# * S. Rush, *Triton-Puzzles* and *Mamba: The Hard Way* (2024): the puzzle ladder and the
#   challenge this notebook follows.
# * The Triton tutorials and language reference (`tl.load`, `tl.store`, `tl.program_id`,
#   `TRITON_INTERPRET`).
