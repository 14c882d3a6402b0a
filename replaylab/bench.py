"""Benchmarks, one harness: ``python -m replaylab.bench kernels [--quick] [--out FILE]``.

``kernels`` times, on a GPU, every provider side by side in one run, under CUDA graphs (median
of repeats after warm-up), for an 8B-class Mamba-2 layer (H=128, P=64, N=128, G=8):

    replay_step      ours: outputs of T tokens from checkpoint + log of length L, no state write
    fold             ours: write the state at checkpoint + L (restore / log full)
    ssu              mamba-ssm selective_state_update: state read and written every token;
                     for T > 1 one state copy kept per draft for rollback (the per-draft path)
    chunk_scan       mamba-ssm mamba_chunk_scan_combined over the L + T tokens from the checkpoint
    fla_recurrent / fla_chunk   flash-linear-attention fused_recurrent_simple_gla /
                     chunk_simple_gla over the same L + T tokens (SSD as simple GLA: q=C, k=B,
                     v=Δx, g=ΔA, heads expanded from groups as fla expects)
    copy             restoring a snapshot: one device copy of the state

Each row carries the bytes the provider must move (by the formula in ``_bytes``), the achieved
GB/s and the fraction of the device-copy bandwidth measured in the same run. Results go to a
JSON file with device, versions, date and command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time

import torch

SHAPE = dict(H=128, P=64, N=128, G=8)
BATCHES = [1, 8, 32, 64, 128]
LOG_LENS = [1, 4, 16, 64]
VERIFY_T = [1, 4, 8]
FOLD_LENS = [1, 4, 16, 64]


def _versions():
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("triton", "mamba_ssm", "fla", "transformers"):
        try:
            out[name] = getattr(__import__(name), "__version__", "?")
        except Exception as err:  # noqa: BLE001 - record why a peer is missing
            out[name] = f"unavailable: {type(err).__name__}: {err}"[:200]
    return out


def _time(fn, graphs=True):
    """Median milliseconds of fn under a CUDA graph (falls back to plain launches)."""
    import triton.testing
    fn()
    torch.cuda.synchronize()
    if graphs:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"), True
        except Exception:  # noqa: BLE001 - some providers cannot be captured
            torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), False


def _inputs(batch, L, T, dtype=torch.bfloat16, Lmax=None):
    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    dev = "cuda"
    Lmax = Lmax or L + T
    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    return dict(
        states=r(batch, H, P, N) * 0.1, slots=torch.arange(batch, dtype=torch.int32, device=dev),
        log_x=r(batch, Lmax, H, P).to(dtype), log_dt=(r(batch, Lmax, H) - 2).to(dtype),
        log_B=r(batch, Lmax, G, N).to(dtype), log_C=r(batch, Lmax, G, N).to(dtype),
        log_len=torch.full((batch,), L, dtype=torch.int32, device=dev),
        x=r(batch, T, H, P).to(dtype), dt=(r(batch, T, H) - 2).to(dtype),
        B=r(batch, T, G, N).to(dtype), C=r(batch, T, G, N).to(dtype),
        A=-torch.rand(H, device=dev) * 4, D=r(H), dt_bias=torch.rand(H, device=dev) - 0.5)


def _bytes(kind, batch, L, T, esize=2):
    """Bytes a provider must move, by what it reads and writes at least once."""
    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    state = batch * H * P * N * 4
    token = batch * (H * P + H + 2 * G * N) * esize      # x, dt, B, C of one token
    y = batch * T * H * P * esize
    return {
        "replay_step": state + (L + T) * token + T * token + y,   # read S_c, log, new; append
        "ssu": 2 * T * state + T * token + y + (T - 1) * state * (T > 1),  # + per-draft copies
        "chunk_scan": 2 * state + (L + T) * token + (L + T) * batch * H * P * esize,
        "fla_recurrent": 2 * state + (L + T) * batch * H * (2 * N + P + 1) * esize
        + (L + T) * batch * H * P * esize,
        "fla_chunk": 2 * state + (L + T) * batch * H * (2 * N + P + 1) * esize
        + (L + T) * batch * H * P * esize,
        "fold": 2 * state + L * token,
        "copy": 2 * state,
    }[kind]


def _providers(inp, L, T, peers):
    """name -> zero-argument callable, for one (batch, L, T) shape."""
    from replaylab.kernels.replay import replay_step
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
                ssu(state, inp["x"][:, t], dts[t], A, inp["B"][:, t], inp["C"][:, t], D=D,
                    dt_bias=bias, dt_softplus=True)
                if t < T - 1:
                    drafts[t].copy_(state)  # keep each draft's state for rollback
        out["ssu"] = ssu_path

    seq = {k: torch.cat([inp[f"log_{k}"][:, :L], inp[k]], 1) for k in ("x", "dt", "B", "C")}
    if "chunk_scan" in peers:
        scan = peers["chunk_scan"]
        out["chunk_scan"] = lambda: scan(seq["x"], seq["dt"], inp["A"], seq["B"], seq["C"], 256,
                                         D=inp["D"], dt_bias=inp["dt_bias"], dt_softplus=True,
                                         initial_states=inp["states"], return_final_states=True)
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
                out[name] = (lambda fn=fn: fn(q=q, k=k, v=v, g=g, scale=1.0, initial_state=h0,
                                              output_final_state=True))
    return out


def _load_peers():
    peers, errors = {}, {}
    try:
        from replaylab.oracles import _prepare_import
        _prepare_import()  # as when data/bench_kernels.json was measured
        from mamba_ssm.ops.triton.selective_state_update import selective_state_update
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        peers["ssu"], peers["chunk_scan"] = selective_state_update, mamba_chunk_scan_combined
    except Exception as err:  # noqa: BLE001
        errors["mamba_ssm"] = repr(err)[:300]
    try:
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
        peers["fla_recurrent"], peers["fla_chunk"] = fused_recurrent_simple_gla, chunk_simple_gla
    except Exception as err:  # noqa: BLE001
        errors["fla"] = repr(err)[:300]
    return peers, errors


def copy_bandwidth_gbs(gib=2):
    """Device-copy bandwidth, read + write bytes per second (GB/s), on ``gib`` GiB."""
    src = torch.empty(gib * 2**30 // 4, device="cuda")
    dst = torch.empty_like(src)
    ms, _ = _time(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def sweep():
    """Time each kernel for BLOCK_P x num_warps at batch 32 (L=16, T=1 and 4; fold 16): the
    numbers behind ``replaylab.kernels.replay.LAUNCH``."""
    from replaylab.kernels.replay import fold, replay_step
    rows = []
    for T in (1, 4):
        inp = _inputs(32, 16, T)
        y = torch.empty_like(inp["x"])
        for bp in (8, 16, 32, 64):
            for w in (2, 4, 8):
                def fn():
                    replay_step(**inp, out=y, check=False, block_p=bp, num_warps=w)
                    inp["log_len"].sub_(T)
                rows.append(dict(kernel=f"replay_step T={T}", block_p=bp, num_warps=w,
                                 us=_time(fn)[0] * 1e3))
    inp = _inputs(32, 16, 1, Lmax=16)
    dst = torch.empty_like(inp["states"])
    fold_len = torch.full((32,), 16, dtype=torch.int32, device="cuda")
    for bp in (8, 16, 32, 64):
        for w in (2, 4, 8):
            fn = lambda: fold(inp["states"], inp["slots"], dst, inp["slots"], inp["log_x"],  # noqa: E731
                              inp["log_dt"], inp["log_B"], fold_len, inp["A"], inp["dt_bias"],
                              check=False, block_p=bp, num_warps=w)
            rows.append(dict(kernel="fold L=16", block_p=bp, num_warps=w, us=_time(fn)[0] * 1e3))
    return rows


def run_kernels(quick=False, progress=True, batches=None, log_lens=None, ts=None, fold=True):
    from tqdm.auto import tqdm

    from replaylab.kernels.replay import fold
    peers, errors = _load_peers()
    bw = max(copy_bandwidth_gbs() for _ in range(3))  # the first runs while clocks ramp up
    default = (BATCHES, LOG_LENS, VERIFY_T) if not quick else ([1, 32], [4, 16], [1, 4])
    batches, logs, ts = batches or default[0], log_lens or default[1], ts or default[2]
    rows = []

    def record(kind, provider, batch, L, T, ms, graph, err=None):
        nbytes = _bytes(provider, batch, L, T)
        row = dict(kind=kind, provider=provider, batch=batch, log_len=L, T=T, graph=graph)
        if err is None:
            gbs = nbytes / (ms * 1e-3) / 1e9
            row.update(us=ms * 1e3, bytes=nbytes, gbs=gbs, frac_copy_bw=gbs / bw)
        else:
            row["error"] = err
        rows.append(row)

    shapes = [(b, L, T) for b in batches for L in logs for T in ts]
    for batch, L, T in tqdm(shapes, desc="replay shapes", disable=not progress):
        inp = _inputs(batch, L, T)
        for name, fn in _providers(inp, L, T, peers).items():
            if name == "ssu" and L != logs[0]:
                continue  # ssu does not depend on the log length: time it once per (batch, T)
            try:
                ms, graph = _time(fn)
                record("verify" if T > 1 else "decode", name, batch, L, T, ms, graph)
            except Exception as err:  # noqa: BLE001
                record("verify" if T > 1 else "decode", name, batch, L, T, None, None,
                       repr(err)[:300])
        del inp
        torch.cuda.empty_cache()
    for batch in tqdm(batches if fold else [], desc="fold vs copy", disable=not progress):
        for L in (FOLD_LENS if not quick else [16]):
            inp = _inputs(batch, L, 1, Lmax=L)
            src = inp["states"]
            dst = torch.empty_like(src)
            slots = inp["slots"]
            fold_len = torch.full((batch,), L, dtype=torch.int32, device="cuda")
            ms, graph = _time(lambda: fold(src, slots, dst, slots, inp["log_x"], inp["log_dt"],
                                           inp["log_B"], fold_len, inp["A"], inp["dt_bias"],
                                           check=False))
            record("fold", "fold", batch, L, 0, ms, graph)
            ms, graph = _time(lambda: dst.copy_(src))
            record("fold", "copy", batch, L, 0, ms, graph)
    return dict(rows=rows, copy_bandwidth_gbs=bw, peer_errors=errors)


def summary(result):
    """Side-by-side ratios for the issue's targets, from one run's rows."""
    rows = [r for r in result["rows"] if "us" in r]
    get = lambda **k: next((r for r in rows if all(r[a] == v for a, v in k.items())), None)  # noqa: E731
    lines = []
    for batch in sorted({r["batch"] for r in rows}):
        ssu1 = get(provider="ssu", batch=batch, T=1)
        for L in sorted({r["log_len"] for r in rows if r["kind"] == "decode"}):
            ours = get(provider="replay_step", batch=batch, log_len=L, T=1)
            if ours and ssu1:
                lines.append(f"decode  b={batch:3d} L={L:2d}: ours {ours['us']:8.1f} us "
                             f"({ours['frac_copy_bw']:.0%} of copy bw), ssu {ssu1['us']:8.1f} us, "
                             f"speedup {ssu1['us'] / ours['us']:.2f}x")
        for T in sorted({r["T"] for r in rows if r["T"] > 1}):
            ssu = get(provider="ssu", batch=batch, T=T)
            ours = get(provider="replay_step", batch=batch, log_len=16, T=T) or \
                get(provider="replay_step", batch=batch, T=T)
            if ours and ssu:
                lines.append(f"verify  b={batch:3d} T={T} L={ours['log_len']:2d}: ours "
                             f"{ours['us']:8.1f} us, per-draft ssu {ssu['us']:8.1f} us, speedup "
                             f"{ssu['us'] / ours['us']:.2f}x")
        f, c = get(provider="fold", batch=batch, log_len=16), get(provider="copy", batch=batch, log_len=16)
        if f and c:
            lines.append(f"fold16  b={batch:3d}: fold {f['us']:8.1f} us, copy {c['us']:8.1f} us, "
                         f"ratio {f['us'] / c['us']:.2f}x")
    return lines


# --- end-to-end decoding -------------------------------------------------------------------

def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _spread(values):
    values = sorted(values)
    return dict(median=values[len(values) // 2], min=values[0], max=values[-1], runs=len(values))


def decode_once(model, prompt, n_new, strategy, interval, weights_bytes):
    """Greedy decode timed after the prefill; peak memory per sequence minus the weights."""
    from replaylab.cache import HybridCache
    device = prompt.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cache = HybridCache(model, prompt.shape[0], strategy, interval=interval)
    logits = model(prompt, cache)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n_new):
        logits = model(logits[:, -1].argmax(-1, keepdim=True), cache)
    _sync(device)
    seconds = (time.perf_counter() - t0) / n_new
    peak = (torch.cuda.max_memory_allocated() - weights_bytes if cuda else cache.stats.peak_bytes)
    return seconds, peak / prompt.shape[0]


def _hfdecode_once(hf, prompt, n_new, weights_bytes):
    """transformers generate (greedy): decode seconds per token = (t(n) - t(1)) / (n - 1)."""
    device = prompt.device
    mask = torch.ones_like(prompt)
    times = {}
    for n in (1, n_new):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        _sync(device)
        t0 = time.perf_counter()
        hf.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                    do_sample=False)
        _sync(device)
        times[n] = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - weights_bytes if device.type == "cuda" else None
    return (times[n_new] - times[1]) / (n_new - 1), (None if peak is None else peak / prompt.shape[0])


@torch.no_grad()
def run_decode(preset_name="tiny", batches=(1, 4), n_new=32, prompt_len=64, repeats=3,
               interval=16, latency_factor=4.0, max_batch=512, progress=True):
    """The seed's measurements for every strategy, side by side with transformers."""
    from tqdm.auto import tqdm

    from replaylab.decoding import (PromptLookupDrafter, SyntheticDrafter, beam_search, best_of_n,
                                    greedy, speculative)
    from replaylab.model import HybridLM, preset, to_transformers_nemotron_h
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hf_kernels = False
    if device == "cuda":  # the baseline as deployed: transformers on mamba-ssm's kernels
        from replaylab.oracles import use_mamba_ssm_kernels_in_transformers
        hf_kernels = use_mamba_ssm_kernels_in_transformers()
    model = HybridLM(preset(preset_name), seed=0).to(device=device, dtype=dtype).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    vocab = model.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    rows, bar = [], tqdm(total=0, disable=not progress, desc=f"decode ({preset_name})")

    errors = []

    def timed(fn):
        fn()  # warm-up, discarded
        return [fn() for _ in range(repeats)]

    def guarded(name, fn):
        """Run one workload; an error is recorded, not fatal, so one failure keeps the rest."""
        try:
            fn()
        except Exception as err:  # noqa: BLE001
            errors.append(f"{name}: {type(err).__name__}: {err}"[:400])

    strategies = ("snapshot", "recompute", "replay")
    for batch in batches:
        prompt = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
        for strategy in strategies:
            runs = timed(lambda: decode_once(model, prompt, n_new, strategy, interval, weights))
            rows.append(dict(workload="decode", provider="replaylab", strategy=strategy,
                             batch=batch, seconds_per_token=_spread([r[0] for r in runs]),
                             peak_bytes_per_sequence=_spread([r[1] for r in runs])["median"]))
            bar.update()
    # transformers on the same weights
    hf = to_transformers_nemotron_h(model)
    for batch in batches:
        prompt = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
        runs = timed(lambda: _hfdecode_once(hf, prompt, n_new, weights))
        rows.append(dict(workload="decode", provider="transformers", strategy="generate",
                         batch=batch, seconds_per_token=_spread([r[0] for r in runs]),
                         peak_bytes_per_sequence=runs[0][1]))
        bar.update()
    try:
        p1 = torch.randint(0, vocab, (1, 8), generator=g).to(device)
        hf.generate(p1, attention_mask=torch.ones_like(p1), max_new_tokens=2, do_sample=False,
                    assistant_model=hf)
        refusal = None
    except ValueError as err:
        refusal = str(err)
    # speculative decoding, one sequence: synthetic drafts and prompt lookup
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=g).to(device)
    reference = torch.cat([prompt, greedy(model, prompt, n_new).tokens], 1).cpu()
    pattern = torch.randint(0, vocab, (1, 12), generator=g)
    repetitive = pattern.repeat(1, prompt_len // 12 + 1)[:, :prompt_len].to(device)
    for strategy in strategies:
        for alpha in (0.5, 0.8, 0.95):
            guarded(f"speculative {alpha} {strategy}", lambda: rows.append(_spec_row(
                timed(lambda: speculative(model, prompt, n_new,
                                          SyntheticDrafter(reference, alpha, seed=1), k=4,
                                          strategy=strategy, interval=interval)),
                f"speculative a={alpha}", strategy, n_new)))
            bar.update()
        guarded(f"prompt lookup {strategy}", lambda: rows.append(_spec_row(
            timed(lambda: speculative(model, repetitive, n_new, PromptLookupDrafter(), k=4,
                                      strategy=strategy, interval=interval)),
            "speculative prompt-lookup", strategy, n_new)))
        guarded(f"greedy {strategy}", lambda: rows.append(dict(
            workload="greedy (whole request)", provider="replaylab", strategy=strategy, batch=1,
            seconds_per_token=_spread([r.seconds / n_new for r in timed(
                lambda: greedy(model, prompt, n_new, strategy, interval))]))))
        guarded(f"beam {strategy}", lambda: rows.append(dict(
            workload="beam 4", provider="replaylab", strategy=strategy, batch=1,
            seconds_per_token=_spread([r.seconds / n_new for r in timed(
                lambda: beam_search(model, prompt, n_new, 4, strategy, interval))]))))
        guarded(f"best-of-8 {strategy}", lambda: rows.append(dict(
            workload="best-of-8", provider="replaylab", strategy=strategy, batch=1,
            seconds_per_token=_spread([r.seconds / n_new for r in timed(
                lambda: best_of_n(model, prompt, n_new, 8, strategy=strategy,
                                  interval=interval))]))))
        bar.update()
    # sustainable concurrency: raise the batch until OOM or latency_factor x batch-1 latency
    concurrency = {}
    for strategy in strategies:
        base, batch, best = None, 1, 0
        while batch <= max_batch:
            prompt = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
            try:
                sec, _ = decode_once(model, prompt, 8, strategy, interval, weights)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                break
            base = base or sec
            if sec > latency_factor * base:
                break
            best, batch = batch, batch * 2
        concurrency[strategy] = dict(max_batch=best, latency_target_s=latency_factor * base,
                                     tokens_per_s_at_max=best / sec if best else None)
    bar.close()
    return dict(rows=rows, concurrency=concurrency, assisted_generation_refusal=refusal,
                errors=errors, transformers_on_mamba_ssm_kernels=hf_kernels,
                preset=preset_name, config=vars(model.cfg), weights_bytes=weights,
                dtype=str(dtype), device_kind=device, n_new=n_new, prompt_len=prompt_len,
                repeats=repeats, interval=interval)


def _hf_row(runs):
    return dict(seconds_per_token=_spread([r[0] for r in runs]),
                peak_bytes_per_sequence=runs[0][1])


def _spec_row(runs, workload, strategy, n_new):
    r = runs[len(runs) // 2]
    return dict(workload=workload, provider="replaylab", strategy=strategy, batch=1,
                seconds_per_token=_spread([x.seconds / n_new for x in runs]),
                acceptance=r.acceptance_rate, restores=r.restores,
                rollback_seconds=(r.restore_seconds / r.restores if r.restores else 0.0),
                peak_bytes=r.peak_bytes, same_tokens=None)


def decode_summary(result):
    rows = result["rows"]
    out = []
    for r in rows:
        spt = r["seconds_per_token"]["median"]
        extra = ""
        if "acceptance" in r:
            extra = f" acc {r['acceptance']:.2f} restores {r['restores']} rollback {r['rollback_seconds'] * 1e3:.2f} ms"
        if r.get("peak_bytes_per_sequence"):
            extra += f" peak/seq {r['peak_bytes_per_sequence'] / 2**20:.1f} MiB"
        out.append(f"{r['workload']:26s} {r['provider']:12s} {r['strategy']:9s} b={r['batch']:3d} "
                   f"{spt * 1e3:8.2f} ms/token ({r['batch'] / spt:8.1f} tok/s){extra}")
    for s, c in result["concurrency"].items():
        out.append(f"concurrency {s:9s}: batch {c['max_batch']} within {c['latency_target_s'] * 1e3:.1f} ms/step")
    out.append(f"transformers assisted generation: {result['assisted_generation_refusal']}")
    out.extend(f"error: {e}" for e in result.get("errors", []))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m replaylab.bench")
    parser.add_argument("what", choices=["kernels", "sweep", "decode"])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--out", default=None)
    parser.add_argument("--preset", default="tiny", help="decode: tiny, 1b or 8b-layers")
    parser.add_argument("--batches", default="1,4", help="decode: comma-separated batches")
    parser.add_argument("--n-new", type=int, default=32)
    parser.add_argument("--log-lens", default=None, help="kernels: comma-separated log lengths")
    parser.add_argument("--ts", default=None, help="kernels: comma-separated new-token counts")
    parser.add_argument("--no-fold", action="store_true", help="kernels: skip fold vs copy")
    args = parser.parse_args(argv)
    args.out = args.out or f"data/bench_{args.what}.json"
    if args.what == "decode":
        t0 = time.time()
        result = run_decode(args.preset, [int(b) for b in args.batches.split(",")], args.n_new)
        result.update(device=(torch.cuda.get_device_name() if torch.cuda.is_available()
                              else platform.processor() or "cpu"), versions=_versions(),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      command="python -m replaylab.bench " + " ".join(argv or sys.argv[1:]),
                      seconds=round(time.time() - t0, 1))
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
        for line in decode_summary(result):
            print(line)
        return
    if not torch.cuda.is_available():
        sys.exit("replaylab.bench kernels times GPU kernels: no CUDA device here. The committed "
                 "results are in data/bench_kernels.json.")
    t0 = time.time()
    if args.what == "sweep":
        rows = sweep()
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, device=torch.cuda.get_device_name(), versions=_versions(),
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           command="python -m replaylab.bench " + " ".join(argv or sys.argv[1:])),
                      f, indent=1)
        for r in sorted(rows, key=lambda r: (r["kernel"], r["us"])):
            print(f"{r['kernel']:18s} BLOCK_P={r['block_p']:2d} warps={r['num_warps']}: {r['us']:7.1f} us")
        return
    ints = lambda text: [int(v) for v in text.split(",")] if text else None  # noqa: E731
    result = run_kernels(quick=args.quick, batches=ints(args.batches if "--batches" in
                                                         " ".join(argv or sys.argv) else None),
                         log_lens=ints(args.log_lens), ts=ints(args.ts), fold=not args.no_fold)
    result.update(device=torch.cuda.get_device_name(), versions=_versions(),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python -m replaylab.bench " + " ".join(argv or sys.argv[1:]),
                  shape=SHAPE, seconds=round(time.time() - t0, 1))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"device {result['device']}; copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s; "
          f"peer errors: {result['peer_errors'] or 'none'}")
    for line in summary(result):
        print(line)


if __name__ == "__main__":
    main()
