"""``kernels.conv.conv_prompt``, a prompt chunk's causal depthwise conv in one launch, against
the teaching mixer's ``Mamba2Mixer.conv`` (``F.conv1d``) in float64, and its promises: a
token's bits are those the fused decode step's ``kernels.decode.conv_step`` gives it, and they
do not depend on how the prompt is cut into chunks or on the batch (an elementwise kernel, so
this last check guards against a future tiling that mixes tokens). CPU through Triton's
interpreter; on a GPU the same tests run on the device's tensors."""

from __future__ import annotations

import pytest
import torch

from replaylab.kernels.conv import conv_prompt
from replaylab.kernels.decode import conv_step
from replaylab.model import HybridConfig, HybridLM
from replaylab.recurrent import window_after
from replaylab.testing import DEVICE


def _mixer(dtype, bias=True):
    cfg = HybridConfig(vocab_size=16, hidden_size=32, pattern="M", ssm_heads=4, ssm_head_dim=8,
                       d_state=8, n_groups=2, attn_heads=2, kv_heads=1, head_dim=8,
                       intermediate_size=32)  # fmt: skip
    mixer = HybridLM(cfg, seed=0).model.layers[0].mixer
    if not bias:
        mixer.conv1d.bias = None
    return mixer.to(device=DEVICE, dtype=dtype)


