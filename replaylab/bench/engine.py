"""The fast decode path end to end (GPU): ``DecodeEngine`` under CUDA graphs for snapshot and
replay, per batch, beside transformers' ``generate`` and mamba-ssm's CUDA-graphed decode loop
on the same layer shapes, all in one run.

Per (preset, strategy, batch) it reports the decode-only time per output token (CUDA events
around ``n_new`` graph steps; prefill excluded; median of ``repeats`` after a warm-up), the
bytes one step must move (``costmodel.decode_step_bytes``: weights once, then per sequence its
state traffic, KV and log reads) over the device-copy bandwidth measured in the same run (the
fraction of the roofline), the GPU-busy fraction from torch.profiler, and peak memory per
sequence. Speculative decoding (batch 1, k=4) with synthetic acceptance 0.5 / 0.8 / 0.95 runs
under both strategies; the snapshot engine keeps a state per draft (the per-draft-snapshot
path). Before timing, the engine's greedy tokens are compared with the teaching cache's.
"""

from __future__ import annotations

import time

import torch

from replaylab.bench.timing import copy_bandwidth_gbs, spread
from replaylab.costmodel import decode_step_bytes
from replaylab.engine import DecodeEngine
from replaylab.model import HybridLM, preset

__all__ = ["run_engine", "engine_summary"]


def _decode_ms(engine, tok, n_new):
    """Milliseconds per step over n_new greedy steps from the engine's current position."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n_new):
        tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n_new, tok


def _busy_fraction(engine, tok, steps=16):
    """Share of the wall time the GPU spent in kernels over ``steps`` decode steps."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernel_us = sum(
        getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
        for e in prof.key_averages()
    )
    return min(1.0, kernel_us * 1e-6 / wall), tok


def _copy_bandwidth_events(gib=1, copies=20):
    """Read + write bytes per second of back-to-back device copies timed with CUDA events
    after a warm-up (a second estimate beside the graph-timed one; the larger is used)."""
    src = torch.empty(gib * 2**30 // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(copies):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 4 * copies / (start.elapsed_time(end) * 1e-3)


def _check_tokens(model, strategy, log_length):
    """The engine (graphs on) against the teaching cache (kernels on): same greedy tokens?"""
    from replaylab.cache import CacheConfig
    from replaylab.decoding import greedy

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=g).cuda()
    ref = greedy(model, prompts, 16, CacheConfig(strategy, log_length=log_length)).tokens
    engine = DecodeEngine(model, 2, 40, strategy, log_length=log_length)
    got = engine.greedy(prompts, 16)
    return dict(
        same_sequences=int((got == ref).all(-1).sum()),
        of=2,
        same_token_fraction=float((got == ref).float().mean()),
    )


def _speculative(model, strategy, alpha, n_new, prompt_len, log_length, k=4):
    from replaylab.decoding import SyntheticDrafter

    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, prompt_len), generator=g).cuda()
    engine = DecodeEngine(
        model, 1, prompt_len + n_new + k + 2, strategy, log_length, max_verify=k + 1
    )
    reference = torch.cat([prompt, engine.greedy(prompt, n_new)], 1).cpu()
    runs = []
    for i in range(4):  # the first is a warm-up (graph capture); prefill is not timed
        pending = engine.prefill(prompt).argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens, proposed, accepted = engine.speculate(
            prompt, pending, n_new, SyntheticDrafter(reference, alpha, seed=3), k=k
        )
        torch.cuda.synchronize()
        if i:
            runs.append((time.perf_counter() - t0) / n_new)
    same = bool(torch.equal(tokens.cpu(), reference[:, prompt_len:]))
    return dict(
        seconds_per_token=spread(runs), acceptance=accepted / proposed, same_tokens_as_greedy=same
    )


def _transformers_baseline(model, batches, n_new, prompt_len):
    from replaylab.bench.decode import _hfdecode_once
    from replaylab.model import to_transformers_nemotron_h

    hf = to_transformers_nemotron_h(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    for batch in batches:
        g = torch.Generator().manual_seed(3)
        prompt = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), generator=g).cuda()
        try:
            _hfdecode_once(hf, prompt, n_new, weights)  # warm-up
            runs = [_hfdecode_once(hf, prompt, n_new, weights)[0] for _ in range(3)]
            rows.append(
                dict(provider="transformers generate", batch=batch, seconds_per_token=spread(runs))
            )
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            rows.append(dict(provider="transformers generate", batch=batch, error="OOM"))
    del hf
    torch.cuda.empty_cache()
    return rows


