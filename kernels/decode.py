"""Fused decode operations for ``replaylab.serving.DecodeEngine`` on a GPU, each beside the
PyTorch expression it replaces (the teaching model's), with the same rounding points.

A decode step at small batch moves little data per operation, so its time is set by how many
kernels it launches: the teaching model's RMSNorm alone is five. These kernels fold each group
of element-wise operations into one launch:

    add_rmsnorm     h + delta (the residual add) then RMSNorm:        model.RMSNorm
    gated_rmsnorm   y * silu(gate), RMS-normalised per group:          mamba2.GatedRMSNorm
                    or (norm_first) RMSNorm(y) * weight * silu(gate)
                    per head:                                          GatedDeltaNetMixer.norm
    conv_step       causal depthwise conv + SiLU over window + T new
                    tokens, split into contiguous x, B, C and dt,
                    the window advanced in place (and kept per token
                    for a rollback when T > 1):                        Mamba2Mixer.conv
    relu2           relu(u)^2:                                         model.MLP (NemotronH)
    swiglu          silu(gate) * up:                                   model.MLP (Bamba)
    rope_           RoPE on the first rotary_dim dims of q's and k's
                    heads, in place, each row at its slot's position:  model.Attention.rotate
    state_update    the snapshot strategy's step: S <- a S + Δ x B^T,
                    y = S C + D x, the state written back (and kept
                    per token when T > 1):                             scan.ssd_scan
    attention       one query token against the KV rows up to its
                    position, online softmax, per (sequence, head,
                    token), reading only the visible rows:             model.Attention

Each output row is computed the same way whatever T is, so with these kernels a (k+1)-token
verify rounds as k+1 single-token steps would (a matrix product over all T rows at once may
pick another reduction order for another T, and a near-tie then flips a verified token).

Shapes: R rows (batch * T tokens), D hidden width, H, P, N, G as in ``replaylab.model``,
K = d_conv - 1 window rows, C conv channels (H*P + 2*G*N), W the in_proj output width.
Under ``TRITON_INTERPRET=1`` they run on CPU tensors (the tests compare them with the
references there).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from replaylab.kernels.mamba2 import _delta, check_token_sizes, token_specs

__all__ = [
    "add_rmsnorm", "gated_rmsnorm", "conv_step", "relu2", "swiglu", "rope_", "state_update",
    "attention", "write_kept_states",
]  # fmt: skip


@triton.jit
def _silu(v):
    return v / (1.0 + tl.exp(-v))


@triton.jit
def _add_rmsnorm_kernel(
    h, delta, weight, h_out, y, eps, D, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    v = tl.load(h + row * D + offs, mask=m, other=0.0)
    if HAS_DELTA:
        d = tl.load(delta + row * D + offs, mask=m, other=0.0)
        v = (v.to(tl.float32) + d.to(tl.float32)).to(h_out.dtype.element_ty)
        tl.store(h_out + row * D + offs, v, mask=m)
    v32 = v.to(tl.float32)
    r = tl.rsqrt(tl.sum(v32 * v32, axis=0) / D + eps)
    w = tl.load(weight + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(y + row * D + offs, (w * (v32 * r)).to(y.dtype.element_ty), mask=m)


def add_rmsnorm(h, weight, eps, delta=None):
    """RMSNorm of ``h + delta`` (or of ``h``): returns (residual, normed), both (..., D) in
    h's dtype. ``residual`` is the new residual stream ``h + delta`` (``h`` itself without
    delta). Rounding as ``model.RMSNorm``: the sum in h's dtype, the norm in fp32."""
    D = h.shape[-1]
    if tuple(weight.shape) != (D,):
        raise ValueError(f"weight: expected ({D},), h's last dimension, got {tuple(weight.shape)}")
    if delta is not None and delta.shape != h.shape:
        raise ValueError(f"delta: expected h's shape {tuple(h.shape)}, got {tuple(delta.shape)}")
    h2 = h.reshape(-1, D)
    if not h2.is_contiguous():
        raise ValueError("h: expected a contiguous tensor")
    y = torch.empty_like(h2)
    out = torch.empty_like(h2) if delta is not None else h2
    d2 = delta.reshape(-1, D).contiguous() if delta is not None else h2
    _add_rmsnorm_kernel[(h2.shape[0],)](
        h2,
        d2,
        weight,
        out,
        y,
        float(eps),
        D,
        HAS_DELTA=delta is not None,
        BLOCK=triton.next_power_of_2(D),
        num_warps=8 if D >= 2048 else 4,
    )
    return out.view(h.shape), y.view(h.shape)


