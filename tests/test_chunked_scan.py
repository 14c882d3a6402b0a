"""The SSD chunked (matrix) scan equals the per-token scan and mamba-ssm's
``ssd_minimal_discrete``; gradients flow through it; the Mamba-2 layer uses it for long inputs
only, so decode steps keep the token loop's bitwise agreement."""

import math

import pytest
import torch
from einops import repeat

from replaylab import assert_close
from replaylab.cache import HybridCache
from replaylab.mamba2 import Mamba2Spec
from replaylab.model import HybridConfig, HybridLM
from replaylab.scan import process_dt, segsum, ssd_chunked_scan, ssd_scan
from replaylab.testing import mamba_ssm_references


def inputs(batch, T, H, P, N, G, dtype=torch.float64):
    return dict(
        x=torch.randn(batch, T, H, P, dtype=dtype),
        dt=torch.randn(batch, T, H, dtype=dtype) - 1.0,
        A=-torch.exp(torch.rand(H, dtype=dtype) * math.log(16)),
        B=torch.randn(batch, T, G, N, dtype=dtype),
        C=torch.randn(batch, T, G, N, dtype=dtype),
        D=torch.randn(H, dtype=dtype),
        z=torch.randn(batch, T, H, P, dtype=dtype),
        dt_bias=torch.rand(H, dtype=dtype) - 0.5,
        dt_softplus=True,
        dt_limit=(0.001, 5.0),
    )


SIZES = [
    dict(batch=3, T=63, H=6, P=5, N=7, G=3),  # T not a multiple of the chunk
    dict(batch=1, T=64, H=4, P=8, N=16, G=1),
    dict(batch=2, T=5, H=2, P=3, N=4, G=2),  # shorter than one chunk
]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [1, 16, 64])
def test_chunked_equals_the_token_loop_in_float64(size, chunk):
    inp = inputs(**size)
    init = torch.randn(size["batch"], size["H"], size["P"], size["N"], dtype=torch.float64)
    ref = ssd_scan(**inp, initial_state=init, compute_dtype=torch.float64)
    got = ssd_chunked_scan(**inp, initial_state=init, chunk_size=chunk, compute_dtype=torch.float64)
    assert_close(got.y, ref.y, atol=1e-10, rtol=1e-10, name="y")
    assert_close(got.state, ref.state, atol=1e-10, rtol=1e-10, name="state")


def test_chunked_float32_and_zero_start_and_empty_input():
    inp = {
        k: v.float() if torch.is_tensor(v) else v for k, v in inputs(2, 100, 4, 8, 16, 2).items()
    }
    ref = ssd_scan(**inp)
    got = ssd_chunked_scan(**inp, chunk_size=32)
    assert_close(got.y, ref.y, atol=1e-4, rtol=1e-4, name="y")
    assert_close(got.state, ref.state, atol=1e-4, rtol=1e-4, name="state")
    empty = {k: v[:, :0] if torch.is_tensor(v) and v.dim() > 1 else v for k, v in inp.items()}
    res = ssd_chunked_scan(**empty)
    assert res.y.shape == (2, 0, 4, 8) and not res.state.any()
    with pytest.raises(ValueError, match="chunk_size: expected >= 1, got 0"):
        ssd_chunked_scan(**inp, chunk_size=0)


def test_segsum_is_the_causal_sum_of_log_decays():
    l = torch.randn(7, dtype=torch.float64)
    out = segsum(l)
    for t in range(7):
        for s in range(7):
            want = l[s + 1 : t + 1].sum() if s <= t else -math.inf
            assert out[t, s] == pytest.approx(float(want), abs=1e-12)


def test_gradients_equal_the_token_loops():
    inp = inputs(2, 40, 4, 3, 5, 2)
    leaves = ("x", "dt", "B", "C", "A", "D", "dt_bias")
    grads = []
    for scan in (ssd_scan, lambda **kw: ssd_chunked_scan(**kw, chunk_size=16)):
        args = {k: (v.clone().requires_grad_() if k in leaves else v) for k, v in inp.items()}
        res = scan(**args, compute_dtype=torch.float64)
        (res.y.square().sum() + res.state.sum()).backward()
        grads.append([args[k].grad for k in leaves])
    for name, a, b in zip(leaves, *grads):
        assert_close(a, b, atol=1e-9, rtol=1e-9, name=f"d/d{name}")


@pytest.mark.mamba_ssm
def test_chunked_against_mamba_ssm_ssd_minimal_discrete():
    ref = mamba_ssm_references().ssd_minimal_discrete
    size = dict(batch=2, T=48, H=6, P=4, N=8, G=3)
    inp = inputs(**size)
    inp.update(D=None, z=None)
    init = torch.randn(2, 6, 4, 8, dtype=torch.float64)
    got = ssd_chunked_scan(**inp, initial_state=init, chunk_size=16, compute_dtype=torch.float64)
    delta = process_dt(inp["dt"], inp["dt_bias"], True, inp["dt_limit"], torch.float64)
    Bh = repeat(inp["B"], "b t g n -> b t (g r) n", r=2)
    Ch = repeat(inp["C"], "b t g n -> b t (g r) n", r=2)
    ref_y, ref_state = ref(
        inp["x"] * delta[..., None], inp["A"] * delta, Bh, Ch, 16, initial_states=init[:, None]
    )
    assert_close(got.y, ref_y, atol=1e-9, rtol=1e-9, name="y")
    assert_close(got.state, ref_state, atol=1e-9, rtol=1e-9, name="state")


def test_the_layer_uses_the_chunked_form_for_long_inputs_only(monkeypatch):
    model = HybridLM(HybridConfig(pattern="M*M-", ssm_heads=4, n_groups=2), seed=3).eval()
    calls = []
    import replaylab.mamba2 as m2

    real = m2.ssd_chunked_scan
    monkeypatch.setattr(m2, "ssd_chunked_scan", lambda *a, **k: calls.append(1) or real(*a, **k))
    short = Mamba2Spec.CHUNKED_MIN_TOKENS - 1
    ids = torch.randint(0, 128, (2, short + 40))
    with torch.no_grad():
        model(ids[:, :short], HybridCache(model, 2))
        assert not calls  # below the threshold: the token loop
        one = model(ids, HybridCache(model, 2, "snapshot"))
        assert calls  # a long prefill: chunked
        n_chunked = len(calls)
        cache = HybridCache(model, 2, "replay", log_length=8)
        steps = [model(ids[:, :short], cache)]
        steps += [model(ids[:, t : t + 1], cache) for t in range(short, ids.shape[1])]
        assert len(calls) == n_chunked  # decode steps never use it
        no_cache = model(ids, None)
    assert_close(torch.cat(steps, 1), one, atol=1e-4, name="decode vs chunked prefill")
    assert torch.equal(no_cache, one)  # the training path is the same computation
