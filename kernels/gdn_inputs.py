"""One launch for a Gated DeltaNet layer's recurrence inputs (the serving engine's fused path),
``prepare``: the arithmetic of ``GatedDeltaNetSpec.prepare`` (causal depthwise conv, SiLU,
per-head L2 norms, the decay and the write strength; the teaching mixer's PyTorch operations
are its reference), which are otherwise many small operations a layer.

Glossary (code name -> paper symbol, shape):
    qkv        x_t            (batch, T, C)      the conv's input, C = 2 Hk K + H V
    window                    (batch, W, C)      the conv's last W = d_conv - 1 inputs
    weight                    (C, d_conv)        the depthwise conv's taps (no bias)
    a, b                      (batch, T, H)      per-head projections
    A_log, dt_bias            (H,)               g_t = -exp(A_log) softplus(a_t + dt_bias)
    q, k       q_t, k_t       (batch, T, Hk, K)  after conv, SiLU and L2 norm; q times K^-1/2
    v          v_t            (batch, T, H, V)   after conv and SiLU
    g          log α_t        (batch, T, H) fp32
    beta       β_t            (batch, T, H)      sigmoid(b_t)

One program per (sequence, token, key head) on a GPU (all key heads in one under the
interpreter): the key head's q and k channels, the H / Hk value heads it serves, their g and
β. A token's numbers are computed from its own inputs and the window alone, in one order, so
row i of a batch and token t of a verify are the same bits whatever the batch and however many
tokens the call holds (the engine's lossless contracts).
Rounding follows the reference: the conv's sum rounded to the activations' dtype, then SiLU
rounded, the L2 norm in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["prepare"]


@triton.jit
def _conv_silu(qkv, window, weight, b, t, T, C, channel, mask, W: tl.constexpr,
               TAPS: tl.constexpr, BLOCK_TAPS: tl.constexpr):  # fmt: skip
    """SiLU(Σ_j weight[c, j] x[t + j - W]) for a (rows, n) tile of ``channel`` indices, x
    before 0 read from the window (in qkv's dtype); the sum rounded to qkv's dtype first, as a
    conv in that dtype rounds it. The taps are the tile's middle axis: one load each side."""
    taps = tl.arange(0, BLOCK_TAPS)[None, :, None]
    i = t + taps  # row of cat(window, qkv), (1, BLOCK_TAPS, 1)
    c = channel[:, None, :]
    m = mask[:, None, :] & (taps < TAPS)
    x = tl.load(window + (b * W + i) * C + c, mask=m & (i < W), other=0.0)
    x += tl.load(qkv + (b * T + i - W) * C + c, mask=m & (i >= W), other=0.0)
    w = tl.load(weight + c * TAPS + taps, mask=m, other=0.0)
    y = tl.sum(x.to(tl.float32) * w.to(tl.float32), axis=1)
    y = y.to(qkv.dtype.element_ty).to(tl.float32)
    return (y / (1.0 + tl.exp(-y))).to(qkv.dtype.element_ty).to(tl.float32)


@triton.jit(do_not_specialize=["T"])
def _prepare_kernel(
    qkv, window, weight, a, b_in, A_log, dt_bias,  # inputs (see the glossary)
    q_out, k_out, v_out, g_out, beta_out,  # outputs, contiguous
    T, C, scale, eps,
    W: tl.constexpr, TAPS: tl.constexpr, HK: tl.constexpr, K: tl.constexpr,
    HPK: tl.constexpr, V: tl.constexpr, HEADS: tl.constexpr, BLOCK_TAPS: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_HV: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Program (token bt, group of HEADS key heads); tiles are (HEADS, channels of a head)."""
    bt = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)[:, None]  # (HEADS, 1)
    b, t = bt // T, bt % T
    dtype = qkv.dtype.element_ty

    ks = tl.arange(0, BLOCK_K)[None, :]
    mk = (ks < K) & (heads < HK)
    for part in tl.static_range(2):  # 0: q (scaled), 1: k
        c = part * HK * K + heads * K + ks
        y = _conv_silu(qkv, window, weight, b, t, T, C, c, mk, W, TAPS, BLOCK_TAPS)
        y = y * tl.rsqrt(tl.sum(y * y, axis=1)[:, None] + eps)
        if part == 0:
            y = y * scale
        out = q_out if part == 0 else k_out
        tl.store(out + (bt * HK + heads) * K + ks, y.to(dtype), mask=mk)

    vs = tl.arange(0, BLOCK_HV)[None, :]  # a key head's HPK value heads, V channels each
    mv = (vs < HPK * V) & (heads < HK)
    y = _conv_silu(
        qkv, window, weight, b, t, T, C, 2 * HK * K + heads * HPK * V + vs, mv, W, TAPS, BLOCK_TAPS
    )
    tl.store(v_out + (bt * HK + heads) * HPK * V + vs, y.to(dtype), mask=mv)

    hs = heads * HPK + tl.arange(0, BLOCK_H)[None, :]  # (HEADS, BLOCK_H) value heads
    mh = (hs < (heads + 1) * HPK) & (heads < HK)
    H = HK * HPK
    x = tl.load(a + bt * H + hs, mask=mh, other=0.0).to(tl.float32)
    x += tl.load(dt_bias + hs, mask=mh, other=0.0).to(tl.float32)
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e  # log1p(e) as log(u) e / (u - 1): exact where 1 + e rounds (Goldberg)
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    softplus = tl.where(x > 20.0, x, log1p)  # torch's threshold of 20
    A = -tl.exp(tl.load(A_log + hs, mask=mh, other=0.0).to(tl.float32))
    tl.store(g_out + bt * H + hs, A * softplus, mask=mh)
    bb = tl.load(b_in + bt * H + hs, mask=mh, other=0.0).to(tl.float32)
    tl.store(beta_out + bt * H + hs, (1.0 / (1.0 + tl.exp(-bb))).to(dtype), mask=mh)


def _check(qkv, window, weight, a, b, A_log, dt_bias, k_heads, k_head_dim):
    """Shapes and dtypes against each other; returns (batch, T, C, W, taps, H, V)."""
    if qkv.dim() != 3:
        raise ValueError(f"qkv: expected (batch, T, C), got {tuple(qkv.shape)}")
    batch, T, C = qkv.shape
    if weight.dim() != 2 or weight.shape[0] != C:
        raise ValueError(f"weight: expected (C={C}, d_conv), got {tuple(weight.shape)}")
    taps = weight.shape[1]
    if window.shape != (batch, taps - 1, C):
        raise ValueError(
            f"window: expected (batch, d_conv - 1, C) = {(batch, taps - 1, C)}, got "
            f"{tuple(window.shape)}"
        )
    if k_heads < 1 or k_head_dim < 1:
        raise ValueError(f"k_heads={k_heads}, k_head_dim={k_head_dim}: expected both >= 1")
    H = a.shape[-1] if a.dim() == 3 else -1
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 3 or t.shape[:2] != (batch, T) or t.shape[2] != H:
            raise ValueError(
                f"{name}: expected (batch, T, H) = {(batch, T, H)}, got {tuple(t.shape)}"
            )
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if t.shape != (H,):
            raise ValueError(f"{name}: expected ({H},) (a's heads), got {tuple(t.shape)}")
    value_dim = C - 2 * k_heads * k_head_dim
    if H < 1 or H % k_heads or value_dim < H or value_dim % H:
        raise ValueError(
            f"heads: C={C} = 2 x Hk={k_heads} x K={k_head_dim} + H={H} x V needs H a multiple "
            f"of Hk and a whole V >= 1"
        )
    others = dict(window=window, weight=weight, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    for name, t in others.items():
        if t.device != qkv.device:
            raise ValueError(f"{name}: on {t.device}, expected qkv's device {qkv.device}")
    return batch, T, C, taps - 1, taps, H, value_dim // H


def prepare(qkv, window, weight, a, b, A_log, dt_bias, k_heads, k_head_dim, eps=1e-6):
    """(q, k, v, g, beta) of ``GatedDeltaNetSpec.prepare`` in one launch: shapes in the
    module's glossary; q, k, v and beta in qkv's dtype, g fp32; all contiguous."""
    batch, T, C, W, taps, H, V = _check(qkv, window, weight, a, b, A_log, dt_bias, k_heads,
                                        k_head_dim)  # fmt: skip
    Hk, K = k_heads, k_head_dim
    q = qkv.new_empty(batch, T, Hk, K)
    k = torch.empty_like(q)
    v = qkv.new_empty(batch, T, H, V)
    g = torch.empty(batch, T, H, dtype=torch.float32, device=qkv.device)
    beta = qkv.new_empty(batch, T, H)
    if batch * T == 0:
        return q, k, v, g, beta
    # a GPU takes one key head a program (parallel enough at batch 1); the interpreter, whose
    # cost is per operation, all of them in one (a device's choice, never the batch's)
    heads = 1 if qkv.is_cuda else triton.next_power_of_2(Hk)
    inputs = (qkv, window.to(qkv.dtype), weight, a, b)
    _prepare_kernel[(batch * T, triton.cdiv(Hk, heads))](
        *(t.contiguous() for t in inputs), A_log, dt_bias, q, k, v, g, beta, T, C, K**-0.5, eps,
        W=W, TAPS=taps, HK=Hk, K=K, HPK=H // Hk, V=V, HEADS=heads,
        BLOCK_TAPS=triton.next_power_of_2(taps), BLOCK_K=triton.next_power_of_2(K),
        BLOCK_HV=triton.next_power_of_2(H // Hk * V), BLOCK_H=triton.next_power_of_2(H // Hk),
        num_warps=4,
    )  # fmt: skip
    return q, k, v, g, beta
