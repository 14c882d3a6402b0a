"""Triton kernels for Gated DeltaNet (Qwen3-Next, Qwen3.5), each beside a PyTorch reference
with the same signature: replay's ``replay_step`` / ``replay_step_ref`` and ``fold`` /
``fold_ref``, and the snapshot and recompute strategies' step ``state_update`` /
``state_update_ref`` (the state read and written every token, as fla's
``fused_recurrent_gated_delta_rule``).

Glossary (code name -> paper symbol, shape):
    states     S_c     (slots, H, K, V) fp32   checkpoint states (o = Sᵀ q), one slot each
    slots              (batch,) int32           the slot each sequence reads (forked branches
                                                may share one)
    log_k      k_s     (batch, Lmax, Hk, K)     logged keys (after conv, SiLU, L2 norm)
    log_u      u_s     (batch, Lmax, H, V)      logged corrected updates, fp32
    log_g      g_s     (batch, Lmax, H) fp32    logged log-decays, log α_s <= 0
    log_len            (batch,) int32           valid entries per sequence
    log_head           (batch,) int32           ring start: entry i at row (head + i) % Lmax
    q, k               (batch, T, Hk, K)        the new tokens (q already scaled by K^-1/2)
    v                  (batch, T, H, V)
    g, beta            (batch, T, H)

What the log holds. The recurrence S_t = α_t (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ is
S_t = α_t S_{t-1} + k_t u_tᵀ with the corrected update u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t).
Logging u (not v and β) makes the state after j entries a decayed sum, as in Mamba-2:
    S_{c+j} = γ_j S_c + Σ_{s<=j} (γ_j / γ_s) k_s u_sᵀ,      γ_j = Π_{s<=j} α_s,
so every read of checkpoint + log is parallel over the log (no token-by-token recursion):
    α_t S_{t-1}ᵀ x = γ_t S_cᵀ x + Σ_{s<t} (γ_t / γ_s) (k_s · x) u_s      for x = k_t and q_t,
which gives u_t (appended to the log) and o_t = S_tᵀ q_t = α_t S_{t-1}ᵀ q_t + (k_t · q_t) u_t
from one read of S_c, and the fold is one matrix product per head. ``replay_step`` writes no
state; ``fold`` writes S_{c+j} to a slot.

A verify of T tokens is one launch whose loop runs each token exactly as a single decode step
at its position would (one compiled loop body; the earlier tokens' k and g read from the
inputs, their u from the ring): row t of a verify is bit for bit that step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replaylab.kernels.decode import write_kept_states
from replaylab.kernels.mamba2 import _ring_rows
from replaylab.scan import gdn_scan

__all__ = [
    "replay_step", "replay_step_ref", "fold", "fold_ref", "corrected_updates", "state_update",
    "state_update_ref",
]  # fmt: skip


@triton.jit
def _log_decay_total(log_g, b, h, n, head, Lmax, H, BLOCK_L: tl.constexpr):
    """Σ_{s<n} g_s over the ring: log γ of the whole log."""
    total = 0.0
    for l0 in range(0, n, BLOCK_L):
        offs = l0 + tl.arange(0, BLOCK_L)
        row = b * Lmax + (head + offs) % Lmax
        total += tl.sum(tl.load(log_g + row * H + h, mask=offs < n, other=0.0))
    return total


@triton.jit(do_not_specialize=["T"])  # one binary for every T (see the loop)
def _replay_step_kernel(
    states,  # (S, H, K, V) fp32
    slots,  # (batch,)
    log_k,  # (batch, Lmax, Hk, K)
    log_u,  # (batch, Lmax, H, V) fp32
    log_g,  # (batch, Lmax, H) fp32
    log_len,  # (batch,) entries before the step's first token
    log_head,  # (batch,)
    append_count,  # (batch,) with HAS_COUNT: append only the first append_count[b] tokens
    q,
    k,  # (batch, T, Hk, K) in log_k's dtype
    v,  # (batch, T, H, V)
    g,  # (batch, T, H) fp32
    beta,  # (batch, T, H)
    o,  # (batch, T, H, V) output
    T,  # new tokens per sequence: a runtime loop bound, never specialized
    Lmax,
    H,
    Hk,
    K,
    V,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_L: tl.constexpr,
    APPEND: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    b, h, pid_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    hk = h // (H // Hk)
    slot = tl.load(slots + b).to(tl.int64)
    n0 = tl.load(log_len + b)
    head = tl.load(log_head + b)
    count = T
    if HAS_COUNT:
        count = tl.load(append_count + b)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mk, mv = offs_k < K, offs_v < V
    # the one read of the checkpoint (used after the log pass, so the loads overlap)
    S = tl.load(
        states + ((slot * H + h) * K + offs_k[:, None]) * V + offs_v[None, :],
        mask=mk[:, None] & mv[None, :],
        other=0.0,
    )
    # Token t is computed exactly as a one-token step at entry n0 + t computes it: the same
    # loop body (T is a runtime bound, so a decode step and every row of a verify run one
    # compiled body), over the same values. Entries n0 .. n0+t-1 are this step's tokens: their
    # k and g are read from the inputs, their u from the ring, where this program wrote them.
    for t in range(T):
        n = n0 + t
        row_t = b * T + t
        q_t = tl.load(q + (row_t * Hk + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        k_t = tl.load(k + (row_t * Hk + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        v_t = tl.load(v + (row_t * H + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        g_t = tl.load(g + row_t * H + h).to(tl.float32)
        beta_t = tl.load(beta + row_t * H + h).to(tl.float32)
        total = 0.0  # Σ_{s<n} g_s: log γ of the whole log
        for l0 in range(0, n, BLOCK_L):
            offs_l = l0 + tl.arange(0, BLOCK_L)
            row = b * Lmax + (head + offs_l) % Lmax
            at = tl.where(offs_l < n0, log_g + row * H, g + (b * T + offs_l - n0) * H) + h
            total += tl.sum(tl.load(at, mask=offs_l < n, other=0.0))
        log_gamma = total + g_t  # log γ_t
        acc_q = tl.zeros([BLOCK_V], dtype=tl.float32)
        acc_k = tl.zeros([BLOCK_V], dtype=tl.float32)
        run = 0.0  # log γ_s of the entry before this block
        for l0 in range(0, n, BLOCK_L):
            offs_l = l0 + tl.arange(0, BLOCK_L)
            ml, old = offs_l < n, offs_l < n0
            row = b * Lmax + (head + offs_l) % Lmax
            new = b * T + offs_l - n0  # the step's token rows of entries past n0
            g_l = tl.load(tl.where(old, log_g + row * H, g + new * H) + h, mask=ml, other=0.0)
            w = tl.where(ml, tl.exp(log_gamma - (run + tl.cumsum(g_l, axis=0))), 0.0)  # γ_t/γ_s
            run += tl.sum(g_l)
            k_l = tl.load(
                tl.where(old[:, None], log_k + (row[:, None] * Hk + hk) * K,
                         k + (new[:, None] * Hk + hk) * K)
                + offs_k[None, :],
                mask=ml[:, None] & mk[None, :],
                other=0.0,
            ).to(tl.float32)  # fmt: skip
            u_l = tl.load(
                log_u + (row[:, None] * H + h) * V + offs_v[None, :],
                mask=ml[:, None] & mv[None, :],
                other=0.0,
            )
            acc_q += tl.sum((w * tl.sum(k_l * q_t[None, :], axis=1))[:, None] * u_l, axis=0)
            acc_k += tl.sum((w * tl.sum(k_l * k_t[None, :], axis=1))[:, None] * u_l, axis=0)
        Sq = tl.sum(S * q_t[:, None], axis=0)  # S_cᵀ q and S_cᵀ k over this block of V
        Sk = tl.sum(S * k_t[:, None], axis=0)
        gamma = tl.exp(log_gamma)
        u_t = beta_t * (v_t - (gamma * Sk + acc_k))  # β_t (v_t - α_t S_{t-1}ᵀ k_t)
        o_t = gamma * Sq + acc_q + tl.sum(k_t * q_t) * u_t
        tl.store(o + (row_t * H + h) * V + offs_v, o_t.to(o.dtype.element_ty), mask=mv)
        if APPEND:
            row = b * Lmax + (head + n) % Lmax  # padding (t >= count) leaves the ring alone
            tl.store(log_u + (row * H + h) * V + offs_v, u_t, mask=mv & (offs_v * 0 + t < count))
            # one program per key head writes k, one per head writes g
            zero_k = offs_k * 0
            k_owner = (zero_k + pid_v == 0) & (zero_k + h % (H // Hk) == 0) & (zero_k + t < count)
            tl.store(
                log_k + (row * Hk + hk) * K + offs_k,
                k_t.to(log_k.dtype.element_ty),
                mask=mk & k_owner,
            )
            lane = tl.arange(0, 1)
            g_owner = (lane + pid_v == 0) & (lane + t < count)
            tl.store(log_g + row * H + h + lane, g_t + lane * 0.0, mask=g_owner)
            tl.debug_barrier()  # the next token reads this u from the ring


@triton.jit
def _fold_kernel(
    states,
    src_slots,
    out,
    dst_slots,
    log_k,
    log_u,
    log_g,
    fold_len,
    log_head,
    Lmax,
    H,
    Hk,
    K,
    V,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_L: tl.constexpr,
    PRECISION: tl.constexpr,
    IN_PLACE: tl.constexpr,
):
    b, h, pid_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    j = tl.load(fold_len + b)
    src = tl.load(src_slots + b).to(tl.int64)
    dst = tl.load(dst_slots + b).to(tl.int64)
    if (j > 0) | (src != dst) | (not IN_PLACE):  # an in-place fold of nothing: nothing to do
        hk = h // (H // Hk)
        head = tl.load(log_head + b)
        offs_k = tl.arange(0, BLOCK_K)
        offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        mk, mv = offs_k < K, offs_v < V
        tile = offs_k[:, None] * V + offs_v[None, :]
        m_tile = mk[:, None] & mv[None, :]
        log_gamma = _log_decay_total(log_g, b, h, j, head, Lmax, H, BLOCK_L)  # log γ_j
        acc = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
        run = 0.0
        for l0 in range(0, j, BLOCK_L):
            offs_l = l0 + tl.arange(0, BLOCK_L)
            ml = offs_l < j
            row = b * Lmax + (head + offs_l) % Lmax
            g_l = tl.load(log_g + row * H + h, mask=ml, other=0.0)
            w = tl.where(ml, tl.exp(log_gamma - (run + tl.cumsum(g_l, axis=0))), 0.0)
            run += tl.sum(g_l)
            k_l = tl.load(
                log_k + (row[:, None] * Hk + hk) * K + offs_k[None, :],
                mask=ml[:, None] & mk[None, :],
                other=0.0,
            ).to(tl.float32)
            u_l = tl.load(
                log_u + (row[:, None] * H + h) * V + offs_v[None, :],
                mask=ml[:, None] & mv[None, :],
                other=0.0,
            )
            # Σ_s (γ_j / γ_s) k_s u_sᵀ: (K, BLOCK_L) @ (BLOCK_L, BLOCK_V)
            acc += tl.dot(tl.trans(k_l * w[:, None]), u_l, input_precision=PRECISION)
        # the checkpoint read after the log's products, not before: fewer registers, faster
        # (data/gdn_fold_sweep_tiles.jsonl, data/ncu_summary*.json; figures in data/README.md)
        S = tl.load(states + (src * H + h) * K * V + tile, mask=m_tile, other=0.0)
        S = tl.exp(log_gamma) * S + acc
        tl.store(out + (dst * H + h) * K * V + tile, S, mask=m_tile)


@triton.jit
def _state_update_kernel(
    state,  # (S, H, K, V) fp32 current states, rows 0 .. batch-1 read and written in place
    q,
    k,  # (batch, T, Hk, K)
    v,  # (batch, T, H, V)
    g,
    beta,  # (batch, T, H): log α and β
    o,  # (batch, T, H, V) output
    drafts,  # (S, max_verify, H, K, V) fp32: the state after each token (KEEP_DRAFTS)
    counts,  # (batch,) int32: the state written is the one after counts[b] tokens (HAS_COUNTS)
    H,
    Hk,
    K,
    V,
    max_verify,
    T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    KEEP_DRAFTS: tl.constexpr,
    HAS_COUNTS: tl.constexpr,
):
    b, h, pid_v = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    hk = h // (H // Hk)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mk, mv = offs_k < K, offs_v < V
    tile = offs_k[:, None] * V + offs_v[None, :]
    mask = mk[:, None] & mv[None, :]
    S = tl.load(state + (b * H + h) * K * V + tile, mask=mask, other=0.0)
    kept = S  # the state after counts[b] tokens (HAS_COUNTS; 0: the state read)
    n = tl.load(counts + b) if HAS_COUNTS else T
    for t in tl.static_range(T):  # each token as a one-token step runs it
        row = b * T + t
        q_t = tl.load(q + (row * Hk + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        k_t = tl.load(k + (row * Hk + hk) * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        v_t = tl.load(v + (row * H + h) * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        S = tl.exp(tl.load(g + row * H + h).to(tl.float32)) * S  # α_t S_{t-1}
        predicted = tl.sum(S * k_t[:, None], axis=0)  # (α_t S_{t-1})ᵀ k_t
        u = tl.load(beta + row * H + h).to(tl.float32) * (v_t - predicted)
        S = S + k_t[:, None] * u[None, :]
        out = tl.sum(S * q_t[:, None], axis=0)
        tl.store(o + (row * H + h) * V + offs_v, out.to(o.dtype.element_ty), mask=mv)
        if KEEP_DRAFTS:
            tl.store(drafts + ((b * max_verify + t) * H + h) * K * V + tile, S, mask=mask)
        if HAS_COUNTS:
            kept = tl.where(n == t + 1, S, kept)
    if HAS_COUNTS:
        S = kept
    tl.store(state + (b * H + h) * K * V + tile, S, mask=mask)


# (batch bound, BLOCK_V, num_warps), from the H200 launch sweep in data/gdn_launch_sweep.jsonl
# (tools/tune_families.py): one warp per 32 values for the step, 4 warps per 64 for the fold
LAUNCH = {
    "replay_step": [(float("inf"), 32, 1)],
    "fold": [(float("inf"), 64, 4)],
}


def _launch(kernel, batch, V, block_v=None, num_warps=None):
    default_v, default_w = next((bv, w) for bound, bv, w in LAUNCH[kernel] if batch <= bound)
    return min(block_v or default_v, triton.next_power_of_2(V)), num_warps or default_w


def _check_int(name, t, batch, low, high):
    if not isinstance(t, torch.Tensor) or t.shape != (batch,) or t.dtype != torch.int32:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected int32 of shape ({batch},), got {got}")
    if batch and (int(t.min()) < low or int(t.max()) > high):
        raise ValueError(f"{name}: expected values in [{low}, {high}], got {t.tolist()}")


def _check_log(states, log_k, log_u, log_g):
    """The log's shapes against each other and the checkpoint states; returns sizes."""
    if states.dim() != 4 or states.dtype != torch.float32:
        raise ValueError(
            f"states: expected float32 (slots, H, K, V), got {states.dtype} {tuple(states.shape)}"
        )
    _, H, K, V = states.shape
    batch, Lmax, Hk = log_k.shape[:3]
    if log_k.dim() != 4 or log_k.shape[3] != K:
        raise ValueError(f"log_k: expected (batch, Lmax, Hk, K={K}), got {tuple(log_k.shape)}")
    if log_u.shape != (batch, Lmax, H, V) or log_u.dtype != torch.float32:
        raise ValueError(
            f"log_u: expected float32 {(batch, Lmax, H, V)} (log_k's batch and Lmax, the states' "
            f"H and V), got {log_u.dtype} {tuple(log_u.shape)}"
        )
    if log_g.shape != (batch, Lmax, H) or log_g.dtype != torch.float32:
        raise ValueError(
            f"log_g: expected float32 {(batch, Lmax, H)}, got {log_g.dtype} {tuple(log_g.shape)}"
        )
    if H % Hk:
        raise ValueError(f"heads: the states' H={H} is not a multiple of log_k's Hk={Hk}")
    if batch * Lmax * H * max(K, V) >= 2**31:
        raise ValueError(
            f"log: batch {batch} x Lmax {Lmax} x H {H} x {max(K, V)} elements exceed the "
            f"kernels' 32-bit offsets (2**31)"
        )
    return batch, Lmax, H, Hk, K, V


