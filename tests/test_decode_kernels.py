"""The fused decode kernels (``replaylab.kernels.decode``, through Triton's interpreter here)
against the teaching model's own modules, and the fused engine against the teaching cache.

The interpreter rounds fp32 -> bf16 toward zero where a GPU rounds to nearest even, so bf16
results are compared within a bf16 step here; ``test_bf16_rounding_on_gpu`` checks them
bitwise on a GPU. On a GPU machine every tensor here lives on the device (Triton's
interpreter is off there and cannot read CPU tensors)."""

import pytest
import torch

from replaylab.cache import CacheConfig
from replaylab.decoding import SyntheticDrafter, greedy
from replaylab.kernels.decode import (
    add_rmsnorm,
    attention,
    conv_step,
    gated_rmsnorm,
    relu2,
    rope_,
    state_update,
    swiglu,
)
from replaylab.mamba2 import GatedRMSNorm
from replaylab.model import HybridLM, RMSNorm, preset
from replaylab.recurrent import windows_per_token
from replaylab.scan import ssd_scan
from replaylab.serving import DecodeEngine
from replaylab.testing import DEVICE, kernel_sized

MODEL = HybridLM(preset("tiny"), seed=0).eval().to(DEVICE)
ENGINE_MODEL = kernel_sized(MODEL)  # the fused engine's (on CPU: two heads of state 16)
GEN = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(DEVICE, dtype)


