"""The Mamba-2 prefill scan in one Triton launch (``replaylab.kernels.ssd_chunked``, issue 38
item 1) against the float64 token recurrence (``replaylab.scan.ssd_scan``), under Triton's
interpreter on CPU and natively on a GPU; and in the serving engine, where it scans the prompt
chunks of every strategy under ``DecodeEngine(prefill_kernels=True)``. Sizes are awkward on purpose (P, N not powers
of two, heads sharing groups, prompts that end inside a chunk)."""

import pytest
import torch
import triton
import triton.language as tl

from replaylab import assert_close
from replaylab.kernels.ssd_chunked import _tf32_split, ssd_chunked_scan
from replaylab.scan import NO_LIMIT, ssd_scan
from replaylab.testing import DEVICE


def inputs(batch=2, T=100, H=4, P=12, G=2, N=10, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t = dict(
        x=r(batch, T, H, P).to(dtype),
        dt=r(batch, T, H).to(dtype),
        A=-torch.rand(H, generator=gen) - 0.1,
        B=r(batch, T, G, N).to(dtype),
        C=r(batch, T, G, N).to(dtype),
        D=r(H),
        dt_bias=r(H) * 0.1,
        initial_state=r(batch, H, P, N) * 0.3,
    )
    return {k: v.to(DEVICE) for k, v in t.items()}


def oracle(t, dt_softplus, dt_limit, with_state=True):
    f64 = {k: v.double() for k, v in t.items()}
    state = f64.pop("initial_state") if with_state else None
    return ssd_scan(**f64, dt_softplus=dt_softplus, dt_limit=dt_limit, initial_state=state,
                    compute_dtype=torch.float64)  # fmt: skip


@pytest.mark.parametrize("T", [1, 37, 64, 100])
@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize(
    "dt_softplus, dt_limit", [(True, (0.001, 5.0)), (False, NO_LIMIT)], ids=["softplus", "raw"]
)
def test_outputs_and_state_equal_the_float64_recurrence(T, chunk, dt_softplus, dt_limit):
    t = inputs(T=T)
    if not dt_softplus:  # raw Δ must be positive
        t["dt"] = t["dt"].abs() + 0.01
    got = ssd_chunked_scan(**t, dt_softplus=dt_softplus, dt_limit=dt_limit, chunk_size=chunk)
    want = oracle(t, dt_softplus, dt_limit)
    assert got.state.dtype == torch.float32 and got.y.dtype == t["x"].dtype
    assert_close(got.y.double(), want.y, atol=2e-5, rtol=2e-5, name="y")
    assert_close(got.state.double(), want.state, atol=2e-5, rtol=2e-5, name="state")


@pytest.mark.parametrize("shift", [5.0, 20.0])
def test_large_steps_keep_the_error_at_fp32_rounding(shift):
    """Δ up to about 20 with |A| up to 5: the log decay's running sum reaches thousands inside a
    chunk, and the kernel takes decays as differences of it; the error over the scale stays
    at fp32 rounding against the float64 recurrence."""
    t = inputs(T=128)
    t["dt"], t["A"] = t["dt"] + shift, t["A"] * 5
    got = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=64)
    want = oracle(t, True, NO_LIMIT)
    for name, a, b in (("y", got.y, want.y), ("state", got.state, want.state)):
        assert float((a.double() - b).abs().max() / b.abs().max()) < 2e-6, name


@pytest.mark.parametrize("T", [0, 37])
def test_the_state_moved_on_in_place_equals_a_new_one_bit_for_bit(T):
    """``out_state=initial_state`` (what a snapshot prefill does with a slot's row): the kernel
    reads each tile of the initial state before it writes it, so the result is the new
    tensor's, bit for bit; the initial state is not touched without ``out_state``."""
    t = inputs(T=T)
    before = t["initial_state"].clone()
    fresh = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16)
    assert torch.equal(t["initial_state"], before)
    pool = torch.zeros(3, *before.shape[1:], device=before.device)
    pool[1:] = before  # rows 1, 2 of a pool, as a slot's rows are
    t["initial_state"] = pool[1:]
    moved = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16, out_state=pool[1:])
    assert moved.state.data_ptr() == pool[1:].data_ptr()
    assert torch.equal(moved.y, fresh.y) and torch.equal(pool[1:], fresh.state)
    assert torch.equal(pool[0], torch.zeros_like(pool[0]))
    elsewhere = torch.full_like(before, 7.0)  # read from initial_state, not from out_state
    t["initial_state"] = before
    apart = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16, out_state=elsewhere)
    assert torch.equal(apart.y, fresh.y) and torch.equal(elsewhere, fresh.state)


