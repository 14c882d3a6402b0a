"""Replay kernels timed against their peers on a GPU, every provider side by side in one run,
under CUDA graphs (median of repeats after warm-up), for an 8B-class Mamba-2 layer
(H=128, P=64, N=128, G=8):

    replay_step      ours: outputs of T tokens from checkpoint + log of length L, no state write
    fold             ours: write the state at checkpoint + L (restore / log full)
    ssu              mamba-ssm selective_state_update: state read and written every token;
                     for T > 1 one state copy kept per draft for rollback (the per-draft path)
    chunk_scan       mamba-ssm mamba_chunk_scan_combined over the L + T tokens from the checkpoint
    fla_recurrent / fla_chunk   flash-linear-attention fused_recurrent_simple_gla /
                     chunk_simple_gla over the same L + T tokens (SSD as simple GLA: q=C, k=B,
                     v=Δx, g=ΔA, heads expanded from groups as fla expects)
    copy             restoring a snapshot: one device copy of the state

Each row carries the bytes the provider must move (``replaylab.costmodel.kernel_bytes``), the
achieved GB/s and the fraction of the device-copy bandwidth measured in the same run.
"""

from __future__ import annotations

import math

import torch

from replaylab.bench.peers import load_kernel_peers
from replaylab.bench.timing import copy_bandwidth_gbs, time_ms
from replaylab.costmodel import kernel_bytes
from replaylab.results import amortised_decode  # also re-exported: notebooks read it here

__all__ = ["SHAPE", "kernel_inputs", "run_kernels", "sweep", "summary", "amortised_decode"]

SHAPE = dict(H=128, P=64, N=128, G=8)
BATCHES = [1, 8, 32, 64, 128]
LOG_LENS = [1, 4, 16, 64]
VERIFY_T = [1, 4, 8]
FOLD_LENS = [1, 4, 16, 64]


def kernel_inputs(batch, L, T, dtype=torch.bfloat16, Lmax=None):
    """Random inputs of the kernels at ``SHAPE`` on the GPU: states (batch, H, P, N) fp32, a log
    of ``Lmax`` (default L + T) rows with ``log_len`` = L, T new tokens (x, dt, B, C in
    ``dtype``), A, D, dt_bias (H,) fp32, and ``slots``."""
    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    dev = "cuda"
    Lmax = Lmax or L + T
    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    return dict(
        states=r(batch, H, P, N) * 0.1,
        slots=torch.arange(batch, dtype=torch.int32, device=dev),
        log_x=r(batch, Lmax, H, P).to(dtype),
        log_dt=(r(batch, Lmax, H) - 2).to(dtype),
        log_B=r(batch, Lmax, G, N).to(dtype),
        log_C=r(batch, Lmax, G, N).to(dtype),
        log_len=torch.full((batch,), L, dtype=torch.int32, device=dev),
        x=r(batch, T, H, P).to(dtype),
        dt=(r(batch, T, H) - 2).to(dtype),
        B=r(batch, T, G, N).to(dtype),
        C=r(batch, T, G, N).to(dtype),
        A=-torch.rand(H, device=dev) * 4,
        D=r(H),
        dt_bias=torch.rand(H, device=dev) - 0.5,
    )


def _providers(inp, L, T, peers):
    """name -> zero-argument callable, for one (batch, L, T) shape."""
    from replaylab.kernels.mamba2 import replay_step

    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    batch = inp["x"].shape[0]
    out = {}
    y = torch.empty_like(inp["x"])

    def ours():
        replay_step(**inp, dt_limit=(0.0, math.inf), out=y, check=False)
        inp["log_len"].sub_(T)  # keep the log length fixed across graph replays

    out["replay_step"] = ours

    if "ssu" in peers:
        ssu = peers["ssu"]
        state = inp["states"].clone()
        drafts = torch.empty((max(T - 1, 0),) + state.shape, device="cuda")
        A = inp["A"][:, None, None].expand(H, P, N)
        D = inp["D"][:, None].expand(H, P)
        bias = inp["dt_bias"][:, None].expand(H, P)
        dts = [inp["dt"][:, t, :, None].expand(batch, H, P) for t in range(T)]

        def ssu_path():
            for t in range(T):
                ssu(
                    state,
                    inp["x"][:, t],
                    dts[t],
                    A,
                    inp["B"][:, t],
                    inp["C"][:, t],
                    D=D,
                    dt_bias=bias,
                    dt_softplus=True,
                )
                if t < T - 1:
                    drafts[t].copy_(state)  # keep each draft's state for rollback

        out["ssu"] = ssu_path

    seq = {k: torch.cat([inp[f"log_{k}"][:, :L], inp[k]], 1) for k in ("x", "dt", "B", "C")}
    if "chunk_scan" in peers:
        scan = peers["chunk_scan"]
        out["chunk_scan"] = lambda: scan(
            seq["x"],
            seq["dt"],
            inp["A"],
            seq["B"],
            seq["C"],
            256,
            D=inp["D"],
            dt_bias=inp["dt_bias"],
            dt_softplus=True,
            initial_states=inp["states"],
            return_final_states=True,
        )
    if "fla_recurrent" in peers or "fla_chunk" in peers:
        delta = torch.nn.functional.softplus(seq["dt"].float() + inp["dt_bias"])
        rep = H // G
        q = seq["C"].repeat_interleave(rep, 2).contiguous()
        k = seq["B"].repeat_interleave(rep, 2).contiguous()
        v = (seq["x"].float() * delta[..., None]).to(seq["x"].dtype).contiguous()
        g = (delta * inp["A"]).contiguous()
        h0 = inp["states"].transpose(-1, -2).contiguous()  # fla keeps (K=N, V=P)
        for name in ("fla_recurrent", "fla_chunk"):
            if name in peers:
                fn = peers[name]
                out[name] = lambda fn=fn: fn(
                    q=q, k=k, v=v, g=g, scale=1.0, initial_state=h0, output_final_state=True
                )
    return out


