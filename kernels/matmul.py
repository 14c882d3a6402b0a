"""A row-invariant matrix product for the serving engine: row i of ``linear(x, w)`` is the same
bits whatever the number of rows M, so a (k+1)-token verify at batch B (M = B(k+1)) rounds
each row as a decode step at batch B (M = B) does.

cuBLAS picks its kernel, tile and split of the reduction by shape, so its rows can change with
M (``data/bench_serve_matmul_rows.json``). Here what decides a row's bits, the reduction, is a
function of the weight's shape (N, K) alone: K cut into a fixed number of slices, each slice
reduced in BLOCK_K chunks in one order into an fp32 partial, and the partials summed in slice
order. The tile, warps, stages and how the slices are spread over programs (each slice its own
programs and a second launch that sums them, or one program per tile that sums them as it
goes: the same additions) only decide the speed, and ``launch_for`` chooses them by the row
count. The slices keep a narrow weight's product at the copy bandwidth when M is small:
without them a (4096, K) weight gives the GPU 32-64 programs. What it costs against cuBLAS is
measured by ``bench matmul``.

    y = x W^T      x: (M, K), W: (N, K) (nn.Linear's layout), y: (M, N), fp32 accumulation

That a tile does not change the bits rests on ``tl.dot`` adding a chunk's products to the
accumulator alike in every tile shape: measured (Triton 3.6, an H200), not promised by the
compiler, so ``tests/test_matmul.py``'s GPU tests (every swept tile of one reduction; every
tuned weight across its row buckets) are to be rerun after a Triton upgrade.

A launch may fetch its tiles with the tensor memory accelerator (``Launch.tma``, Hopper and
later): the same slices and order along K, zeros past the edges instead of masks; it applies
where a weight's rows are 16-byte multiples and its base 16-byte aligned (the rows are copied
to an aligned buffer where theirs is not), else the launch keeps pointer loads.

``row_sum`` is the same promise for a sum over the last dim (the norms' mean of squares, an
L2 normalisation): one program per row, its chunks in one order, whatever the row count.

Under ``TRITON_INTERPRET=1`` it runs on CPU tensors (the tile is upcast to fp32 there, since
the interpreter's bf16 arithmetic is not the GPU's).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = [
    "Launch", "linear", "linear_ref", "launch_for", "launch_for_rows", "previous_launch_for",
    "row_sum", "use_launches",
]  # fmt: skip


class Launch(NamedTuple):
    """One launch of ``linear`` for a weight (N, K): the output tile (block_m x block_n), the
    K chunk a ``tl.dot`` takes (block_k), how many slices K is cut into (splits; each slice is
    reduced in BLOCK_K chunks into an fp32 partial, the partials summed in slice order: by a
    second launch, or, ``in_loop``, by the tile's one program as it goes), Triton's warps and
    pipeline stages, and the launch order of the tiles (group_m).

    A row's bits follow from block_k and splits alone (the reduction); the tile, warps,
    stages, TMA and ``in_loop`` only decide how fast (``launch_for`` may choose them by the
    row count)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    splits: int = 1
    num_warps: int = 4
    num_stages: int = 4
    group_m: int = 8  # row tiles that run together on one weight tile (L2 reuse)
    tma: bool = False  # tiles fetched by TMA where it applies (16-byte rows and weight base)
    in_loop: bool = False  # one program per tile reduces every slice (no partials, no 2nd launch)

    @property
    def reduction(self):
        """(block_k, splits): what a row's bits depend on."""
        return self.block_k, self.splits


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count
def _linear_kernel(
    x,  # (M, K) rows
    w,  # (N, K) weight
    y,  # (M, N) output, or (splits, M, N) fp32 partials when PARTIAL
    M,
    N,
    K,
    k_slice,  # columns of K per slice (a multiple of BLOCK_K)
    n_slices,  # cdiv(K, k_slice)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # M tiles that run together on one weight tile (L2 reuse)
    EVEN_K: tl.constexpr,  # K a multiple of BLOCK_K: no mask along K (vectorised loads)
    PARTIAL: tl.constexpr,  # slice s is program_id(1), its fp32 sums stored as partials
    IN_LOOP: tl.constexpr,  # every slice in this program, summed in slice order
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,  # fp32 inputs: "ieee" (no TF32 rounding of the inputs)
):
    s = tl.program_id(1)  # the slice (0 when IN_LOOP: one program per tile)
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = x + offs_m[:, None].to(tl.int64) * K
    w_rows = w + offs_n[None, :].to(tl.int64) * K
    mm, mn = offs_m < M, offs_n < N
    if IN_LOOP:  # the split form's second launch, done here: 0 + p_0 + p_1 + ... in order
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for t in range(0, n_slices):
            acc += _slice_product(x_rows, w_rows, mm, mn, K, k_slice, t, BLOCK_M, BLOCK_N,
                                  BLOCK_K, EVEN_K, UPCAST, PRECISION)  # fmt: skip
    else:
        acc = _slice_product(x_rows, w_rows, mm, mn, K, k_slice, s, BLOCK_M, BLOCK_N, BLOCK_K,
                             EVEN_K, UPCAST, PRECISION)  # fmt: skip
    _store(y, acc, s, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, PARTIAL)


@triton.jit
def _slice_product(x_rows, w_rows, mm, mn, K, k_slice, s, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                   UPCAST: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """Slice s of K: its BLOCK_K chunks reduced in order into a fresh fp32 tile."""
    offs_k = tl.arange(0, BLOCK_K)
    k_end = tl.minimum(K, (s + 1) * k_slice)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(s * k_slice, k_end, BLOCK_K):
        mk = ((k0 + offs_k) < k_end) | EVEN_K
        a = tl.load(x_rows + k0 + offs_k[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        b = tl.load(w_rows + k0 + offs_k[:, None], mask=mn[None, :] & mk[:, None], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every row count
def _linear_tma_kernel(
    x_desc,  # (M, K) rows, tiles (BLOCK_M, BLOCK_K) fetched by the tensor memory accelerator
    w_desc,  # (N, K) weight, tiles (BLOCK_N, BLOCK_K)
    y,  # (M, N) output, or (splits, M, N) fp32 partials when PARTIAL
    M,
    N,
    K,
    k_slice,
    n_slices,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PARTIAL: tl.constexpr,
    IN_LOOP: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """``_linear_kernel``'s products with the tiles loaded by TMA (zeros past M, N and K:
    no masks) instead of pointer loads; the same reduction order along K."""
    s = tl.program_id(1)
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    if IN_LOOP:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for t in range(0, n_slices):
            acc += _tma_slice_product(x_desc, w_desc, pid_m, pid_n, K, k_slice, t, BLOCK_M,
                                      BLOCK_N, BLOCK_K, UPCAST, PRECISION)  # fmt: skip
    else:
        acc = _tma_slice_product(x_desc, w_desc, pid_m, pid_n, K, k_slice, s, BLOCK_M, BLOCK_N,
                                 BLOCK_K, UPCAST, PRECISION)  # fmt: skip
    _store(y, acc, s, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, PARTIAL)


@triton.jit
def _tma_slice_product(x_desc, w_desc, pid_m, pid_n, K, k_slice, s, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
                       PRECISION: tl.constexpr):  # fmt: skip
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(s * k_slice, tl.minimum(K, (s + 1) * k_slice), BLOCK_K):
        a = x_desc.load([pid_m * BLOCK_M, k0])
        b = w_desc.load([pid_n * BLOCK_N, k0])
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid``: GROUP_M row tiles run together on one
    weight tile."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = pid // (GROUP_M * tiles_n) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows_in_group
    pid_n = (pid % (GROUP_M * tiles_n)) // rows_in_group
    return pid_m, pid_n


@triton.jit
def _store(y, acc, s, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           PARTIAL: tl.constexpr):  # fmt: skip
    """The tile's fp32 sums: slice s of the partials, or rounded once into y."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out = y + s.to(tl.int64) * M * N if PARTIAL else y
    value = acc if PARTIAL else acc.to(y.dtype.element_ty)
    tl.store(
        out + offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
        value,
        mask=(offs_m < M)[:, None] & (offs_n < N)[None, :],
    )


@triton.jit(do_not_specialize=["MN"])
def _sum_slices_kernel(partials, y, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """y = partials[0] + partials[1] + ... in slice order, rounded once to y's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(partials + s * MN.to(tl.int64) + offs, mask=mask, other=0.0)
    tl.store(y + offs, acc.to(y.dtype.element_ty), mask=mask)


# The launches of 2026-12-04 .. 12-06, one per weight for every row count: measured on an H200
# (bench matmul --sweep, data/bench_matmul_sweep.json), the one with the lowest worst ratio to
# cuBLAS over the rows. Kept to time ``TUNED`` against (``previous_launch_for``).
PREVIOUS_TUNED: dict[tuple[int, int], Launch] = {
    (32, 4096): Launch(64, 64, 64, 8, 4, 4),
    (288, 8192): Launch(64, 128, 64, 8, 4, 4),
    (512, 2048): Launch(64, 64, 64, 2, 4, 4),
    (1024, 4096): Launch(64, 64, 64, 2, 4, 4),
    (2048, 2048): Launch(64, 64, 64, 1, 4, 4),
    (2048, 4096): Launch(64, 64, 64, 2, 4, 4),
    (2048, 8192): Launch(128, 128, 64, 4, 8, 3),
    (4096, 4096): Launch(64, 64, 64, 1, 4, 4),
    (4096, 8192): Launch(128, 256, 64, 4, 8, 3),
    (4096, 12288): Launch(128, 256, 64, 4, 8, 3),
    (4096, 14336): Launch(128, 256, 64, 4, 8, 3),
    (4096, 21504): Launch(128, 256, 64, 8, 8, 3),
    (4096, 32256): Launch(128, 256, 64, 8, 8, 3),
    (8192, 16): Launch(128, 128, 64, 1, 8, 3),
    (8192, 256): Launch(128, 128, 64, 1, 8, 3),
    (8192, 2048): Launch(64, 128, 64, 1, 4, 4),
    (8192, 4096): Launch(64, 128, 64, 1, 4, 4),
    (10304, 2048): Launch(128, 128, 64, 1, 8, 3),
    (12288, 4096): Launch(128, 128, 64, 1, 8, 3),
    (14336, 4096): Launch(128, 128, 64, 1, 8, 3),
    (16384, 4096): Launch(128, 128, 64, 1, 8, 3),
    (16768, 4096): Launch(128, 128, 64, 1, 8, 3),
    (18560, 4096): Launch(128, 128, 64, 1, 8, 3),
    (21504, 4096): Launch(128, 128, 64, 1, 8, 3),
    (32000, 2048): Launch(128, 128, 64, 1, 8, 3),
    (32000, 4096): Launch(128, 128, 64, 1, 8, 3),
    (32256, 4096): Launch(128, 128, 64, 1, 8, 3),
    (32768, 4096): Launch(128, 128, 64, 1, 8, 3),
}  # fmt: skip


# Launches by row count for the weight shapes of the presets, ((max_rows, Launch), ...), the
# last for any M: chosen by ``bench.matmul.best_launches(sweep, one_slice_stands_in=True)`` from
# the H200 sweeps data/bench_matmul_sweep_tma.json (10 weights, pointer and TMA tiles) and
# data/bench_matmul_sweep.json (the other 18): per weight the reduction (block_k, splits) whose
# fastest launches have the lowest worst ratio to cuBLAS up to 256 rows, then per row count its
# fastest launch. Those sweeps predate ``in_loop``: an in-loop launch was timed there as its
# one-slice launch (the same loop, with a sum at each slice's end), which changed the count of
# slices chosen for 6 weights. Timed as it is on an H200 (data/README.md):
# faster than ``PREVIOUS_TUNED`` up to 128 rows, slower at 320 rows (none was chosen there) and
# at 640 where the stand-in was wrong; a sweep that times in-loop launches is still to run.
TUNED: dict[tuple[int, int], tuple[tuple[int | None, Launch], ...]] = {
    (32, 4096): (
        (None, Launch(64, 64, 64, 8, 4, 4)),
    ),
    (288, 8192): (
        (286, Launch(64, 64, 64, 8, 4, 4)),
        (None, Launch(64, 128, 64, 8, 4, 4)),
    ),
    (512, 2048): (
        (None, Launch(64, 64, 64, 4, 4, 4)),
    ),
    (1024, 4096): (
        (404, Launch(64, 64, 64, 6, 4, 4, tma=True)),
        (None, Launch(128, 256, 64, 6, 8, 3, tma=True)),
    ),
    (2048, 2048): (
        (286, Launch(64, 128, 128, 4, 4, 3)),
        (None, Launch(64, 128, 128, 4, 4, 3, in_loop=True)),
    ),
    (2048, 4096): (
        (286, Launch(64, 64, 64, 4, 4, 4)),
        (None, Launch(64, 64, 64, 4, 4, 4, in_loop=True)),
    ),
    (2048, 8192): (
        (4, Launch(64, 64, 64, 8, 4, 4)),
        (286, Launch(64, 128, 64, 8, 4, 4)),
        (None, Launch(64, 64, 64, 8, 4, 4, in_loop=True)),
    ),
    (4096, 4096): (
        (22, Launch(64, 64, 64, 3, 4, 4)),
        (181, Launch(64, 64, 64, 3, 4, 4, tma=True)),
        (404, Launch(64, 64, 64, 3, 4, 4, tma=True, in_loop=True)),
        (None, Launch(128, 128, 64, 3, 8, 3, tma=True, in_loop=True)),
    ),
    (4096, 8192): (
        (181, Launch(64, 128, 128, 2, 4, 3, tma=True)),
        (None, Launch(64, 128, 128, 2, 4, 3, tma=True, in_loop=True)),
    ),
    (4096, 12288): (
        (45, Launch(64, 64, 64, 4, 4, 4)),
        (286, Launch(64, 128, 64, 4, 4, 4)),
        (None, Launch(128, 256, 64, 4, 8, 3)),
    ),
    (4096, 14336): (
        (45, Launch(64, 64, 64, 4, 4, 4)),
        (286, Launch(64, 128, 64, 4, 4, 4)),
        (None, Launch(128, 256, 64, 4, 8, 3)),
    ),
    (4096, 21504): (
        (22, Launch(64, 64, 64, 4, 4, 4)),
        (90, Launch(64, 64, 64, 4, 4, 4, tma=True)),
        (181, Launch(64, 128, 64, 4, 4, 4, tma=True)),
        (None, Launch(128, 256, 64, 4, 8, 3, tma=True)),
    ),
    (4096, 32256): (
        (22, Launch(64, 64, 64, 4, 4, 4)),
        (90, Launch(64, 64, 64, 4, 4, 4, tma=True)),
        (181, Launch(64, 128, 64, 4, 4, 4, tma=True)),
        (None, Launch(128, 256, 64, 4, 8, 3, tma=True)),
    ),
    (6144, 4096): (
        (22, Launch(64, 64, 64, 2, 4, 4)),
        (181, Launch(64, 64, 64, 2, 4, 4, tma=True)),
        (404, Launch(64, 64, 64, 2, 4, 4, tma=True, in_loop=True)),
        (None, Launch(128, 128, 64, 2, 8, 3, tma=True, in_loop=True)),
    ),
    (8192, 16): (
        (4, Launch(64, 64, 64, 1, 4, 4)),
        (45, Launch(128, 128, 64, 1, 8, 3)),
        (286, Launch(64, 128, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
    (8192, 256): (
        (286, Launch(64, 64, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
    (8192, 2048): (
        (45, Launch(64, 128, 128, 2, 4, 3)),
        (None, Launch(64, 128, 128, 2, 4, 3, in_loop=True)),
    ),
    (8192, 4096): (
        (45, Launch(64, 64, 64, 2, 4, 4)),
        (286, Launch(64, 128, 64, 2, 4, 4)),
        (None, Launch(128, 128, 64, 2, 8, 3, in_loop=True)),
    ),
    (10304, 2048): (
        (4, Launch(64, 64, 64, 2, 4, 4)),
        (45, Launch(64, 128, 64, 2, 4, 4)),
        (286, Launch(64, 64, 64, 2, 4, 4, in_loop=True)),
        (None, Launch(128, 128, 64, 2, 8, 3, in_loop=True)),
    ),
    (12288, 4096): (
        (4, Launch(64, 64, 64, 2, 4, 4)),
        (45, Launch(64, 128, 64, 2, 4, 4)),
        (286, Launch(64, 64, 64, 2, 4, 4, in_loop=True)),
        (None, Launch(128, 128, 64, 2, 8, 3, in_loop=True)),
    ),
    (14336, 4096): (
        (45, Launch(64, 64, 64, 1, 4, 4)),
        (286, Launch(64, 128, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
    (16384, 4096): (
        (45, Launch(64, 64, 64, 1, 4, 4)),
        (286, Launch(64, 128, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
    (16768, 4096): (
        (45, Launch(64, 64, 64, 1, 4, 4)),
        (286, Launch(64, 128, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
    (18560, 4096): (
        (22, Launch(64, 64, 64, 1, 4, 4)),
        (90, Launch(64, 64, 64, 1, 4, 4, tma=True)),
        (181, Launch(128, 128, 64, 1, 8, 3, tma=True)),
        (404, Launch(128, 128, 64, 1, 8, 4, tma=True)),
        (None, Launch(128, 128, 64, 1, 8, 3, tma=True)),
    ),
    (21504, 4096): (
        (90, Launch(64, 64, 64, 1, 4, 4)),
        (181, Launch(128, 128, 64, 1, 8, 3, tma=True)),
        (None, Launch(128, 128, 64, 1, 8, 4, tma=True)),
    ),
    (32000, 2048): (
        (45, Launch(64, 128, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
    (32000, 4096): (
        (22, Launch(64, 128, 64, 1, 4, 4)),
        (90, Launch(64, 128, 64, 1, 4, 4, tma=True)),
        (None, Launch(128, 128, 64, 1, 8, 3, tma=True)),
    ),
    (32256, 4096): (
        (22, Launch(64, 128, 64, 1, 4, 4)),
        (90, Launch(64, 128, 64, 1, 4, 4, tma=True)),
        (None, Launch(128, 128, 64, 1, 8, 3, tma=True)),
    ),
    (32768, 4096): (
        (45, Launch(64, 128, 64, 1, 4, 4)),
        (None, Launch(128, 128, 64, 1, 8, 3)),
    ),
}  # fmt: skip


def previous_launch_for(N, K, M=None):
    """The launch before ``launch_for`` chose tiles by the row count (2026-12-04 .. 12-06):
    ``PREVIOUS_TUNED``'s, one for every M. Kept to time the change against
    (``use_launches``)."""
    return PREVIOUS_TUNED.get((N, K)) or _untuned(N, K)


_policy = contextvars.ContextVar("launch_policy", default=None)  # set by ``use_launches``


@contextlib.contextmanager
def use_launches(policy):
    """Within the block (this thread or task only), ``linear`` launches ``policy(N, K, M)``
    instead of ``launch_for(N, K, M)``: a benchmark's side-by-side arm. The policy is read when
    ``linear`` runs, so an engine's graphs must be captured inside the block too."""
    token = _policy.set(policy)
    try:
        yield
    finally:
        _policy.reset(token)


def _untuned(N, K):
    """A weight shape no sweep measured: what the sweep found for its kind on an H200 (wide
    outputs one slice of 128 x 128 tiles, narrow outputs with a long K 128 x 256 tiles and K
    cut in 4-8 slices, small weights 64 x 64 tiles), one launch for every row count."""
    if N >= 10240:
        return Launch(128, 128, 64, 1, 8, 3)
    if K >= 8192:
        return Launch(128, 256, 64, 8 if K >= 16384 else 4, 8, 3)
    return Launch(64, 64, 64, 2 if N <= 2048 and K >= 4096 else 1, 4, 4)


def launch_for_rows(buckets, M):
    """The launch of ``buckets`` ((max_rows, Launch), ..., (None, Launch)) for M rows."""
    return next(launch for bound, launch in buckets if bound is None or M <= bound)


def launch_for(N, K, M):
    """The ``Launch`` for a weight (N, K) at M rows: ``TUNED``'s bucket for M where a sweep
    measured the shape, else ``_untuned``'s. The reduction (block_k, splits) is the weight's
    alone, so a row's bits do not depend on M; the tile may."""
    buckets = TUNED.get((N, K))
    return _untuned(N, K) if buckets is None else launch_for_rows(buckets, M)


def linear(x, weight, launch=None):
    """``x @ weight.T`` for x (..., K) and weight (N, K), row-invariant: (..., N). ``launch``
    overrides ``launch_for(N, K, M)`` (a sweep's candidate)."""
    if weight.dim() != 2:
        raise ValueError(f"linear: weight: expected (N, K), got shape {tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: x has {x.shape[-1]} features, weight (N, K) = {tuple(weight.shape)} "
            f"expects K={weight.shape[1]}"
        )
    if x.dtype != weight.dtype:
        raise ValueError(f"linear: x is {x.dtype} and weight {weight.dtype}; expected one dtype")
    if weight.shape[1] == 0:
        raise ValueError(f"linear: weight (N, K) = {tuple(weight.shape)}; expected K >= 1")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    w = weight.contiguous()
    M, K = x2.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0:
        return y.view(*lead, N)
    # the interpreter's tl.dot (numpy) sums a chunk in an order that follows the tile: on CPU
    # one launch serves every row count
    L = launch or (_policy.get() or launch_for)(N, K, M if x.is_cuda else 1)
    if L.splits < 1 or L.block_k < 16:
        raise ValueError(f"linear: launch {L} needs splits >= 1 and block_k >= 16")
    k_slice = triton.cdiv(triton.cdiv(K, L.splits), L.block_k) * L.block_k
    splits = triton.cdiv(K, k_slice)  # a slice is never empty
    in_loop = L.in_loop and splits > 1  # one slice: the plain form is the same sums
    partial = splits > 1 and not in_loop
    out = torch.empty(splits, M, N, dtype=torch.float32, device=x.device) if partial else y
    grid = (triton.cdiv(M, L.block_m) * triton.cdiv(N, L.block_n), splits if partial else 1)
    common = dict(
        BLOCK_M=L.block_m, BLOCK_N=L.block_n, BLOCK_K=L.block_k, GROUP_M=L.group_m,
        PARTIAL=partial, IN_LOOP=in_loop, UPCAST=not x.is_cuda,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=L.num_warps, num_stages=L.num_stages,
    )  # fmt: skip
    if L.tma and (K * x.element_size()) % 16 == 0 and w.data_ptr() % 16 == 0:  # TMA's rules
        if x2.data_ptr() % 16:
            x2 = x2.clone()  # an offset view: TMA needs a 16-byte aligned base
        x_desc = TensorDescriptor.from_tensor(x2, [L.block_m, L.block_k])
        w_desc = TensorDescriptor.from_tensor(w, [L.block_n, L.block_k])
        _linear_tma_kernel[grid](x_desc, w_desc, out, M, N, K, k_slice, splits, **common)
    else:
        _linear_kernel[grid](
            x2, w, out, M, N, K, k_slice, splits, EVEN_K=K % L.block_k == 0, **common
        )  # fmt: skip
    if partial:
        block = 1024
        _sum_slices_kernel[(triton.cdiv(M * N, block),)](
            out, y, M * N, SPLITS=splits, BLOCK=block, num_warps=4
        )
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
