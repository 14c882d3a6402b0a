"""The prefill's shortcuts that launch fewer operations (issue 38: a prefix hit is host-bound):
torch's fused attention with a lower-right causal mask against a float64 softmax, the conv
window taken as a view of the chunk, and the log ring's rows as a slice where they do not
wrap, each against what it replaces."""

import pytest
import torch

from replaylab.kv import attend
from replaylab.recurrent import window_after
from replaylab.serving.prefill import _fused_attend
from replaylab.serving.strategies.replay import _ring_rows


def softmax_attention_f64(q, keys, values):
    """The chunk's T queries over ``keys``' rows, the last T being their own (float64)."""
    q, keys, values = q.double(), keys.double(), values.double()
    heads, Hkv = q.shape[1], keys.shape[1]
    keys = keys.repeat_interleave(heads // Hkv, 1)
    values = values.repeat_interleave(heads // Hkv, 1)
    T, rows, Dh = q.shape[2], keys.shape[2], q.shape[3]
    scores = q @ keys.transpose(2, 3) / Dh**0.5
    own = torch.arange(rows - T, rows, device=q.device)[:, None]
    scores = scores.masked_fill(torch.arange(rows, device=q.device) > own, float("-inf"))
    out = torch.softmax(scores, -1) @ values
    return out.transpose(1, 2).reshape(1, T, heads * Dh)


@pytest.mark.parametrize("T, rows", [(1, 1), (1, 37), (5, 5), (6, 40), (16, 23)])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2)])
def test_the_fused_attention_is_a_causal_softmax_over_the_slots_rows(T, rows, heads, kv_heads):
    gen = torch.Generator().manual_seed(T * 100 + rows)
    q = torch.randn(1, heads, T, 16, generator=gen)
    keys, values = (torch.randn(1, kv_heads, rows, 16, generator=gen) for _ in range(2))
    want = softmax_attention_f64(q, keys, values)
    got = _fused_attend(q, keys, values)
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=2e-5)
    visible = torch.arange(rows) <= torch.arange(rows - T, rows)[:, None]
    torch.testing.assert_close(
        attend(q, keys, values, visible).double(), want, atol=2e-6, rtol=2e-5
    )


@pytest.mark.gpu
@pytest.mark.parametrize("Dh", [64, 100])
@pytest.mark.parametrize("T, rows", [(48, 2048), (256, 256), (1, 300)])
def test_the_fused_attention_in_bf16_on_a_gpu_is_as_close_as_kv_attend(T, rows, Dh):
    """The GPU's path (grouped heads; a head size that is not a multiple of 8): its error
    against float64 at most kv.attend's (which rounds the scores to bf16 first) or bf16's
    resolution near 1 (8e-3), whichever is larger. Which of torch's kernels ran is not checked."""
    gen = torch.Generator().manual_seed(rows + Dh)
    q = torch.randn(1, 32, T, Dh, generator=gen).cuda()
    keys, values = (torch.randn(1, 8, rows, Dh, generator=gen).cuda() for _ in range(2))
    want = softmax_attention_f64(q, keys, values)
    q, keys, values = q.bfloat16(), keys.bfloat16(), values.bfloat16()
    got = _fused_attend(q, keys, values)
    visible = (torch.arange(rows) <= torch.arange(rows - T, rows)[:, None]).cuda()
    ref = attend(q, keys, values, visible)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    err, ref_err = ((t.double() - want).abs().max().item() for t in (got, ref))
    assert err <= max(ref_err, 8e-3), (err, ref_err)


@pytest.mark.parametrize("T", [0, 1, 2, 3, 4, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_window_as_a_view_equals_the_window_made_by_concatenation(T, dtype):
    gen = torch.Generator().manual_seed(T)
    window = torch.randn(2, 3, 5, generator=gen)  # K = 3 rows kept
    chunk = torch.randn(2, T, 5, generator=gen).to(dtype)
    want = torch.cat([window, chunk.to(window.dtype)], 1)[:, -3:]
    got = window_after(window, chunk, view=True)
    assert got.dtype == window.dtype and torch.equal(got, want)
    if T >= 3 and dtype == window.dtype:  # no copy made
        assert got.data_ptr() == chunk[:, -3:].data_ptr()
    assert torch.equal(window_after(window, chunk), want)
    assert torch.equal(window_after(window[:, :0], chunk, view=True), window[:, :0])


@pytest.mark.parametrize("capacity", [4, 16, 18])
def test_a_slots_ring_rows_are_a_slice_until_they_wrap(capacity):
    for head in range(capacity):
        for start in range(capacity):
            for stop in range(start + 1, capacity + 1):
                rows = _ring_rows(head, start, stop, capacity, "cpu")
                want = (head + torch.arange(start, stop)) % capacity
                assert torch.equal(torch.arange(capacity)[rows], want)
                wraps = (head + start) % capacity + stop - start > capacity
                assert isinstance(rows, slice) == (not wraps)