def test_a_bad_out_state_is_refused_before_anything_is_written():
    """Wrong shape or dtype, an expanded buffer, or one that overlaps the initial state without
    being it (a program could overwrite a tile another has yet to read)."""
    t = inputs(T=8)
    pool = torch.zeros(3, 4, 12, 10, device=DEVICE)
    pool[:2] = t["initial_state"]
    t["initial_state"] = pool[:2]
    before = pool.clone()
    bad = {
        "shape": torch.zeros(2, 4, 12, 9, device=DEVICE),
        "float32": torch.zeros(2, 4, 12, 10, dtype=torch.float64, device=DEVICE),
        "distinct": torch.zeros(1, 4, 12, 10, device=DEVICE).expand(2, -1, -1, -1),
        "overlap": pool[1:],
    }
    for what, out in bad.items():
        with pytest.raises(ValueError, match="out_state") as raised:
            ssd_chunked_scan(**t, dt_softplus=True, out_state=out)
        assert what in str(raised.value) or what == "shape", (what, raised.value)
        assert torch.equal(pool, before), what


def test_from_zeros_without_d_and_on_strided_inputs():
    t = inputs(T=50)
    xBC = torch.cat([t["x"].flatten(2), t["B"].flatten(2), t["C"].flatten(2)], -1)
    x, B, C = xBC.split([48, 20, 20], -1)  # views with the row stride of the concatenation
    x, B, C = x.unflatten(-1, (4, 12)), B.unflatten(-1, (2, 10)), C.unflatten(-1, (2, 10))
    assert not x.is_contiguous()
    got = ssd_chunked_scan(x, t["dt"], t["A"], B, C, None, t["dt_bias"], True, chunk_size=16)
    want = ssd_scan(*(v.double() for v in (x, t["dt"], t["A"], B, C)), None,
                    dt_bias=t["dt_bias"].double(), dt_softplus=True,
                    compute_dtype=torch.float64)  # fmt: skip
    assert_close(got.y.double(), want.y, atol=2e-5, rtol=2e-5)
    assert_close(got.state.double(), want.state, atol=2e-5, rtol=2e-5)


def test_per_head_parameters_as_strided_views_equal_their_contiguous_copies():
    t = dict(inputs(T=40), dt_softplus=True, chunk_size=16)
    want = ssd_chunked_scan(**t)
    # every other element of a longer tensor: A[h], D[h] and dt_bias[h] at stride 2
    spread = lambda v: torch.stack([v, torch.full_like(v, 7.0)], -1).flatten()[::2]  # noqa: E731
    strided = dict(t, **{k: spread(t[k]) for k in ("A", "D", "dt_bias")})
    assert not strided["A"].is_contiguous()
    got = ssd_chunked_scan(**strided)
    assert torch.equal(got.y, want.y) and torch.equal(got.state, want.state)


def test_bf16_inputs_stay_within_bf16_rounding_of_the_float64_recurrence():
    t = inputs(T=100, dtype=torch.bfloat16)
    got = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=64)
    want = oracle(t, True, NO_LIMIT)
    scale = want.y.abs().max()
    assert float((got.y.double() - want.y).abs().max() / scale) < 1e-2  # bf16 output rounding
    assert_close(got.state.double(), want.state, atol=1e-4, rtol=1e-4, name="state")


def _launches(monkeypatch, force=None):
    """Record each launch's ``EXACT_BC`` (a list), forcing it to ``force`` where given."""
    from replaylab.kernels import ssd_chunked

    kernel, seen = ssd_chunked._ssd_chunked_kernel, []

    class Launcher:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw["EXACT_BC"])
                return kernel[grid](*args, **dict(kw, EXACT_BC=kw["EXACT_BC"] if force is None
                                                  else force))  # fmt: skip

            return launch

    monkeypatch.setattr(ssd_chunked, "_ssd_chunked_kernel", Launcher())
    return seen


