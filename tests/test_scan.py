"""Reference selective scans against themselves (step vs scan, split vs one pass), a float64
recurrence, mamba-ssm's references and transformers' own Mamba-2 mixer functions."""

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange, repeat

from replaylab import assert_close
from replaylab.scan import process_dt, s6_scan, s6_step, ssd_scan, ssd_step
from replaylab.testing import mamba_ssm_references

# awkward sizes: T not a power of two, batch 3, H not a power of two
SSD_SIZES = [
    dict(batch=3, T=63, H=6, P=5, N=7, G=3),
    dict(batch=1, T=17, H=4, P=8, N=16, G=1),
    dict(batch=2, T=1, H=3, P=4, N=4, G=3),
]
DTYPES = [torch.float32, torch.bfloat16]


def ssd_inputs(batch, T, H, P, N, G, dtype=torch.float32, z=True):
    """Fresh random Mamba-2 inputs with the value ranges of a trained layer."""
    return dict(
        x=torch.randn(batch, T, H, P).to(dtype),
        dt=torch.randn(batch, T, H) - 1.0,
        A=-torch.exp(torch.rand(H) * math.log(16)),
        B=torch.randn(batch, T, G, N).to(dtype),
        C=torch.randn(batch, T, G, N).to(dtype),
        D=torch.randn(H),
        z=torch.randn(batch, T, H, P).to(dtype) if z else None,
        dt_bias=torch.rand(H) - 0.5,
        dt_softplus=True,
        dt_limit=(0.001, 5.0),
    )


def s6_inputs(batch, T, D, N, dtype=torch.float32):
    return dict(
        u=torch.randn(batch, T, D).to(dtype),
        dt=torch.randn(batch, T, D) - 1.0,
        A=-torch.exp(torch.randn(D, N) * 0.5),
        B=torch.randn(batch, T, N).to(dtype),
        C=torch.randn(batch, T, N).to(dtype),
        Dskip=torch.randn(D),
        z=torch.randn(batch, T, D).to(dtype),
        dt_bias=torch.rand(D) - 0.5,
        dt_softplus=True,
    )


def ssd_float64_loop(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_state=None):
    """An independent float64 recurrence written element-wise over heads (the oracle)."""
    x, B, C, z = x.double(), B.double(), C.double(), z.double()
    delta = dt.double() + dt_bias.double()
    delta = torch.nn.functional.softplus(delta).clamp(*dt_limit)
    batch, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    h = (
        torch.zeros(batch, H, P, N, dtype=torch.float64)
        if initial_state is None
        else initial_state.double().clone()
    )
    y = torch.zeros(batch, T, H, P, dtype=torch.float64)
    for t in range(T):
        for head in range(H):
            g = head // (H // G)
            a = torch.exp(delta[:, t, head] * A[head].double())
            h[:, head] = (
                a[:, None, None] * h[:, head]
                + delta[:, t, head, None, None] * x[:, t, head, :, None] * B[:, t, g, None, :]
            )
            out = (h[:, head] * C[:, t, g, None, :]).sum(-1) + D[head].double() * x[:, t, head]
            y[:, t, head] = out * z[:, t, head] * torch.sigmoid(z[:, t, head])
    return y, h


@pytest.mark.parametrize("size", SSD_SIZES)
def test_ssd_step_by_step_equals_scan_bitwise(size):
    inp = ssd_inputs(**size)
    res = ssd_scan(**inp, return_states=True)
    state = torch.zeros(size["batch"], size["H"], size["P"], size["N"])
    for t in range(size["T"]):
        step = {k: (v[:, t] if k in "x dt B C z".split() else v) for k, v in inp.items()}
        y, state = ssd_step(state, **step)
        assert torch.equal(y, res.y[:, t])
        assert torch.equal(state, res.states[:, t])
    assert torch.equal(state, res.state)


