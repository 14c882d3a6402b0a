"""The host's time per call of the depthwise causal conv that every Mamba-2 prefill chunk and
prefix-hit seat runs (``Mamba2Mixer.conv``: ``F.conv1d`` with groups = channels), beside the
same conv written as d_conv shifted products (fp32, rounded once), ``kernels.conv.conv_prompt``
(one launch, SiLU included), and the layer's
in-projection over the T rows (F.linear, 4,096 -> 18,560), on a GPU
(issue 38: a prefix hit is host-bound; ``data/prefill_profile_fused_h100_ed17032.json`` has
6 conv1d calls of a replay hit at about 1.6 ms of its host time, under cProfile).

For T new tokens after a window of d_conv - 1 (the 8B layer: 10,240 channels, d_conv 4, bf16),
per T: the first call at that T (a shape not seen before) and the median of later calls, each
as the host's wall time of the call alone (no synchronisation inside: what a launch costs the
host) and the device's (CUDA events behind a sleep kernel); whether the two convs agree (max
|difference|). Each library's start-up is paid first, at a shape not timed; the file is
written after each T. The ``F.conv1d`` and shifted arms leave out the model's cat and SiLU
around the conv; ``conv_prompt`` includes them.

    python3 tools/conv_host_probe.py OUT.json
"""

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from replaylab.bench.provenance import provenance
from replaylab.kernels.conv import conv_prompt

C, K = 10240, 4
TOKENS = (1, 5, 17, 33, 48, 97, 128, 256, 2048)
dev = "cuda"
weight = torch.randn(C, 1, K, device=dev, dtype=torch.bfloat16) * 0.3
bias = torch.randn(C, device=dev, dtype=torch.bfloat16) * 0.1
w_in = torch.randn(18560, 4096, device=dev, dtype=torch.bfloat16) * 0.02  # the in-projection


def conv1d(full):  # full: (1, K - 1 + T, C)
    return F.conv1d(full.transpose(1, 2), weight, bias, groups=C).transpose(1, 2)


def shifted(full):  # in fp32, rounded once to bf16 at the end, as conv1d's accumulation
    T = full.shape[1] - (K - 1)
    w = weight[:, 0].float()
    out = full[:, 0:T].float() * w[:, 0]
    for k in range(1, K):
        out = out + full[:, k : k + T].float() * w[:, k]
    return (out + bias.float()).to(full.dtype)


def kernel(full):  # kernels.conv.conv_prompt (SiLU included: the others leave it out)
    return conv_prompt(full[:, K - 1 :], full[:, : K - 1], weight[:, 0], bias)


def project(rows):  # rows: (1, T, 4096) -> (1, T, 18560), the layer's in-projection
    return F.linear(rows, w_in)


def timed(fn, x, reps=30):
    """(host µs of the first call, median host µs of later calls, median device µs). The
    device's time is taken behind a long ``torch.cuda._sleep``, so that the events bracket the
    kernels alone and not the host's enqueueing of them."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(x)
    first = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    host, device = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000)  # about a millisecond: the host runs ahead of the device
        start.record()
        t0 = time.perf_counter()
        fn(x)
        host.append((time.perf_counter() - t0) * 1e6)
        end.record()
        torch.cuda.synchronize()
        device.append(start.elapsed_time(end) * 1e3)
    return first, statistics.median(host), statistics.median(device)


def save(rows):
    prov = {**provenance(), "command": "python3 tools/conv_host_probe.py " + " ".join(sys.argv[1:])}
    json.dump(dict(rows=rows, channels=C, d_conv=K, **prov), open(sys.argv[1], "w"), indent=1)


rows = []
with torch.no_grad():
    for fn in (conv1d, shifted, kernel):  # each one-off start-up, at a shape not timed
        fn(torch.randn(1, K - 1 + 3, C, device=dev, dtype=torch.bfloat16))
    project(torch.randn(1, 3, 4096, device=dev, dtype=torch.bfloat16))
    for T in TOKENS:
        full = torch.randn(1, K - 1 + T, C, device=dev, dtype=torch.bfloat16)
        row = dict(T=T)
        arms = (("conv1d", conv1d), ("shifted", shifted), ("conv_prompt", kernel),
                ("matmul_rows", project))  # fmt: skip
        for name, fn in arms:
            x = full if name != "matmul_rows" else full[:, K - 1 :, :4096].contiguous()
            row[name] = dict(zip(("first_host_us", "host_us", "device_us"), timed(fn, x)))
        row["max_abs_difference"] = float(
            (conv1d(full).float() - shifted(full).float()).abs().max()
        )
        rows.append(row)
        save(rows)
        print(f"T={T:5d} " + " ".join(
            f"{n}: first {row[n]['first_host_us']:.0f} host {row[n]['host_us']:.1f} "
            f"device {row[n]['device_us']:.1f} us;" for n, _ in arms
        ) + f" |diff| {row['max_abs_difference']:.3g}")  # fmt: skip