def sweep(batches=(1, 8, 32, 128)):
    """BLOCK_P x num_warps per kernel and batch (decode, T=1, L=16; fold of 16 entries), with
    mamba-ssm's ``selective_state_update`` beside them at each batch and the fold's bandwidth
    as a fraction of the device copy measured in the same run: the numbers behind
    ``replaylab.kernels.mamba2.LAUNCH`` and ``replaylab.kernels.decode.LAUNCH_STATE_UPDATE``."""
    from replaylab.kernels.decode import state_update
    from replaylab.kernels.mamba2 import fold, replay_step

    peers, _ = load_kernel_peers()
    copy_gbs = max(copy_bandwidth_gbs() for _ in range(3))
    rows = []

    def record(kernel, batch, bp, w, fn, nbytes):
        us = time_ms(fn)[0] * 1e3
        gbs = nbytes / us / 1e3
        rows.append(
            dict(
                kernel=kernel,
                batch=batch,
                block_p=bp,
                num_warps=w,
                us=us,
                gbs=gbs,
                copy_fraction=gbs / copy_gbs,
            )
        )

    for batch in batches:
        inp = kernel_inputs(batch, 16, 1)
        y = torch.empty_like(inp["x"])
        step_bytes = kernel_bytes("replay_step", batch, 16, 1, **SHAPE)
        for bp in (16, 32, 64):
            for w in (1, 2, 4):

                def fn(bp=bp, w=w):
                    replay_step(**inp, out=y, check=False, block_p=bp, num_warps=w)
                    inp["log_len"].sub_(1)

                record("replay_step T=1 L=16", batch, bp, w, fn, step_bytes)
        state = inp["states"].clone()
        ssu_bytes = kernel_bytes("ssu", batch, 16, 1, **SHAPE)
        for bp in (8, 16, 32, 64):
            for w in (2, 4):
                fn = lambda bp=bp, w=w: state_update(  # noqa: E731
                    state,
                    inp["x"],
                    inp["dt"],
                    inp["B"],
                    inp["C"],
                    inp["A"],
                    inp["D"],
                    inp["dt_bias"],
                    (0.0, math.inf),
                    block_p=bp,
                    num_warps=w,
                )
                record("state_update T=1", batch, bp, w, fn, ssu_bytes)
        if "ssu" in peers:
            record(
                "mamba-ssm selective_state_update T=1",
                batch,
                None,
                None,
                _providers(inp, 16, 1, {"ssu": peers["ssu"]})["ssu"],
                ssu_bytes,
            )
        fin = kernel_inputs(batch, 16, 1, Lmax=16)
        dst = torch.empty_like(fin["states"])
        fold_len = torch.full((batch,), 16, dtype=torch.int32, device="cuda")
        fold_bytes = kernel_bytes("fold", batch, 16, 0, **SHAPE)
        for bp in (8, 16, 32, 64):
            for w in (1, 2, 4, 8):
                fn = lambda bp=bp, w=w: fold(  # noqa: E731
                    fin["states"],
                    fin["slots"],
                    dst,
                    fin["slots"],
                    fin["log_x"],
                    fin["log_dt"],
                    fin["log_B"],
                    fold_len,
                    fin["A"],
                    fin["dt_bias"],
                    check=False,
                    block_p=bp,
                    num_warps=w,
                )
                record("fold L=16", batch, bp, w, fn, fold_bytes)
    return dict(rows=rows, copy_bandwidth_gbs=copy_gbs)