def _check_token_shapes(tokens, batch, T, H, Hk, K, V, sizes_from):
    """q, k (batch, T, Hk, K), v (batch, T, H, V), g, beta (batch, T, H); the error names
    where the sizes came from."""
    expected = dict(q=(batch, T, Hk, K), k=(batch, T, Hk, K), v=(batch, T, H, V),
                    g=(batch, T, H), beta=(batch, T, H))  # fmt: skip
    for name, shape in expected.items():
        if tuple(tokens[name].shape) != shape:
            raise ValueError(
                f"{name}: expected {shape} ({sizes_from}), got {tuple(tokens[name].shape)}"
            )


def _check_new(q, k, v, g, beta, batch, H, Hk, K, V, log_k):
    T = q.shape[1] if q.dim() == 4 else None
    _check_token_shapes(dict(q=q, k=k, v=v, g=g, beta=beta), batch, T, H, Hk, K, V,
                        f"the log's batch, the states' H={H}, K={K}, V={V}, log_k's Hk={Hk}")  # fmt: skip
    if k.dtype != log_k.dtype:
        raise ValueError(f"k: dtype {k.dtype} differs from log_k's {log_k.dtype}")
    if g.dtype != torch.float32:
        raise ValueError(f"g: expected float32 log-decays, got {g.dtype}")
    return T


