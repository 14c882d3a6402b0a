"""A row-invariant matrix product for the serving engine: row i of ``linear(x, w)`` is the same
bits whatever the number of rows M, so a (k+1)-token verify at batch B (M = B(k+1)) rounds
each row as a decode step at batch B (M = B) does.

cuBLAS picks its kernel, tile and split of the reduction by shape, so its rows can change with
M (``data/bench_serve_matmul_rows.json``). Here the launch
depends only on the weight's shape (N, K), never on M: one compiled kernel, one tile shape,
the K reduction in BLOCK_K chunks in one order, no split of K. A row's result then depends
only on its own inputs. What that costs against cuBLAS is measured by ``bench serve``.

    y = x W^T      x: (M, K), W: (N, K) (nn.Linear's layout), y: (M, N), fp32 accumulation

``row_sum`` is the same promise for a sum over the last dim (the norms' mean of squares, an
L2 normalisation): one program per row, its chunks in one order, whatever the row count.

Under ``TRITON_INTERPRET=1`` it runs on CPU tensors (the tile is upcast to fp32 there, since
the interpreter's bf16 arithmetic is not the GPU's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["linear", "linear_ref", "launch_for", "row_sum"]


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count
def _linear_kernel(
    x,  # (M, K) rows
    w,  # (N, K) weight
    y,  # (M, N) output
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # M tiles that run together on one weight tile (L2 reuse)
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,  # fp32 inputs: "ieee" (no TF32 rounding of the inputs)
):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows_in_group
    pid_n = (pid % (GROUP_M * tiles_n)) // rows_in_group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mm, mn = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mk = (k0 + offs_k) < K
        a = tl.load(
            x + offs_m[:, None].to(tl.int64) * K + k0 + offs_k[None, :],
            mask=mm[:, None] & mk[None, :],
            other=0.0,
        )
        b = tl.load(
            w + offs_n[None, :].to(tl.int64) * K + k0 + offs_k[:, None],
            mask=mn[None, :] & mk[:, None],
            other=0.0,
        )
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(
        y + offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
        acc.to(y.dtype.element_ty),
        mask=mm[:, None] & mn[None, :],
    )


def launch_for(N, K):
    """(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) for a weight (N, K): a
    function of the weight alone (narrow outputs get narrow tiles so the SMs stay busy)."""
    block_n = 64 if N >= 8192 else 32
    return 64, block_n, 64, 16, 4, 4


def linear(x, weight):
    """``x @ weight.T`` for x (..., K) and weight (N, K), row-invariant: (..., N)."""
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: x has {x.shape[-1]} features, weight (N, K) = {tuple(weight.shape)} "
            f"expects K={weight.shape[1]}"
        )
    if x.dtype != weight.dtype:
        raise ValueError(f"linear: x is {x.dtype} and weight {weight.dtype}; expected one dtype")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    w = weight.contiguous()
    M, K = x2.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y.view(*lead, N)
    BM, BN, BK, GM, warps, stages = launch_for(N, K)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _linear_kernel[grid](
        x2, w, y, M, N, K, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM,
        UPCAST=not x.is_cuda, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return y.view(*lead, N)


def linear_ref(x, weight):
    """The reference: fp32 accumulation, rounded once to x's dtype."""
    return torch.nn.functional.linear(x.float(), weight.float()).to(x.dtype)


@triton.jit(do_not_specialize=["R"])
def _row_sum_kernel(x, out, R, C, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, C, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        acc += tl.load(x + r * C + offs, mask=offs < C, other=0.0).to(tl.float32)
    tl.store(out + r, tl.sum(acc, axis=0).to(out.dtype.element_ty))


def row_sum(x):
    """``x.sum(-1)`` for x (..., C), row-invariant (fp32 accumulation, x's dtype out):
    (...,). The launch depends on C alone."""
    lead, C = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, C).contiguous()
    out = torch.empty(x2.shape[0], dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(triton.next_power_of_2(max(C, 1)), 1024)
        _row_sum_kernel[(x2.shape[0],)](x2, out, x2.shape[0], C, BLOCK=block, num_warps=4)
    return out.view(lead)