def _xbc(mixer, batch, T, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    C, K = mixer.cfg.conv_dim, mixer.cfg.d_conv - 1
    window = torch.randn(batch, K, C, generator=gen).to(DEVICE, dtype)
    # a slice of a wider projection, as the prefill passes it
    wide = torch.randn(batch, T, C + 5, generator=gen).to(DEVICE, dtype)
    return window, wide[..., 3 : 3 + C]


def _weights(mixer):
    bias = mixer.conv1d.bias
    return mixer.conv1d.weight[:, 0], None if bias is None else bias.detach()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("T", [1, 5, 37])
def test_it_is_the_teaching_conv(T, bias):
    """fp32 inputs: within float32 rounding of the teaching conv computed in float64."""
    mixer = _mixer(torch.float32, bias)
    window, xbc = _xbc(mixer, 2, T, torch.float32)
    got = conv_prompt(xbc, window, *_weights(mixer))
    want = mixer.double().conv(xbc.double(), window.double())
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("C, taps, T", [(200, 4, 21), (200, 1, 5), (64, 4, 0)])
def test_every_channel_block_any_width_and_an_empty_chunk(C, taps, T):
    """Channels over several programs (C = 200 > 128 a block), a conv of one tap (d_conv = 1: no
    window), an empty chunk: against F.conv1d and SiLU in float64."""
    gen = torch.Generator().manual_seed(2)
    window = torch.randn(2, taps - 1, C, generator=gen).to(DEVICE)
    xbc = torch.randn(2, T, C, generator=gen).to(DEVICE)
    weight, bias = (torch.randn(C, taps, generator=gen).to(DEVICE), torch.randn(C).to(DEVICE))
    got = conv_prompt(xbc, window, weight, bias)
    assert got.shape == (2, T, C)
    if T == 0:  # F.conv1d refuses an input shorter than its kernel
        return
    full = torch.cat([window, xbc], 1).double().transpose(1, 2)
    want = torch.nn.functional.conv1d(full, weight.double()[:, None], bias.double(), groups=C)
    want = torch.nn.functional.silu(want).transpose(1, 2)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_tokens_bits_are_the_decode_steps():
    """bf16: a 6-token chunk equals conv_step over the same tokens (one launch of T = 6) and
    over one token at a time, the window advanced between them."""
    mixer = _mixer(torch.bfloat16)
    batch, T = 3, 6
    window, xbc = _xbc(mixer, batch, T, torch.bfloat16)
    weight, bias = _weights(mixer)
    got = conv_prompt(xbc, window, weight, bias)
    C = mixer.cfg.conv_dim
    H = 1
    # conv_step reads xBC from an in-projection row (here xBC and then one dt column)
    zx = torch.cat([xbc, torch.zeros(batch, T, H, device=DEVICE, dtype=xbc.dtype)], -1)
    XP, GN, _ = mixer.scan_input_widths()

    def stepped(zx_rows, win, n):
        x, B, Cm, _ = conv_step(zx_rows.reshape(batch * n, -1).contiguous(), win, weight, bias,
                                0, C, XP, GN, H, n)  # fmt: skip
        return torch.cat([x, B, Cm], -1)

    at_once = stepped(zx, window.clone(), T)
    assert torch.equal(got, at_once)
    win, one_by_one = window.clone(), []
    for t in range(T):
        one_by_one.append(stepped(zx[:, t : t + 1], win, 1))
    assert torch.equal(got, torch.cat(one_by_one, 1))


def test_chunks_and_batch_do_not_change_a_tokens_bits():
    """bf16: a 40-token prompt in one call equals it cut into chunks of 16, 7 and 17 (the window
    carried by ``recurrent.window_after``), and row 1 of a batch of 3 equals it alone."""
    mixer = _mixer(torch.bfloat16)
    window, xbc = _xbc(mixer, 3, 40, torch.bfloat16)
    weight, bias = _weights(mixer)
    whole = conv_prompt(xbc, window, weight, bias)
    win, parts, at = window, [], 0
    for n in (16, 7, 17):
        parts.append(conv_prompt(xbc[:, at : at + n], win, weight, bias))
        win, at = window_after(win, xbc[:, at : at + n]), at + n
    assert torch.equal(whole, torch.cat(parts, 1))
    alone = conv_prompt(xbc[1:2], window[1:2], weight, bias)
    assert torch.equal(alone, whole[1:2])


@pytest.mark.parametrize("C, splits, T", [(64, "mixer", 9), (200, (130, 35), 7), (200, (200, 0), 3),
                                          (200, (130, 35), 0)])  # fmt: skip
def test_its_three_parts_are_the_whole_and_contiguous(C, splits, T):
    """With ``splits``, x, B and C come back as three contiguous tensors (what the scan and the
    log read without a copy) with the bits of the whole output's slices: the mixer's widths,
    parts that cross the 128-channel blocks, no B and C, an empty chunk."""
    gen = torch.Generator().manual_seed(3)
    if splits == "mixer":
        mixer = _mixer(torch.bfloat16)
        window, xbc = _xbc(mixer, 2, T, torch.bfloat16)
        weight, bias = _weights(mixer)
        splits = mixer.scan_input_widths()[:2]
    else:
        window = torch.randn(2, 3, C, generator=gen).to(DEVICE, torch.bfloat16)
        xbc = torch.randn(2, T, C, generator=gen).to(DEVICE, torch.bfloat16)
        weight = torch.randn(C, 4, generator=gen).to(DEVICE, torch.bfloat16)
        bias = torch.randn(C, generator=gen).to(DEVICE, torch.bfloat16)
    whole = conv_prompt(xbc, window, weight, bias)
    parts = conv_prompt(xbc, window, weight, bias, splits=splits)
    XP, GN = splits
    assert [p.shape for p in parts] == [(2, T, w) for w in (XP, GN, C - XP - GN)]
    assert all(p.is_contiguous() for p in parts)
    assert torch.equal(torch.cat(parts, -1), whole)


def test_bad_shapes_are_refused_by_name():
    mixer = _mixer(torch.float32)
    window, xbc = _xbc(mixer, 2, 4, torch.float32)
    weight, bias = _weights(mixer)
    with pytest.raises(ValueError, match=r"window \(2, 2, "):
        conv_prompt(xbc, window[:, :2], weight, bias)
    strided = torch.stack([xbc, xbc], -1)[..., 0]  # its channels two elements apart
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        conv_prompt(strided, window, weight, bias)
    with pytest.raises(ValueError, match=r"splits \(XP, GN\) = \(60, 8\) must have .* <= C = 64"):
        conv_prompt(xbc, window, weight, bias, splits=(60, 8))
    with pytest.raises(ValueError, match=r"bias: expected \(64,\), got \(3,\)"):
        conv_prompt(xbc, window, weight, bias[:3])  # it read past the bias before