def replay_step(
    states,
    slots,
    log_k,
    log_u,
    log_g,
    log_len,
    q,
    k,
    v,
    g,
    beta,
    *,
    log_head=None,
    append_count=None,
    append=True,
    advance=True,
    out=None,
    check=True,
    block_v=None,
    num_warps=None,
    block_l=8,
):
    """Outputs o (batch, T, H, V) of T new tokens from checkpoint ``states[slots]`` and the
    log of ``log_len`` entries since it, writing no state (into ``out`` when given).

    With ``append`` each token's k, u and g go to the ring at log_len + t before the next token
    runs (one launch, one compiled loop body for every T: row t equals a single step bit for
    bit); the caller keeps room (log_len + T <= Lmax); ``advance=False`` leaves ``log_len``
    for the caller to move. ``append_count`` (batch,) int32: sequence b appends only its first
    append_count[b] tokens (the rest are padding of a ragged batch). ``check=False`` skips the
    checks that read values back from the device (inside a CUDA graph capture). ``block_v``,
    ``num_warps``, ``block_l``: the launch (default: ``LAUNCH`` by batch; 8 log entries a
    block).
    """
    batch, Lmax, H, Hk, K, V = _check_log(states, log_k, log_u, log_g)
    T = _check_new(q, k, v, g, beta, batch, H, Hk, K, V, log_k) if check else q.shape[1]
    head = torch.zeros_like(log_len) if log_head is None else log_head
    if check:
        _check_int("slots", slots, batch, 0, states.shape[0] - 1)
        _check_int("log_len", log_len, batch, 0, Lmax)
        _check_int("log_head", head, batch, 0, Lmax - 1)
        if append:
            added = T if append_count is None else append_count.clamp(0, T)
            ends = log_len + added
            if int(ends.max()) > Lmax:
                raise ValueError(
                    f"log_len: appending needs log_len + tokens appended <= Lmax={Lmax}, got "
                    f"log_len {log_len.tolist()} + {added if isinstance(added, int) else added.tolist()}"
                )
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device) if out is None else out
    if check and out is not None and tuple(out.shape) != tuple(v.shape):
        raise ValueError(f"out: expected v's shape {tuple(v.shape)}, got {tuple(out.shape)}")
    if not append and T > 1:
        raise ValueError("append=False: a verify appends each token before the next; T must be 1")
    BLOCK_V, warps = _launch("replay_step", batch, V, block_v, num_warps)
    grid = (batch, H, triton.cdiv(V, BLOCK_V))
    dest = o if o.is_contiguous() else torch.empty(o.shape, dtype=o.dtype, device=o.device)
    if T:
        _replay_step_kernel[grid](
            states, slots, log_k, log_u, log_g, log_len, head,
            log_len if append_count is None else append_count,
            q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
            dest, T, Lmax, H, Hk, K, V,
            BLOCK_K=triton.next_power_of_2(K), BLOCK_V=BLOCK_V, BLOCK_L=block_l,
            APPEND=append, HAS_COUNT=append_count is not None, num_warps=warps,
        )  # fmt: skip
    if dest is not o:
        o.copy_(dest)
    if append and advance:
        log_len += T
    return o


