"""Mamba-2's causal depthwise conv over a prompt chunk, in one launch.

y_t = SiLU(bias + Σ_{k=0..K} w_k · u_{t+k}) over u = [window; xBC], the window holding the K
rows before the chunk (K = d_conv - 1): the conv that ``Mamba2Mixer.conv`` computes with
``F.conv1d``, in the arithmetic of the fused decode step's ``kernels.decode.conv_step`` (fp32
accumulation from the bias in tap order, rounded to xBC's dtype, then SiLU), so that a prompt
chunk's conv rounds as the fused path decoding the same tokens one by one does, at any chunk
length, where the window is kept in xBC's dtype (the engine's pools keep it so; a window of
another dtype is read in xBC's here, as ``Mamba2Mixer.conv`` reads it, and in its own by
``conv_step``). The token count is a runtime argument, so one compiled kernel serves most
chunk and suffix lengths (Triton still specialises the batch stride on its divisibility).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["conv_prompt"]


@triton.jit(do_not_specialize=["T"])
def _conv_prompt_kernel(
    xbc,  # (B, T, C) with strides (stride_b, stride_t, 1)
    window,  # (B, K, C) contiguous
    weight,  # (C, K + 1) contiguous
    bias,  # (C,)
    x_out,  # (B, T, XP) contiguous, xbc's dtype: channels [0, XP)
    b_out,  # (B, T, GN): channels [XP, XP + GN)
    c_out,  # (B, T, C - XP - GN): the rest
    T,
    C,
    XP,
    GN,
    stride_b,
    stride_t,
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    t = (tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]).to(tl.int64)  # (BLOCK_T, 1)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]  # (1, BLOCK_C)
    mc = c < C
    m = (t < T) & mc
    dtype = x_out.dtype.element_ty
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + c, mask=mc, other=0.0).to(tl.float32)
    for k in tl.static_range(K + 1):
        row = t + k  # row of [window; xBC]
        old = tl.load(window + (b * K + row) * C + c, mask=m & (row < K), other=0.0)
        new = tl.load(xbc + b * stride_b + (row - K) * stride_t + c, mask=m & (row >= K), other=0.0)
        v = tl.where(row < K, old.to(dtype), new).to(tl.float32)
        w = tl.load(weight + c * (K + 1) + k, mask=mc, other=0.0).to(tl.float32)
        acc += v * w
    y = acc.to(dtype).to(tl.float32)  # the conv's output dtype
    y = y / (1.0 + tl.exp(-y))
    y = y.to(dtype)
    row = b * T + t
    tl.store(x_out + row * XP + c, y, mask=m & (c < XP))
    tl.store(b_out + row * GN + c - XP, y, mask=m & (c >= XP) & (c < XP + GN))
    tl.store(c_out + row * (C - XP - GN) + c - XP - GN, y, mask=m & (c >= XP + GN))


def conv_prompt(xbc, window, weight, bias, splits=None):
    """SiLU(causal depthwise conv) of a prompt chunk, one launch.

    xbc: (B, T, C), its last dimension contiguous (a slice of the in-projection may be passed
    as it is); window: (B, K, C), the K rows before the chunk, read in xbc's dtype;
    weight: (C, K + 1); bias: (C,) or None. Returns (B, T, C) in xbc's dtype, contiguous; with
    ``splits`` = (XP, GN), its three parts x (B, T, XP), B (B, T, GN) and C (B, T, C - XP - GN)
    as three contiguous tensors (what the scan and the log read), written by the same launch.
    """
    batch, T, C = xbc.shape
    K = window.shape[1]
    if window.shape != (batch, K, C) or weight.shape != (C, K + 1):
        raise ValueError(
            f"conv_prompt: window {tuple(window.shape)} and weight {tuple(weight.shape)} do not "
            f"fit xbc {tuple(xbc.shape)}: expected ({batch}, K, {C}) and ({C}, K + 1)"
        )
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"conv_prompt: bias: expected ({C},), got {tuple(bias.shape)}")
    if xbc.stride(-1) != 1:
        raise ValueError("conv_prompt: xbc's last dimension must be contiguous")
    XP, GN = splits if splits is not None else (C, 0)
    if not (0 < XP and 0 <= GN and XP + GN <= C):
        raise ValueError(
            f"conv_prompt: splits (XP, GN) = {splits} must have 0 < XP, 0 <= GN and XP + GN <= "
            f"C = {C}"
        )
    flat = torch.empty(batch * T * C, dtype=xbc.dtype, device=xbc.device)  # one allocation
    parts, at = [], 0
    for width in (XP, GN, C - XP - GN):  # three contiguous views of it
        parts.append(flat[at : at + batch * T * width].view(batch, T, width))
        at += batch * T * width
    if T == 0:
        return tuple(parts) if splits is not None else parts[0]
    BLOCK_T, BLOCK_C = 16, 128
    grid = (batch, triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))
    _conv_prompt_kernel[grid](
        xbc,
        window.contiguous(),
        weight.contiguous(),
        bias if bias is not None else weight,
        *parts,
        T,
        C,
        XP,
        GN,
        xbc.stride(0),
        xbc.stride(1),
        K=K,
        BLOCK_T=BLOCK_T,
        BLOCK_C=BLOCK_C,
        HAS_BIAS=bias is not None,
        num_warps=4,
    )
    return tuple(parts) if splits is not None else parts[0]