@pytest.mark.parametrize(
    "shape, dtype",
    [((4, 64, 2, 32), torch.bfloat16), ((2, 64, 1, 128), torch.bfloat16),
     ((4, 64, 2, 32), torch.float16)],
    ids=["small-bf16", "layer-head-bf16", "small-fp16"],
)  # fmt: skip
def test_16_bit_b_and_c_skip_the_products_of_their_zero_small_parts_with_the_same_bits(
    shape, dtype, monkeypatch
):
    """Under tf32x3, B and C in bf16 or fp16 take one TF32 product for C B^T and two for the
    others (their small parts are 0), where the kernel forced to take all three
    (``EXACT_BC=False``) gives the same sums: on a GPU bit for bit; under the interpreter, which
    sums in fp32 whatever the precision, to fp32 rounding."""
    H, P, G, N = shape
    t = inputs(batch=2, T=100, H=H, P=P, G=G, N=N, dtype=dtype)
    got = ssd_chunked_scan(**t, dt_softplus=True)
    seen = _launches(monkeypatch, force=False)
    want = ssd_chunked_scan(**t, dt_softplus=True)
    assert seen == [True]  # the default took the two-product path
    if DEVICE == "cuda":
        assert torch.equal(got.y, want.y) and torch.equal(got.state, want.state)
    else:
        assert_close(got.state, want.state, atol=1e-6, rtol=1e-6, name="state")
        assert_close(got.y.float(), want.y.float(), atol=1e-2, rtol=1e-2, name="y")


@pytest.mark.parametrize(
    "B_dtype, C_dtype, precision, exact",
    [(torch.bfloat16, torch.bfloat16, "tf32x3", True), (torch.float16, torch.float16, "tf32x3", True),
     (torch.bfloat16, torch.float32, "tf32x3", False), (torch.float32, torch.float32, "tf32x3", False),
     (torch.bfloat16, torch.bfloat16, "ieee", False), (torch.bfloat16, torch.bfloat16, "tf32", False)],
)  # fmt: skip
def test_the_two_product_path_is_taken_only_for_16_bit_floats_under_tf32x3(
    B_dtype, C_dtype, precision, exact, monkeypatch
):
    t = inputs(T=20)
    t["B"], t["C"] = t["B"].to(B_dtype), t["C"].to(C_dtype)
    seen = _launches(monkeypatch)
    ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16, precision=precision)
    assert seen == [exact]


def test_integer_b_or_c_is_refused_by_name():
    t = inputs(T=20)
    with pytest.raises(
        ValueError, match=r"C: expected a floating-point tensor, got dtype torch.int16"
    ):
        ssd_chunked_scan(**dict(t, C=t["C"].to(torch.int16)), dt_softplus=True)


# numpy warns of inf - inf and NaN casts: what these tests are about
INF_MINUS_INF = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@INF_MINUS_INF
def test_an_inf_in_the_state_gives_the_three_products_infs_not_nans(monkeypatch):
    """tf32x3 zeroes a NaN in its first sums (an inf's small part is NaN): the two-product path
    does too, so an inf entering the chunk gives the same non-finite outputs in the same places
    (on a GPU the same bits)."""
    t = inputs(batch=1, T=40, H=4, P=64, G=2, N=32, dtype=torch.bfloat16)
    t["initial_state"][0, 1, 3, 5] = float("inf")
    got = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16)
    _launches(monkeypatch, force=False)
    want = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16)
    for a, b in ((got.y.float(), want.y.float()), (got.state, want.state)):
        assert not b.isfinite().all()  # the inf reached the outputs
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
        assert torch.equal(a[a.isinf()], b[b.isinf()])
        if DEVICE == "cuda":
            assert torch.equal(a[a.isfinite()], b[b.isfinite()])


def _tf32_oracle(v):
    """Round float32 values to TF32 in float64 arithmetic: to nearest, ties away from zero, at
    a quantum of 2^(e - 11) for |v| in [2^(e-1), 2^e) and 2^-136 below fp32's normal range (the
    mantissa field's 13 low bits); NaN stays NaN and overflow goes to inf."""
    import numpy as np

    d = v.astype(np.float64)
    _, e = np.frexp(d)
    quantum = np.maximum(np.ldexp(1.0, e - 11), np.ldexp(1.0, -136))
    rounded = np.copysign(np.floor(np.abs(d) / quantum + 0.5) * quantum, d)
    with np.errstate(over="ignore"):
        out = rounded.astype(np.float32)
    return np.where(np.isfinite(d), out, d.astype(np.float32))