def fold(
    states,
    src_slots,
    out,
    dst_slots,
    log_k,
    log_u,
    log_g,
    fold_len,
    *,
    log_head=None,
    check=True,
    block_v=None,
    num_warps=None,
    precision=None,
    block_l=16,
):
    """Write S_{c+j} = γ_j S_c + Σ_{s<=j} (γ_j/γ_s) k_s u_sᵀ to ``out[dst_slots[b]]`` from
    S_c = ``states[src_slots[b]]`` and the first j = ``fold_len[b]`` log entries (``out`` may be
    ``states``; then no slot may be both read by one sequence and written by another). A
    sequence folding 0 entries in place costs nothing. ``precision``: tl.dot's input precision
    (default "ieee": fp32 products, chosen by data/gdn_launch_sweep.jsonl). Returns ``out``."""
    batch, Lmax, H, Hk, K, V = _check_log(states, log_k, log_u, log_g)
    head = torch.zeros_like(fold_len) if log_head is None else log_head
    if check:
        if out.shape[1:] != states.shape[1:] or out.dtype != states.dtype:
            raise ValueError(
                f"out: expected {states.dtype} (slots, {H}, {K}, {V}) like states, got "
                f"{out.dtype} {tuple(out.shape)}"
            )
        _check_int("src_slots", src_slots, batch, 0, states.shape[0] - 1)
        _check_int("dst_slots", dst_slots, batch, 0, out.shape[0] - 1)
        _check_int("fold_len", fold_len, batch, 0, Lmax)
        _check_int("log_head", head, batch, 0, Lmax - 1)
    BLOCK_V, warps = _launch("fold", batch, V, block_v, num_warps)
    BLOCK_V = max(16, BLOCK_V)  # tl.dot's smallest tile
    _fold_kernel[(batch, H, triton.cdiv(V, BLOCK_V))](
        states,
        src_slots,
        out,
        dst_slots,
        log_k,
        log_u,
        log_g,
        fold_len,
        head,
        Lmax,
        H,
        Hk,
        K,
        V,
        BLOCK_K=max(16, triton.next_power_of_2(K)),
        BLOCK_V=BLOCK_V,
        BLOCK_L=block_l,
        PRECISION=precision or "ieee",
        IN_PLACE=out.data_ptr() == states.data_ptr(),
        num_warps=warps,
    )
    return out


