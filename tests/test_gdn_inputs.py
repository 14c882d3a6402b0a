"""``kernels.gdn_inputs.prepare``, the fused path's one launch for a Gated DeltaNet layer's
recurrence inputs, against the teaching mixer's own PyTorch operations
(``GatedDeltaNetSpec.prepare``), and its promise that a token's numbers depend on nothing but
its own inputs and window: row i of a batch and token t of a multi-token call are the bits the
same row or token gets alone (the engine's lossless contracts rest on it). CPU through Triton's
interpreter; on a GPU the same tests run on the device's tensors."""

from __future__ import annotations

import pytest
import torch

from replaylab.gated_deltanet import GDNConfig
from replaylab.kernels.gdn_inputs import prepare
from replaylab.model import HybridConfig, HybridLM
from replaylab.recurrent import window_after
from replaylab.testing import DEVICE

FIELDS = ("q", "k", "v", "g", "beta")


def _mixer(gdn, dtype, seed=0):
    cfg = HybridConfig(vocab_size=16, hidden_size=16, pattern="G", gdn=gdn, attn_heads=2,
                       kv_heads=1, head_dim=8)  # fmt: skip
    mixer = HybridLM(cfg, seed=seed).model.layers[0].mixer
    with torch.no_grad():  # decays of every size, past softplus's threshold and exp's fp32 range
        mixer.A_log.copy_(torch.linspace(-2.0, 2.0, gdn.v_heads))
        mixer.dt_bias.copy_(torch.linspace(-30.0, 100.0, gdn.v_heads))
    return mixer.to(device=DEVICE, dtype=dtype)


def _inputs(mixer, batch, T, dtype, seed=1):
    s = mixer.settings
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)

    window = randn(batch, s.d_conv - 1, s.conv_dim)
    inputs = dict(
        qkv=randn(batch, T, s.conv_dim), a=randn(batch, T, s.v_heads, scale=3.0),
        b=randn(batch, T, s.v_heads, scale=3.0),
    )  # fmt: skip
    return window, inputs


def _kernel(mixer, window, inputs):
    s = mixer.settings
    fields = prepare(inputs["qkv"], window, mixer.conv1d.weight[:, 0], inputs["a"], inputs["b"],
                     mixer.A_log, mixer.dt_bias, s.k_heads, s.k_head_dim)  # fmt: skip
    return dict(zip(FIELDS, fields))


SHAPES = {  # powers of two, and not (masked lanes: 3 value heads a key head, 3 key heads)
    "pow2": GDNConfig(k_heads=2, v_heads=4, k_head_dim=8, v_head_dim=8, d_conv=4),
    "ragged": GDNConfig(k_heads=2, v_heads=6, k_head_dim=6, v_head_dim=5, d_conv=3),
    "no window": GDNConfig(k_heads=1, v_heads=2, k_head_dim=4, v_head_dim=4, d_conv=1),
    "3 key heads": GDNConfig(k_heads=3, v_heads=6, k_head_dim=5, v_head_dim=3, d_conv=2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_prepare_equals_the_teaching_mixers_operations(shape, dtype):
    """q, k, v, g and β of the kernel against ``GatedDeltaNetSpec.prepare`` (conv over the
    window then the tokens, SiLU, L2 norms, q scaled, softplus decay, sigmoid): fp32 to float
    rounding, bf16 to one rounding of the result (the conv's sum is rounded once on each side,
    in a different order)."""
    mixer = _mixer(SHAPES[shape], dtype)
    window, inputs = _inputs(mixer, batch=3, T=5, dtype=dtype)
    with torch.no_grad():
        want = mixer.state_spec.prepare(window, inputs)
        got = _kernel(mixer, window, inputs)
    tol = dict(atol=2e-6, rtol=2e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for name in FIELDS:
        assert got[name].dtype == want[name].dtype, name
        # g fp32 in both dtypes, relative only: the decays of a strongly negative a + dt_bias
        # are tiny, and a zero for them would pass any absolute tolerance
        close = dict(atol=0.0, rtol=1e-5) if name == "g" else tol
        torch.testing.assert_close(got[name], want[name], **close, msg=name)


def test_a_tokens_numbers_do_not_depend_on_its_batch_or_its_call():
    """Bit for bit: a row computed among three equals the row computed alone, and the tokens of
    one 4-token call equal four 1-token calls, each after the window the previous ones left
    (``window_after``), as a verify must equal decode steps."""
    dtype = torch.bfloat16
    mixer = _mixer(SHAPES["ragged"], dtype)
    window, inputs = _inputs(mixer, batch=3, T=4, dtype=dtype, seed=2)
    with torch.no_grad():
        together = _kernel(mixer, window, inputs)
        alone = _kernel(mixer, window[1:2], {n: t[1:2] for n, t in inputs.items()})
        for name in FIELDS:
            assert torch.equal(together[name][1:2], alone[name]), name
        w = window
        for t in range(4):
            one = {n: x[:, t : t + 1] for n, x in inputs.items()}
            step = _kernel(mixer, w, one)
            for name in FIELDS:
                assert torch.equal(step[name], together[name][:, t : t + 1]), (name, t)
            w = window_after(w, one["qkv"])


def test_prepare_names_the_shape_it_expected():
    mixer = _mixer(SHAPES["pow2"], torch.float32)
    window, inputs = _inputs(mixer, batch=2, T=1, dtype=torch.float32)
    s, weight = mixer.settings, mixer.conv1d.weight[:, 0]
    args = (inputs["a"], inputs["b"], mixer.A_log, mixer.dt_bias)
    with pytest.raises(
        ValueError, match=r"window: expected \(batch, d_conv - 1, C\) = \(2, 3, 64\)"
    ):
        prepare(inputs["qkv"], window[:, :2], weight, *args, s.k_heads, s.k_head_dim)
    with pytest.raises(ValueError, match=r"heads: C=64 = 2 x Hk=3 x K=8"):
        prepare(inputs["qkv"], window, weight, *args, 3, s.k_head_dim)
    with pytest.raises(ValueError, match=r"b: expected \(batch, T, H\) = \(2, 1, 4\)"):
        prepare(inputs["qkv"], window, weight, inputs["a"], inputs["b"][..., :3],
                mixer.A_log, mixer.dt_bias, s.k_heads, s.k_head_dim)  # fmt: skip
