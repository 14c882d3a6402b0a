"""The Mamba-1 (S6) prompt scan in one Triton launch (``replaylab.kernels.s6_scan``, issue 38
item 1) against the float64 token recurrence (``replaylab.scan.s6_scan``), under Triton's
interpreter on CPU and natively on a GPU; and in the serving engine under ``prefill_kernels``
on a Jamba-like model. Sizes are awkward on purpose (40 channels in blocks of 32, N = 6)."""

import pytest
import torch

from replaylab import assert_close
from replaylab.kernels.s6_scan import s6_prompt_scan
from replaylab.scan import s6_scan
from replaylab.testing import DEVICE


def inputs(batch=2, T=23, D=40, N=6, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t = dict(
        x=r(batch, T, D).to(dtype),
        dt=r(batch, T, D).to(dtype),
        A=-torch.rand(D, N, generator=gen) - 0.2,
        B=r(batch, T, N).to(dtype),
        C=r(batch, T, N).to(dtype),
        D=r(D),
        dt_bias=r(D) * 0.3,
    )
    return {k: v.to(DEVICE) for k, v in t.items()}


def oracle(t, state):
    f64 = {k: v.double() for k, v in t.items()}
    init = None if state is None else state.double()
    return s6_scan(f64["x"], f64["dt"], f64["A"], f64["B"], f64["C"], f64["D"],
                   dt_bias=f64["dt_bias"], dt_softplus=True, initial_state=init,
                   compute_dtype=torch.float64)  # fmt: skip


@pytest.mark.parametrize("T", [1, 23])
@pytest.mark.parametrize("block_d", [32, 64])
@pytest.mark.parametrize("with_state", [True, False], ids=["from a state", "from zeros"])
def test_outputs_and_state_equal_the_float64_recurrence(T, block_d, with_state):
    t = inputs(T=T)
    state = torch.randn(2, 40, 6, device=DEVICE) * 0.3 if with_state else None
    got = s6_prompt_scan(**t, initial_state=state, block_d=block_d)
    want = oracle(t, state)
    assert got.state.dtype == torch.float32 and got.y.dtype == t["x"].dtype
    for name, a, b in (("y", got.y, want.y), ("state", got.state, want.state)):
        scale = float(b.abs().max())
        assert_close(a.double() / scale, b / scale, atol=2e-6, rtol=0, name=name)


def test_parameters_as_strided_views_equal_their_contiguous_copies():
    t = inputs()
    want = s6_prompt_scan(**t)
    spread = lambda v: torch.stack([v, torch.full_like(v, 7.0)], -1).flatten(-2)[..., ::2]  # noqa: E731
    strided = dict(t, **{k: spread(t[k]) for k in ("A", "D", "dt_bias")})
    assert not strided["A"].is_contiguous() and not strided["D"].is_contiguous()
    got = s6_prompt_scan(**strided)
    assert torch.equal(got.y, want.y) and torch.equal(got.state, want.state)


def test_without_d_bf16_and_a_split_prompt():
    t = inputs(T=30, dtype=torch.bfloat16)
    t.pop("D")
    whole = s6_prompt_scan(**t)
    want = oracle(dict(t, D=torch.zeros(40, device=DEVICE)), None)
    assert float((whole.y.double() - want.y).abs().max() / want.y.abs().max()) < 1e-2
    part = lambda a, b: {k: (v[:, a:b] if v.dim() == 3 else v) for k, v in t.items()}  # noqa: E731
    first = s6_prompt_scan(**part(0, 11))
    second = s6_prompt_scan(**part(11, 30), initial_state=first.state)
    if DEVICE == "cpu":
        assert torch.equal(torch.cat([first.y, second.y], 1), whole.y)
        assert torch.equal(second.state, whole.state)
    else:  # from a state is another compiled variant (HAS_STATE): its FMAs may contract apart
        assert_close(torch.cat([first.y, second.y], 1), whole.y, name="y")
        assert_close(second.state, whole.state, atol=1e-6, rtol=1e-6, name="state")


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(x=torch.zeros(2, 23)), r"x: expected \(batch, T, D\), got shape \(2, 23\)"),
        (dict(A=torch.zeros(41, 6)), r"A: expected \(D=40, N\), got shape \(41, 6\)"),
        (dict(dt=torch.zeros(2, 22, 40)), r"dt: expected shape \(2, 23, 40\), got \(2, 22, 40\)"),
        (dict(C=torch.zeros(2, 23, 5)), r"C: expected shape \(2, 23, 6\), got \(2, 23, 5\)"),
        (dict(dt_bias=torch.zeros(4)), r"dt_bias: expected shape \(40\), got \(4,\)"),
        (dict(initial_state=torch.zeros(2, 6, 40)), r"initial_state: expected shape \(2, 40, 6\)"),
        (dict(block_d=48), r"block_d: expected a power of two >= 1, got 48"),
    ],
)
def test_bad_input_is_refused_naming_the_value(change, match):
    t = inputs()
    t.update({k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in change.items()})
    with pytest.raises(ValueError, match=match):
        s6_prompt_scan(**t)


def test_the_engine_prefills_with_it_under_every_strategy():
    """prefill_kernels=True on a Jamba-like model: the pools scan prompts through the kernel;
    their buffers, each strategy's logits, the next steps' and a prefix hit's equal the default
    prefill's (PyTorch's token loop) to fp32 rounding."""
    from prefill_kernel_checks import check_prefill_kernels

    from replaylab.mamba1 import Mamba1Config
    from replaylab.model import HybridConfig, HybridLM

    cfg = HybridConfig(
        pattern="S*-", mamba1=Mamba1Config(d_inner=40, d_state=4, dt_rank=4), vocab_size=50,
        hidden_size=32, attn_heads=2, kv_heads=1, head_dim=16, intermediate_size=64,
    )  # fmt: skip
    model = HybridLM(cfg, seed=11).eval().to(DEVICE)
    prompt = torch.randint(0, 50, (70,), generator=torch.Generator().manual_seed(4))
    check_prefill_kernels(model, prompt.to(DEVICE), 50, 16, family="mamba1", seed=4)