# Values per program and warps of ``state_update``: a (K, 32) tile, as the replay step's
# blocks of V (not swept)
STATE_UPDATE_LAUNCH = (32, 4)


def _check_state_update(state, q, k, v, g, beta, drafts, counts):
    if state.dim() != 4 or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(
            f"state: expected a contiguous float32 pool (slots, H, K, V), got {state.dtype} "
            f"{tuple(state.shape)}"
        )
    _, H, K, V = state.shape
    batch, T, Hk = q.shape[:3] if q.dim() == 4 else (None, None, None)
    _check_token_shapes(dict(q=q, k=k, v=v, g=g, beta=beta), batch, T, H, Hk, K, V,
                        f"q's batch, T and Hk, the state's H={H}, K={K}, V={V}")  # fmt: skip
    if H % Hk:
        raise ValueError(f"heads: the state's H={H} is not a multiple of q's Hk={Hk}")
    if state.shape[0] < batch:
        raise ValueError(f"state: {state.shape[0]} rows, need one per sequence ({batch})")
    if drafts is not None:
        want = (H, K, V)
        if drafts.dim() != 5 or tuple(drafts.shape[2:]) != want or drafts.dtype != torch.float32:
            raise ValueError(
                f"drafts: expected float32 (slots, max_verify, {H}, {K}, {V}), got "
                f"{drafts.dtype} {tuple(drafts.shape)}"
            )
        if drafts.shape[0] < batch or drafts.shape[1] < T or not drafts.is_contiguous():
            raise ValueError(
                f"drafts: {drafts.shape[0]} slots x {drafts.shape[1]} tokens, need at least "
                f"({batch}, {T}), contiguous"
            )
    if counts is not None:
        _check_int("counts", counts, batch, 0, T)
    for name, t in dict(q=q, k=k, v=v, g=g, beta=beta, drafts=drafts, counts=counts).items():
        if t is not None and t.device != state.device:
            raise ValueError(f"{name}: expected device {state.device}, got {t.device}")


