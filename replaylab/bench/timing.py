"""Timing helpers: CUDA-graph medians, the device-copy bandwidth, the GPU-busy fraction, spreads
of repeated runs."""

from __future__ import annotations

import time

import torch

__all__ = ["time_ms", "copy_bandwidth_gbs", "busy_fraction", "spread", "sync"]


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


def copy_bandwidth_gbs(gib=2, methods=False):
    """Device-copy bandwidth, read + write bytes per second (GB/s), on ``gib`` GiB: the larger
    of two timings of the same copy, replayed in a CUDA graph and launched back to back
    between CUDA events (on an H200 the graph-replayed copy reads 2.8 TB/s, the launched one
    4.3 TB/s: fractions of the larger are the conservative ones). ``methods=True`` returns
    (best, {method: GB/s})."""
    src = torch.empty(gib * 2**30 // 4, device="cuda")
    dst = torch.empty_like(src)
    nbytes = 2 * src.numel() * 4
    ms, _ = time_ms(lambda: dst.copy_(src))
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    found = dict(
        cudagraph=nbytes / (ms * 1e-3) / 1e9, events=nbytes * 10 / start.elapsed_time(end) / 1e6
    )
    best = max(found.values())
    return (best, found) if methods else best


def spread(values):
    """median, min, max and count of repeated measurements."""
    values = sorted(values)
    return dict(median=values[len(values) // 2], min=values[0], max=values[-1], runs=len(values))


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def busy_fraction(engine, tok, steps=16):
    """(share of the wall time the GPU spent in kernels over ``steps`` greedy decode steps of
    ``engine`` from ``tok`` (S, 1), the next token) (torch.profiler; GPU only)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernel_us = sum(  # device events only: a CPU op also carries its kernels' time
        getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
        for e in prof.key_averages()
        if e.device_type != DeviceType.CPU
    )
    return min(1.0, kernel_us * 1e-6 / wall), tok