@triton.jit
def _split_kernel(v, big, small, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b, s = _tf32_split(tl.load(v + i, mask=i < n))
    tl.store(big + i, b, mask=i < n)
    tl.store(small + i, s, mask=i < n)


@INF_MINUS_INF
def test_the_tf32_split_rounds_to_nearest_ties_away_like_an_independent_oracle():
    import numpy as np

    gen = np.random.default_rng(0)
    bits = gen.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    ties = (gen.integers(0, 2**19, 256, dtype=np.uint64).astype(np.uint32) << 13) | 0x1000
    values = np.concatenate([
        bits.view(np.float32), (ties | np.uint32(0x80000000)).view(np.float32),
        ties.view(np.float32), np.uint32([0x7FFFFFFF, 0xFFFFFFFF, 0x7F7FF000]).view(np.float32),
        np.float32([0.0, -0.0, 1.0, -1.5, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45,
                    1.1754942e-38, np.inf, -np.inf, np.nan]),
    ]).astype(np.float32)  # fmt: skip
    v = torch.from_numpy(values).to(DEVICE)
    big, small = torch.empty_like(v), torch.empty_like(v)
    _split_kernel[(triton.cdiv(v.numel(), 256),)](v, big, small, v.numel(), BLOCK=256)
    want = _tf32_oracle(values)
    got = big.cpu().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)  # compared as bits: a wrong sign of zero fails
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    ok = np.isfinite(got)  # small = v - big exactly where both are finite
    assert np.array_equal((big + small).cpu().numpy()[ok], values[ok])


def test_a_prompt_split_on_the_chunk_grid_equals_one_pass_bit_for_bit():
    t = inputs(T=96)
    whole = ssd_chunked_scan(**t, dt_softplus=True, chunk_size=16)
    seq = lambda a, b: {k: (v[:, a:b] if v.dim() >= 3 and k != "initial_state" else v)  # noqa: E731
                        for k, v in t.items()}  # fmt: skip
    first = ssd_chunked_scan(**seq(0, 48), dt_softplus=True, chunk_size=16)
    rest = dict(seq(48, 96), initial_state=first.state)
    second = ssd_chunked_scan(**rest, dt_softplus=True, chunk_size=16)
    assert torch.equal(torch.cat([first.y, second.y], 1), whole.y)
    assert torch.equal(second.state, whole.state)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(x=torch.zeros(2, 5, 4)), r"x: expected \(batch, T, H, P\), got shape \(2, 5, 4\)"),
        (dict(B=torch.zeros(2, 100, 3, 10)), r"B: its 3 groups must divide the 4 heads"),
        (dict(C=torch.zeros(2, 100, 2, 9)), r"C: expected shape \(2, 100, 2, 10\), got"),
        (dict(dt=torch.zeros(2, 99, 4)), r"dt: expected shape \(2, 100, 4\), got \(2, 99, 4\)"),
        (dict(D=torch.zeros(5)), r"D: expected shape \(4\), got \(5,\)"),
        (dict(initial_state=torch.zeros(2, 4, 12, 11)), r"initial_state: expected shape"),
        (dict(chunk_size=48), r"chunk_size: expected a power of two >= 16, got 48"),
        (dict(chunk_size=8), r"chunk_size: expected a power of two >= 16, got 8"),
        (dict(block_p=24), r"block_p: expected a power of two >= 32, got 24"),
        (dict(block_p=16), r"block_p: expected a power of two >= 32, got 16"),
        (dict(block_n=8), r"block_n: expected a power of two >= 32, got 8"),
        (dict(precision="fp8"), r"precision: expected 'ieee', 'tf32' or 'tf32x3', got 'fp8'"),
    ],
)
def test_bad_input_is_refused_naming_the_value(change, match):
    t = dict(inputs(), dt_softplus=True)
    t.update({k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in change.items()})
    with pytest.raises(ValueError, match=match):
        ssd_chunked_scan(**t)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_the_engine_prefills_with_its_kernels_under_every_strategy(fused):
    """prefill_kernels=True: each strategy's prefill scans through the kernel (on the fused
    path the chunk also runs the fused decode's norm and MLP kernels); the pools' buffers, the
    logits, the next steps' and a prefix hit's equal the default prefill's to fp32 rounding
    (``prefill_kernel_checks``)."""
    from prefill_kernel_checks import check_prefill_kernels

    from replaylab.testing import tiny_hybrid

    model = tiny_hybrid().to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.cfg.vocab_size, (100,), generator=gen).to(DEVICE)
    check_prefill_kernels(model, prompt, 80, 32, family="mamba2", fused=fused)