def state_update(state, q, k, v, g, beta, *, drafts=None, counts=None, check=True, block_v=None,
                 num_warps=None):  # fmt: skip
    """The snapshot / recompute step of a Gated DeltaNet layer: for each of the T new tokens
    S <- α S, u = β (v - Sᵀ k), S <- S + k uᵀ, o = Sᵀ q (α = exp g), written back to ``state``
    (rows 0 .. batch-1 of a (S, H, K, V) fp32 pool). With ``drafts`` (S', max_verify, H, K, V)
    fp32 the state after each token is kept (a snapshot's rollback); with ``counts`` (batch,)
    int32 the state written is the one after counts[b] tokens (0: unchanged), the others being
    a ragged step's padding (their o is still computed). q, k (batch, T, Hk, K) (q scaled);
    v (batch, T, H, V); g, beta (batch, T, H). Returns o (batch, T, H, V) in v's dtype.
    ``check=False`` skips the checks, which read ``counts`` back (needed inside a CUDA graph
    capture)."""
    if check:
        _check_state_update(state, q, k, v, g, beta, drafts, counts)
    batch, T, H, V = v.shape
    Hk, K = q.shape[2], q.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # contiguous, whatever v's strides
    BV = min(block_v or STATE_UPDATE_LAUNCH[0], triton.next_power_of_2(V))
    _state_update_kernel[(batch, H, triton.cdiv(V, BV))](
        state,
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        g.contiguous(),
        beta.contiguous(),
        o,
        state if drafts is None else drafts,
        state if counts is None else counts,
        H,
        Hk,
        K,
        V,
        1 if drafts is None else drafts.shape[1],
        T=T,
        BLOCK_K=triton.next_power_of_2(K),
        BLOCK_V=BV,
        KEEP_DRAFTS=drafts is not None,
        HAS_COUNTS=counts is not None,
        num_warps=num_warps or STATE_UPDATE_LAUNCH[1],
    )
    return o