@triton.jit
def _gated_rmsnorm_kernel(
    y, gate, weight, out, gate_stride, eps, width, group, WEIGHT_STRIDE: tl.constexpr,
    NORM_FIRST: tl.constexpr, ROUND_PRODUCT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row, g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = g * group + tl.arange(0, BLOCK)
    m = tl.arange(0, BLOCK) < group
    dtype = out.dtype.element_ty
    v = tl.load(y + row * width + offs, mask=m, other=0.0).to(tl.float32)
    z = _silu(tl.load(gate + row * gate_stride + offs, mask=m, other=0.0).to(tl.float32))
    w = tl.load(weight + g * WEIGHT_STRIDE + tl.arange(0, BLOCK), mask=m, other=0.0)
    if NORM_FIRST:
        r = tl.rsqrt(tl.sum(v * v, axis=0) / group + eps)
        normed = w.to(tl.float32) * (v * r).to(dtype).to(tl.float32)
        if ROUND_PRODUCT:  # weight * x in y's dtype, as torch multiplies two tensors of it
            normed = normed.to(dtype).to(tl.float32)
        tl.store(out + row * width + offs, (normed * z).to(dtype), mask=m)
    else:
        v = v * z
        r = tl.rsqrt(tl.sum(v * v, axis=0) / group + eps)
        normed = (v * r).to(dtype).to(tl.float32)
        tl.store(out + row * width + offs, (w.to(tl.float32) * normed).to(dtype), mask=m)


def gated_rmsnorm(y, gate, weight, groups, eps, norm_first=False):
    """``GatedRMSNorm``: y (R, width) * silu(gate (R, width), any row stride), normalised
    within each of ``groups`` groups, times weight (width,); (R, width) in y's dtype.
    ``norm_first``: Gated DeltaNet's order instead, RMSNorm(y) * weight * silu(gate), with one
    weight (width / groups,) shared by every group (head)."""
    R, width = y.shape
    if not y.is_contiguous() or gate.stride(-1) != 1:
        raise ValueError("y: expected contiguous rows; gate: unit stride in the last dim")
    if width % groups:
        raise ValueError(f"groups: {groups} does not divide the width {width}")
    group = width // groups
    if weight.shape != ((group,) if norm_first else (width,)):
        raise ValueError(
            f"weight: expected ({group if norm_first else width},), got {tuple(weight.shape)}"
        )
    out = torch.empty_like(y)
    _gated_rmsnorm_kernel[(R, groups)](
        y, gate, weight, out, gate.stride(0), float(eps), width, group,
        WEIGHT_STRIDE=0 if norm_first else group, NORM_FIRST=norm_first,
        ROUND_PRODUCT=weight.dtype == y.dtype,
        BLOCK=triton.next_power_of_2(group), num_warps=4,
    )  # fmt: skip
    return out


@triton.jit
def _conv_step_kernel(
    zx,  # (B*T, W) in_proj output: xBC at column xbc_col, dt at dt_col
    window,  # (B, K, C) conv window, advanced in place
    weight,  # (C, K + 1)
    bias,  # (C,)
    x_out,  # (B*T, XP)
    B_out,  # (B*T, GN)
    C_out,  # (B*T, GN)
    dt_out,  # (B*T, H)
    drafts,  # (slots, max_verify, K, C): the window after each token (KEEP_DRAFTS)
    counts,  # (B,) int32: the window advances by counts[b] tokens (HAS_COUNTS; else T)
    W,
    xbc_col,
    dt_col,
    C,
    XP,
    GN,
    H,
    max_verify,
    T: tl.constexpr,
    K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    KEEP_DRAFTS: tl.constexpr,
    HAS_COUNTS: tl.constexpr,
):
    b, pid_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mc = offs < C
    win = window + b * K * C
    # convolution: output t reads sequence rows t .. t + K of [window; new tokens]
    for t in tl.static_range(T):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias + offs, mask=mc, other=0.0).to(tl.float32)
        for k in tl.static_range(K + 1):
            if t + k < K:
                v = tl.load(win + (t + k) * C + offs, mask=mc, other=0.0)
            else:
                v = tl.load(zx + (b * T + t + k - K) * W + xbc_col + offs, mask=mc, other=0.0)
            w = tl.load(weight + offs * (K + 1) + k, mask=mc, other=0.0)
            acc += v.to(tl.float32) * w.to(tl.float32)
        v = acc.to(x_out.dtype.element_ty).to(tl.float32)  # the conv's output dtype
        v = _silu(v).to(x_out.dtype.element_ty)
        row = b * T + t
        tl.store(x_out + row * XP + offs, v, mask=mc & (offs < XP))
        tl.store(B_out + row * GN + offs - XP, v, mask=mc & (offs >= XP) & (offs < XP + GN))
        tl.store(C_out + row * GN + offs - XP - GN, v, mask=mc & (offs >= XP + GN))
        if pid_c == 0:
            oh = tl.arange(0, BLOCK_H)
            d = tl.load(zx + row * W + dt_col + oh, mask=oh < H)
            tl.store(dt_out + row * H + oh, d, mask=oh < H)
    if KEEP_DRAFTS:  # window after token t: sequence rows t + 1 .. t + K
        for t in tl.static_range(T):
            for j in tl.static_range(K):
                if t + 1 + j < K:
                    v = tl.load(win + (t + 1 + j) * C + offs, mask=mc, other=0.0)
                else:
                    v = tl.load(zx + (b * T + t + 1 + j - K) * W + xbc_col + offs, mask=mc)
                dst = drafts + ((b * max_verify + t) * K + j) * C
                tl.store(dst + offs, v.to(drafts.dtype.element_ty), mask=mc)
    # the window advances in place by n tokens: new row j is old row n + j (read before it is
    # written, since n >= 0 and rows are written in order) or a new token
    if HAS_COUNTS:
        n = tl.load(counts + b)
        for j in tl.static_range(K):
            src = n + j + offs * 0  # the sequence row, as a vector for the masks
            old = src < K
            v_old = tl.load(win + src * C + offs, mask=mc & old, other=0.0)
            v_new = tl.load(
                zx + (b * T + src - K) * W + xbc_col + offs, mask=mc & (src >= K), other=0.0
            )
            v = tl.where(old, v_old.to(window.dtype.element_ty), v_new.to(window.dtype.element_ty))
            tl.store(win + j * C + offs, v, mask=mc)
    else:
        for j in tl.static_range(K):
            if T + j < K:
                v = tl.load(win + (T + j) * C + offs, mask=mc, other=0.0)
            else:
                v = tl.load(zx + (b * T + T + j - K) * W + xbc_col + offs, mask=mc, other=0.0)
            tl.store(win + j * C + offs, v.to(window.dtype.element_ty), mask=mc)