def run_kernels(quick=False, progress=True, batches=None, log_lens=None, ts=None, fold=True):
    from tqdm.auto import tqdm

    from replaylab.kernels.mamba2 import fold

    peers, errors = load_kernel_peers()
    bw = max(copy_bandwidth_gbs() for _ in range(3))  # the first runs while clocks ramp up
    default = (BATCHES, LOG_LENS, VERIFY_T) if not quick else ([1, 32], [4, 16], [1, 4])
    batches, logs, ts = batches or default[0], log_lens or default[1], ts or default[2]
    rows = []

    def record(kind, provider, batch, L, T, ms, graph, err=None):
        nbytes = kernel_bytes(provider, batch, L, T, **SHAPE)
        row = dict(kind=kind, provider=provider, batch=batch, log_len=L, T=T, graph=graph)
        if err is None:
            gbs = nbytes / (ms * 1e-3) / 1e9
            row.update(us=ms * 1e3, bytes=nbytes, gbs=gbs, frac_copy_bw=gbs / bw)
        else:
            row["error"] = err
        rows.append(row)

    shapes = [(b, L, T) for b in batches for L in logs for T in ts]
    for batch, L, T in tqdm(shapes, desc="replay shapes", disable=not progress):
        inp = kernel_inputs(batch, L, T)
        for name, fn in _providers(inp, L, T, peers).items():
            if name == "ssu" and L != logs[0]:
                continue  # ssu does not depend on the log length: time it once per (batch, T)
            try:
                ms, graph = time_ms(fn)
                record("verify" if T > 1 else "decode", name, batch, L, T, ms, graph)
            except Exception as err:  # noqa: BLE001
                record(
                    "verify" if T > 1 else "decode", name, batch, L, T, None, None, repr(err)[:300]
                )
        del inp
        torch.cuda.empty_cache()
    for batch in tqdm(batches if fold else [], desc="fold vs copy", disable=not progress):
        for L in FOLD_LENS if not quick else [16]:
            inp = kernel_inputs(batch, L, 1, Lmax=L)
            src = inp["states"]
            dst = torch.empty_like(src)
            slots = inp["slots"]
            fold_len = torch.full((batch,), L, dtype=torch.int32, device="cuda")
            ms, graph = time_ms(
                lambda: fold(
                    src,
                    slots,
                    dst,
                    slots,
                    inp["log_x"],
                    inp["log_dt"],
                    inp["log_B"],
                    fold_len,
                    inp["A"],
                    inp["dt_bias"],
                    check=False,
                )
            )
            record("fold", "fold", batch, L, 0, ms, graph)
            ms, graph = time_ms(lambda: dst.copy_(src))
            record("fold", "copy", batch, L, 0, ms, graph)
    return dict(rows=rows, copy_bandwidth_gbs=bw, peer_errors=errors)


def summary(result):
    """Side-by-side ratios for the issue's targets, from one run's rows (decode amortised)."""
    rows = [r for r in result["rows"] if "us" in r]
    get = lambda **k: next((r for r in rows if all(r[a] == v for a, v in k.items())), None)  # noqa: E731
    lines = []
    # the decode figure: a full log forces a fold, so a step costs step + fold(L)/L (the step is
    # timed with L entries in the log: its longest, a bound)
    decode = amortised_decode(result)
    for batch in sorted({r["batch"] for r in rows}):
        for d in (d for d in decode if d["batch"] == batch):
            lines.append(
                f"decode  b={batch:3d} L={d['L']:2d}: step {d['step_us']:7.1f} us + fold "
                f"{d['fold_us']:7.1f}/{d['L']} = {d['amortised_us']:7.1f} us amortised, ssu "
                f"{d['ssu_us']:7.1f} us: {d['speedup']:.2f}x"
            )
        for T in sorted({r["T"] for r in rows if r["T"] > 1}):
            ssu = get(provider="ssu", batch=batch, T=T)
            ours = get(provider="replay_step", batch=batch, log_len=16, T=T) or get(
                provider="replay_step", batch=batch, T=T
            )
            if ours and ssu:
                lines.append(
                    f"verify  b={batch:3d} T={T} L={ours['log_len']:2d}: ours "
                    f"{ours['us']:8.1f} us, per-draft ssu {ssu['us']:8.1f} us, speedup "
                    f"{ssu['us'] / ours['us']:.2f}x"
                )
        f, c = (
            get(provider="fold", batch=batch, log_len=16),
            get(provider="copy", batch=batch, log_len=16),
        )
        if f and c:
            lines.append(
                f"fold16  b={batch:3d}: fold {f['us']:8.1f} us, copy {c['us']:8.1f} us, "
                f"ratio {f['us'] / c['us']:.2f}x"
            )
    return lines
