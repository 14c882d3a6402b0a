"""Timing helpers: CUDA-graph medians, the device-copy bandwidth, spreads of repeated runs."""

from __future__ import annotations

import torch

__all__ = ["time_ms", "copy_bandwidth_gbs", "spread", "sync"]


def time_ms(fn, graphs=True):
    """(median milliseconds of ``fn``, whether a CUDA graph was used); falls back to plain
    launches for providers that cannot be captured."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    if graphs:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"), True
        except Exception:  # noqa: BLE001 - some providers cannot be captured
            torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), False


def copy_bandwidth_gbs(gib=2):
    """Device-copy bandwidth, read + write bytes per second (GB/s), on ``gib`` GiB."""
    src = torch.empty(gib * 2**30 // 4, device="cuda")
    dst = torch.empty_like(src)
    ms, _ = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def spread(values):
    """median, min, max and count of repeated measurements."""
    values = sorted(values)
    return dict(median=values[len(values) // 2], min=values[0], max=values[-1], runs=len(values))


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
