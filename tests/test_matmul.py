"""The row-invariant matrix product (``kernels.matmul.linear``) against fp32 accumulation, and
its contract: a row's bits do not depend on how many rows are computed with it. Under the
interpreter on CPU (small shapes), natively on a GPU (the serving engine's shapes too)."""

import pytest
import torch

from replaylab import assert_close
from replaylab.kernels.matmul import (
    Launch,
    launch_for,
    linear,
    linear_ref,
    previous_launch_for,
    row_sum,
    use_launches,
)
from replaylab.testing import DEVICE

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 40, 24), (70, 33, 100)])
def test_linear_matches_fp32_accumulation(dtype, shape):
    M, K, N = shape  # K and N not multiples of the tiles, M across two row tiles
    x = torch.randn(M, K, device=DEVICE).to(dtype)
    w = torch.randn(N, K, device=DEVICE).to(dtype)
    assert_close(linear(x, w), linear_ref(x, w), dtype=dtype, name="y")


def test_a_rows_bits_do_not_depend_on_the_row_count():
    x = torch.randn(67, 48, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(40, 48, device=DEVICE).to(torch.bfloat16)
    every = linear(x, w)
    for m in (1, 5, 8, 40, 64, 66):
        assert torch.equal(linear(x[:m], w), every[:m]), m
    assert torch.equal(linear(x[None, 3:8], w)[0], every[3:8])  # leading dims, an offset view


LAUNCHES = [
    Launch(64, 32, 32, 3, 4, 4),
    Launch(64, 64, 16, 4, 4, 4),
    Launch(64, 32, 32, 3, 4, 4, tma=True),
    Launch(64, 64, 64, 1, 4, 4, tma=True),
]


@pytest.mark.parametrize("launch", LAUNCHES)
def test_k_slices_keep_rows_invariant_and_match_fp32_accumulation(launch):
    """K cut into slices (fp32 partials summed in slice order), tiles by pointer loads or by
    TMA: within fp32 accumulation's error, and a row's bits do not depend on the row count."""
    x = torch.randn(70, 104, device=DEVICE).to(torch.bfloat16)  # K=104: a partial last chunk
    w = torch.randn(40, 104, device=DEVICE).to(torch.bfloat16)
    every = linear(x, w, launch)
    assert_close(every, linear_ref(x, w), dtype=torch.bfloat16, name="y")
    for m in (1, 5, 64, 66):
        assert torch.equal(linear(x[:m], w, launch), every[:m]), m


def test_a_tma_launch_where_tma_cannot_apply():
    """Rows that are not 16-byte multiples keep pointer loads (the same bits as tma=False);
    rows at an unaligned base are copied to an aligned buffer first (the same bits as an
    aligned copy of them)."""
    tma = Launch(64, 32, 32, 3, 4, 4, tma=True)
    x = torch.randn(70, 100, device=DEVICE).to(torch.bfloat16)  # 200-byte rows
    w = torch.randn(40, 100, device=DEVICE).to(torch.bfloat16)
    assert torch.equal(linear(x, w, tma), linear(x, w, tma._replace(tma=False)))
    flat = torch.randn(70 * 104 + 1, device=DEVICE).to(torch.bfloat16)
    shifted = flat[1:].view(70, 104)  # its base 2 bytes past an aligned one
    w = torch.randn(40, 104, device=DEVICE).to(torch.bfloat16)
    assert shifted.data_ptr() % 16
    assert torch.equal(linear(shifted, w, tma), linear(shifted.clone(), w, tma))


def test_use_launches_swaps_the_policy_and_restores_it():
    x = torch.randn(3, 96, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(40, 96, device=DEVICE).to(torch.bfloat16)
    sliced = Launch(64, 32, 32, 3, 4, 4)
    with use_launches(lambda N, K, M: sliced):
        inside = linear(x, w)
    assert torch.equal(inside, linear(x, w, sliced))
    assert torch.equal(linear(x, w), linear(x, w, launch_for(40, 96, 3)))  # restored
    assert previous_launch_for(4096, 21504, 1) == previous_launch_for(4096, 21504, 640)
    few, many = launch_for(4096, 21504, 1), launch_for(4096, 21504, 640)  # one reduction, 2 tiles
    assert few != many and few.reduction == many.reduction


def test_a_bad_launch_is_named():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="needs splits >= 1"):
        linear(x, torch.randn(4, 8, device=DEVICE), Launch(64, 32, 32, 0))
    with pytest.raises(ValueError, match=r"weight \(N, K\) = \(4, 0\); expected K >= 1"):
        linear(torch.randn(2, 0, device=DEVICE), torch.randn(4, 0, device=DEVICE))


@pytest.mark.parametrize("C", [7, 128, 1500])  # a partial block, one block, two blocks
def test_row_sum_matches_torch_and_its_rows_do_not_depend_on_the_row_count(C):
    x = torch.randn(9, 3, C, device=DEVICE)
    every = row_sum(x)
    assert every.shape == (9, 3)
    assert_close(every, x.double().sum(-1).float(), dtype=torch.float32, name="sum")
    for m in (1, 2, 5):
        assert torch.equal(row_sum(x[:m]), every[:m]), m
    assert torch.equal(row_sum(x[4:6, 1]), every[4:6, 1])  # an offset, strided view


def test_bad_input_is_named():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"x has 8 features, weight \(N, K\) = \(4, 6\)"):
        linear(x, torch.randn(4, 6, device=DEVICE))
    with pytest.raises(ValueError, match=r"x is torch.float32 and weight torch.bfloat16"):
        linear(x, torch.randn(4, 8, device=DEVICE).to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"weight: expected \(N, K\), got shape \(8,\)"):
        linear(x, torch.randn(8, device=DEVICE))  # a raw IndexError before


