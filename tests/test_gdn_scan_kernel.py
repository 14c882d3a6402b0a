"""The Gated DeltaNet prompt scan in one Triton launch (``replaylab.kernels.gdn_scan``, issue
38 item 1) against the float64 token recurrence (``replaylab.scan.gdn_scan``), with the
corrected updates a replay log keeps, under Triton's interpreter on CPU and natively on a GPU;
and in the serving engine under ``prefill_kernels``. Sizes are awkward on purpose (K, V not
powers of two, value heads sharing key heads, V wider than one program's block)."""

import pytest
import torch

from replaylab import assert_close
from replaylab.gated_deltanet import GDNConfig, l2_normalize
from replaylab.kernels.gdn_scan import gdn_prompt_scan
from replaylab.scan import gdn_chunked_scan, gdn_scan
from replaylab.testing import DEVICE


def tokens(batch=2, T=37, H=4, Hk=2, K=12, V=10, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    t = dict(
        q=(l2_normalize(r(batch, T, Hk, K)) * K**-0.5).to(dtype),
        k=l2_normalize(r(batch, T, Hk, K)).to(dtype),
        v=r(batch, T, H, V).to(dtype),
        g=-torch.rand(batch, T, H, generator=gen) * 0.5,
        beta=torch.rand(batch, T, H, generator=gen).to(dtype),
    )
    return {name: x.to(DEVICE) for name, x in t.items()}


def oracle(toks, state):
    f64 = {name: x.double() for name, x in toks.items()}
    init = None if state is None else state.double()
    return gdn_scan(**f64, initial_state=init, compute_dtype=torch.float64)


@pytest.mark.parametrize("T", [1, 16, 37])
@pytest.mark.parametrize("block_v", [None, 4], ids=["one block", "blocks of 4"])
@pytest.mark.parametrize("with_state", [True, False], ids=["from a state", "from zeros"])
def test_outputs_state_and_updates_equal_the_float64_recurrence(T, block_v, with_state):
    toks = tokens(T=T)
    state = torch.randn(2, 4, 12, 10, device=DEVICE) * 0.3 if with_state else None
    got = gdn_prompt_scan(**toks, initial_state=state, return_updates=True, block_v=block_v)
    want = oracle(toks, state)
    assert got.state.dtype == torch.float32 and got.y.dtype == toks["v"].dtype
    assert_close(got.y.double(), want.y, atol=2e-5, rtol=2e-5, name="o")
    assert_close(got.state.double(), want.state, atol=2e-5, rtol=2e-5, name="state")
    # u_t = β_t (v_t - α_t S_{t-1}^T k_t), as the library's chunked form solves for it
    ref = gdn_chunked_scan(**toks, initial_state=state, return_updates=True)
    assert_close(got.updates, ref.updates, atol=2e-5, rtol=2e-5, name="u")


def test_bf16_inputs_stay_within_bf16_rounding_of_the_float64_recurrence():
    toks = tokens(T=40, dtype=torch.bfloat16)
    state = torch.randn(2, 4, 12, 10, device=DEVICE) * 0.3
    got = gdn_prompt_scan(**toks, initial_state=state)
    want = oracle(toks, state)
    assert float((got.y.double() - want.y).abs().max() / want.y.abs().max()) < 1e-2
    assert_close(got.state.double(), want.state, atol=1e-4, rtol=1e-4, name="state")
    assert got.updates is None


def test_a_prompt_split_anywhere_equals_one_pass_bit_for_bit():
    toks = tokens(T=30)
    whole = gdn_prompt_scan(**toks, return_updates=True)
    part = lambda a, b: {n: x[:, a:b] for n, x in toks.items()}  # noqa: E731
    first = gdn_prompt_scan(**part(0, 13), return_updates=True)
    second = gdn_prompt_scan(**part(13, 30), initial_state=first.state, return_updates=True)
    assert torch.equal(torch.cat([first.y, second.y], 1), whole.y)
    assert torch.equal(torch.cat([first.updates, second.updates], 1), whole.updates)
    assert torch.equal(second.state, whole.state)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(v=torch.zeros(2, 37, 4)), r"v: expected \(batch, T, H, V\), got shape \(2, 37, 4\)"),
        (dict(k=torch.zeros(2, 37, 3, 12)), r"k: its 3 key heads must divide the 4 value heads"),
        (dict(k=torch.zeros(2, 36, 2, 12)), r"k: expected \(batch=2, T=37, Hk, K\), got"),
        (dict(q=torch.zeros(2, 37, 2, 11)), r"q: expected shape \(2, 37, 2, 12\), got"),
        (dict(g=torch.zeros(2, 37, 5)), r"g: expected shape \(2, 37, 4\), got \(2, 37, 5\)"),
        (
            dict(beta=torch.zeros(2, 37)),
            r"beta: expected 3 dims with shape \(2, 37, 4\), got shape \(2, 37\)",
        ),
        (dict(initial_state=torch.zeros(2, 4, 10, 12)), r"initial_state: expected shape"),
        (dict(block_v=24), r"block_v: expected a power of two >= 1, got 24"),
    ],
)
def test_bad_input_is_refused_naming_the_value(change, match):
    toks = tokens()
    toks.update({k: v.to(DEVICE) if torch.is_tensor(v) else v for k, v in change.items()})
    with pytest.raises(ValueError, match=match):
        gdn_prompt_scan(**toks)


def test_the_engine_prefills_with_it_under_every_strategy():
    """prefill_kernels=True on a Qwen3.5-like model: the pools scan prompts through the
    kernel; their buffers (replay's kernel log takes u from the same launch), each strategy's
    logits, the next steps' and a prefix hit's equal the default prefill's to fp32 rounding."""
    from prefill_kernel_checks import check_prefill_kernels

    from replaylab.model import HybridConfig, HybridLM

    cfg = HybridConfig(
        pattern="G*-", gdn=GDNConfig(k_heads=1, v_heads=2, k_head_dim=8, v_head_dim=6),
        attention="gated", rotary_dim=8, mlp="swiglu", vocab_size=50, hidden_size=32,
        attn_heads=2, kv_heads=1, head_dim=16, intermediate_size=64,
    )  # fmt: skip
    model = HybridLM(cfg, seed=11).eval().to(DEVICE)
    prompt = torch.randint(0, 50, (70,), generator=torch.Generator().manual_seed(3))
    check_prefill_kernels(model, prompt.to(DEVICE), 50, 16, family="gated_deltanet", seed=3)
