"""Probe the chunked Mamba-2 prompt kernel (kernels/ssd_chunked.py) on a GPU: for each launch
configuration, in its own process (an illegal memory access loses the CUDA context), the error
of y and the final state against the float64 recurrence relative to their scale, or the
failure; at Nemotron-H 8B's layer shape in bf16 also the median time of a 2,048-token prompt.

    python tools/ssd_chunked_probe.py [--workers 6] [--out FILE.json]
    python tools/ssd_chunked_probe.py --speed --previous OLD/ssd_chunked.py [--out FILE.json]

``--speed``: at the layer shape in bf16, in one process, each launch (chunk, warps, block of
P) of this tree's kernel beside the same launch of a previous copy of the module (``--previous``,
a file) and beside mamba-ssm's ``mamba_chunk_scan_combined``: the median time of one prompt
chunk (1 x 256 tokens, the engine's prefill chunk) and of a 2,048-token prompt, the error
against the float64 recurrence, and whether the two trees' bits agree.

Rows with 16-wide blocks go below the kernel's floor (``MIN_BLOCK``, which they explain) by
lowering it in their own process.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SMALL, LAYER = (4, 12, 2, 10), (128, 64, 8, 128)  # (H, P, G, N): the tests' and Nemotron-H 8B's


def blocks(shape, min_block):
    """(block_p, block_n): ``min_block`` (the kernel's default block of P, 32, is its floor; the
    16-wide rows lower both) and N's power of two, at least ``min_block``."""
    power = lambda n: 1 << (n - 1).bit_length()  # noqa: E731
    return min_block, max(min_block, power(shape[3]))


def inputs(T, shape, dtype, batch):
    import torch

    H, P, G, N = shape
    gen = torch.Generator().manual_seed(T)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(x=r(batch, T, H, P).to(dtype), dt=r(batch, T, H).to(dtype) - 1.0,
                A=-torch.rand(H, generator=gen) - 0.1, B=r(batch, T, G, N).to(dtype),
                C=r(batch, T, G, N).to(dtype), D=r(H), dt_bias=r(H) * 0.1,
                initial_state=r(batch, H, P, N) * 0.3)  # fmt: skip


def one(cfg: dict) -> None:
    import torch
    import triton.testing

    from replaylab.kernels import ssd_chunked
    from replaylab.scan import ssd_scan

    ssd_chunked.MIN_BLOCK = min(ssd_chunked.MIN_BLOCK, cfg["min_block"])
    block_p, block_n = blocks(cfg["shape"], cfg["min_block"])
    dtype = getattr(torch, cfg["dtype"])
    for T in cfg["Ts"]:
        t = inputs(T, cfg["shape"], dtype, 1 if cfg["shape"] == LAYER else 2)
        f64 = {k: v.cuda().double() for k, v in t.items()}
        s0 = f64.pop("initial_state")
        want = ssd_scan(**f64, dt_softplus=True, dt_limit=(0.001, 5.0), initial_state=s0,
                        compute_dtype=torch.float64)  # fmt: skip
        cuda = {k: v.cuda() for k, v in t.items()}
        run = lambda: ssd_chunked.ssd_chunked_scan(  # noqa: E731
            **cuda, dt_softplus=True, dt_limit=(0.001, 5.0), chunk_size=cfg["Q"],  # noqa: B023
            precision=cfg["precision"], num_warps=cfg["warps"], block_p=block_p, block_n=block_n,
        )  # fmt: skip
        got = run()
        torch.cuda.synchronize()
        row = {"T": T, **_error(got.y, got.state, want)}
        if cfg["dtype"] == "bfloat16" and T >= 1024:
            row["ms"] = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
        print(json.dumps(row), flush=True)