def conv_step(zx, window, weight, bias, xbc_col, dt_col, XP, GN, H, T, drafts=None, counts=None):
    """One causal-conv step of a Mamba-2 layer over the window and T new tokens.

    zx: (B*T, W) the in_proj output (xBC at ``xbc_col``, raw dt at ``dt_col``); window:
    (B, K, C) contiguous, advanced in place by T, or by ``counts[b]`` (B,) int32 tokens per
    sequence (0 <= counts <= T: the rest are padding of a ragged step); weight (C, K+1);
    bias (C,) or None; drafts: (slots, max_verify, K, C) to keep the window after each
    token, or None.
    Returns x (B, T, XP), B (B, T, GN), C (B, T, GN) after SiLU and dt (B, T, H), contiguous.
    """
    rows, W = zx.shape
    batch, K, C = window.shape
    if rows != batch * T or not zx.is_contiguous() or not window.is_contiguous():
        raise ValueError("conv_step: zx (B*T, W) and window (B, K, C), contiguous")
    if drafts is not None and (drafts.shape[0] < batch or drafts.shape[1] < T):
        raise ValueError(
            f"drafts: {tuple(drafts.shape[:2])} slots x tokens, need at least ({batch}, {T})"
        )
    _check_counts(counts, batch)
    new = lambda width: torch.empty(rows, width, dtype=zx.dtype, device=zx.device)  # noqa: E731
    x, B, Cm, dt = new(XP), new(GN), new(GN), new(H)
    BLOCK_C = 256
    _conv_step_kernel[(batch, triton.cdiv(C, BLOCK_C))](
        zx,
        window,
        weight,
        bias if bias is not None else weight,
        x,
        B,
        Cm,
        dt,
        drafts if drafts is not None else window,
        counts if counts is not None else window,
        W,
        xbc_col,
        dt_col,
        C,
        XP,
        GN,
        H,
        drafts.shape[1] if drafts is not None else 1,
        T=T,
        K=K,
        BLOCK_C=BLOCK_C,
        BLOCK_H=triton.next_power_of_2(H),
        HAS_BIAS=bias is not None,
        KEEP_DRAFTS=drafts is not None,
        HAS_COUNTS=counts is not None,
        num_warps=4,
    )
    return (
        x.view(batch, T, XP),
        B.view(batch, T, GN),
        Cm.view(batch, T, GN),
        dt.view(batch, T, H),
    )