def test_the_committed_launch_counts_and_their_table_in_the_data_readme():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = json.loads((root / "data" / "prefill_launch_count_cpu.json").read_text())
    assert {"device", "versions", "date", "command", "commit"} <= set(result)
    count = {(r["layout"], r["strategy"], r["arm"]): r["launches"] for r in result["rows"]}
    text = (root / "data" / "README.md").read_text()
    for layout in ("8b-layers", "qwen3.5-9b-layers", "jamba-1.5-mini-layers"):
        for strategy in ("snapshot", "replay"):  # each kernel path launches fewer operations
            arms = [count[(layout, strategy, a)] for a in ("default", "triton scan")]
            fused = count.get((layout, strategy, "fused kernels"))
            assert arms[1] < arms[0] and (fused is None or fused < arms[1])
            cells = [f"{n:,}" for n in arms] + ["-" if fused is None else f"{fused:,}"]
            assert f"| {layout} | {strategy} | " + " | ".join(cells) + " |" in text


def test_the_default_scans_prompts_with_kernels_on_a_gpu_for_mamba2_only():
    """prefill_kernels=None: on a GPU the Mamba-2 pools scan prompts with the kernel (timed
    faster in the engine, data/README.md), the other families' stay opt-in; on CPU none does."""
    from replaylab.gated_deltanet import GDNConfig
    from replaylab.mamba1 import Mamba1Config
    from replaylab.model import HybridConfig, HybridLM
    from replaylab.serving import DecodeEngine

    cfg = HybridConfig(
        pattern="MSG*-", ssm_heads=2, ssm_head_dim=8, d_state=8, n_groups=1,
        mamba1=Mamba1Config(d_inner=16, d_state=4, dt_rank=4),
        gdn=GDNConfig(k_heads=1, v_heads=2, k_head_dim=8, v_head_dim=6), vocab_size=50,
        hidden_size=32, attn_heads=2, kv_heads=1, head_dim=16, intermediate_size=64,
    )  # fmt: skip
    model = HybridLM(cfg, seed=0).eval().to(DEVICE)
    on_gpu = DEVICE == "cuda"
    engine = DecodeEngine(model, 1, 32, "replay", graphs=False)
    assert engine.prefill_kernels == on_gpu
    kinds = {p.spec.family: p.prompt_kernel for p in engine.ssm.values()}
    assert kinds == {"mamba2": on_gpu, "mamba1": False, "gated_deltanet": False}
    every = DecodeEngine(model, 1, 32, "replay", graphs=False, use_kernels=True,
                         prefill_kernels=True)  # fmt: skip
    assert all(p.prompt_kernel for p in every.ssm.values())


def test_the_committed_gpu_probe_and_its_table_in_the_data_readme():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = json.loads((root / "data" / "prefill_kernel_probe.json").read_text())
    assert {"device", "versions", "date", "command", "commit"} <= set(result)
    ms = {(r["kind"], r["strategy"], r["arm"]): 1e3 * r["seconds"] for r in result["rows"]}
    text = (root / "data" / "README.md").read_text()
    labels = {"cold": "cold, 2,048 tokens", "hit": "hit, 2,000 shared + 48"}
    for kind, label in labels.items():
        for strategy in ("snapshot", "replay"):
            base = ms[(kind, strategy, "default")]
            cells = [f"{base:.1f} ms"] + [
                f"{ms[(kind, strategy, arm)]:.1f} ms ({base / ms[(kind, strategy, arm)]:.2f}x)"
                for arm in ("triton scan", "fused kernels")
            ]
            assert f"| {label} | {strategy} | " + " | ".join(cells) + " |" in text


