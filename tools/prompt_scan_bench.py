"""The prompt scans alone, side by side in one run, each family at its layer shape, bf16
inputs, one sequence: the Triton kernels of ``prefill_kernels`` against the PyTorch forms the
engine's prefill runs by default, and a peer where it imports.

- Mamba-2 at Nemotron-H 8B's shape (H = 128, P = 64, N = 128, G = 8): ``kernels.ssd_chunked``
  at a few launches, ``scan.ssd_chunked_scan``, mamba-ssm's ``mamba_chunk_scan_combined``;
- Gated DeltaNet at Qwen3.5-9B's (32 value heads of 128, 16 key heads): ``kernels.gdn_scan``
  with the corrected updates, ``scan.gdn_chunked_scan`` with them, fla's
  ``chunk_gated_delta_rule`` (no updates) where fla imports;
- Mamba-1 at Jamba-1.5-Mini's (D = 8192, N = 16): ``kernels.s6_scan``, ``scan.s6_scan`` (the
  token loop).

Each row: median microseconds (``triton.testing.do_bench``), and the output's and the final
state's errors over their scales against a float64 recurrence of the same inputs (the output
is rounded to bf16, so the fp32 state shows a kernel's own precision).

    python tools/prompt_scan_bench.py OUT.json [--lengths 256,2048] [--families mamba2,gdn,mamba1]
"""

from __future__ import annotations

import argparse
import sys
import time
import types

import torch

from replaylab.bench.provenance import write_tool_result
from replaylab.gated_deltanet import l2_normalize
from replaylab.kernels.gdn_scan import gdn_prompt_scan
from replaylab.kernels.s6_scan import s6_prompt_scan
from replaylab.kernels.ssd_chunked import ssd_chunked_scan as ssd_kernel
from replaylab.scan import gdn_chunked_scan, gdn_scan, s6_scan, ssd_chunked_scan, ssd_scan

MAMBA2_LAUNCHES = [dict(precision="tf32x3"), dict(precision="ieee"), dict(precision="tf32")]
# (block_p 64 and 8 warps, the defaults; 4 warps and block_p 32 were 2.4-2.7x slower in ieee)


def _rand(T, *shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed * 7919 + T))


def mamba2(T, device):
    H, P, N, G = 128, 64, 128, 8
    bf = lambda *s, seed: _rand(T, *s, seed=seed).to(device, torch.bfloat16)  # noqa: E731
    t = dict(x=bf(1, T, H, P, seed=1), dt=bf(1, T, H, seed=2) - 2.0, B=bf(1, T, G, N, seed=3),
             C=bf(1, T, G, N, seed=4))  # fmt: skip
    t.update(A=-_rand(T, H, seed=5).abs().to(device) - 0.5, D=_rand(T, H, seed=6).to(device),
             dt_bias=(_rand(T, H, seed=7) * 0.1).to(device),
             initial_state=(_rand(T, 1, H, P, N, seed=8) * 0.1).to(device))  # fmt: skip
    f64 = {k: v.double() for k, v in t.items()}
    init = f64.pop("initial_state")
    want = ssd_scan(**f64, dt_softplus=True, initial_state=init, compute_dtype=torch.float64)
    arms = {"torch chunked form": lambda: ssd_chunked_scan(**t, dt_softplus=True)}
    for launch in MAMBA2_LAUNCHES:
        name = "triton " + ", ".join(f"{k}={v}" for k, v in launch.items())
        arms[name] = lambda launch=launch: ssd_kernel(**t, dt_softplus=True, **launch)
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as peer
    except Exception as e:  # noqa: BLE001 (any import failure: the row says why)
        arms["mamba-ssm mamba_chunk_scan_combined"] = f"{type(e).__name__}: {e}"
    else:
        arms["mamba-ssm mamba_chunk_scan_combined"] = lambda: peer(
            t["x"], t["dt"], t["A"], t["B"], t["C"], 256, D=t["D"], dt_bias=t["dt_bias"],
            initial_states=t["initial_state"], dt_softplus=True, return_final_states=True,
        )  # fmt: skip
    return arms, want