@pytest.mark.gpu
@pytest.mark.parametrize(
    "NK",
    [
        (4096, 21504),
        (21504, 4096),
        (18560, 4096),
        (4096, 32256),
        (1024, 4096),
        (4096, 4096),
        (131072, 4096),
    ],  # fmt: skip
)
def test_row_invariant_at_8b_shapes(NK):
    """Nemotron-H 8B layer shapes (some with K in slices, ``launch_for``): rows of a decode
    step at batch 1 .. 128 equal the same rows of a 5-token verify of that batch, bit for
    bit."""
    N, K = NK
    w = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16) * K**-0.5
    x = torch.randn(640, K, device=DEVICE, dtype=torch.bfloat16)
    every = linear(x, w)
    for m in (1, 8, 64, 128, 320):
        assert torch.equal(linear(x[:m], w), every[:m]), m
    assert_close(every[:8], linear_ref(x[:8], w), dtype=torch.bfloat16, name="y")


@pytest.mark.gpu
@pytest.mark.parametrize("NK", [(4096, 8192), (18560, 4096)])
@pytest.mark.parametrize("splits", [1, 4])
def test_tma_launches_are_row_invariant_at_8b_shapes(NK, splits):
    """Tiles loaded by TMA (zeros past the edges instead of masks): rows of 1 .. 320 equal the
    same rows among 640, bit for bit, and match fp32 accumulation."""
    N, K = NK
    launch = Launch(128, 128, 64, splits, 8, 3, tma=True)
    w = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16) * K**-0.5
    x = torch.randn(640, K, device=DEVICE, dtype=torch.bfloat16)
    every = linear(x, w, launch)
    for m in (1, 8, 64, 128, 320):
        assert torch.equal(linear(x[:m], w, launch), every[:m]), m
    assert_close(every[:8], linear_ref(x[:8], w), dtype=torch.bfloat16, name="y")


def _swept(weight, cublas, tried):
    """A sweep's result for one weight: cuBLAS µs by row, and (launch, µs by row) tried."""
    return dict(weight=list(weight), cublas_us=cublas, tried=[
        dict(launch=launch._asdict(), us=us, rows_equal=True) for launch, us in tried
    ])  # fmt: skip


def test_the_launch_table_holds_one_reduction_per_weight_and_chooses_tiles_by_rows():
    """``bench.matmul.best_launches``: one reduction (block_k, splits) per weight, the one whose
    fastest launches are worst off against cuBLAS the least; then each row count's fastest
    launch of it, up to the geometric middle of the swept row counts. A one-slice launch stands
    in for the in-loop launch of its tile only when asked."""
    from replaylab.bench.matmul import best_launches

    small = Launch(64, 64, 64, 4, 4, 4)  # 4 slices, fast at few rows
    wide = Launch(128, 256, 64, 4, 8, 3)  # 4 slices, fast at many
    one = Launch(128, 128, 64, 1, 8, 3)  # 1 slice: another reduction
    cublas = {"1": 10.0, "64": 10.0, "640": 40.0}
    shape = _swept((4096, 21504), cublas, [
        (small, {"1": 11.0, "64": 12.0, "640": 90.0}),
        (wide, {"1": 20.0, "64": 19.0, "640": 44.0}),
        (one, {"1": 30.0, "64": 30.0, "640": 41.0}),
    ])  # fmt: skip
    table = best_launches(dict(shapes=[shape]))[(4096, 21504)]
    assert table == ((202, small), (None, wide))  # int(sqrt(64 * 640)) = 202
    assert {launch.reduction for _, launch in table} == {(64, 4)}
    stood_in = best_launches(dict(shapes=[shape]), one_slice_stands_in=True)[(4096, 21504)]
    assert stood_in == ((202, small), (None, one._replace(splits=4, in_loop=True)))


