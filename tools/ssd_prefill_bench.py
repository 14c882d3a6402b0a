"""The Mamba-2 prompt scan alone, side by side in one run: ``kernels.ssd_chunked`` at a few
launches, PyTorch's chunked form (``scan.ssd_chunked_scan``, the engine's prefill scan before
2026-12-05) and mamba-ssm's ``mamba_chunk_scan_combined`` where it imports, at Nemotron-H 8B's
layer shape (H = 128, P = 64, N = 128, G = 8), bf16 inputs, one sequence. Each row: median
microseconds (``triton.testing.do_bench``) and the error over the scale of a float64 token
recurrence of the same inputs.

    python tools/ssd_prefill_bench.py OUT.json [--lengths 256,2048]
"""

from __future__ import annotations

import argparse
import sys
import types

import torch
import triton.testing

from replaylab.bench.provenance import write_tool_result
from replaylab.kernels.ssd_chunked import ssd_chunked_scan as kernel_scan
from replaylab.scan import ssd_chunked_scan, ssd_scan

H, P, N, G = 128, 64, 128, 8
LAUNCHES = [dict(block_p=64, num_warps=4), dict(block_p=64, num_warps=8),
            dict(block_p=32, num_warps=4), dict(block_p=64, num_warps=8, precision="tf32x3"),
            dict(block_p=64, num_warps=8, precision="tf32")]  # fmt: skip


def _inputs(T, device):
    g = torch.Generator().manual_seed(T)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = dict(x=r(1, T, H, P), dt=r(1, T, H) - 2.0, B=r(1, T, G, N), C=r(1, T, G, N))
    t = {k: v.to(device, torch.bfloat16) for k, v in t.items()}
    t.update(A=-torch.rand(H, generator=g).to(device) - 0.5, D=r(H).to(device),
             dt_bias=(r(H) * 0.1).to(device), initial_state=(r(1, H, P, N) * 0.1).to(device))  # fmt: skip
    return t


def _peer():
    """mamba-ssm's chunked scan (its Triton kernels; the CUDA extension is not needed)."""
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # noqa: BLE001 (any import failure: the row says why)
        return None, f"{type(e).__name__}: {e}"
    return mamba_chunk_scan_combined, None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--lengths", default="256,2048")
    args = p.parse_args(argv)
    device = "cuda"
    peer, why = _peer()
    rows = []
    for T in (int(v) for v in args.lengths.split(",")):
        t = _inputs(T, device)
        f64 = {k: v.double() for k, v in t.items()}
        state0 = f64.pop("initial_state")
        want = ssd_scan(**f64, dt_softplus=True, initial_state=state0, compute_dtype=torch.float64)
        scale = float(want.y.abs().max())
        arms = {"torch chunked form": lambda t=t: ssd_chunked_scan(**t, dt_softplus=True)}
        for launch in LAUNCHES:
            name = "triton " + ", ".join(f"{k}={v}" for k, v in launch.items())
            arms[name] = lambda launch=launch, t=t: kernel_scan(**t, dt_softplus=True, **launch)
        if peer is not None:
            arms["mamba-ssm mamba_chunk_scan_combined"] = lambda t=t: peer(
                t["x"], t["dt"], t["A"], t["B"], t["C"], 256, D=t["D"], dt_bias=t["dt_bias"],
                initial_states=t["initial_state"], dt_softplus=True, return_final_states=True,
            )  # fmt: skip
        for name, fn in arms.items():
            out = fn()
            y = out[0] if isinstance(out, tuple) else out.y
            us = triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3
            err = float((y.double() - want.y).abs().max()) / scale
            rows.append(dict(tokens=T, arm=name, us=us, y_error_over_scale_vs_f64=err))
            print(f"T={T:5d} {name:55s} {us:9.1f} us  err {err:.1e}", flush=True)
        base = next(r["us"] for r in rows if r["tokens"] == T and r["arm"] == "torch chunked form")
        for r in rows:
            if r["tokens"] == T:
                r["speedup_over_torch"] = base / r["us"]
    if why:
        rows.append(dict(arm="mamba-ssm mamba_chunk_scan_combined", missing=why))
    write_tool_result(args.out, "ssd_prefill_bench.py", rows)


if __name__ == "__main__":
    main()
