"""The Mamba-2 prefill scan in one launch: SSD's chunked form (``replaylab.scan.ssd_chunked_scan``)
as a Triton kernel, for the serving engine's prompt chunks.

One program per (sequence, head, block of BLOCK_P head channels) walks the prompt's chunks of
Q tokens in order, holding its rows of the state S (BLOCK_P x N, fp32) in registers. Per chunk,
with l_t = Δ_t A the log decay and Λ_t = l_1 + ... + l_t its running sum inside the chunk:

    y_t   = sum_{s<=t} exp(Λ_t - Λ_s) (C_t . B_s) Δ_s x_s    the chunk's own tokens
          + exp(Λ_t) S_in C_t                                 the state entering it
          + D x_t
    S_out = exp(Λ_Q) S_in + sum_s exp(Λ_Q - Λ_s) Δ_s x_s B_s^T

four small matrix products a chunk (C B^T, its decayed product with Δx, C S_in^T and the
chunk's outer products), where the PyTorch form launches some fifty operations a layer and
chunk. Tokens past the prompt's end get Δ = 0 and x = 0: decay 1, nothing added.

Under "tf32x3" each product is three TF32 products (a_big b_big + a_big b_small + a_small
b_big). With bf16 or fp16 B and C, a factor of B or C is its own TF32 value (small part 0), so
C B^T takes one product and C S_in^T and the outer products two (``_dot_exact_*``): on an H100
the same bits as the three for finite inputs (tests/test_ssd_chunked_kernel.py, bf16, at the
kernel of 9313930). Where B or C holds an inf, or a state or outer-product entry rounds up to
inf in TF32 (|v| >= 2^128 (1 - 2^-12)), the two products give NaN where the three give ±inf:
tf32x3 zeroes its first sum when it is NaN, and the dropped products are what make it NaN there.
The same values stored in fp32 (three products) gave other bits there than in bf16 (two); the
cause was not looked into.

    x: (batch, T, H, P)  dt: (batch, T, H) raw (bias, softplus and the clamp applied here)
    B, C: (batch, T, G, N), head h reads group h // (H / G)
    A, D, dt_bias: (H,)  initial_state: (batch, H, P, N)
    -> y (batch, T, H, P) in x's dtype, final state (batch, H, P, N) fp32 (written into
    out_state where given: initial_state itself, or memory apart from it)

Under ``TRITON_INTERPRET=1`` it runs on CPU tensors.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from replaylab.kernels.mamba2 import _delta
from replaylab.scan import NO_LIMIT, ScanResult
from replaylab.validation import as_power_of_two, check_tensor

__all__ = ["ssd_chunked_scan"]

# Blocks of P and N at least 32 wide: Triton 3.6 miscompiles 16-wide ones with 64-token chunks
# and 8 warps on Hopper (wrong outputs, then an illegal memory access; tools/ssd_chunked_probe.py)
MIN_BLOCK = 32
# with 4 warps, the fastest block of P at Nemotron-H's head on an H100 (data/README.md)
DEFAULT_BLOCK_P = 32
# (device, dtype, Q asked, launch) -> the Q that fit in shared memory, so a refusal is met once
_CHUNK_THAT_FITS: dict = {}


@triton.jit
def _tf32_split(v):
    """v (fp32) = big + small, big rounded to TF32 (10 mantissa bits, to nearest, ties away from
    zero: PTX's cvt.rna.tf32.f32, as Triton's tf32x3 splits); a NaN's big part is NaN."""
    big = ((v.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    big = tl.where(v == v, big, v)
    return big, v - big


@triton.jit
def _dot_exact_right(a, b):
    """tl.dot(a, b) in tf32x3 where b's entries are TF32 values (bf16 or fp16 inputs): a_small
    b, then a_big b added to it, two TF32 products in tf32x3's order; as tf32x3 does, a NaN in
    the first sum (from an inf or NaN in a) becomes 0 (the module docstring says where the two
    products still differ from three)."""
    big, small = _tf32_split(a)
    low = tl.dot(small, b, input_precision="tf32")
    return tl.dot(big, b, tl.where(low == low, low, 0.0), input_precision="tf32")


@triton.jit
def _dot_exact_left(a, b):
    """tl.dot(a, b) in tf32x3 where a's entries are TF32 values: a b_small, then a b_big, as in
    ``_dot_exact_right``."""
    big, small = _tf32_split(b)
    low = tl.dot(a, small, input_precision="tf32")
    return tl.dot(a, big, tl.where(low == low, low, 0.0), input_precision="tf32")


@triton.jit
def _ssd_chunked_kernel(
    x, dt, B, C, y, state, initial, A, D, bias,
    T, H, P, N, heads_per_group, lo, hi,
    sx_b, sx_t, sx_h, sx_p,
    sdt_b, sdt_t, sdt_h,
    sB_b, sB_t, sB_g, sB_n,
    sC_b, sC_t, sC_g, sC_n,
    sy_b, sy_t, sy_h, sy_p,
    sS_b, sS_h, sS_p, sS_n,
    sI_b, sI_h, sI_p, sI_n,
    Q: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_STATE: tl.constexpr,
    PRECISION: tl.constexpr,
    EXACT_BC: tl.constexpr,
):  # fmt: skip
    bh, pb = tl.program_id(0), tl.program_id(1)
    b, h = (bh // H).to(tl.int64), bh % H  # int64: b * stride may pass 2**31
    g = h // heads_per_group
    offs_q = tl.arange(0, Q)
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mp, mn = offs_p < P, offs_n < N
    A_h = tl.load(A + h).to(tl.float32)
    bias_h = tl.load(bias + h).to(tl.float32)
    s_ptr = state + b * sS_b + h * sS_h + offs_p[:, None] * sS_p + offs_n[None, :] * sS_n
    if HAS_STATE:  # a program reads its own tile before it writes it: initial may be state
        i_ptr = initial + b * sI_b + h * sI_h + offs_p[:, None] * sI_p + offs_n[None, :] * sI_n
        S = tl.load(i_ptr, mask=mp[:, None] & mn[None, :], other=0.0).to(tl.float32)
    else:
        S = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    if HAS_D:
        D_h = tl.load(D + h).to(tl.float32)
    causal = offs_q[:, None] >= offs_q[None, :]
    for c0 in range(0, T, Q):
        t = (c0 + offs_q).to(tl.int64)  # int64: t * stride may pass 2**31 in a long prompt
        mt = t < T
        raw = tl.load(dt + b * sdt_b + t * sdt_t + h * sdt_h, mask=mt, other=0.0).to(tl.float32)
        delta = tl.where(mt, _delta(raw, bias_h, lo, hi, SOFTPLUS), 0.0)
        lam = tl.cumsum(delta * A_h, 0)  # Λ_t, (Q,)
        lam_end = tl.sum(tl.where(offs_q == Q - 1, lam, 0.0), 0)
        mtp = mt[:, None] & mp[None, :]
        xt = tl.load(
            x + b * sx_b + t[:, None] * sx_t + h * sx_h + offs_p[None, :] * sx_p,
            mask=mtp,
            other=0.0,
        ).to(tl.float32)
        mtn = mt[:, None] & mn[None, :]
        Bt = tl.load(
            B + b * sB_b + t[:, None] * sB_t + g * sB_g + offs_n[None, :] * sB_n,
            mask=mtn,
            other=0.0,
        ).to(tl.float32)
        Ct = tl.load(
            C + b * sC_b + t[:, None] * sC_t + g * sC_g + offs_n[None, :] * sC_n,
            mask=mtn,
            other=0.0,
        ).to(tl.float32)
        xd = xt * delta[:, None]  # Δ_s x_s, (Q, BLOCK_P)
        decay = tl.exp(tl.where(causal, lam[:, None] - lam[None, :], float("-inf")))
        if EXACT_BC:  # B and C are TF32 values: the products of their zero small parts are left out
            CB = tl.dot(Ct, tl.trans(Bt), input_precision="tf32")  # (Q, Q): C_t . B_s
            entering = _dot_exact_left(Ct, tl.trans(S))  # (Q, BLOCK_P): S_in C_t
        else:
            CB = tl.dot(Ct, tl.trans(Bt), input_precision=PRECISION)
            entering = tl.dot(Ct, tl.trans(S), input_precision=PRECISION)
        out = tl.dot(CB * decay, xd, input_precision=PRECISION)  # (Q, BLOCK_P)
        out = out + entering * tl.exp(lam)[:, None]
        if HAS_D:
            out = out + D_h * xt
        tl.store(
            y + b * sy_b + t[:, None] * sy_t + h * sy_h + offs_p[None, :] * sy_p,
            out.to(y.dtype.element_ty),
            mask=mtp,
        )
        to_end = tl.exp(lam_end - lam)  # (Q,)
        if EXACT_BC:
            added = _dot_exact_right(tl.trans(xd * to_end[:, None]), Bt)
        else:
            added = tl.dot(tl.trans(xd * to_end[:, None]), Bt, input_precision=PRECISION)
        S = tl.exp(lam_end) * S + added  # (BLOCK_P, BLOCK_N)
    tl.store(s_ptr, S, mask=mp[:, None] & mn[None, :])


def _byte_span(t):
    """[first, last + 1) byte addresses ``t``'s elements occupy."""
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _check_out_state(out, initial, shape, device):
    """``out_state``: fp32 of ``shape`` on ``device``, no element written twice, and either
    ``initial_state`` itself (the same elements, read by each program before it writes them)
    or apart from it (a partial overlap would let one program overwrite a tile another has yet
    to read)."""
    check_tensor("out_state", out, shape)
    if out.dtype != torch.float32 or out.device != device:
        raise ValueError(
            f"out_state: expected float32 on {device}, got {out.dtype} on {out.device}"
        )
    if any(st == 0 and n > 1 for n, st in zip(out.shape, out.stride())):
        raise ValueError(f"out_state: expected distinct elements, got strides {out.stride()}")
    if initial is None:
        return
    same = initial.data_ptr() == out.data_ptr() and initial.stride() == out.stride()
    (a, b), (c, d) = _byte_span(initial), _byte_span(out)
    if not same and a < d and c < b:
        raise ValueError(
            "out_state: expected initial_state itself or memory apart from it, got an overlap"
        )


def ssd_chunked_scan(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    initial_state=None,
    out_state=None,
    chunk_size=64,
    block_p=None,
    block_n=None,
    num_warps=4,
    precision="tf32x3",
) -> ScanResult:
    """``replaylab.scan.ssd_chunked_scan`` (no z) in one Triton launch: shapes in the module
    docstring; returns ``ScanResult(y, state)`` with the state in fp32, written into
    ``out_state`` ((batch, H, P, N) fp32) where given, which may be ``initial_state`` itself
    (the scan then moves it on in place: no copy). ``chunk_size``: Q, a
    power of two of at least 16 (``tl.dot``'s smallest side), halved where a chunk does not
    fit the GPU's shared memory (fp32 inputs at N = 128 need Q = 32 on Hopper; Q changes only
    the rounding). ``block_p``, ``block_n``: powers of two of at least 32; by default 32
    (``DEFAULT_BLOCK_P``) and N rounded up to a power of two. The block of P changes the
    rounding. ``precision``: ``tl.dot``'s input precision: "tf32x3" (three TF32 products,
    about fp32's accuracy on tensor cores; fewer where B and C are bf16 or fp16, with the same
    sums), "ieee" (fp32 products on the CUDA cores) or "tf32" (one TF32 product)."""
    if x.dim() != 4:
        raise ValueError(f"x: expected (batch, T, H, P), got shape {tuple(x.shape)}")
    batch, T, H, P = x.shape
    if B.dim() != 4 or B.shape[:2] != (batch, T):
        raise ValueError(f"B: expected (batch={batch}, T={T}, G, N), got {tuple(B.shape)}")
    G, N = B.shape[2], B.shape[3]
    if G < 1 or H % G:
        raise ValueError(f"B: its {G} groups must divide the {H} heads")
    check_tensor("C", C, (batch, T, G, N))
    for name, t in (("B", B), ("C", C)):
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    check_tensor("dt", dt, (batch, T, H))
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            check_tensor(name, t, (H,))
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (batch, H, P, N))
    q = as_power_of_two("chunk_size", chunk_size, low=16)
    if block_p is not None:
        block_p = as_power_of_two("block_p", block_p, low=MIN_BLOCK)
    if block_n is not None:
        block_n = as_power_of_two("block_n", block_n, low=MIN_BLOCK)
        if block_n < N:
            raise ValueError(f"block_n: {block_n} must be at least the state size N = {N}")
    if precision not in ("ieee", "tf32", "tf32x3"):
        raise ValueError(f"precision: expected 'ieee', 'tf32' or 'tf32x3', got {precision!r}")
    # NO_LIMIT clamps nothing (process_dt's rule), not even at 0
    lo, hi = (-math.inf, math.inf) if tuple(dt_limit) == NO_LIMIT else map(float, dt_limit)
    device = x.device
    y = torch.empty_like(x)
    if initial_state is not None and initial_state.device != device:
        raise ValueError(
            f"initial_state: expected a tensor on {device}, got {initial_state.device}"
        )
    if out_state is None:
        state = torch.empty(batch, H, P, N, dtype=torch.float32, device=device)
    else:
        _check_out_state(out_state, initial_state, (batch, H, P, N), device)
        state = out_state
    if T == 0:
        y.zero_()
        return ScanResult(
            y, state.copy_(initial_state) if initial_state is not None else state.zero_()
        )
    block_p = block_p or DEFAULT_BLOCK_P
    block_n = block_n or max(MIN_BLOCK, triton.next_power_of_2(N))
    A = A.contiguous()  # the kernel reads A[h], D[h], dt_bias[h] at unit stride
    bias = dt_bias.contiguous() if dt_bias is not None else torch.zeros(H, device=device)
    grid = (batch * H, triton.cdiv(P, block_p))
    initial = state if initial_state is None else initial_state  # read only under HAS_STATE
    exact_bc = precision == "tf32x3" and {B.dtype, C.dtype} <= {torch.bfloat16, torch.float16}
    launch = (x.device, x.dtype, q, block_p, block_n, num_warps, precision, exact_bc)
    q = _CHUNK_THAT_FITS.get(launch, q)
    while True:
        try:
            _ssd_chunked_kernel[grid](
                x, dt, B, C, y, state, initial, A, D.contiguous() if D is not None else A, bias,
                T, H, P, N, H // G, lo, hi,
                *x.stride(), *dt.stride(), *B.stride(), *C.stride(), *y.stride(), *state.stride(),
                *initial.stride(),
                Q=q, BLOCK_P=block_p, BLOCK_N=block_n,
                SOFTPLUS=bool(dt_softplus), HAS_D=D is not None, HAS_STATE=initial_state is not None,
                PRECISION=precision, EXACT_BC=exact_bc, num_warps=num_warps,
            )  # fmt: skip
            _CHUNK_THAT_FITS[launch] = q
            return ScanResult(y, state)
        except OutOfResources:  # raised before the launch: y and state are untouched
            if q == 16:
                raise
            q //= 2
