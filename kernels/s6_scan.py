"""The Mamba-1 (S6) prompt scan in one launch: the token recurrence (``replaylab.scan.s6_scan``)
as a Triton kernel, for the serving engine's prompt chunks.

One program per (sequence, block of BLOCK_D channels) walks the tokens in order, holding its
rows of the state S (BLOCK_D x N, fp32) in registers. Per token, with Δ_t = softplus(dt_t +
dt_bias):

    S_t = exp(Δ_t ⊙ A) ⊙ S_{t-1} + (Δ_t x_t) B_t^T      (``kernels.mamba1``'s update)
    y_t = S_t C_t + D ⊙ x_t

where PyTorch's token loop launches some ten operations a token.

    x, dt: (batch, T, D)  B, C: (batch, T, N)  A: (D, N)  D, dt_bias: (D,)
    initial_state: (batch, D, N)
    -> y (batch, T, D) in x's dtype, final state (batch, D, N) fp32

Under ``TRITON_INTERPRET=1`` it runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replaylab.kernels.mamba1 import _s6_update
from replaylab.scan import ScanResult
from replaylab.validation import as_power_of_two, check_tensor

__all__ = ["s6_prompt_scan"]


@triton.jit
def _s6_scan_kernel(
    x, dt, B, C, y, state, A, Dskip, bias,
    T, D, N,
    sx_b, sx_t, sx_d,
    sdt_b, sdt_t, sdt_d,
    sB_b, sB_t, sB_n,
    sC_b, sC_t, sC_n,
    sy_b, sy_t, sy_d,
    sS_b, sS_d, sS_n,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_STATE: tl.constexpr,
):  # fmt: skip
    b, db = tl.program_id(0).to(tl.int64), tl.program_id(1)  # int64: b * stride may pass 2**31
    offs_d = db * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md, mn = offs_d < D, offs_n < N
    m2 = md[:, None] & mn[None, :]
    A_t = tl.load(A + offs_d[:, None] * N + offs_n[None, :], mask=m2, other=0.0).to(tl.float32)
    bias_d = tl.load(bias + offs_d, mask=md, other=0.0).to(tl.float32)
    if HAS_D:
        D_d = tl.load(Dskip + offs_d, mask=md, other=0.0).to(tl.float32)
    s_ptr = state + b * sS_b + offs_d[:, None] * sS_d + offs_n[None, :] * sS_n
    if HAS_STATE:
        S = tl.load(s_ptr, mask=m2, other=0.0).to(tl.float32)
    else:
        S = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    sx_t, sdt_t, sB_t, sC_t, sy_t = (
        tl.cast(sx_t, tl.int64), tl.cast(sdt_t, tl.int64), tl.cast(sB_t, tl.int64),
        tl.cast(sC_t, tl.int64), tl.cast(sy_t, tl.int64),
    )  # int64: t * stride may pass 2**31 in a long prompt (tl.cast: a stride of 1 is constexpr)  # fmt: skip
    for t in range(T):
        xt = tl.load(x + b * sx_b + t * sx_t + offs_d * sx_d, mask=md, other=0.0).to(tl.float32)
        dtt = tl.load(dt + b * sdt_b + t * sdt_t + offs_d * sdt_d, mask=md, other=0.0)
        Bt = tl.load(B + b * sB_b + t * sB_t + offs_n * sB_n, mask=mn, other=0.0).to(tl.float32)
        Ct = tl.load(C + b * sC_b + t * sC_t + offs_n * sC_n, mask=mn, other=0.0).to(tl.float32)
        S = _s6_update(S, A_t, bias_d, xt, dtt.to(tl.float32), Bt)
        yt = tl.sum(S * Ct[None, :], 1)
        if HAS_D:
            yt = yt + D_d * xt
        tl.store(y + b * sy_b + t * sy_t + offs_d * sy_d, yt.to(y.dtype.element_ty), mask=md)
    tl.store(s_ptr, S, mask=m2)


def s6_prompt_scan(
    x, dt, A, B, C, D=None, dt_bias=None, *, initial_state=None, block_d=32, num_warps=4
) -> ScanResult:
    """``replaylab.scan.s6_scan`` with ``dt_softplus=True`` and no clamp (Jamba's), in one
    Triton launch: shapes in the module docstring; returns ``ScanResult(y, state)`` with the
    state in fp32. ``block_d``: channels a program holds (a power of two)."""
    if x.dim() != 3:
        raise ValueError(f"x: expected (batch, T, D), got shape {tuple(x.shape)}")
    batch, T, Dm = x.shape
    if A.dim() != 2 or A.shape[0] != Dm:
        raise ValueError(f"A: expected (D={Dm}, N), got shape {tuple(A.shape)}")
    N = A.shape[1]
    check_tensor("dt", dt, (batch, T, Dm))
    check_tensor("B", B, (batch, T, N))
    check_tensor("C", C, (batch, T, N))
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_tensor(name, t, (Dm,))
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (batch, Dm, N))
    block_d = as_power_of_two("block_d", block_d)
    device = x.device
    y = torch.empty_like(x)
    state = torch.zeros(batch, Dm, N, dtype=torch.float32, device=device)
    if initial_state is not None:
        state.copy_(initial_state)
    if T > 0:
        A32 = A.float().contiguous()
        # the kernel reads A, D and dt_bias at unit stride
        bias = dt_bias.contiguous() if dt_bias is not None else torch.zeros(Dm, device=device)
        _s6_scan_kernel[(batch, triton.cdiv(Dm, block_d))](
            x, dt, B, C, y, state, A32, D.contiguous() if D is not None else bias, bias,
            T, Dm, N,
            *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *y.stride(), *state.stride(),
            BLOCK_D=block_d, BLOCK_N=max(2, triton.next_power_of_2(N)),
            HAS_D=D is not None, HAS_STATE=initial_state is not None, num_warps=num_warps,
        )  # fmt: skip
    return ScanResult(y, state)