@triton.jit
def _relu2_kernel(u, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.maximum(tl.load(u + offs, mask=m, other=0.0), 0.0)
    tl.store(out + offs, v * v, mask=m)


def _check_counts(counts, batch):
    if counts is not None and (
        counts.dtype != torch.int32 or counts.shape != (batch,) or not counts.is_contiguous()
    ):
        raise ValueError(
            f"counts: expected contiguous int32 of shape ({batch},), got {counts.dtype} "
            f"{tuple(counts.shape)}"
        )


def write_kept_states(state, states, drafts, counts):
    """What a snapshot step writes, from the states after each of its T tokens ``states``
    (batch, T, ...): ``drafts[:batch, :T]`` (when given) and ``state[:batch]`` the state after
    ``counts[b]`` tokens (0: unchanged; None: after all T). The state_update kernels'
    PyTorch references end with it."""
    batch, T = states.shape[:2]
    if drafts is not None:
        drafts[:batch, :T] = states
    after = torch.cat([state[:batch, None], states], 1)
    n = torch.full((batch,), T, device=states.device) if counts is None else counts.long()
    state[:batch] = after[torch.arange(batch, device=states.device), n]


def relu2(u):
    """relu(u) ** 2 in u's dtype (the NemotronH MLP activation)."""
    u = u.contiguous()
    out = torch.empty_like(u)
    BLOCK = 2048
    _relu2_kernel[(triton.cdiv(u.numel(), BLOCK),)](u, out, u.numel(), BLOCK=BLOCK, num_warps=8)
    return out


@triton.jit
def _swiglu_kernel(gate, up, out, F, BLOCK: tl.constexpr):
    r, fb = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = fb * BLOCK + tl.arange(0, BLOCK)
    m = offs < F
    g = tl.load(gate + r * F + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(up + r * F + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out + r * F + offs, (_silu(g) * u).to(out.dtype.element_ty), mask=m)


def swiglu(gate, up):
    """silu(gate) * up, both (..., F) (the products of the gate and up weights) -> (..., F)
    in gate's dtype, computed in fp32 and rounded once."""
    if gate.dim() < 1 or up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(
            f"gate, up: expected two (..., F) tensors of one shape and dtype, got "
            f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}"
        )
    gate, up = gate.contiguous(), up.contiguous()
    F = gate.shape[-1]
    R = gate.numel() // max(F, 1)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    BLOCK = min(1024, triton.next_power_of_2(max(F, 1)))
    if R and F:
        _swiglu_kernel[(R, triton.cdiv(F, BLOCK))](gate, up, out, F, BLOCK=BLOCK, num_warps=4)
    return out


@triton.jit
def _rope_kernel(
    t, position, inv_freq, row_stride, head_dim, T, HALF: tl.constexpr, BLOCK: tl.constexpr
):
    r, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    pos = (tl.load(position + r // T) + r % T).to(tl.float32)
    offs = tl.arange(0, BLOCK)
    m = offs < HALF
    angle = pos * tl.load(inv_freq + offs, mask=m, other=0.0)
    cos, sin = tl.cos(angle), tl.sin(angle)
    base = t + r * row_stride + head * head_dim
    x1 = tl.load(base + offs, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(base + offs, (x1 * cos - x2 * sin).to(t.dtype.element_ty), mask=m)
    tl.store(base + HALF + offs, (x2 * cos + x1 * sin).to(t.dtype.element_ty), mask=m)


def rope_(t, heads, head_dim, inv_freq, position, T):
    """RoPE in place on the first ``2 * len(inv_freq)`` dims of each of the first ``heads``
    heads of ``t`` (R = batch * T rows, at least heads * head_dim columns; row r is token r % T
    of sequence r // T, at position ``position[r // T] + r % T``). ``inv_freq`` (rotary_dim / 2,)
    fp32: theta^(-2i / rotary_dim); ``position`` (batch,) int64 on the device. The halves
    rotate as ``model.Attention.rotate``'s: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin),
    in fp32, rounded once. Returns t."""
    half = inv_freq.numel()
    if t.dim() != 2 or t.stride(1) != 1 or t.shape[1] < heads * head_dim:
        raise ValueError(
            f"t: expected (rows, >= {heads} x {head_dim}) with unit column stride, got "
            f"{tuple(t.shape)} strides {t.stride()}"
        )
    if not 0 < 2 * half <= head_dim or inv_freq.dtype != torch.float32 or inv_freq.dim() != 1:
        raise ValueError(
            f"inv_freq: expected 1 .. {head_dim // 2} fp32 frequencies, got {inv_freq.dtype} "
            f"{tuple(inv_freq.shape)}"
        )
    if not t.device == inv_freq.device == position.device:
        raise ValueError(
            f"t, inv_freq, position: expected one device, got {t.device}, {inv_freq.device}, "
            f"{position.device}"
        )
    if position.dtype != torch.int64 or position.dim() != 1 or t.shape[0] != position.numel() * T:
        raise ValueError(
            f"position: expected int64 (batch,) with batch x T = {t.shape[0]} rows, got "
            f"{position.dtype} {tuple(position.shape)} and T = {T}"
        )
    if t.shape[0]:
        _rope_kernel[(t.shape[0], heads)](
            t, position, inv_freq, t.stride(0), head_dim, T, HALF=half, BLOCK=triton.next_power_of_2(half),
            num_warps=1,
        )  # fmt: skip
    return t


# (up to batch, BLOCK_P, num_warps), as ``replay.LAUNCH``; from ``replaylab.bench sweep``
LAUNCH_STATE_UPDATE = [(32, 8, 2), (math.inf, 64, 2)]

# One launch (BLOCK_P, num_warps) for every batch, so a sequence's bits do not depend on how
# many sequences share the launch (Triton 3.9's PTX for sm_90 contracts the state update into
# an FMA one way at BLOCK_P 8 and another at 64; Triton 3.6 on an H100 rounds them alike). The
# serving engine's ``batch_invariant`` default; LAUNCH_STATE_UPDATE's up to batch 32 (timed
# against it beyond: data/README.md)
BATCH_INVARIANT_STATE_UPDATE = (8, 2)


def tuned_state_update_launch(batch):
    """(BLOCK_P, num_warps) of ``LAUNCH_STATE_UPDATE`` for ``batch`` sequences."""
    return next((p, w) for bound, p, w in LAUNCH_STATE_UPDATE if batch <= bound)


@triton.jit
def _state_update_kernel(
    state,  # (slots, H, P, N) fp32, updated in place
    x,  # (B, T, H, P)
    dt,  # (B, T, H) raw
    Bm,  # (B, T, G, N)
    Cm,
    A,
    D,
    dt_bias,  # (H,) fp32
    y,  # (B, T, H, P)
    drafts,  # (slots, max_verify, H, P, N) fp32: the state after each token (KEEP_DRAFTS)
    counts,  # (B,) int32: the state kept is the one after counts[b] tokens (HAS_COUNTS)
    dt_lo,
    dt_hi,
    H,
    P,
    N,
    G,
    max_verify,
    T: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    KEEP_DRAFTS: tl.constexpr,
    HAS_COUNTS: tl.constexpr,
):
    b, h, pid_p = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    g = h // (H // G)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mp, mn = offs_p < P, offs_n < N
    tile = offs_p[:, None] * N + offs_n[None, :]
    mask = mp[:, None] & mn[None, :]
    a_h = tl.load(A + h).to(tl.float32)
    bias = tl.load(dt_bias + h).to(tl.float32)
    d_h = tl.load(D + h).to(tl.float32)
    S = tl.load(state + (b * H + h) * P * N + tile, mask=mask, other=0.0)
    kept = S  # the state after counts[b] tokens (HAS_COUNTS)
    n = 0
    if HAS_COUNTS:
        n = tl.load(counts + b)
    for t in tl.static_range(T):
        row = b * T + t
        delta = _delta(tl.load(dt + row * H + h).to(tl.float32), bias, dt_lo, dt_hi, SOFTPLUS)
        x_t = tl.load(x + (row * H + h) * P + offs_p, mask=mp, other=0.0).to(tl.float32)
        B_t = tl.load(Bm + (row * G + g) * N + offs_n, mask=mn, other=0.0).to(tl.float32)
        C_t = tl.load(Cm + (row * G + g) * N + offs_n, mask=mn, other=0.0).to(tl.float32)
        S = tl.exp(delta * a_h) * S + (delta * x_t)[:, None] * B_t[None, :]
        out = tl.sum(S * C_t[None, :], axis=1) + d_h * x_t
        tl.store(y + (row * H + h) * P + offs_p, out.to(y.dtype.element_ty), mask=mp)
        if KEEP_DRAFTS:
            tl.store(drafts + ((b * max_verify + t) * H + h) * P * N + tile, S, mask=mask)
        if HAS_COUNTS:
            kept = tl.where(n == t + 1, S, kept)
    if HAS_COUNTS:
        tl.store(state + (b * H + h) * P * N + tile, kept, mask=mask)
    else:
        tl.store(state + (b * H + h) * P * N + tile, S, mask=mask)


def state_update(
    state,
    x,
    dt,
    B,
    C,
    A,
    D,
    dt_bias,
    dt_limit,
    drafts=None,
    block_p=None,
    num_warps=None,
    counts=None,
):
    """The snapshot strategy's decode / verify step of a Mamba-2 layer, fused: for each of the
    T new tokens S <- exp(Δ A) S + Δ x B^T and y = S C + D x; ``state`` (batch rows of a
    (slots, H, P, N) fp32 pool) is written in place, and with ``drafts``
    (slots, max_verify, H, P, N) the state after each token is kept for a rollback. With
    ``counts`` (B,) int32 the state written is the one after counts[b] tokens (0: unchanged),
    the other tokens being padding of a ragged step.
    x (B, T, H, P), dt (B, T, H) raw, B/C (B, T, G, N), contiguous. Returns y (B, T, H, P)."""
    batch, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    if state.dtype != torch.float32 or state.shape[0] < batch or not state.is_contiguous():
        raise ValueError("state: expected a contiguous fp32 pool with a row per sequence")
    check_token_sizes(token_specs(x, dt, B, C, A, D, dt_bias, state=state[:batch]))
    if not all(t.is_contiguous() for t in (x, dt, B, C)):
        raise ValueError("x, dt, B, C: expected contiguous tensors")
    if drafts is not None and (drafts.shape[0] < batch or drafts.shape[1] < T):
        raise ValueError(
            f"drafts: {tuple(drafts.shape[:2])} slots x tokens, need at least ({batch}, {T})"
        )
    _check_counts(counts, batch)
    y = torch.empty_like(x)
    default_p, default_w = tuned_state_update_launch(batch)
    BLOCK_P = min(block_p or default_p, triton.next_power_of_2(P))
    _state_update_kernel[(batch, H, triton.cdiv(P, BLOCK_P))](
        state,
        x,
        dt,
        B,
        C,
        A,
        D,
        dt_bias,
        y,
        drafts if drafts is not None else state,
        counts if counts is not None else state,
        float(dt_limit[0]),
        float(min(dt_limit[1], 3.0e38)),
        H,
        P,
        N,
        G,
        drafts.shape[1] if drafts is not None else 1,
        T=T,
        BLOCK_P=BLOCK_P,
        BLOCK_N=triton.next_power_of_2(N),
        SOFTPLUS=True,
        KEEP_DRAFTS=drafts is not None,
        HAS_COUNTS=counts is not None,
        num_warps=num_warps or default_w,
    )
    return y


@triton.jit
def _attention_kernel(
    q,  # (B, T, Hq, Dh), rows q_row apart
    k,  # (slots, Hkv, max_len, Dh)
    v,
    out,  # (B, T, Hq, Dh)
    position,  # (B,) int64: the position of each sequence's token 0 (stride POS_STRIDE)
    scale,
    q_row,
    Hq,
    Hkv,
    max_len,
    T: tl.constexpr,
    Dh: tl.constexpr,
    BLOCK_D: tl.constexpr,  # Dh rounded up to a power of two (the columns past Dh masked)
    BLOCK_S: tl.constexpr,
    POS_STRIDE: tl.constexpr,  # 0: one position for all sequences, 1: one each
):
    b, hq, t = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    kv = hq // (Hq // Hkv)
    last = tl.load(position + b * POS_STRIDE) + t  # rows 0 .. last are visible to token t
    offs_d = tl.arange(0, BLOCK_D)
    in_d = offs_d < Dh
    qv = tl.load(q + (b * T + t) * q_row + hq * Dh + offs_d, mask=in_d, other=0.0).to(tl.float32)
    base = (b * Hkv + kv) * max_len * Dh
    m = tl.full([1], float("-inf"), tl.float32)
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([Dh], tl.float32)
    for s0 in range(0, last + 1, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        seen = offs_s <= last
        rows = base + offs_s[:, None] * Dh + offs_d[None, :]
        keys = tl.load(k + rows, mask=seen[:, None] & in_d[None, :], other=0.0).to(tl.float32)
        scores = tl.where(seen, tl.sum(keys * qv[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m - m_new)
        values = tl.load(v + rows, mask=seen[:, None] & in_d[None, :], other=0.0).to(tl.float32)
        total = total * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * values, axis=0)
        m = m_new
    o = acc / total
    tl.store(out + ((b * T + t) * Hq + hq) * Dh + offs_d, o.to(out.dtype.element_ty), mask=in_d)


def attention(q, k, v, position, scale):
    """Causal attention of T new tokens over a static KV buffer: q (B, T, Hq, Dh) (heads
    contiguous; token rows may be a column slice of a wider matrix),
    k/v (slots, Hkv, max_len, Dh) holding rows 0 .. position + T - 1 of the first B slots,
    ``position`` an int64 tensor on the device (so a CUDA graph replays it): 0-d, the first
    new token's position in every sequence, or (B,), one per sequence (a ragged batch).
    Query head h reads KV head h // (Hq // Hkv). Returns (B, T, Hq, Dh) in q's dtype."""
    batch, T, Hq, Dh = q.shape
    Hkv, max_len = k.shape[1], k.shape[2]
    q_row = q.stride(1) if T > 1 else q.stride(0)  # a size-1 dim's stride is arbitrary
    if Hq % Hkv or not (k.is_contiguous() and v.is_contiguous()) or k.shape != v.shape:
        raise ValueError("k, v: expected equal contiguous (slots, Hkv, max_len, Dh) buffers")
    if k.shape[0] < batch or k.shape[3] != Dh:
        raise ValueError(
            f"k, v: expected (slots >= {batch}, Hkv, max_len, Dh={Dh}) for q {tuple(q.shape)}, "
            f"got {tuple(k.shape)}"
        )
    rows_ok = q.stride(0) == T * q_row and q.stride(2) == Dh and q.stride(3) == 1
    if not rows_ok:
        raise ValueError("q: expected contiguous heads and evenly spaced rows")
    if position.dtype != torch.int64 or position.shape not in ((), (batch,)):
        raise ValueError(
            f"position: expected int64 of shape () or ({batch},), got {position.dtype} "
            f"{tuple(position.shape)}"
        )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _attention_kernel[(batch, Hq, T)](
        q,
        k,
        v,
        out,
        position,
        float(scale),
        q_row,
        Hq,
        Hkv,
        max_len,
        T=T,
        Dh=Dh,
        BLOCK_D=triton.next_power_of_2(Dh),
        BLOCK_S=64,
        POS_STRIDE=1 if position.dim() else 0,
        num_warps=4,
    )
    return out