def _mamba_ssm_baseline(cfg, batches, n_new, prompt_len):
    """mamba-ssm's MambaLMHeadModel with the preset's Mamba-2 and attention shapes (one mixer
    and one gated MLP per layer), decoded with generate(cg=True)."""
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

    attn = [i for i, k in enumerate(c for c in cfg.pattern if c != "-") if k == "*"]
    n_layer = sum(c != "-" for c in cfg.pattern)
    mcfg = MambaConfig(
        d_model=cfg.hidden_size,
        d_intermediate=cfg.intermediate_size,
        n_layer=n_layer,
        vocab_size=cfg.vocab_size,
        attn_layer_idx=attn,
        ssm_cfg=dict(
            layer="Mamba2",
            d_state=cfg.d_state,
            headdim=cfg.ssm_head_dim,
            ngroups=cfg.n_groups,
            expand=cfg.ssm_heads * cfg.ssm_head_dim // cfg.hidden_size,
        ),
        attn_cfg=dict(
            num_heads=cfg.attn_heads, num_heads_kv=cfg.kv_heads, head_dim=cfg.head_dim, causal=True
        ),
        fused_add_norm=False,
        tie_embeddings=False,
    )
    model = MambaLMHeadModel(mcfg, device="cuda", dtype=torch.bfloat16).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    for batch in batches:
        g = torch.Generator().manual_seed(4)
        prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).cuda()
        try:

            def timed(n):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.generate(prompt, max_length=prompt_len + n, cg=True, top_k=1)
                torch.cuda.synchronize()
                return time.perf_counter() - t0

            timed(n_new), timed(1)  # warm-up and graph capture
            runs = [(timed(n_new) - timed(1)) / (n_new - 1) for _ in range(3)]
            rows.append(
                dict(
                    provider="mamba-ssm generate(cg=True)",
                    batch=batch,
                    seconds_per_token=spread(runs),
                    weights_bytes=weights,
                )
            )
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            rows.append(dict(provider="mamba-ssm generate(cg=True)", batch=batch, error="OOM"))
    return rows, weights