def test_every_tuned_weight_keeps_one_reduction_at_every_row_count():
    """``TUNED``'s buckets: rising bounds, the last for any M, and one (block_k, splits) per
    weight (what keeps a row's bits independent of M); ``launch_for`` walks them."""
    from replaylab.kernels.matmul import TUNED

    for weight, buckets in TUNED.items():
        bounds = [b for b, _ in buckets]
        assert bounds[-1] is None and bounds[:-1] == sorted(bounds[:-1]), weight
        assert len({launch.reduction for _, launch in buckets}) == 1, weight
        for (bound, launch), (_, after) in zip(buckets, buckets[1:]):
            assert launch_for(*weight, bound) == launch and launch_for(*weight, bound + 1) == after
        assert launch_for(*weight, 10**6) == buckets[-1][1]


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_slices_summed_in_one_program_equal_the_second_launchs_sum(dtype, tma):
    """``in_loop``: each tile's program reduces its slices one after another and sums them in
    slice order, the split form's second launch done in place: the same bits (fp32 outputs
    compared as integers, where another order of three slices shows), at every row count,
    in two tiles, and within fp32 accumulation's error. (That two tiles give each other's
    bits holds on the GPU, ``test_every_swept_tile_rounds_one_reduction_alike``; the
    interpreter's ``tl.dot`` sums a chunk in an order that follows the tile.)"""
    x = torch.randn(70, 200, device=DEVICE).to(dtype)  # K=200: a partial last chunk
    w = torch.randn(40, 200, device=DEVICE).to(dtype)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    first = Launch(64, 32, 32, 3, 4, 4, tma=tma)
    for split in (first, first._replace(block_m=16, block_n=64, num_warps=2)):
        every = linear(x, w, split)
        assert_close(every, linear_ref(x, w), dtype=dtype, name="y")
        for m in (1, 5, 64, 70):
            got = linear(x[:m], w, split._replace(in_loop=True))
            assert torch.equal(got.view(bits), every[:m].view(bits)), (split, m)


@pytest.mark.gpu
@pytest.mark.parametrize("NK", [(4096, 32256), (18560, 4096)])
@pytest.mark.parametrize("splits", [1, 4])
def test_every_swept_tile_rounds_one_reduction_alike(NK, splits):
    """What lets ``launch_for`` choose tiles by the row count: for one reduction (block_k 64,
    ``splits`` slices), every tile the sweep tries, by pointer loads or TMA, with the slices
    in programs of their own or in one, gives the same bits."""
    from replaylab.bench.matmul import TILES

    N, K = NK
    w = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16) * K**-0.5
    x = torch.randn(200, K, device=DEVICE, dtype=torch.bfloat16)
    base = linear(x, w, Launch(64, 64, 64, splits, 4, 4))
    for bm, bn, bk, warps, stages in TILES:
        for tma in (False, True):
            for in_loop in (False, True) if splits > 1 else (False,):
                if bk == 64:
                    launch = Launch(bm, bn, bk, splits, warps, stages, tma=tma, in_loop=in_loop)
                    assert torch.equal(linear(x, w, launch), base), launch


@pytest.mark.gpu
def test_every_tuned_weight_keeps_its_rows_across_its_buckets():
    """Each weight of ``TUNED`` at the row counts on both sides of every bucket bound (a
    decode step's and a verify's), each with its own launch: rows equal the same rows among
    the most, bit for bit."""
    from replaylab.kernels.matmul import TUNED

    for (N, K), buckets in TUNED.items():
        bounds = [b for b, _ in buckets[:-1]]
        rows = sorted({1, *bounds, *(b + 1 for b in bounds)})
        w = torch.randn(N, K, device=DEVICE, dtype=torch.bfloat16) * K**-0.5
        x = torch.randn(max(rows[-1], 641), K, device=DEVICE, dtype=torch.bfloat16)
        every = linear(x, w)
        for m in rows:
            assert torch.equal(linear(x[:m], w), every[:m]), ((N, K), m, launch_for(N, K, m))


def test_slower_weights_names_the_weights_past_the_margin_at_each_row_count():
    from replaylab.bench.matmul import run_summary, slower_weights

    def shape(weight, new, previous):
        return dict(weight=list(weight), rows_equal={"1": True}, row_invariant_us=new,
                    previous_launch_us=previous, cublas_us={"1": 1.0, "8": 1.0})  # fmt: skip

    result = dict(rows=[1, 8], shapes=[
        shape((64, 32), {"1": 1.04, "8": 1.0}, {"1": 1.0, "8": 1.0}),  # 4% slower at 1 row
        shape((32, 64), {"1": 1.02, "8": 2.0}, {"1": 1.0, "8": 1.0}),  # 2% at 1: within
    ])  # fmt: skip
    assert slower_weights(result) == {1: [(64, 32)], 8: [(32, 64)]}
    assert run_summary(result, show=(1, 8))[-1].endswith("M=1: 1, M=8: 1")