def test_a_layer_shape_in_fp32_equals_the_float64_recurrence():
    """Nemotron-H's head (P = 64, N = 128) with fp32 inputs: on Hopper a 64-token chunk does not
    fit in shared memory, so the scan runs 32-token chunks (on CPU it runs them as asked)."""
    t = inputs(batch=1, T=40, H=2, P=64, G=1, N=128)
    got = ssd_chunked_scan(**t, dt_softplus=True, dt_limit=(0.001, 5.0))
    want = oracle(t, True, (0.001, 5.0))
    assert_close(got.y.double(), want.y, atol=2e-5, rtol=2e-5, name="y")
    assert_close(got.state.double(), want.state, atol=2e-5, rtol=2e-5, name="state")


def test_a_chunk_that_does_not_fit_runs_at_half_the_size(monkeypatch):
    """Where the compiler refuses a chunk for its shared memory, the scan retries with Q / 2:
    the same outputs as asking for Q / 2, bit for bit, and later calls start from the chunk
    that fit; at Q = 16 the error reaches the caller."""
    from triton.runtime.errors import OutOfResources

    from replaylab.kernels import ssd_chunked

    kernel, tried = ssd_chunked._ssd_chunked_kernel, []

    class RefusingAbove:
        def __init__(self, largest):
            self.largest = largest

        def __getitem__(self, grid):
            def launch(*args, **kw):
                tried.append(kw["Q"])
                if kw["Q"] > self.largest:
                    raise OutOfResources(263168, 232448, "shared memory")
                return kernel[grid](*args, **kw)

            return launch

    t = dict(inputs(T=37), dt_softplus=True)
    want = ssd_chunked_scan(**t, chunk_size=16)
    monkeypatch.setattr(ssd_chunked, "_ssd_chunked_kernel", RefusingAbove(16))
    monkeypatch.setattr(ssd_chunked, "_CHUNK_THAT_FITS", {})
    got = ssd_chunked_scan(**t, chunk_size=64)
    assert tried == [64, 32, 16]
    assert torch.equal(got.y, want.y) and torch.equal(got.state, want.state)
    again = ssd_chunked_scan(**t, chunk_size=64)  # the chunk that fit is remembered
    assert tried == [64, 32, 16, 16] and torch.equal(again.y, want.y)
    monkeypatch.setattr(ssd_chunked, "_ssd_chunked_kernel", RefusingAbove(8))
    with pytest.raises(OutOfResources):
        ssd_chunked_scan(**t, chunk_size=32)


def test_the_committed_launch_sweeps_and_their_table_in_the_data_readme():
    """Each cell of data/README.md's sweep table against the two sweeps' JSON: 5cb051d's
    default launch (Q 64, 8 warps, blocks of 64), this kernel at that launch and at the new
    default (4 warps, blocks of 32), their ratio and mamba-ssm's time; and every launch that
    ran the same chunk on both trees gave the same bits."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runs = [json.loads((root / "data" / f"ssd_chunked_speed_h100_{c}.json").read_text())
            for c in ("dd8a94b", "9313930")]  # fmt: skip
    text = (root / "data" / "README.md").read_text()

    def ms(run, T, arm, warps=None, block_p=None):
        (row,) = [r for r in run["rows"] if r["T"] == T and r["arm"] == arm
                  and (warps is None or (r["Q"], r["warps"], r["block_p"]) == (64, warps, block_p))]  # fmt: skip
        return row["ms"]

    for T, label in ((256, "256 (one prefill chunk)"), (2048, "2,048")):
        cells = [" / ".join(f"{ms(r, T, *arm):.4f}" for r in runs) + " ms"
                 for arm in (("previous", 8, 64), ("this", 8, 64), ("this", 4, 32))]  # fmt: skip
        ratios = [ms(r, T, "previous", 8, 64) / ms(r, T, "this", 4, 32) for r in runs]
        cells.append(" / ".join(f"{x:.2f}x" for x in ratios))
        cells.append(
            " / ".join(f"{ms(r, T, 'mamba_chunk_scan_combined'):.3f}" for r in runs) + " ms"
        )
        assert f"| {label} | " + " | ".join(cells) + " |" in text
    for run in runs:
        assert {"device", "versions", "date", "command", "commit"} <= set(run)
        for r in run["rows"]:
            if r["arm"] == "previous" and r["Q"] == r["Q_run"]:
                twin = [t for t in run["rows"] if t["arm"] == "this" and
                        all(t[k] == r[k] for k in ("T", "Q", "warps", "block_p"))]  # fmt: skip
                if twin[0]["Q_run"] == r["Q_run"]:
                    assert r["this_equals_previous"], r