def gdn(T, device):
    H, Hk, K, V = 32, 16, 128, 128
    q = l2_normalize(_rand(T, 1, T, Hk, K, seed=1)) * K**-0.5
    t = dict(q=q, k=l2_normalize(_rand(T, 1, T, Hk, K, seed=2)), v=_rand(T, 1, T, H, V, seed=3))
    t = {k: v.to(device, torch.bfloat16) for k, v in t.items()}
    t.update(g=(-torch.rand(1, T, H, generator=torch.Generator().manual_seed(T)) * 0.3).to(device),
             beta=torch.rand(1, T, H, generator=torch.Generator().manual_seed(T + 1)).to(device))  # fmt: skip
    state = (_rand(T, 1, H, K, V, seed=4) * 0.1).to(device)
    f64 = {k: v.double() for k, v in t.items()}
    want = gdn_scan(**f64, initial_state=state.double(), compute_dtype=torch.float64)
    arms = {
        "torch chunked form (with u)": lambda: gdn_chunked_scan(
            **t, initial_state=state, return_updates=True
        ),
        "triton gdn_scan (with u)": lambda: gdn_prompt_scan(
            **t, initial_state=state, return_updates=True
        ),
        "triton gdn_scan, block_v=32 (with u)": lambda: gdn_prompt_scan(
            **t, initial_state=state, return_updates=True, block_v=32
        ),
    }
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as peer
    except Exception as e:  # noqa: BLE001
        arms["fla chunk_gated_delta_rule (no u)"] = f"{type(e).__name__}: {e}"
    else:
        rep = H // Hk  # fla takes q, k per value head
        qh, kh = (x.repeat_interleave(rep, dim=2) for x in (t["q"], t["k"]))
        arms["fla chunk_gated_delta_rule (no u)"] = lambda: peer(
            qh, kh, t["v"], t["g"], t["beta"].to(torch.bfloat16), scale=1.0,
            initial_state=state, output_final_state=True,
        )  # fmt: skip
    return arms, want


def mamba1(T, device):
    D, N = 8192, 16
    t = dict(x=_rand(T, 1, T, D, seed=1), dt=_rand(T, 1, T, D, seed=2) - 3.0,
             B=_rand(T, 1, T, N, seed=3), C=_rand(T, 1, T, N, seed=4))  # fmt: skip
    t = {k: v.to(device, torch.bfloat16) for k, v in t.items()}
    A = (-_rand(T, D, N, seed=5).abs() - 0.5).to(device)
    Ds, bias = _rand(T, D, seed=6).to(device), (_rand(T, D, seed=7) * 0.1).to(device)
    state = (_rand(T, 1, D, N, seed=8) * 0.1).to(device)
    f64 = {k: v.double() for k, v in t.items()}
    want = s6_scan(f64["x"], f64["dt"], A.double(), f64["B"], f64["C"], Ds.double(),
                   dt_bias=bias.double(), dt_softplus=True, initial_state=state.double(),
                   compute_dtype=torch.float64)  # fmt: skip
    args = (t["x"], t["dt"], A, t["B"], t["C"], Ds)
    arms = {
        "torch token loop": lambda: s6_scan(
            *args, dt_bias=bias, dt_softplus=True, initial_state=state
        ),  # fmt: skip
        "triton s6_scan": lambda: s6_prompt_scan(*args, bias, initial_state=state),
        "triton s6_scan, block_d=64": lambda: s6_prompt_scan(
            *args, bias, initial_state=state, block_d=64
        ),
    }
    return arms, want


FAMILIES = {"mamba2": mamba2, "gdn": gdn, "mamba1": mamba1}
# each family: (arms: name -> a call returning (y, final state), or why the arm is missing;
# the float64 recurrence's ScanResult)


def _error(got, want):
    """Largest absolute difference over ``want``'s largest magnitude."""
    return float((got.double() - want).abs().max()) / float(want.abs().max())


def _time_us(fn, device):
    if device == "cuda":
        import triton.testing  # after replaylab, which sets Triton's interpreter on a CPU

        return triton.testing.do_bench(fn, warmup=10, rep=50) * 1e3
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--lengths", default="256,2048")
    p.add_argument("--families", default="mamba2,gdn,mamba1")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (one timed call each)")
    args = p.parse_args(argv)
    device = args.device
    rows = []
    for family in args.families.split(","):
        for T in (int(v) for v in args.lengths.split(",")):
            arms, want = FAMILIES[family](T, device)
            for name, fn in arms.items():
                if isinstance(fn, str):
                    rows.append(dict(family=family, tokens=T, arm=name, missing=fn))
                    continue
                try:
                    out = fn()
                    y, state = (out.y, out.state) if hasattr(out, "y") else out[:2]
                except Exception as e:  # noqa: BLE001 (a peer that fails here: the row says why)
                    rows.append(dict(family=family, tokens=T, arm=name, failed=repr(e)[:300]))
                    print(f"{family:6s} T={T:5d} {name:52s} failed: {e!r}"[:200], flush=True)
                    continue
                us = _time_us(fn, device)
                err, state_err = _error(y, want.y), _error(state, want.state)
                rows.append(dict(family=family, tokens=T, arm=name, us=us,
                                 y_error_over_scale_vs_f64=err,
                                 state_error_over_scale_vs_f64=state_err))  # fmt: skip
                write_tool_result(args.out, "prompt_scan_bench.py", rows)  # a cut run keeps it
                print(f"{family:6s} T={T:5d} {name:52s} {us:10.1f} us  err {err:.1e} "
                      f"state err {state_err:.1e}", flush=True)  # fmt: skip
            timed = [r for r in rows if r["family"] == family and r["tokens"] == T and "us" in r]
            for r in timed:
                r["speedup_over_torch"] = timed[0]["us"] / r["us"]  # the torch form is first
    write_tool_result(args.out, "prompt_scan_bench.py", rows)


if __name__ == "__main__":
    main()