@pytest.mark.parametrize("size", SSD_SIZES[:2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ssd_split_at_any_point_equals_one_pass(size, dtype):
    inp = ssd_inputs(**size, dtype=dtype)
    whole = ssd_scan(**inp)
    for split in sorted({0, 1, size["T"] // 3, size["T"] - 1, size["T"]}):
        seq = "x dt B C z".split()
        first = ssd_scan(**{k: (v[:, :split] if k in seq else v) for k, v in inp.items()})
        second = ssd_scan(
            **{k: (v[:, split:] if k in seq else v) for k, v in inp.items()},
            initial_state=first.state,
        )
        assert torch.equal(torch.cat([first.y, second.y], 1), whole.y)
        assert torch.equal(second.state, whole.state)


@pytest.mark.parametrize("size", SSD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ssd_against_float64_recurrence(size, dtype):
    inp = ssd_inputs(**size, dtype=dtype)
    init = torch.randn(size["batch"], size["H"], size["P"], size["N"])
    res = ssd_scan(**inp, initial_state=init)
    ref_y, ref_state = ssd_float64_loop(**inp, initial_state=init)
    # bf16 inputs: the oracle sees the same rounded inputs, so only fp32 accumulation differs
    assert_close(res.state, ref_state, dtype=torch.float32, name="state")
    assert_close(res.y, ref_y.to(dtype), dtype=dtype, name="y")
    res64 = ssd_scan(**inp, initial_state=init, compute_dtype=torch.float64)
    assert_close(res64.state, ref_state, dtype=torch.float64, name="state (float64 path)")


@pytest.mark.mamba_ssm
@pytest.mark.parametrize("size", SSD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ssd_step_against_mamba_ssm_selective_state_update_ref(size, dtype):
    ref = mamba_ssm_references().selective_state_update_ref
    inp = ssd_inputs(**size, dtype=dtype, z=True)
    inp["dt_limit"] = (0.0, math.inf)  # selective_state_update has no limits
    H, P, N = size["H"], size["P"], size["N"]
    state = torch.randn(size["batch"], H, P, N)
    ref_state = state.clone()
    for t in range(size["T"]):
        step = {k: (v[:, t] if k in "x dt B C z".split() else v) for k, v in inp.items()}
        y, state = ssd_step(state, **step)
        # mamba-ssm ties the per-head scalars across P (and N) by broadcasting
        ref_y = ref(
            ref_state,
            step["x"],
            repeat(step["dt"], "b h -> b h p", p=P),
            repeat(step["A"], "h -> h p n", p=P, n=N),
            step["B"],
            step["C"],
            D=repeat(step["D"], "h -> h p", p=P),
            z=step["z"],
            dt_bias=repeat(step["dt_bias"], "h -> h p", p=P),
            dt_softplus=True,
        )
        assert_close(y, ref_y, dtype=dtype, name=f"y[t={t}]")
    assert_close(state, ref_state, dtype=torch.float32, name="state")


@pytest.mark.mamba_ssm
@pytest.mark.parametrize(
    "size", [dict(batch=3, T=64, H=6, P=5, N=7, G=3), dict(batch=2, T=32, H=4, P=8, N=16, G=1)]
)
def test_ssd_scan_against_mamba_ssm_ssd_minimal_discrete(size):
    ref = mamba_ssm_references().ssd_minimal_discrete
    inp = ssd_inputs(**size, dtype=torch.float64, z=False)
    inp.update(D=None, z=None)
    init = torch.randn(size["batch"], size["H"], size["P"], size["N"])
    res = ssd_scan(**inp, initial_state=init, compute_dtype=torch.float64)
    delta = process_dt(inp["dt"], inp["dt_bias"], True, inp["dt_limit"], torch.float64)
    heads_per_group = size["H"] // size["G"]
    Bh = repeat(inp["B"].double(), "b t g n -> b t (g r) n", r=heads_per_group)
    Ch = repeat(inp["C"].double(), "b t g n -> b t (g r) n", r=heads_per_group)
    ref_y, ref_state = ssd_minimal_discrete(
        inp["x"].double() * delta[..., None],
        inp["A"].double() * delta,
        Bh,
        Ch,
        16,
        initial_states=init.double()[:, None],
        ref=ref,
    )
    assert_close(res.y, ref_y, dtype=torch.float64, atol=1e-9, rtol=1e-9, name="y")
    assert_close(res.state, ref_state, dtype=torch.float64, atol=1e-9, rtol=1e-9, name="state")


def ssd_minimal_discrete(X, A, B, C, block_len, initial_states, ref):
    return ref(X, A, B, C, block_len, initial_states=initial_states)


# transformers' NemotronH Mamba-2 layer as the oracle, through its public model class: the
# layer's forward with a DynamicCache; the scan output is what it hands its gated norm. Works
# with transformers 5.17 (the GPU machine's), 5.24 (requirements.lock) and 5.25: the layer is
# called positionally (its cache argument is `cache_params` up to 5.17, `cache` later) and the
# state is read where every 5.x cache keeps it, `cache.layers[i].recurrent_states[0]`.
DT_FLOOR = 0.001  # time_step_min and time_step_limit[0]: <= 5.24 reads one, >= 5.25 the other


def transformers_mamba2_layer(H, P, N, G, chunk=16, hidden=12):
    """One NemotronH Mamba-2 layer (``NemotronHModel(...).layers[0].mixer``) with its SSM
    scalars in trained ranges; head 0's dt_bias puts its Δ under the floor, so the clamp counts."""
    from transformers import NemotronHConfig, NemotronHModel

    cfg = NemotronHConfig(
        vocab_size=8,
        hidden_size=hidden,
        num_hidden_layers=1,
        hybrid_override_pattern="M",
        mamba_num_heads=H,
        mamba_head_dim=P,
        ssm_state_size=N,
        n_groups=G,
        chunk_size=chunk,
        time_step_min=DT_FLOOR,
        time_step_limit=(DT_FLOOR, math.inf),
    )
    layer = NemotronHModel(cfg).eval().layers[0].mixer
    with torch.no_grad():
        layer.A_log.copy_(torch.rand(H) * math.log(16))
        layer.D.copy_(torch.randn(H))
        layer.dt_bias.copy_(torch.rand(H) - 0.5)
        layer.dt_bias[0] = -9.0  # softplus(-9 + dt) ~ 1e-4 < DT_FLOOR
    return layer, cfg


def layer_scan_inputs(layer, h, H, P, N, G):
    """x (batch,T,H,P), dt (batch,T,H), B, C (batch,T,G,N) as the layer computes them (input
    projection, causal depthwise conv, SiLU), written out here from its weights."""
    T, inner = h.shape[1], H * P
    _, xBC, dt = layer.in_proj(h).split([inner, inner + 2 * G * N, H], dim=-1)
    w = layer.conv1d.weight
    conv = F.conv1d(
        xBC.transpose(1, 2), w, layer.conv1d.bias, padding=w.shape[-1] - 1, groups=w.shape[0]
    )
    x, B, C = F.silu(conv[..., :T]).transpose(1, 2).split([inner, G * N, G * N], dim=-1)
    return x.unflatten(-1, (H, P)), dt, B.unflatten(-1, (G, N)), C.unflatten(-1, (G, N))


def run_layer(layer, h, cache):
    """The layer's forward over h with the cache: (scan output (batch, T, H*P), state)."""
    seen = []
    hook = layer.norm.register_forward_pre_hook(lambda _, args: seen.append(args[0].clone()))
    try:
        layer(h, cache)
    finally:
        hook.remove()
    return seen[0], cache.layers[0].recurrent_states[0]


def layer_with_state(size, chunk=16, prefix=3):
    """A transformers layer, fresh inputs, and a DynamicCache whose layer holds a random state
    after a ``prefix``-token pass (the conv window stays the prefix's)."""
    from transformers import DynamicCache

    H, P, N, G = (size[k] for k in "HPNG")
    layer, cfg = transformers_mamba2_layer(H, P, N, G, chunk)
    h = torch.randn(size["batch"], prefix + size["T"], cfg.hidden_size)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        _, state = run_layer(layer, h[:, :prefix], cache)
        init = torch.randn_like(state)
        state.copy_(init)
        x, dt, B, C = (t[:, prefix:] for t in layer_scan_inputs(layer, h, H, P, N, G))
    A = -torch.exp(layer.A_log.detach().float())
    scalars = dict(A=A, D=layer.D.detach(), dt_bias=layer.dt_bias.detach(), dt_softplus=True)
    return layer, h[:, prefix:], cache, init, (x, dt, B, C), scalars


@pytest.mark.parametrize("size", SSD_SIZES[:2])
@pytest.mark.parametrize("chunk", [8, 16])
def test_ssd_scan_against_transformers_nemotron_h_layer_chunked(size, chunk):
    layer, h, cache, init, (x, dt, B, C), scalars = layer_with_state(size, chunk)
    delta = process_dt(dt, scalars["dt_bias"], True)
    assert (delta < DT_FLOOR).any() and (delta > DT_FLOOR).any()  # the floor decides some Δ
    with torch.no_grad():
        ref_y, ref_state = run_layer(layer, h, cache)  # T > 1: transformers' chunked form
    res = ssd_scan(x, dt, B=B, C=C, **scalars, dt_limit=(DT_FLOOR, math.inf), initial_state=init)
    assert_close(res.y.flatten(-2), ref_y, name="y")
    assert_close(res.state, ref_state, name="state")


@pytest.mark.parametrize("size", SSD_SIZES[:2])
def test_ssd_step_against_transformers_nemotron_h_layer_decode(size):
    layer, h, cache, state, (x, dt, B, C), scalars = layer_with_state(size)
    for t in range(min(size["T"], 8)):
        with torch.no_grad():
            ref_y, ref_state = run_layer(layer, h[:, t : t + 1], cache)  # one token: decode
        # transformers' decode path applies no floor on Δ
        y, state = ssd_step(
            state,
            x[:, t],
            dt[:, t],
            scalars["A"],
            B[:, t],
            C[:, t],
            scalars["D"],
            dt_bias=scalars["dt_bias"],
            dt_softplus=True,
        )
        assert_close(y.flatten(-2), ref_y[:, 0], name=f"y[t={t}]")
    assert_close(state, ref_state, name="state")


S6_SIZES = [dict(batch=3, T=63, D=10, N=5), dict(batch=1, T=16, D=8, N=16)]


@pytest.mark.mamba_ssm
@pytest.mark.parametrize("size", S6_SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_s6_scan_against_mamba_ssm_selective_scan_ref(size, dtype):
    ref = mamba_ssm_references().selective_scan_ref
    inp = s6_inputs(**size, dtype=dtype)
    res = s6_scan(**inp)
    ref_y, ref_state = ref(
        rearrange(inp["u"], "b t d -> b d t"),
        rearrange(inp["dt"], "b t d -> b d t"),
        inp["A"],
        rearrange(inp["B"], "b t n -> b n t"),
        rearrange(inp["C"], "b t n -> b n t"),
        D=inp["Dskip"],
        z=rearrange(inp["z"], "b t d -> b d t"),
        delta_bias=inp["dt_bias"],
        delta_softplus=True,
        return_last_state=True,
    )
    assert_close(res.y, rearrange(ref_y, "b d t -> b t d"), dtype=dtype, name="y")
    assert_close(res.state, ref_state, dtype=torch.float32, name="state")


@pytest.mark.mamba_ssm
@pytest.mark.parametrize("size", S6_SIZES)
def test_s6_step_equals_scan_and_mamba_ssm_state_update(size):
    ref = mamba_ssm_references().selective_state_update_ref
    inp = s6_inputs(**size)
    res = s6_scan(**inp, return_states=True)
    state = torch.zeros(size["batch"], size["D"], size["N"])
    ref_state = state.clone()
    for t in range(size["T"]):
        step = {k: (v[:, t] if k in "u dt B C z".split() else v) for k, v in inp.items()}
        y, state = s6_step(state, **step)
        assert torch.equal(y, res.y[:, t]) and torch.equal(state, res.states[:, t])
        ref_y = ref(
            ref_state,
            step["u"],
            step["dt"],
            step["A"],
            step["B"],
            step["C"],
            D=step["Dskip"],
            z=step["z"],
            dt_bias=step["dt_bias"],
            dt_softplus=True,
        )
        assert_close(y, ref_y, name=f"y[t={t}]")
    assert_close(state, ref_state, name="state")


def test_s6_split_equals_one_pass():
    inp = s6_inputs(batch=3, T=21, D=6, N=4)
    whole = s6_scan(**inp)
    seq = "u dt B C z".split()
    first = s6_scan(**{k: (v[:, :8] if k in seq else v) for k, v in inp.items()})
    second = s6_scan(
        **{k: (v[:, 8:] if k in seq else v) for k, v in inp.items()}, initial_state=first.state
    )
    assert torch.equal(torch.cat([first.y, second.y], 1), whole.y)
    assert torch.equal(second.state, whole.state)
