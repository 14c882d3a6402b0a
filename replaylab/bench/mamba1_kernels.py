"""Mamba-1 (Jamba) replay kernels timed against mamba-ssm's ``selective_state_update`` on a
GPU, every provider side by side in one run, under CUDA graphs (``timing.time_ms``: median of
repeats after warm-up), for a Jamba-1.5-Mini-class layer (``SHAPE``):

    ssu        mamba-ssm selective_state_update, Mamba-1 form (state (batch, D, N), x/dt
               (batch, D), A (D, N), B/C (batch, N), dt_softplus): the state read and written
               every token
    update     ours, ``replaylab.kernels.mamba1.state_update`` (T = 1): the same work, the
               snapshot and recompute strategies' step in the engine
    step       ours, ``replaylab.kernels.mamba1.replay_step`` (T = 1, appending) with
               log_len = L // 2: the mean over a fold cycle (0 .. L - 1), rounded up
    step_full  the same at log_len = L - 1, the last step before a fold
    fold       ours, ``fold`` of L entries in place
    amortised  step + fold / L: a full log forces a fold, so this is replay's decode cost
    copy       a snapshot: one device copy of the state (batch, D, N) fp32

Each provider carries the bytes it must move per token (``_bytes``), the GB/s achieved and its
share of the device-copy bandwidth measured in the same run (``timing.copy_bandwidth_gbs``).
At batch 1 and 8 the state (512 KiB a sequence) stays in the 50 MB L2 cache between graph
replays: shares above 1 there are L2, not DRAM. Compute: the step evaluates exp(Δ ⊙ A) once per
(channel, state index, log entry), (log_len + 1) D N exponentials a token against ssu's D N
(``exps_per_token``); at long logs that, not bytes, can bind.

    from replaylab.bench.mamba1_kernels import run; result = run()   # on the GPU machine

``device="cpu"`` runs the same code through Triton's interpreter with wall-clock timing of one
call (a smoke test at tiny ``shape``; its times mean nothing).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from unittest import mock

import torch

from replaylab.bench.peers import load_kernel_peers
from replaylab.bench.provenance import provenance
from replaylab.bench.timing import copy_bandwidth_gbs, time_ms

__all__ = ["SHAPE", "run", "summary"]

# Jamba-1.5-Mini (ai21labs/AI21-Jamba-1.5-Mini config): hidden_size 4096, mamba_expand 2
# (d_inner D = 8192), mamba_d_state 16, mamba_d_conv 4, mamba_dt_rank 256
SHAPE = dict(D=8192, N=16)


def _timer(device):
    """fn -> (median ms, whether a CUDA graph was used)."""
    if torch.device(device).type == "cuda":
        return time_ms

    def once(fn):  # CPU / interpreter: one call after a warm-up call
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3, False

    return once


def _copy_gbs(device):
    if torch.device(device).type == "cuda":
        return max(copy_bandwidth_gbs() for _ in range(3))  # the first runs while clocks ramp up
    src = torch.empty(2**24, device=device)
    dst = torch.empty_like(src)
    ms, _ = _timer(device)(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def _bytes(kind, batch, D, N, n=0, L=0, sx=2):
    """Bytes a provider moves per call: fp32 state (S), inputs/logs in ``sx`` bytes, each
    parameter read once (A fp32 (D, N), D and dt_bias fp32). ``n``: log entries read."""
    state = batch * D * N * 4
    params = D * N * 4 + 2 * D * 4
    token = batch * (2 * D + N) * sx  # one token's x, dt, B (what the log holds)
    new = token + batch * N * sx + batch * D * sx  # + C, + y written
    return {
        "ssu": 2 * state + new + params,
        "step": state + n * token + new + token + params,  # + the append
        "fold": 2 * state + L * token + params,
        "copy": 2 * state,
    }[kind]


def kernel_inputs(batch, Lmax, D, N, dtype, device, T=1):
    """Random inputs of the Mamba-1 kernels: states (batch, D, N) fp32, an empty log of
    ``Lmax`` rows, T new tokens (x, dt (batch, T, D), B, C (batch, T, N) in ``dtype``), A (D,
    N) at the S4D-real initialisation, D, dt_bias (D,) fp32, ``slots`` and ``log_head``."""
    g = torch.Generator(device=device).manual_seed(0)
    r = lambda *s: torch.randn(*s, device=device, generator=g)  # noqa: E731
    A_log = torch.log(torch.arange(1, N + 1, device=device, dtype=torch.float32)).expand(D, N)
    return dict(
        states=r(batch, D, N) * 0.1,
        slots=torch.arange(batch, dtype=torch.int32, device=device),
        log_x=r(batch, Lmax, D).to(dtype),
        log_dt=(r(batch, Lmax, D) * 0.5 - 2).to(dtype),
        log_B=r(batch, Lmax, N).to(dtype),
        log_len=torch.zeros(batch, dtype=torch.int32, device=device),
        x=r(batch, T, D).to(dtype),
        dt=(r(batch, T, D) * 0.5 - 2).to(dtype),
        B=r(batch, T, N).to(dtype),
        C=r(batch, T, N).to(dtype),
        A=-torch.exp(A_log).contiguous(),  # S4D-real initialisation: A[d, n] = -(n + 1)
        D=torch.ones(D, device=device),
        dt_bias=torch.rand(D, device=device, generator=g) - 0.5,
        log_head=torch.zeros(batch, dtype=torch.int32, device=device),
    )


def ssu_call(ssu, inp, state, device):
    """selective_state_update on ``state`` (written in place) for the one new token."""
    # on CPU (interpreter) mamba-ssm's `with torch.cuda.device(...)` needs a stand-in
    cpu = torch.device(device).type != "cuda"
    ctx = mock.patch("torch.cuda.device", lambda _: contextlib.nullcontext()) if cpu else None
    with ctx or contextlib.nullcontext():
        return ssu(
            state,
            inp["x"][:, 0],
            inp["dt"][:, 0],
            inp["A"],
            inp["B"][:, 0],
            inp["C"][:, 0],
            D=inp["D"],
            dt_bias=inp["dt_bias"],
            dt_softplus=True,
        )


def run(
    batches=(1, 8, 32, 128, 256),
    Ls=(4, 8, 16, 32, 64),
    shape=None,
    device="cuda",
    dtype=torch.bfloat16,
    block_d=None,
    num_warps=None,
):
    """Per batch: ssu's and our ``state_update``'s time per decode step; ours per L (step at
    log_len L // 2 and L - 1, fold of L, amortised = step + fold / L, bytes per token, share of
    the copy bandwidth, speedup over ssu and over our update); a snapshot copy; the copy bandwidth of the same run; provenance.
    Returns a dict (nothing printed). ``block_d`` / ``num_warps``: our kernels' launch."""
    from replaylab.kernels.mamba1 import fold, replay_step, state_update

    shape = dict(SHAPE if shape is None else shape)
    D, N = shape["D"], shape["N"]
    sx = torch.empty((), dtype=dtype).element_size()
    timer = _timer(device)
    with warnings.catch_warnings():  # mamba-ssm's note on deterministic mode
        warnings.filterwarnings("ignore", message="Deterministic mode", category=UserWarning)
        peers, errors = load_kernel_peers()
    ssu = peers.get("ssu")
    copy_gbs = _copy_gbs(device)
    launch = dict(block_d=block_d, num_warps=num_warps)
    Lmax = max(Ls)
    out = []

    def row(kind, ms, graph, nbytes, **extra):
        us = ms * 1e3
        gbs = nbytes / (us * 1e-6) / 1e9
        return dict(kind=kind, us=us, graph=graph, bytes=nbytes, gbs=gbs, share=gbs / copy_gbs,
                    **extra)  # fmt: skip

    for batch in batches:
        inp = kernel_inputs(batch, Lmax, D, N, dtype, device)
        entry = dict(batch=batch, L={})
        # correctness at the full shape: our step from the checkpoint (empty log) vs ssu
        check = {}
        ours_y = replay_step(**{**inp, "log_len": torch.zeros_like(inp["log_len"])},
                             append=False, **launch)  # fmt: skip
        if ssu is not None:
            try:
                ssu_y = ssu_call(ssu, inp, inp["states"].clone(), device)
                check["max_abs_diff_vs_ssu"] = float(
                    (ours_y[:, 0].float() - ssu_y.float()).abs().max()
                )
                state = inp["states"].clone()
                entry["ssu"] = row("ssu", *timer(lambda: ssu_call(ssu, inp, state, device)),
                                   _bytes("ssu", batch, D, N, sx=sx))  # fmt: skip
            except Exception as err:  # noqa: BLE001 - record why the peer did not run
                entry["ssu"] = dict(error=repr(err)[:300])
        state = inp["states"].clone()
        update_y = state_update(
            state, *(inp[k] for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")), **launch
        )
        check["update_equals_replay_step"] = bool(torch.equal(update_y, ours_y))

        def update(state=state):
            state_update(state, *(inp[k] for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")),
                         check=False, **launch)  # fmt: skip

        entry["update"] = row("update", *timer(update), _bytes("ssu", batch, D, N, sx=sx))
        if "us" in entry.get("ssu", {}):
            entry["update"]["speedup_vs_ssu"] = entry["ssu"]["us"] / entry["update"]["us"]
        entry["check"] = check
        snap = torch.empty_like(inp["states"])
        entry["copy"] = row("copy", *timer(lambda: snap.copy_(inp["states"])),
                            _bytes("copy", batch, D, N))  # fmt: skip
        for L in Ls:
            res = {}
            for kind, n in (("step", L // 2), ("step_full", L - 1)):
                step_inp = {**inp, "log_len": torch.full_like(inp["log_len"], n)}

                def step(step_inp=step_inp):
                    replay_step(**step_inp, check=False, **launch)  # appends at row n each time

                res[kind] = row(kind, *timer(step), _bytes("step", batch, D, N, n=n, sx=sx),
                                log_len=n, exps_per_token=(n + 1) * D * N)  # fmt: skip
            fold_len = torch.full_like(inp["log_len"], L)
            states = inp["states"].clone()

            def fold_call(states=states, fold_len=fold_len):
                fold(states, inp["slots"], states, inp["slots"], inp["log_x"], inp["log_dt"],
                     inp["log_B"], fold_len, inp["A"], inp["dt_bias"], log_head=inp["log_head"],
                     check=False, **launch)  # fmt: skip

            res["fold"] = row("fold", *timer(fold_call), _bytes("fold", batch, D, N, L=L, sx=sx),
                              exps_per_sequence=L * D * N)  # fmt: skip
            amortised_us = res["step"]["us"] + res["fold"]["us"] / L
            nbytes = res["step"]["bytes"] + res["fold"]["bytes"] / L
            gbs = nbytes / (amortised_us * 1e-6) / 1e9
            res["amortised"] = dict(
                us=amortised_us,
                bytes_per_token=nbytes,
                gbs=gbs,
                share=gbs / copy_gbs,
                exps_per_token=(L // 2 + 2) * D * N,  # step + fold / L
            )
            if "us" in entry.get("ssu", {}):
                res["amortised"]["speedup_vs_ssu"] = entry["ssu"]["us"] / amortised_us
            res["amortised"]["speedup_vs_update"] = entry["update"]["us"] / amortised_us
            entry["L"][L] = res
        out.append(entry)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    prov = provenance(argv=[])
    prov["command"] = (
        f"replaylab.bench.mamba1_kernels.run(batches={tuple(batches)}, Ls={tuple(Ls)}, "
        f"shape={shape}, device={device!r}, dtype={dtype}, block_d={block_d}, "
        f"num_warps={num_warps})"
    )
    return dict(
        shape=shape,
        dtype=str(dtype),
        copy_bandwidth_gbs=copy_gbs,
        batches=out,
        peer_errors=errors,
        provenance=prov,
    )


def summary(result):
    """One line per (batch, L) from ``run``'s result: amortised decode against ssu."""
    lines = [f"copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s"]
    for entry in result["batches"]:
        b, ssu = entry["batch"], entry.get("ssu", {})
        ssu_text = f"ssu {ssu['us']:7.1f} us" if "us" in ssu else f"ssu: {ssu.get('error', '-')}"
        update = entry["update"]
        vs = f" ({update['speedup_vs_ssu']:.2f}x ssu)" if "speedup_vs_ssu" in update else ""
        lines.append(
            f"b={b:3d}: {ssu_text}, our update {update['us']:7.1f} us{vs}, "
            f"snapshot copy {entry['copy']['us']:7.1f} us"
        )
        for L, res in entry["L"].items():
            am = res["amortised"]
            speed = f", {am['speedup_vs_ssu']:.2f}x ssu" if "speedup_vs_ssu" in am else ""
            lines.append(
                f"  L={L:2d}: step {res['step']['us']:7.1f} us (log {res['step']['log_len']}) + "
                f"fold {res['fold']['us']:7.1f}/{L} = {am['us']:7.1f} us amortised, "
                f"{am['share']:.2f} of copy bw{speed}, {am['speedup_vs_update']:.2f}x our update"
            )
    return lines
