"""Triton kernels for the replay path (Mamba-2 form), each beside a PyTorch reference with the
same signature: ``replay_step`` / ``replay_step_ref`` and ``fold`` / ``fold_ref``.

Glossary (code name -> paper symbol, shape):
    states     S_c     (slots, H, P, N) fp32   checkpoint states, one slot per checkpoint
    slots              (batch,) int32           the slot each sequence reads; forked branches
                                                may share one slot (ragged batches)
    log_x      x_s     (batch, Lmax, H, P)      logged scan inputs since the checkpoint
    log_dt     dt_s    (batch, Lmax, H)         raw dt (before bias / softplus / limits)
    log_B/C    B_s,C_s (batch, Lmax, G, N)
    log_len            (batch,) int32           valid log entries per sequence
    x, dt, B, C        (batch, T, ...)          the T new tokens (T = 1 decode, k + 1 verify)

With Δ processed as the layer does and a_s = exp(Δ_s A), the state after j logged tokens is
    S_{c+j} = (Π_{s<=j} a_s) S_c + Σ_{s<=j} (Π_{s<u<=j} a_u) Δ_s x_s B_s^T,
so a new token's output needs one *read* of S_c and the log:
    y_t = e^{cum_t} (S_c C_t) + Σ_{s<=t} e^{cum_t - cum_s} Δ_s (B_s · C_t) x_s + D x_t,
with cum the running sum of Δ A over log and new tokens. ``replay_step`` computes that without
writing any state and appends the new inputs to the log; ``fold`` writes S_{c+j} to a slot.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from replaylab.scan import ssd_scan
from replaylab.validation import check_sizes_agree

__all__ = ["replay_step", "replay_step_ref", "fold", "fold_ref"]


@triton.jit
def _delta(dt, bias, lo, hi, SOFTPLUS: tl.constexpr):
    """Δ from raw dt, fp32: + bias, softplus, clamp to [lo, hi]."""
    d = dt + bias
    if SOFTPLUS:
        d = tl.where(d > 20.0, d, tl.log(1.0 + tl.exp(tl.minimum(d, 20.0))))
    return tl.minimum(tl.maximum(d, lo), hi)


@triton.jit(do_not_specialize=["T"])  # one binary for every T (see the loop)
def _replay_step_kernel(
    states,
    slots,  # (S, H, P, N) fp32 checkpoints; (batch,) slot per sequence
    log_x,
    log_dt,
    log_B,
    log_C,  # logs (batch, Lmax, ...); appended to when APPEND
    log_len,  # (batch,) valid entries per sequence
    log_head,  # (batch,) ring offset: entry i of sequence b sits at row (head + i) % Lmax
    append_count,  # (batch,) with HAS_COUNT: append only tokens t < append_count[b]
    x,
    dt,
    B,
    C,  # new tokens (batch, T, ...)
    A,
    D,
    dt_bias,  # (H,) per-head parameters (fp32)
    y,  # (batch, T, H, P) output
    dt_lo,
    dt_hi,  # dt limits
    Lmax,
    H,
    P,
    N,
    G,  # sizes
    T,  # new tokens per sequence: a runtime loop bound, never specialized
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    HAS_D: tl.constexpr,
    APPEND: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    b, h, pid_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g = h // (H // G)
    slot = tl.load(slots + b).to(tl.int64)
    L = tl.load(log_len + b)
    n_append = tl.load(append_count + b) if HAS_COUNT else T
    head = tl.load(log_head + b)
    a_h = tl.load(A + h).to(tl.float32)
    bias = tl.load(dt_bias + h).to(tl.float32)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mp, mn = offs_p < P, offs_n < N
    # the one read of the checkpoint state
    S = tl.load(
        states + ((slot * H + h) * P + offs_p[:, None]) * N + offs_n[None, :],
        mask=mp[:, None] & mn[None, :],
        other=0.0,
    )
    # Token t is computed exactly as a one-token step would compute it once tokens 0 .. t-1
    # were in the log: the same operations in the same order, so a verify of T tokens rounds
    # as T single steps do. Log rows L .. L+t-1 are read from the new inputs. T is a runtime
    # bound (not unrolled, not specialized at 1): a decode step and every row of a verify run
    # the same compiled loop body.
    one = tl.arange(0, BLOCK_T)  # a block of one token (the other lanes masked)
    mt = one < 1
    for t in range(T):
        Lt = L + t
        # total decay of the log
        total = 0.0
        for l0 in range(0, Lt, BLOCK_L):
            offs_l = l0 + tl.arange(0, BLOCK_L)
            ml, old = offs_l < Lt, offs_l < L
            ring = b * Lmax + (head + offs_l) % Lmax  # log rows of entries offs_l
            dl = tl.load(
                tl.where(old, log_dt + ring * H, dt + (b * T + offs_l - L) * H) + h,
                mask=ml,
                other=0.0,
            ).to(tl.float32)
            total += tl.sum(tl.where(ml, _delta(dl, bias, dt_lo, dt_hi, SOFTPLUS) * a_h, 0.0))
        # the token itself
        row_t = b * T + t + one
        dn = tl.load(dt + row_t * H + h, mask=mt, other=0.0).to(tl.float32)
        delta_n = tl.where(mt, _delta(dn, bias, dt_lo, dt_hi, SOFTPLUS), 0.0)
        cum_n = tl.cumsum(delta_n * a_h, axis=0)
        Bn = tl.load(
            B + (row_t[:, None] * G + g) * N + offs_n[None, :],
            mask=mt[:, None] & mn[None, :],
            other=0.0,
        ).to(tl.float32)
        xn = tl.load(
            x + (row_t[:, None] * H + h) * P + offs_p[None, :],
            mask=mt[:, None] & mp[None, :],
            other=0.0,
        ).to(tl.float32)
        C_t = tl.load(C + ((b * T + t) * G + g) * N + offs_n, mask=mn, other=0.0).to(tl.float32)
        cum_t = tl.sum(tl.where(one == 0, cum_n, 0.0))
        out = tl.exp(total + cum_t) * tl.sum(S * C_t[None, :], axis=1)
        run = 0.0
        for l0 in range(0, Lt, BLOCK_L):
            offs_l = l0 + tl.arange(0, BLOCK_L)
            ml, old = offs_l < Lt, offs_l < L
            ring = b * Lmax + (head + offs_l) % Lmax  # log rows of entries offs_l
            dl = tl.load(
                tl.where(old, log_dt + ring * H, dt + (b * T + offs_l - L) * H) + h,
                mask=ml,
                other=0.0,
            ).to(tl.float32)
            delta_l = tl.where(ml, _delta(dl, bias, dt_lo, dt_hi, SOFTPLUS), 0.0)
            cum_l = run + tl.cumsum(delta_l * a_h, axis=0)
            run += tl.sum(delta_l * a_h)
            Bl = tl.load(
                tl.where(
                    old[:, None],
                    log_B + (ring[:, None] * G + g) * N,
                    B + ((b * T + offs_l[:, None] - L) * G + g) * N,
                )
                + offs_n[None, :],
                mask=ml[:, None] & mn[None, :],
                other=0.0,
            ).to(tl.float32)
            w = tl.exp(total - cum_l + cum_t) * delta_l * tl.sum(Bl * C_t[None, :], axis=1)
            xl = tl.load(
                tl.where(
                    old[:, None],
                    log_x + (ring[:, None] * H + h) * P,
                    x + ((b * T + offs_l[:, None] - L) * H + h) * P,
                )
                + offs_p[None, :],
                mask=ml[:, None] & mp[None, :],
                other=0.0,
            ).to(tl.float32)
            out += tl.sum(tl.where(ml, w, 0.0)[:, None] * xl, axis=0)
        decay = tl.exp(tl.where(mt, cum_t - cum_n, -float("inf")))
        w_new = decay * delta_n * tl.sum(Bn * C_t[None, :], axis=1)
        out += tl.sum(w_new[:, None] * xn, axis=0)
        x_t = tl.load(x + ((b * T + t) * H + h) * P + offs_p, mask=mp, other=0.0).to(tl.float32)
        if HAS_D:
            out += tl.load(D + h).to(tl.float32) * x_t
        tl.store(y + ((b * T + t) * H + h) * P + offs_p, out.to(y.dtype.element_ty), mask=mp)
        if APPEND:
            row = b * Lmax + (head + L + t) % Lmax
            keep_p = mp & ((offs_p * 0 + t) < n_append)  # padding leaves the ring alone
            tl.store(
                log_x + (row * H + h) * P + offs_p, x_t.to(log_x.dtype.element_ty), mask=keep_p
            )
            lane = tl.arange(0, 1)
            first = ((lane + pid_p) == 0) & ((lane + t) < n_append)  # one per head writes dt
            tl.store(
                log_dt + row * H + h + lane, tl.load(dt + (b * T + t) * H + h + lane), mask=first
            )
            owner = (offs_n * 0 + pid_p + h % (H // G)) == 0  # one per group writes B and C
            owner = owner & ((offs_n * 0 + t) < n_append)
            B_t = tl.load(B + ((b * T + t) * G + g) * N + offs_n, mask=mn, other=0.0)
            tl.store(log_B + (row * G + g) * N + offs_n, B_t, mask=mn & owner)
            tl.store(
                log_C + (row * G + g) * N + offs_n, C_t.to(log_C.dtype.element_ty), mask=mn & owner
            )


@triton.jit
def _replay_verify_kernel(
    states,
    slots,
    log_x,
    log_dt,
    log_B,
    log_C,
    log_len,
    log_head,
    x,
    dt,
    B,
    C,
    A,
    D,
    dt_bias,
    y,
    dt_lo,
    dt_hi,
    Lmax,
    H,
    P,
    N,
    G,  # as _replay_step_kernel
    T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    HAS_D: tl.constexpr,
    APPEND: tl.constexpr,
    PRECISION: tl.constexpr,  # tl.dot input precision: "tf32x3" on a GPU (~fp32)
):
    """T > 1 (verification): all T outputs at once as small matrix products."""
    b, h, pid_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g = h // (H // G)
    slot = tl.load(slots + b).to(tl.int64)
    L = tl.load(log_len + b)
    head = tl.load(log_head + b)
    a_h = tl.load(A + h).to(tl.float32)
    bias = tl.load(dt_bias + h).to(tl.float32)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_T)
    mp, mn, mt = offs_p < P, offs_n < N, offs_t < T
    S = tl.load(
        states + ((slot * H + h) * P + offs_p[:, None]) * N + offs_n[None, :],
        mask=mp[:, None] & mn[None, :],
        other=0.0,
    )
    total = 0.0
    for l0 in range(0, L, BLOCK_L):
        offs_l = l0 + tl.arange(0, BLOCK_L)
        ml = offs_l < L
        ring = b * Lmax + (head + offs_l) % Lmax
        dl = tl.load(log_dt + ring * H + h, mask=ml, other=0.0).to(tl.float32)
        total += tl.sum(tl.where(ml, _delta(dl, bias, dt_lo, dt_hi, SOFTPLUS) * a_h, 0.0))
    tn = (b * T + offs_t) * H + h  # new tokens' (batch, t, head) rows
    dn = tl.load(dt + tn, mask=mt, other=0.0).to(tl.float32)
    delta_n = tl.where(mt, _delta(dn, bias, dt_lo, dt_hi, SOFTPLUS), 0.0)
    cum_n = tl.cumsum(delta_n * a_h, axis=0)
    gn = ((b * T + offs_t[:, None]) * G + g) * N + offs_n[None, :]
    mtn = mt[:, None] & mn[None, :]
    Bn = tl.load(B + gn, mask=mtn, other=0.0)
    Cn = tl.load(C + gn, mask=mtn, other=0.0)
    xn = tl.load(
        x + tn[:, None] * P + offs_p[None, :], mask=mt[:, None] & mp[None, :], other=0.0
    ).to(tl.float32)
    Cf = Cn.to(tl.float32)
    # e^{cum_t} (S_c C_t) for every t: one product with the state tile
    out = tl.exp(total + cum_n)[:, None] * tl.dot(Cf, tl.trans(S), input_precision=PRECISION)
    run = 0.0
    for l0 in range(0, L, BLOCK_L):  # the log: scores C_t . B_s, decayed, times x_s
        offs_l = l0 + tl.arange(0, BLOCK_L)
        ml = offs_l < L
        ring = b * Lmax + (head + offs_l) % Lmax
        dl = tl.load(log_dt + ring * H + h, mask=ml, other=0.0).to(tl.float32)
        delta_l = tl.where(ml, _delta(dl, bias, dt_lo, dt_hi, SOFTPLUS), 0.0)
        cum_l = run + tl.cumsum(delta_l * a_h, axis=0)
        run += tl.sum(delta_l * a_h)
        Bl = tl.load(
            log_B + (ring[:, None] * G + g) * N + offs_n[None, :],
            mask=ml[:, None] & mn[None, :],
            other=0.0,
        ).to(tl.float32)
        xl = tl.load(
            log_x + (ring[:, None] * H + h) * P + offs_p[None, :],
            mask=ml[:, None] & mp[None, :],
            other=0.0,
        ).to(tl.float32)
        scores = tl.dot(Cf, tl.trans(Bl), input_precision=PRECISION)  # (T, L)
        w_log = tl.exp(total - cum_l[None, :] + cum_n[:, None]) * delta_l[None, :] * scores
        out += tl.dot(tl.where(ml[None, :], w_log, 0.0), xl, input_precision=PRECISION)
    scores_n = tl.dot(Cf, tl.trans(Bn.to(tl.float32)), input_precision=PRECISION)  # (T, T)
    causal = (offs_t[None, :] <= offs_t[:, None]) & mt[None, :] & mt[:, None]
    decay = tl.exp(tl.where(causal, cum_n[:, None] - cum_n[None, :], -float("inf")))
    out += tl.dot(decay * delta_n[None, :] * scores_n, xn, input_precision=PRECISION)
    if HAS_D:
        out += tl.load(D + h).to(tl.float32) * xn
    mtp = mt[:, None] & mp[None, :]
    tl.store(y + tn[:, None] * P + offs_p[None, :], out.to(y.dtype.element_ty), mask=mtp)
    if APPEND:
        rows = b * Lmax + (head + L + offs_t) % Lmax
        tl.store(
            log_x + (rows[:, None] * H + h) * P + offs_p[None, :],
            xn.to(log_x.dtype.element_ty),
            mask=mtp,
        )
        first = mt & ((offs_t * 0 + pid_p) == 0)  # one program per head writes dt
        tl.store(log_dt + rows * H + h, tl.load(dt + tn, mask=mt), mask=first)
        owner = (offs_t * 0 + pid_p + h % (H // G)) == 0  # one program per group: B and C
        go = (rows[:, None] * G + g) * N + offs_n[None, :]
        tl.store(log_B + go, Bn, mask=mtn & owner[:, None])
        tl.store(log_C + go, Cn, mask=mtn & owner[:, None])


@triton.jit
def _fold_kernel(
    states,
    src_slots,
    out,
    dst_slots,  # read states[src_slots[b]], write out[dst_slots[b]] (fp32)
    log_x,
    log_dt,
    log_B,  # logs (batch, Lmax, ...)
    fold_len,  # (batch,) entries to fold per sequence; 0: the program returns at once
    log_head,  # (batch,) ring offset of entry 0 (see _replay_step_kernel)
    A,
    dt_bias,  # (H,)
    dt_lo,
    dt_hi,
    Lmax,
    H,
    P,
    N,
    G,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    SOFTPLUS: tl.constexpr,
):
    b, h, pid_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g = h // (H // G)
    src = tl.load(src_slots + b).to(tl.int64)
    dst = tl.load(dst_slots + b).to(tl.int64)
    J = tl.load(fold_len + b)
    if (J > 0) | (src != dst):  # nothing to fold in place: read and write nothing
        head = tl.load(log_head + b)
        a_h = tl.load(A + h).to(tl.float32)
        bias = tl.load(dt_bias + h).to(tl.float32)
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        mp, mn = offs_p < P, offs_n < N
        tile = offs_p[:, None] * N + offs_n[None, :]
        mask = mp[:, None] & mn[None, :]
        S = tl.load(states + (src * H + h) * P * N + tile, mask=mask, other=0.0)
        for l0 in range(0, J, BLOCK_L):  # a block of tokens: S <- e^{sum} S + X^T diag(w) B
            offs_l = l0 + tl.arange(0, BLOCK_L)
            ml = offs_l < J
            ring = b * Lmax + (head + offs_l) % Lmax
            dl = tl.load(log_dt + ring * H + h, mask=ml, other=0.0).to(tl.float32)
            delta = tl.where(ml, _delta(dl, bias, dt_lo, dt_hi, SOFTPLUS), 0.0)
            cum = tl.cumsum(delta * a_h, axis=0)
            block_total = tl.sum(delta * a_h)
            w = tl.where(ml, tl.exp(block_total - cum) * delta, 0.0)
            xl = tl.load(
                log_x + (ring[:, None] * H + h) * P + offs_p[None, :],
                mask=ml[:, None] & mp[None, :],
                other=0.0,
            ).to(tl.float32)
            Bl = tl.load(
                log_B + (ring[:, None] * G + g) * N + offs_n[None, :],
                mask=ml[:, None] & mn[None, :],
                other=0.0,
            ).to(tl.float32)
            S = tl.exp(block_total) * S + tl.dot(
                tl.trans(xl * w[:, None]), Bl, input_precision="ieee"
            )
        tl.store(out + (dst * H + h) * P * N + tile, S, mask=mask)


# (BLOCK_P, num_warps) per kernel on a GPU, by batch: rows (up to batch, BLOCK_P, num_warps),
# the first row whose batch bound holds wins. Chosen by ``python -m replaylab.bench sweep`` on
# an H200 for the 8B-class layer (P=64, N=128; data/bench_kernels_sweep.json); the
# interpreter ignores num_warps.
LAUNCH = {
    "replay_step": [(1, 32, 4), (8, 64, 1), (math.inf, 64, 2)],
    "fold": [(1, 32, 4), (math.inf, 32, 1)],
}


# Entries the fold sums at a time (a block's decay and outer products, then the next block)
FOLD_BLOCK_L = 16


# One launch (block of P, warps) for every batch: the reduction order, and so a sequence's
# bits, then do not depend on how many sequences share the launch. The serving engine's
# default; LAUNCH above is tuned per batch for speed (what this costs: data/README.md, under
# bench_kernels_sweep.json).
BATCH_INVARIANT = {"replay_step": (64, 2), "fold": (32, 1)}


def _blocks(P, N, kernel, block_p=None, num_warps=None, batch=1):
    default_p, default_w = next((p, w) for bound, p, w in LAUNCH[kernel] if batch <= bound)
    block_p = min(block_p or default_p, triton.next_power_of_2(P))
    return block_p, triton.next_power_of_2(N), num_warps or default_w


def _check_offsets(batch, Lmax, H, P):
    """The kernels index logs with 32-bit offsets: refuse what would overflow them."""
    if batch * Lmax * H * P >= 2**31:
        raise ValueError(
            f"log: batch {batch} x capacity {Lmax} x H {H} x P {P} elements exceed the "
            f"kernels' 32-bit offsets (2**31); use fewer sequences per call or a shorter log"
        )


def _check(states, slots, log_x, log_dt, log_B, log_len, length="log_len"):
    if states.dtype != torch.float32:
        raise ValueError(f"states: expected float32 checkpoint states, got {states.dtype}")
    batch = log_x.shape[0]
    for name, t in (("slots", slots), (length, log_len)):
        if t.shape != (batch,) or t.dtype != torch.int32:
            raise ValueError(
                f"{name}: expected int32 of shape ({batch},), got {t.dtype} {tuple(t.shape)}"
            )
    if int(slots.min()) < 0 or int(slots.max()) >= states.shape[0]:
        raise ValueError(f"slots: expected values in [0, {states.shape[0]}), got {slots.tolist()}")
    Lmax = log_x.shape[1]
    if batch and (int(log_len.min()) < 0 or int(log_len.max()) > Lmax):
        raise ValueError(f"{length}: expected values in [0, {Lmax}], got {log_len.tolist()}")


def _check_shapes(states, log_x, log_dt, log_B, log_C=None, new=(None,) * 4, A=None, D=None,
                  dt_bias=None, out=None, states_name="states"):  # fmt: skip
    """The glossary's sizes agree across its tensors (the kernels index them by offsets, so
    a mismatch would read or write outside them); ``new``: (x, dt, B, C)."""
    check_token_sizes([
        (states_name, states, ("slots", "H", "P", "N")), ("log_x", log_x, ("batch", "Lmax", "H", "P")),
        ("log_dt", log_dt, ("batch", "Lmax", "H")), ("log_B", log_B, ("batch", "Lmax", "G", "N")),
        ("log_C", log_C, ("batch", "Lmax", "G", "N")), *token_specs(*new, A, D, dt_bias),
        ("out", out, ("batch", "T", "H", "P")),
    ])  # fmt: skip


def token_specs(x, dt, B, C, A=None, D=None, dt_bias=None, state=None):
    """Mamba-2's per-token inputs as (name, tensor, dims) for ``check_token_sizes``: x (batch,
    T, H, P), ``state`` (batch, H, P, N; rows per sequence), dt (batch, T, H), B and C (batch,
    T, G, N), A, D and dt_bias (H,); None is skipped."""
    return [
        ("x", x, ("batch", "T", "H", "P")), ("state", state, ("batch", "H", "P", "N")),
        ("dt", dt, ("batch", "T", "H")), ("B", B, ("batch", "T", "G", "N")),
        ("C", C, ("batch", "T", "G", "N")), ("A", A, ("H",)), ("D", D, ("H",)),
        ("dt_bias", dt_bias, ("H",)),
    ]  # fmt: skip


def check_token_sizes(specs):
    """``validation.check_sizes_agree`` over ``specs``, then that the G groups of B and C
    divide the H heads; returns the sizes by letter."""
    sizes = check_sizes_agree(specs)
    if "G" in sizes and "H" in sizes and sizes["H"] % sizes["G"]:
        grouped = ", ".join(name for name, t, dims in specs if t is not None and "G" in dims)
        raise ValueError(
            f"{grouped}: their G={sizes['G']} groups do not divide H={sizes['H']} heads"
        )
    return sizes


def _ring_head(log_head, batch, device):
    return torch.zeros(batch, dtype=torch.int32, device=device) if log_head is None else log_head


def _check_head(head, batch, Lmax):
    if head.shape != (batch,) or head.dtype != torch.int32:
        raise ValueError(
            f"log_head: expected int32 of shape ({batch},), got {head.dtype} {tuple(head.shape)}"
        )
    if batch and (int(head.min()) < 0 or int(head.max()) >= Lmax):
        raise ValueError(f"log_head: expected values in [0, {Lmax}), got {head.tolist()}")


def replay_step(
    states,
    slots,
    log_x,
    log_dt,
    log_B,
    log_C,
    log_len,
    x,
    dt,
    B,
    C,
    A,
    D=None,
    dt_bias=None,
    dt_softplus=True,
    dt_limit=(0.0, math.inf),
    append=True,
    out=None,
    check=True,
    block_p=None,
    num_warps=None,
    kernel="auto",
    advance=True,
    log_head=None,
    append_count=None,
):
    """Outputs y (batch, T, H, P) of T new tokens from checkpoint + log, writing no state
    (into ``out`` when given). ``check=False`` skips the input checks, which read values back
    from the device (needed inside a CUDA graph capture). ``kernel``: "per_token" (a loop over
    the T tokens in one launch, one compiled loop body for every T, so each row is bit for bit
    the decode step at its position; best for decode and short verification), "verify" (all
    T at once as matrix products on tensor cores; needs P, N >= 16 on a GPU), "exact" (T
    launches of the one-token kernel, each appending before the next: the same bits at T
    reads of the checkpoint) or "auto" (verify for T >= 8; chosen by
    data/bench_kernels_verify.json).

    With ``append`` the new inputs go to the log at ``log_len`` and ``log_len`` grows by T
    (the caller keeps room: ``log_len + T <= Lmax``); ``advance=False`` leaves ``log_len``
    for the caller to move (one counter shared by several layers). ``log_head`` (batch,)
    int32 makes each log a ring: entry i of sequence b is row (log_head[b] + i) % Lmax, so a
    fold of the oldest entries is a move of the head, not a copy of the rest (None: 0).
    ``append_count`` (batch,) int32 ("per_token" and "exact"): sequence b appends only its
    first append_count[b] tokens, the rest are padding of a ragged batch and leave its ring
    as it was (None: all T).
    """
    batch, T, H, P = x.shape
    Lmax, G, N = log_x.shape[1], B.shape[2], B.shape[3]
    _check_offsets(batch, Lmax, H, P)
    y_dtype = x.dtype
    # the kernel reads log rows and new inputs through one pointer: one dtype per field
    x, dt, B, C = x.to(log_x.dtype), dt.to(log_dt.dtype), B.to(log_B.dtype), C.to(log_C.dtype)
    head = _ring_head(log_head, batch, x.device)
    if check:
        _check_shapes(states, log_x, log_dt, log_B, log_C, (x, dt, B, C), A, D, dt_bias, out)
        _check(states, slots, log_x, log_dt, log_B, log_len)
        _check_head(head, batch, Lmax)
    if check and append:
        ends = log_len + (T if append_count is None else append_count.clamp(0, T))
        if int(ends.max()) > Lmax:
            raise ValueError(
                f"log_len: appending needs log_len + tokens appended <= Lmax={Lmax}, got "
                f"log_len {log_len.tolist()} + {T if append_count is None else append_count.tolist()}"
            )
    # not empty_like: x may be a permuted view, and the kernel writes y row-major
    y = torch.empty(x.shape, dtype=y_dtype, device=x.device) if out is None else out
    if not y.is_contiguous():
        raise ValueError("out: expected a contiguous tensor")
    BLOCK_P, BLOCK_N, warps = _blocks(P, N, "replay_step", block_p, num_warps, batch)
    bias = dt_bias if dt_bias is not None else torch.zeros(H, device=x.device)
    grid = (batch, H, triton.cdiv(P, BLOCK_P))
    if kernel not in ("auto", "per_token", "verify", "exact"):
        raise ValueError(
            f"kernel: expected 'auto', 'per_token', 'verify' or 'exact', got {kernel!r}"
        )
    if kernel == "exact" and T > 1:
        return _replay_exact(
            states, slots, (log_x, log_dt, log_B, log_C), log_len, (x, dt, B, C), A, D,
            dt_bias, dt_softplus, dt_limit, y, append, advance, block_p, num_warps, log_head,
            append_count,
        )  # fmt: skip
    if kernel == "auto":
        kernel = "verify" if T >= 8 and P >= 16 and N >= 16 else "per_token"
    if kernel == "verify" and append_count is not None:
        raise ValueError("append_count: the 'verify' kernel appends all T tokens; use 'per_token'")
    args = (
        states,
        slots,
        log_x,
        log_dt,
        log_B,
        log_C,
        log_len,
        head,
        x.contiguous(),
        dt.contiguous(),
        B.contiguous(),
        C.contiguous(),
        A,
        D if D is not None else A,
        bias,
        y,
        float(dt_limit[0]),
        float(min(dt_limit[1], 3.0e38)),
        Lmax,
        H,
        P,
        N,
        G,
    )
    common = dict(
        T=T,
        BLOCK_P=BLOCK_P,
        BLOCK_N=BLOCK_N,
        BLOCK_L=16,
        SOFTPLUS=dt_softplus,
        HAS_D=D is not None,
        APPEND=append,
    )
    if kernel == "verify":
        _replay_verify_kernel[grid](
            *args,
            **common,
            BLOCK_T=max(16, triton.next_power_of_2(T)),
            PRECISION="tf32x3" if x.is_cuda else "ieee",
            num_warps=4,
        )
    else:  # one token at a time, each as a single step (BLOCK_T: a block of one token)
        counted = append_count is not None
        step_args = (*args[:8], append_count if counted else log_len, *args[8:], T)
        _replay_step_kernel[grid](
            *step_args, **{k: v for k, v in common.items() if k != "T"}, BLOCK_T=2,
            HAS_COUNT=counted, num_warps=warps,
        )  # fmt: skip
    if append and advance:
        log_len += T
    return y


def _replay_exact(
    states, slots, logs, log_len, new, A, D, dt_bias, dt_softplus, dt_limit, y, append, advance,
    block_p, num_warps, log_head, append_count,
):  # fmt: skip
    """``replay_step(kernel="exact")``: token t is a one-token step after tokens 0 .. t-1."""
    if not append:
        raise ValueError("kernel='exact' appends each token before the next: needs append=True")
    for t in range(new[0].shape[1]):
        one = [v[:, t : t + 1].contiguous() for v in new]
        count = None if append_count is None else (append_count - t).clamp(0, 1)
        y[:, t] = replay_step(
            states, slots, *logs, log_len + t, *one, A, D, dt_bias, dt_softplus, dt_limit,
            append=True, check=False, block_p=block_p, num_warps=num_warps, kernel="per_token",
            advance=False, log_head=log_head, append_count=count,
        )[:, 0]  # fmt: skip
    if advance:
        log_len += new[0].shape[1]
    return y


def fold(
    states,
    src_slots,
    out,
    dst_slots,
    log_x,
    log_dt,
    log_B,
    fold_len,
    A,
    dt_bias=None,
    dt_softplus=True,
    dt_limit=(0.0, math.inf),
    check=True,
    block_p=None,
    num_warps=None,
    log_head=None,
):
    """Write S_{c+j} = fold(S_c, log[:j]) to ``out[dst_slots[b]]`` (``out`` may be ``states``;
    then no slot may be both read and written), S_c = ``states[src_slots[b]]``, j = ``fold_len[b]``.
    A sequence with j = 0 folding in place costs nothing (its programs return at once).
    ``log_head``: ring offsets (see ``replay_step``). Returns ``out``. ``check=False`` skips
    the checks (see ``replay_step``)."""
    if check:
        _check_shapes(states, log_x, log_dt, log_B, A=A, dt_bias=dt_bias)
        _check_shapes(out, log_x, log_dt, log_B, states_name="out")
        _check(states, src_slots, log_x, log_dt, log_B, fold_len, "fold_len")
        _check(out, dst_slots, log_x, log_dt, log_B, fold_len, "fold_len")
    batch, Lmax, H, P = log_x.shape
    G, N = log_B.shape[2], log_B.shape[3]
    _check_offsets(batch, Lmax, H, P)
    head = _ring_head(log_head, batch, log_x.device)
    if check:
        _check_head(head, batch, Lmax)
    BLOCK_P, BLOCK_N, warps = _blocks(P, N, "fold", block_p, num_warps, batch)
    bias = dt_bias if dt_bias is not None else torch.zeros(H, device=log_x.device)
    grid = (batch, H, triton.cdiv(P, BLOCK_P))
    _fold_kernel[grid](
        states,
        src_slots,
        out,
        dst_slots,
        log_x,
        log_dt,
        log_B,
        fold_len,
        head,
        A,
        bias,
        float(dt_limit[0]),
        float(min(dt_limit[1], 3.0e38)),
        Lmax,
        H,
        P,
        N,
        G,
        BLOCK_P=BLOCK_P,
        BLOCK_N=BLOCK_N,
        BLOCK_L=FOLD_BLOCK_L,
        SOFTPLUS=dt_softplus,
        num_warps=warps,
    )
    return out


def replay_step_ref(
    states,
    slots,
    log_x,
    log_dt,
    log_B,
    log_C,
    log_len,
    x,
    dt,
    B,
    C,
    A,
    D=None,
    dt_bias=None,
    dt_softplus=True,
    dt_limit=(0.0, math.inf),
    append=True,
    out=None,
    check=True,
    block_p=None,
    num_warps=None,
    kernel="auto",
    advance=True,
    log_head=None,
    append_count=None,
):
    """PyTorch reference of ``replay_step``: fold the log with the reference scan, then scan
    the new tokens from the folded state (float32)."""
    batch, T = x.shape[:2]
    Lmax = log_x.shape[1]
    ys = []
    for b in range(batch):
        n = int(log_len[b])
        rows = _ring_rows(log_head, b, n + T, Lmax, x.device)
        old = rows[:n]
        state = ssd_scan(
            log_x[b : b + 1, old],
            log_dt[b : b + 1, old],
            A,
            log_B[b : b + 1, old],
            log_C[b : b + 1, old],
            dt_bias=dt_bias,
            dt_softplus=dt_softplus,
            dt_limit=dt_limit,
            initial_state=states[int(slots[b])][None],
        ).state
        ys.append(
            ssd_scan(
                x[b : b + 1],
                dt[b : b + 1],
                A,
                B[b : b + 1],
                C[b : b + 1],
                D,
                dt_bias=dt_bias,
                dt_softplus=dt_softplus,
                dt_limit=dt_limit,
                initial_state=state,
            ).y
        )
        if append:
            kept = T if append_count is None else min(int(append_count[b]), T)
            for log, new in ((log_x, x), (log_dt, dt), (log_B, B), (log_C, C)):
                log[b, rows[n : n + kept]] = new[b, :kept].to(log.dtype)
    if append and advance:
        log_len += T
    y = torch.cat(ys)
    return y if out is None else out.copy_(y)


def _ring_rows(log_head, b, n, Lmax, device):
    """Log rows of entries 0 .. n-1 of sequence b (a ring from ``log_head[b]``)."""
    head = 0 if log_head is None else int(log_head[b])
    return (head + torch.arange(n, device=device)) % Lmax


def fold_ref(
    states,
    src_slots,
    out,
    dst_slots,
    log_x,
    log_dt,
    log_B,
    fold_len,
    A,
    dt_bias=None,
    dt_softplus=True,
    dt_limit=(0.0, math.inf),
    check=True,
    block_p=None,
    num_warps=None,
    log_head=None,
):
    """PyTorch reference of ``fold`` (the reference scan over the first j log entries)."""
    folded = []
    for b in range(log_x.shape[0]):
        j = int(fold_len[b])
        rows = _ring_rows(log_head, b, j, log_x.shape[1], log_x.device)
        folded.append(
            ssd_scan(
                log_x[b : b + 1, rows],
                log_dt[b : b + 1, rows],
                A,
                log_B[b : b + 1, rows],
                torch.zeros_like(log_B[b : b + 1, rows]),  # C: shapes only the discarded outputs
                dt_bias=dt_bias,
                dt_softplus=dt_softplus,
                dt_limit=dt_limit,
                initial_state=states[int(src_slots[b])][None],
            ).state[0]
        )
    for b, s in enumerate(folded):  # write after all reads: a dst may be another's src
        out[int(dst_slots[b])] = s
    return out