def zeros(*shape):
    return torch.zeros(*shape, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rmsnorm_equals_the_residual_add_and_rmsnorm(dtype):
    norm = RMSNorm(48, 1e-5)
    norm.weight.data = randn(48)
    h, delta = randn(2, 3, 48, dtype=dtype), randn(2, 3, 48, dtype=dtype)
    res, y = add_rmsnorm(h, norm.weight, norm.eps, delta=delta)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(res, h + delta, **tol)
    torch.testing.assert_close(y, norm.to(dtype)(h + delta), **tol)
    same, y2 = add_rmsnorm(h, norm.weight, norm.eps)
    assert same.data_ptr() == h.data_ptr()
    torch.testing.assert_close(y2, norm.to(dtype)(h), **tol)


def test_gated_rmsnorm_equals_the_module_with_a_strided_gate():
    norm = GatedRMSNorm(32, 4, 1e-5)
    norm.weight.data = randn(32)
    y, wide = randn(5, 32), randn(5, 70)
    gate = wide[:, 3:35]  # a column slice, as the in_proj output gives it
    torch.testing.assert_close(gated_rmsnorm(y, gate, norm.weight, 4, 1e-5), norm(y, gate))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rmsnorm_norm_first_equals_gated_deltanets_norm_then_gate(dtype):
    """``norm_first=True``: per head RMSNorm(o) * weight * silu(z), one weight for every head,
    as ``GatedDeltaNetMixer.norm``; rows of (tokens, heads x V), a head width not a power of
    two (masked lanes). A wrong weight shape is refused by name."""
    from replaylab.gated_deltanet import _NormThenGate

    heads, V = 3, 6
    norm = _NormThenGate(V, 1e-6).to(DEVICE)
    norm.weight.data = randn(V) + 1.0
    norm = norm.to(dtype)
    o, z = randn(4, heads * V, dtype=dtype) * 3, randn(4, heads * V, dtype=dtype)
    got = gated_rmsnorm(o, z, norm.weight, heads, norm.eps, norm_first=True)
    want = norm(o.view(4, heads, V), z.view(4, heads, V)).view(4, heads * V)
    # bf16: three roundings on each side, the interpreter's toward zero (module docstring)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, want, **tol)
    if dtype == torch.bfloat16:  # an fp32 weight: weight * x in fp32, as torch promotes it
        norm32 = norm.float()
        got = gated_rmsnorm(o, z, norm32.weight, heads, norm.eps, norm_first=True)
        want = norm32(o.view(4, heads, V), z.view(4, heads, V)).view(4, heads * V)
        torch.testing.assert_close(got, want, **tol)
    with pytest.raises(ValueError, match=r"weight: expected \(6,\), got \(18,\)"):
        gated_rmsnorm(o, z, randn(heads * V, dtype=dtype), heads, 1e-6, norm_first=True)


def test_relu2():
    u = randn(3, 1000)
    assert torch.equal(relu2(u), torch.relu(u).square())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_equals_the_mlp_activation_to_one_rounding(dtype):
    gu = torch.randn(5, 2 * 1100, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    gate, up = gu[:, :1100], gu[:, 1100:]  # strided views: the kernel takes contiguous copies
    want = torch.nn.functional.silu(gate.double()) * up.double()
    got = swiglu(gate, up)
    assert got.dtype == dtype and got.shape == (5, 1100)
    ulp = 1e-6 if dtype == torch.float32 else 8e-3  # one rounding of the fp32 result
    assert float(((got.double() - want).abs() / want.abs().clamp_min(1e-3)).max()) < ulp
    with pytest.raises(
        ValueError, match=r"gate, up: expected two \(\.\.\., F\) tensors of one shape"
    ):
        swiglu(gate, up[:, :7])


@pytest.mark.parametrize("rotary_dim", [8, 16])
def test_rope_rotates_q_and_k_in_place_as_the_model_at_each_rows_position(rotary_dim):
    """Three sequences at their own positions, T = 2 rows each: q's and k's heads rotated as
    ``model.Attention.rotate`` in float64, v untouched."""
    from replaylab.model import Attention, HybridConfig

    cfg = HybridConfig(vocab_size=50, hidden_size=32, pattern="M*", attn_heads=4, kv_heads=2,
                       head_dim=16, rotary_dim=rotary_dim, rope_theta=500.0)  # fmt: skip
    att, (B, T, Hq, Hkv, Dh) = Attention(cfg, 1), (3, 2, 4, 2, 16)
    qkv = torch.randn(B * T, (Hq + 2 * Hkv) * Dh, generator=torch.Generator().manual_seed(3))
    pos = torch.tensor([5, 0, 1000])
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    got = rope_(qkv.clone().to(DEVICE), Hq + Hkv, Dh, inv_freq.to(DEVICE), pos.to(DEVICE), T)
    got = got.cpu().double()
    heads = lambda t, a, n: t[:, a * Dh : (a + n) * Dh].view(B, T, n, Dh).transpose(1, 2)  # noqa: E731
    positions = pos[:, None] + torch.arange(T)
    for a, n in ((0, Hq), (Hq, Hkv)):
        want = att.rotate(heads(qkv.double(), a, n), positions)
        assert float((heads(got, a, n) - want).abs().max()) < 2e-5  # fp32 angles at 1,000
    assert torch.equal(got[:, (Hq + Hkv) * Dh :], qkv[:, (Hq + Hkv) * Dh :].double())
    with pytest.raises(ValueError, match=r"position: expected int64 \(batch,\) with batch x T"):
        rope_(qkv.to(DEVICE), Hq + Hkv, Dh, inv_freq.to(DEVICE), pos.to(DEVICE), 3)
    with pytest.raises(ValueError, match=r"inv_freq: expected 1 \.\. 8 fp32 frequencies, got "):
        rope_(qkv.to(DEVICE), Hq, Dh, torch.ones(9, device=DEVICE), pos.to(DEVICE), T)
    with pytest.raises(ValueError, match=r"inv_freq: expected 1 \.\. 8 fp32 frequencies, got "):
        rope_(qkv.to(DEVICE), Hq, Dh, inv_freq.double().to(DEVICE), pos.to(DEVICE), T)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_step_equals_the_mixer_conv(T, bias):
    mixer = MODEL.model.layers[MODEL.cfg.ssm_layers[0]].mixer
    c = MODEL.cfg
    inner, C, K = c.ssm_heads * c.ssm_head_dim, c.conv_dim, c.d_conv - 1
    W = inner + C + c.ssm_heads
    batch = 2
    zx, window = randn(batch * T, W), randn(batch, K, C)
    weight = mixer.conv1d.weight.detach().view(C, -1)
    b = mixer.conv1d.bias.detach() if bias and mixer.conv1d.bias is not None else None
    if b is None and bias:
        b = randn(C)
    drafts = zeros(batch + 1, 4, K, C)
    xBC = zx.view(batch, T, W)[..., inner : inner + C]
    ref_conv = torch.nn.functional.silu(
        torch.nn.functional.conv1d(
            torch.cat([window, xBC], 1).transpose(1, 2), weight[:, None], b, groups=C
        )
    ).transpose(1, 2)
    ref_drafts = windows_per_token(window, xBC)
    ref_window = torch.cat([window, xBC], 1)[:, -K:]
    x, Bm, Cm, dt = conv_step(
        zx,
        window,
        weight,
        b,
        inner,
        inner + C,
        inner,
        c.n_groups * c.d_state,
        c.ssm_heads,
        T,
        drafts=drafts if T > 1 else None,
    )
    torch.testing.assert_close(torch.cat([x, Bm, Cm], -1), ref_conv, atol=1e-6, rtol=1e-5)
    assert torch.equal(dt, zx.view(batch, T, W)[..., inner + C :])
    assert torch.equal(window, ref_window)  # advanced in place
    if T > 1:
        assert torch.equal(drafts[:batch, :T], ref_drafts)
        assert not drafts[batch].any()  # other slots untouched


@pytest.mark.parametrize("T", [1, 4])
def test_state_update_equals_the_scan(T):
    batch, H, P, N, G = 2, 4, 8, 16, 2
    x, dt = randn(batch, T, H, P), randn(batch, T, H)
    Bm, Cm = randn(batch, T, G, N), randn(batch, T, G, N)
    A, D, bias = (-torch.rand(H, generator=GEN) - 0.5).to(DEVICE), randn(H), randn(H)
    state = randn(batch + 1, H, P, N)
    before = state.clone()
    drafts = zeros(batch + 1, 5, H, P, N)
    ref = ssd_scan(
        x,
        dt,
        A,
        Bm,
        Cm,
        D,
        dt_bias=bias,
        dt_softplus=True,
        dt_limit=(1e-3, 1e9),
        initial_state=state[:batch],
        return_states=True,
    )
    y = state_update(
        state, x, dt, Bm, Cm, A, D, bias, (1e-3, 1e9), drafts=drafts if T > 1 else None, block_p=4
    )
    torch.testing.assert_close(y, ref.y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state[:batch], ref.state, atol=1e-5, rtol=1e-5)
    assert torch.equal(state[batch], before[batch])
    if T > 1:
        torch.testing.assert_close(drafts[:batch, :T], ref.states, atol=1e-5, rtol=1e-5)


def test_decode_kernels_refuse_shapes_that_disagree_before_writing():
    """They index by offsets from x's shape: a state, norm weight or KV buffer that disagreed
    was read and written outside itself (no error on CPU, heap damage or garbage)."""
    batch, T, H, P, N, G = 2, 1, 2, 4, 4, 1
    x, dt = randn(batch, T, H, P), randn(batch, T, H)
    Bm, Cm = randn(batch, T, G, N), randn(batch, T, G, N)
    A, D, bias = -torch.rand(H, device=DEVICE), randn(H), randn(H)
    state = randn(batch, H, P, N)
    before = state.clone()
    for args, match in (
        (
            (zeros(batch, 1, 2, 2), x, dt, Bm, Cm, A, D, bias),
            r"H: the tensors disagree on this size: x 2, state 1",
        ),
        ((state, x, dt, Bm, randn(batch, T, G, 3), A, D, bias), r"N: .*state 4, B 4, C 3"),
        ((state, x, dt, Bm, Cm, A, randn(3), bias), r"H: .*, D 3,"),
        (  # three groups of B and C cannot share two heads
            (state, x, dt, randn(batch, T, 3, N), randn(batch, T, 3, N), A, D, bias),
            r"B, C: their G=3 groups do not divide H=2 heads",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            state_update(*args, (1e-3, 1e9))
    assert torch.equal(state, before)
    h = randn(3, 8)
    with pytest.raises(
        ValueError, match=r"weight: expected \(8,\), h's last dimension, got \(4,\)"
    ):
        add_rmsnorm(h, randn(4), 1e-5)
    with pytest.raises(ValueError, match=r"delta: expected h's shape \(3, 8\), got \(1, 8\)"):
        add_rmsnorm(h, randn(8), 1e-5, delta=randn(1, 8))
    q = randn(2, 1, 2, 8)
    kv = zeros(2, 1, 16, 4)
    with pytest.raises(ValueError, match=r"k, v: expected \(slots >= 2, Hkv, max_len, Dh=8\)"):
        attention(q, kv, kv.clone(), torch.tensor(0, device=DEVICE), 1.0)
    few = zeros(1, 1, 16, 8)
    with pytest.raises(ValueError, match=r"k, v: expected \(slots >= 2, Hkv, max_len, Dh=8\)"):
        attention(q, few, few.clone(), torch.tensor(0, device=DEVICE), 1.0)


_ON_GPU_ONLY = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CI time: about 35 s through the interpreter; on CPU its fused speculation runs in "
    "test_engine, its tokens against the teaching cache on a GPU",
)


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param("snapshot", marks=_ON_GPU_ONLY),
        pytest.param("recompute", marks=_ON_GPU_ONLY),
        "replay",
    ],
)
def test_fused_engine_gives_the_teaching_tokens(strategy):
    n = 12 if torch.cuda.is_available() else 8  # through the interpreter: 7 + 8 tokens, 2 folds
    prompts = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    ref = greedy(ENGINE_MODEL, prompts, n, CacheConfig(strategy, log_length=5)).tokens
    engine = DecodeEngine(ENGINE_MODEL, 3, 32, strategy, log_length=5, use_kernels=True, fused=True)
    assert torch.equal(engine.greedy(prompts, n).cpu(), ref.cpu())
    prompt = prompts[:1]
    full = torch.cat([prompt, greedy(ENGINE_MODEL, prompt, n, "snapshot").tokens], 1).cpu()
    tokens, proposed, accepted = engine.speculative(prompt, n, SyntheticDrafter(full, 0.6, 1))
    assert torch.equal(tokens.cpu(), full[:, 7:]) and 0 < accepted < proposed


def test_fused_needs_the_kernels():
    with pytest.raises(ValueError, match="use_kernels=True"):
        DecodeEngine(MODEL, 1, 8, use_kernels=False, fused=True)


@pytest.mark.gpu
def test_bf16_rounding_on_gpu():
    """On a GPU the residual add and relu^2 are bitwise torch's, the norms within rounding."""
    norm = RMSNorm(4096, 1e-5).cuda()
    norm.weight.data = randn(4096).cuda()
    h, delta = randn(64, 4096).cuda().bfloat16(), randn(64, 4096).cuda().bfloat16()
    res, y = add_rmsnorm(h, norm.weight, norm.eps, delta=delta)
    assert torch.equal(res, h + delta)
    ref = norm(h + delta)
    assert (y.float() - ref.float()).abs().max() <= 2**-7 * ref.float().abs().max()
    assert (y != ref).float().mean() < 0.01
    u = randn(64, 8192).cuda().bfloat16()
    assert torch.equal(relu2(u), torch.relu(u).square())


@pytest.mark.parametrize("pos", [9, 130])  # one block of 64 keys, and three (the rescaling)
def test_attention_equals_the_model_and_rows_do_not_depend_on_T(pos):
    from replaylab.kernels.decode import attention

    batch, Hq, Hkv, Dh, max_len = 2, 4, 2, 16, 160
    k, v = randn(batch + 1, Hkv, max_len, Dh), randn(batch + 1, Hkv, max_len, Dh)
    q = randn(batch, 3, Hq, Dh)
    position = torch.tensor(pos, device=DEVICE)
    got = attention(q, k, v, position, Dh**-0.5)
    keys = k[:batch].repeat_interleave(Hq // Hkv, 1)[:, :, : pos + 3]
    values = v[:batch].repeat_interleave(Hq // Hkv, 1)[:, :, : pos + 3]
    scores = q.transpose(1, 2) @ keys.transpose(2, 3) * Dh**-0.5
    causal = (
        torch.arange(pos + 3, device=DEVICE)[None, :]
        > (pos + torch.arange(3, device=DEVICE))[:, None]
    )
    ref = torch.softmax(scores.masked_fill(causal, float("-inf")), -1) @ values
    torch.testing.assert_close(got, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    for t in range(3):  # one token at a time: the same rows, bit for bit
        at = torch.tensor(pos + t, device=DEVICE)
        one = attention(q[:, t : t + 1].contiguous(), k, v, at, Dh**-0.5)
        assert torch.equal(one[:, 0], got[:, t])


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["snapshot", "recompute", "replay"])
def test_fused_engine_on_gpu_speculative_returns_its_greedy_tokens(strategy):
    """Compiled, bf16, CUDA graphs: speculative decoding returns the engine's own greedy
    tokens for this prompt (the fused kernels round a verify as single steps do; the matrix
    products and, under replay, the fold schedule may still part them at a near-tie: see
    ``replaylab.serving.engine``)."""
    model = HybridLM(preset("1b"), seed=0).to("cuda", torch.bfloat16).eval()
    prompt = torch.randint(0, 32000, (1, 24), generator=torch.Generator().manual_seed(5)).cuda()
    engine = DecodeEngine(model, 1, 24 + 48 + 6, strategy, log_length=16)
    ref = engine.greedy(prompt, 48)
    full = torch.cat([prompt, ref], 1).cpu()
    tokens, proposed, accepted = engine.speculative(prompt, 48, SyntheticDrafter(full, 0.8, 2))
    tokens, ref = tokens.cpu(), ref.cpu()
    assert torch.equal(tokens, ref), (tokens != ref).nonzero()[:1]
    assert 0 < accepted < proposed


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["snapshot", "recompute", "replay"])
def test_cuda_graphs_give_the_eager_engines_logits_bit_for_bit(strategy):
    """The same steps with and without CUDA graphs, across several folds and verifies with
    rollbacks: capturing a graph (whose warm-up runs the step) must leave no trace."""
    model = HybridLM(preset("8b-layers"), seed=0).to("cuda", torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 32000, (n,), generator=gen).cuda() for n in (5, 13)]
    engines = [DecodeEngine(model, 2, 96, strategy, log_length=8, graphs=g) for g in (True, False)]
    outs = [[], []]
    for engine, out in zip(engines, outs):
        for p in prompts:
            engine.admit(p)
        for i in range(24):
            T = 1 if i % 3 else 4
            counts = [min(T, engine.room(s)) for s in engine.slots]
            tokens = torch.randint(0, 32000, (2, T), generator=torch.Generator().manual_seed(i))
            logits = engine.step(tokens.cuda(), counts, check=False).float().cpu()
            out += [logits[j, :c] for j, c in enumerate(counts)]  # padding rows are undefined
            if T > 1:
                engine.rollback([max(1, c - 1) for c in counts])
    for i, (a, b) in enumerate(zip(*outs)):
        assert torch.equal(a, b), i


def decode_beside_others(model, strategy, batch, steps=40, **engine_kw):
    """Slot 0's logits (steps, vocab) over ``steps`` one-token steps of a fixed prompt and
    fixed tokens, with batch - 1 (at most 63) other sequences (their own prompts and tokens)
    beside it."""
    gen = torch.Generator().manual_seed(3)
    lengths = (11, 5, 9, 17, 3, 8, 14, 6) * 8
    prompts = [torch.randint(0, 32000, (n,), generator=gen) for n in lengths[:batch]]
    engine = DecodeEngine(model, batch, 64, strategy, log_length=8, **engine_kw)
    for p in prompts:
        engine.admit(p.to(model.lm_head.weight.device))
    out = []
    for i in range(steps):
        tokens = torch.randint(0, 32000, (64, 1), generator=torch.Generator().manual_seed(i))
        logits = engine.step(tokens[:batch].to(model.lm_head.weight.device), check=False)
        out.append(logits[0, 0].float().cpu())
    return torch.stack(out)


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["snapshot", "recompute", "replay"])
def test_a_slots_logits_do_not_depend_on_the_batch_it_runs_in(strategy):
    """One prompt decoded alone and beside seven others (fused, graphs, bf16, Nemotron-H 8B
    layer shapes, across folds of L = 8): its logits bit for bit. Needs the row-invariant
    matrix products and, under replay, one kernel launch for every batch (the engine's
    ``batch_invariant``)."""
    model = HybridLM(preset("8b-layers"), seed=0).to("cuda", torch.bfloat16).eval()
    alone, beside = (decode_beside_others(model, strategy, b) for b in (1, 8))
    differ = (alone != beside).any(1).nonzero()
    assert not len(differ), f"slot 0's logits differ from step {int(differ[0])} of 40"


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("strategy", ["snapshot", "recompute"])
def test_a_slots_logits_do_not_depend_on_a_batch_past_32(strategy, fused):
    """Snapshot's and recompute's Mamba-2 step (``kernels.decode.state_update``, on the fused
    path and on the reference path's ``step_kernels``) launches alike at every batch under the
    engine's ``batch_invariant``, where its tuned launch changes past batch 32: one prompt
    decoded alone and beside 39 others gives the same logits, bit for bit (Nemotron-H 8B layer
    shapes, bf16, graphs)."""
    model = HybridLM(preset("8b-layers"), seed=0).to("cuda", torch.bfloat16).eval()
    alone, beside = (decode_beside_others(model, strategy, b, fused=fused) for b in (1, 40))
    differ = (alone != beside).any(1).nonzero()
    assert not len(differ), f"slot 0's logits differ from step {int(differ[0])} of 40"