# --- references ----------------------------------------------------------------------------
def state_update_ref(state, q, k, v, g, beta, *, drafts=None, counts=None, check=True,
                     block_v=None, num_warps=None):  # fmt: skip
    """PyTorch reference of ``state_update``: the token loop ``replaylab.scan.gdn_scan``."""
    if check:
        _check_state_update(state, q, k, v, g, beta, drafts, counts)
    result = gdn_scan(q, k, v, g, beta, initial_state=state[: v.shape[0]], return_states=True)
    write_kept_states(state, result.states, drafts, counts)
    return result.y


def _heads(t, H):
    """(..., Hk, K) -> (..., H, K): each key head serves H / Hk value heads."""
    return t.repeat_interleave(H // t.shape[-2], dim=-2)


def _decayed_read(S_c, k_log, u_log, g_log, x, g_t):
    """α_t S_{t-1}ᵀ x for one sequence: S_c (H, K, V), log (n, H, ...), x (H, K), g_t (H,)."""
    log_gamma = g_log.sum(0) + g_t  # (H,)
    w = torch.exp(log_gamma - g_log.cumsum(0))  # (n, H): γ_t / γ_s
    coeff = w * (k_log * x).sum(-1)  # (n, H)
    return torch.exp(log_gamma)[:, None] * torch.einsum("hkv,hk->hv", S_c, x) + (
        coeff[..., None] * u_log
    ).sum(0)


def replay_step_ref(
    states,
    slots,
    log_k,
    log_u,
    log_g,
    log_len,
    q,
    k,
    v,
    g,
    beta,
    *,
    log_head=None,
    append_count=None,
    append=True,
    advance=True,
    out=None,
    check=True,
    block_v=None,
    num_warps=None,
    block_l=8,
):
    """PyTorch reference of ``replay_step`` (fp32, one sequence and token at a time)."""
    batch, T, H, V = v.shape
    Lmax = log_k.shape[1]
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    for b in range(batch):
        n = int(log_len[b])
        S_c = states[int(slots[b])]
        logged = {}
        rows = _ring_rows(log_head, b, n + T, Lmax, v.device)
        ks = _heads(log_k[b, rows[:n]].float(), H)
        us, gs = log_u[b, rows[:n]], log_g[b, rows[:n]]
        for t in range(T):
            q_t, k_t = _heads(q[b, t].float(), H), _heads(k[b, t].float(), H)
            g_t = g[b, t].float()
            r = _decayed_read(S_c, ks, us, gs, k_t, g_t)
            u_t = beta[b, t].float()[:, None] * (v[b, t].float() - r)
            o_t = _decayed_read(S_c, ks, us, gs, q_t, g_t) + (k_t * q_t).sum(-1)[:, None] * u_t
            o[b, t] = o_t.to(v.dtype)
            ks, us, gs = (torch.cat([a, x[None]]) for a, x in ((ks, k_t), (us, u_t), (gs, g_t)))
            logged[t] = (k[b, t], u_t, g_t)
        kept = T if append_count is None else min(max(int(append_count[b]), 0), T)
        if append:
            for t in range(kept):
                row = rows[n + t]
                log_k[b, row], log_u[b, row], log_g[b, row] = (
                    logged[t][0].to(log_k.dtype),
                    logged[t][1],
                    logged[t][2],
                )
    if append and advance:
        log_len += T
    return o if out is None else out.copy_(o)


def fold_ref(
    states,
    src_slots,
    out,
    dst_slots,
    log_k,
    log_u,
    log_g,
    fold_len,
    *,
    log_head=None,
    check=True,
    block_v=None,
    num_warps=None,
    precision=None,
    block_l=16,
):
    """PyTorch reference of ``fold``: the decayed sum, one sequence at a time (fp32)."""
    H = log_u.shape[2]
    folded = []
    for b in range(log_k.shape[0]):
        j = int(fold_len[b])
        rows = _ring_rows(log_head, b, j, log_k.shape[1], log_k.device)
        ks, us, gs = _heads(log_k[b, rows].float(), H), log_u[b, rows], log_g[b, rows]
        log_gamma = gs.sum(0)
        w = torch.exp(log_gamma - gs.cumsum(0))  # (j, H)
        S = torch.exp(log_gamma)[:, None, None] * states[int(src_slots[b])]
        folded.append(S + torch.einsum("sh,shk,shv->hkv", w, ks, us))
    for b, S in enumerate(folded):  # write after all reads: a dst may be another's src
        out[int(dst_slots[b])] = S
    return out


def corrected_updates(state, k, v, g, beta):
    """The log's u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t) of a sequence of tokens from ``state``
    (batch, H, K, V), by the token recurrence in fp32: k (batch, T, Hk, K), v (batch, T, H, V),
    g, beta (batch, T, H) -> u (batch, T, H, V) fp32, and the final state. A prefill fills the
    log with these."""
    H = v.shape[2]
    S = state.float().clone()
    kh = _heads(k.float(), H)
    us = []
    for t in range(v.shape[1]):
        alpha = torch.exp(g[:, t].float())[..., None, None]
        S = alpha * S
        u = beta[:, t].float()[..., None] * (
            v[:, t].float() - torch.einsum("bhkv,bhk->bhv", S, kh[:, t])
        )
        S = S + kh[:, t, ..., None] * u[..., None, :]
        us.append(u)
    return torch.stack(us, 1), S