def load_previous(path):
    """The module at ``path`` (a previous tree's kernels/ssd_chunked.py), imported on its own;
    its own imports (``_delta``, the checks) resolve to this tree's modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("previous_ssd_chunked", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _error(y, state, want):
    """The largest difference from the float64 recurrence ``want`` over its largest value."""
    return {name: float((a.double() - e).abs().max() / e.abs().max())
            for name, a, e in (("y", y, want.y), ("state", state, want.state))}  # fmt: skip


def speed(previous_path, Ts=(256, 2048)) -> list[dict]:
    """Rows of the ``--speed`` sweep (see the module docstring), printed as they come. Each
    launch is timed once per tree; which tree goes first (``first`` in the row) follows the
    pattern this, previous, previous, this, ... so that both blocks of P see both orders."""
    import torch
    import triton.testing

    from replaylab.bench.peers import load_kernel_peers
    from replaylab.kernels import ssd_chunked
    from replaylab.scan import ssd_scan

    arms = {"this": ssd_chunked, "previous": load_previous(previous_path)}
    peer = load_kernel_peers()[0].get("chunk_scan")
    limit, rows = (0.001, 5.0), []
    bench = functools.partial(triton.testing.do_bench, warmup=25, rep=100, return_mode="median")
    for T in Ts:
        t = {k: v.cuda() for k, v in inputs(T, LAYER, torch.bfloat16, 1).items()}
        f64 = {k: v.double() for k, v in t.items()}
        s0 = f64.pop("initial_state")
        want = ssd_scan(**f64, dt_softplus=True, dt_limit=limit, initial_state=s0,
                        compute_dtype=torch.float64)  # fmt: skip
        bench(functools.partial(ssd_chunked.ssd_chunked_scan, **t, dt_softplus=True))  # warm-up
        if peer is not None:
            args = {k: v for k, v in t.items() if k != "initial_state"}
            run = functools.partial(peer, **args, chunk_size=256, dt_softplus=True,
                                    dt_limit=limit, initial_states=t["initial_state"],
                                    return_final_states=True)  # fmt: skip
            row = dict(T=T, arm="mamba_chunk_scan_combined", Q=256)
            try:
                y, state = run()
                row.update(ms=bench(run), **_error(y, state, want))
            except Exception as err:  # noqa: BLE001 - the peer's failure is a row, not the end
                row["error"] = repr(err)[:200]
            print(json.dumps(row), flush=True)
            rows.append(row)
        launches = itertools.product((32, 64, 128), (4, 8), (32, 64))
        for i, (Q, warps, block_p) in enumerate(launches):
            got, timed = {}, {}
            for arm in ("this", "previous")[:: -1 if (i + i // 2) % 2 else 1]:
                module = arms[arm]
                row = dict(T=T, arm=arm, Q=Q, warps=warps, block_p=block_p, first=not timed)
                run = functools.partial(module.ssd_chunked_scan, **t, dt_softplus=True,
                                        dt_limit=limit, chunk_size=Q, num_warps=warps,
                                        block_p=block_p)  # fmt: skip
                try:
                    got[arm] = run()
                    row["ms"] = bench(run)
                except Exception as err:  # noqa: BLE001 - a launch the compiler refuses
                    timed[arm] = dict(row, error=repr(err)[:200])
                    continue
                fits = [q for key, q in module._CHUNK_THAT_FITS.items()
                        if key[2:7] == (Q, block_p, 128, warps, "tf32x3")]  # fmt: skip
                timed[arm] = dict(row, Q_run=fits[0] if fits else Q,
                                  **_error(got[arm].y, got[arm].state, want))  # fmt: skip
            if len(got) == 2:
                timed["previous"]["this_equals_previous"] = all(
                    torch.equal(getattr(got["this"], f), getattr(got["previous"], f))
                    for f in ("y", "state")
                )
            for arm in ("this", "previous"):  # the file's order: this, then previous
                if arm in timed:
                    print(json.dumps(timed[arm]), flush=True)
                    rows.append(timed[arm])
    return rows


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        return one(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--out", default=None)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--previous", default=None)
    args = ap.parse_args()
    if args.speed:
        if not args.previous:
            ap.error("--speed needs --previous FILE (a previous tree's kernels/ssd_chunked.py)")
        rows = speed(args.previous)
        if args.out:
            from replaylab.bench.provenance import write_tool_result

            write_tool_result(args.out, "ssd_chunked_probe.py", rows)
        return
    cfgs = []
    for q, w in itertools.product((32, 64), (4, 8)):
        for shape, dtype, Ts, min_blocks in ((SMALL, "float32", [1, 37, 100], (16, 32)),
                                             (LAYER, "float32", [37, 300], (32,)),
                                             (LAYER, "bfloat16", [37, 2048], (32,))):  # fmt: skip
            for mb in min_blocks:
                cfgs.append(dict(shape=shape, dtype=dtype, Q=q, warps=w, min_block=mb,
                                 precision="tf32x3", Ts=Ts))  # fmt: skip
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")

    def run(cfg):
        try:
            p = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)], env=env,
                               capture_output=True, text=True, timeout=400)  # fmt: skip
        except subprocess.TimeoutExpired:
            return cfg, [], "timeout"
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        err = "" if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1][:100]
        return cfg, rows, err

    results = []
    with ThreadPoolExecutor(args.workers) as pool:
        for cfg, rows, err in pool.map(run, cfgs):
            results.append(dict(cfg, rows=rows, error=err))
            cells = " ".join(f"T{r['T']}:y{r['y']:.1e}/s{r['state']:.1e}"
                             + (f" {r['ms']:.3f}ms" if "ms" in r else "") for r in rows)  # fmt: skip
            bp, bn = blocks(cfg["shape"], cfg["min_block"])
            print(f"{cfg['shape']} {cfg['dtype']:8} Q{cfg['Q']} w{cfg['warps']} blocks {bp}x{bn} "
                  f"{cfg['precision']:6} | {cells} {err}", flush=True)  # fmt: skip
    if args.out:
        from replaylab.bench.provenance import write_tool_result

        write_tool_result(args.out, "ssd_chunked_probe.py", results)


if __name__ == "__main__":
    main()