def run_engine(
    presets=("8b-layers",),
    batches=(1, 8, 32, 64, 128, 256),
    n_new=32,
    prompt_len=32,
    repeats=3,
    log_length=16,
    baselines=True,
    progress=True,
):
    from tqdm.auto import tqdm

    from replaylab.bench.peers import use_mamba_ssm_kernels_in_transformers

    hf_kernels = use_mamba_ssm_kernels_in_transformers()
    bw_graph = max(copy_bandwidth_gbs() for _ in range(3)) * 1e9
    bw_events = _copy_bandwidth_events()
    bw = max(bw_graph, bw_events)
    rows, checks, errors = [], [], []
    for name in presets:
        model = HybridLM(preset(name), seed=0).to("cuda", torch.bfloat16).eval()
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        for strategy in ("snapshot", "replay"):
            try:
                checks.append(
                    dict(
                        preset=name, strategy=strategy, **_check_tokens(model, strategy, log_length)
                    )
                )
            except Exception as err:  # noqa: BLE001 - record, go on
                errors.append(f"check {name} {strategy}: {type(err).__name__}: {err}"[:400])
            for batch in tqdm(batches, desc=f"{name} {strategy}", disable=not progress):
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                try:
                    max_len = prompt_len + (repeats + 2) * n_new + 16
                    engine = DecodeEngine(model, batch, max_len, strategy, log_length)
                    g = torch.Generator().manual_seed(5)
                    prompts = torch.randint(
                        0, model.cfg.vocab_size, (batch, prompt_len), generator=g
                    ).cuda()
                    tok = engine.prefill(prompts).argmax(-1, keepdim=True)
                    _, tok = _decode_ms(engine, tok, n_new)  # warm-up: graph capture
                    runs = []
                    for _ in range(repeats):
                        ms, tok = _decode_ms(engine, tok, n_new)
                        runs.append(ms * 1e-3)
                    busy, tok = _busy_fraction(engine, tok) if batch in (1, 64) else (None, tok)
                    peak = torch.cuda.max_memory_allocated() - weights
                    spt = spread(runs)
                    context = engine.position - n_new // 2
                    moved = decode_step_bytes(
                        model.cfg, strategy, batch, context, log_length, weights
                    )
                    rows.append(
                        dict(
                            preset=name,
                            strategy=strategy,
                            batch=batch,
                            seconds_per_token=spt,
                            tokens_per_s=batch / spt["median"],
                            bytes_per_step=moved,
                            roofline_fraction=moved / bw / spt["median"],
                            gpu_busy=busy,
                            peak_bytes_per_sequence=peak / batch,
                            folds=engine.stats.folds,
                        )
                    )
                    del engine
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    rows.append(dict(preset=name, strategy=strategy, batch=batch, error="OOM"))
                except Exception as err:  # noqa: BLE001
                    errors.append(f"{name} {strategy} b={batch}: {type(err).__name__}: {err}"[:400])
        if name == presets[0]:
            for strategy in ("snapshot", "replay"):
                for alpha in (0.5, 0.8, 0.95):
                    try:
                        rows.append(
                            dict(
                                preset=name,
                                strategy=strategy,
                                batch=1,
                                workload=f"speculative k=4 a={alpha}",
                                **_speculative(
                                    model, strategy, alpha, n_new, prompt_len, log_length
                                ),
                            )
                        )
                    except Exception as err:  # noqa: BLE001
                        errors.append(
                            f"speculative {strategy} {alpha}: {type(err).__name__}: {err}"[:400]
                        )
            if baselines:
                base_batches = [b for b in batches if b in (1, 8, 64, 128, 256)]
                try:
                    for r in _transformers_baseline(model, base_batches, n_new, prompt_len):
                        rows.append(dict(preset=name, **r))
                except Exception as err:  # noqa: BLE001
                    errors.append(f"transformers: {type(err).__name__}: {err}"[:400])
                try:
                    mrows, mweights = _mamba_ssm_baseline(
                        model.cfg, base_batches, n_new, prompt_len
                    )
                    for r in mrows:
                        if "seconds_per_token" in r:
                            moved = decode_step_bytes(
                                model.cfg,
                                "snapshot",
                                r["batch"],
                                prompt_len + n_new // 2,
                                log_length,
                                mweights,
                            )
                            r["roofline_fraction"] = moved / bw / r["seconds_per_token"]["median"]
                        rows.append(dict(preset=name, **r))
                except Exception as err:  # noqa: BLE001
                    errors.append(f"mamba-ssm: {type(err).__name__}: {err}"[:400])
        del model
        torch.cuda.empty_cache()
    return dict(
        copy_bandwidth_methods_gbs=dict(cudagraph=bw_graph / 1e9, events=bw_events / 1e9),
        rows=rows,
        token_checks=checks,
        errors=errors,
        copy_bandwidth_gbs=bw / 1e9,
        transformers_on_mamba_ssm_kernels=hf_kernels,
        n_new=n_new,
        prompt_len=prompt_len,
        repeats=repeats,
        log_length=log_length,
    )


def engine_summary(result):
    lines = [f"copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(
                f"{r['preset']} {r.get('strategy', r.get('provider'))} b={r['batch']}: {r['error']}"
            )
            continue
        who = r.get("workload") or r.get("provider") or f"engine {r['strategy']}"
        if r.get("workload"):
            who = f"{who} {r['strategy']}"
        ms = r["seconds_per_token"]["median"] * 1e3
        extra = ""
        if r.get("roofline_fraction") is not None:
            extra += f" roofline {r['roofline_fraction']:.0%}"
        if r.get("gpu_busy") is not None:
            extra += f" busy {r['gpu_busy']:.0%}"
        if "acceptance" in r:
            extra += f" acc {r['acceptance']:.2f} same {r['same_tokens_as_greedy']}"
        lines.append(
            f"{r['preset']:9s} {who:38s} b={r['batch']:3d} {ms:8.3f} ms/token "
            f"({r['batch'] / ms * 1e3:9.0f} tok/s){extra}"
        )
    lines.append(f"token checks: {result['token_checks']}")
    lines.extend(f"error: {e}" for e in result["errors"])
    return lines
