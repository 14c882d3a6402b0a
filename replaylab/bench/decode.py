"""End-to-end decoding, the seed article's measurements: decode-only time per token, peak
memory per sequence, speculative decoding's acceptance and rollback cost, beam search and
best-of-n, and the largest batch within a latency target, for every strategy side by side with
transformers' ``generate`` on the same weights (GPU or CPU)."""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from replaylab.bench.peers import use_mamba_ssm_kernels_in_transformers
from replaylab.bench.timing import spread, sync
from replaylab.cache import CacheConfig, as_config
from replaylab.decoding import (
    PromptLookupDrafter,
    SyntheticDrafter,
    beam_search,
    best_of_n,
    greedy,
    speculative,
)
from replaylab.model import HybridLM, preset, to_transformers_nemotron_h
from replaylab.strategies import STRATEGY_NAMES

__all__ = ["decode_once", "run_decode", "decode_summary"]


def decode_once(model, prompt, n_new, cache, weights_bytes):
    """Greedy decode timed after the prefill (``cache``: a strategy name or ``CacheConfig``):
    (seconds per token, peak bytes per sequence minus the weights)."""
    device = prompt.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cache = as_config(cache).build(model, prompt.shape[0])
    logits = model(prompt, cache)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n_new):
        logits = model(logits[:, -1].argmax(-1, keepdim=True), cache)
    sync(device)
    seconds = (time.perf_counter() - t0) / n_new
    peak = torch.cuda.max_memory_allocated() - weights_bytes if cuda else cache.stats.peak_bytes
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
        sync(device)
        t0 = time.perf_counter()
        hf.generate(
            prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        sync(device)
        times[n] = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - weights_bytes if device.type == "cuda" else None
    return (times[n_new] - times[1]) / (n_new - 1), (
        None if peak is None else peak / prompt.shape[0]
    )


@torch.no_grad()
def run_decode(
    preset_name="tiny",
    batches=(1, 4),
    n_new=32,
    prompt_len=64,
    repeats=3,
    checkpoint_interval=16,
    log_length=16,
    latency_factor=4.0,
    max_batch=512,
    progress=True,
):
    """The seed's measurements for every strategy, side by side with transformers."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hf_kernels = False
    if device == "cuda":  # the baseline as deployed: transformers on mamba-ssm's kernels
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

    configs = {
        s: CacheConfig(s, checkpoint_interval=checkpoint_interval, log_length=log_length)
        for s in STRATEGY_NAMES
    }
    strategies = tuple(configs)
    for batch in batches:
        prompt = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
        for strategy in strategies:
            runs = timed(lambda: decode_once(model, prompt, n_new, configs[strategy], weights))
            rows.append(
                dict(
                    workload="decode",
                    provider="replaylab",
                    strategy=strategy,
                    batch=batch,
                    seconds_per_token=spread([r[0] for r in runs]),
                    peak_bytes_per_sequence=spread([r[1] for r in runs])["median"],
                )
            )
            bar.update()
    # transformers on the same weights
    hf = to_transformers_nemotron_h(model)
    for batch in batches:
        prompt = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
        runs = timed(lambda: _hfdecode_once(hf, prompt, n_new, weights))
        rows.append(
            dict(
                workload="decode",
                provider="transformers",
                strategy="generate",
                batch=batch,
                seconds_per_token=spread([r[0] for r in runs]),
                peak_bytes_per_sequence=runs[0][1],
            )
        )
        bar.update()
    try:
        p1 = torch.randint(0, vocab, (1, 8), generator=g).to(device)
        hf.generate(
            p1,
            attention_mask=torch.ones_like(p1),
            max_new_tokens=2,
            do_sample=False,
            assistant_model=hf,
        )
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
            guarded(
                f"speculative {alpha} {strategy}",
                lambda: rows.append(
                    _spec_row(
                        timed(
                            lambda: speculative(
                                model,
                                prompt,
                                n_new,
                                SyntheticDrafter(reference, alpha, seed=1),
                                k=4,
                                cache=configs[strategy],
                            )
                        ),
                        f"speculative a={alpha}",
                        strategy,
                        n_new,
                    )
                ),
            )
            bar.update()
        guarded(
            f"prompt lookup {strategy}",
            lambda: rows.append(
                _spec_row(
                    timed(
                        lambda: speculative(
                            model,
                            repetitive,
                            n_new,
                            PromptLookupDrafter(),
                            k=4,
                            cache=configs[strategy],
                        )
                    ),
                    "speculative prompt-lookup",
                    strategy,
                    n_new,
                )
            ),
        )
        guarded(
            f"greedy {strategy}",
            lambda: rows.append(
                dict(
                    workload="greedy (whole request)",
                    provider="replaylab",
                    strategy=strategy,
                    batch=1,
                    seconds_per_token=spread(
                        [
                            r.seconds / n_new
                            for r in timed(lambda: greedy(model, prompt, n_new, configs[strategy]))
                        ]
                    ),
                )
            ),
        )
        guarded(
            f"beam {strategy}",
            lambda: rows.append(
                dict(
                    workload="beam 4",
                    provider="replaylab",
                    strategy=strategy,
                    batch=1,
                    seconds_per_token=spread(
                        [
                            r.seconds / n_new
                            for r in timed(
                                lambda: beam_search(model, prompt, n_new, 4, configs[strategy])
                            )
                        ]
                    ),
                )
            ),
        )
        guarded(
            f"best-of-8 {strategy}",
            lambda: rows.append(
                dict(
                    workload="best-of-8",
                    provider="replaylab",
                    strategy=strategy,
                    batch=1,
                    seconds_per_token=spread(
                        [
                            r.seconds / n_new
                            for r in timed(
                                lambda: best_of_n(model, prompt, n_new, 8, cache=configs[strategy])
                            )
                        ]
                    ),
                )
            ),
        )
        bar.update()
    # sustainable concurrency: raise the batch until OOM or latency_factor x batch-1 latency
    concurrency = {}
    for strategy in strategies:
        base, batch, best = None, 1, 0
        while batch <= max_batch:
            prompt = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
            try:
                sec, _ = decode_once(model, prompt, 8, configs[strategy], weights)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                break
            base = base or sec
            if sec > latency_factor * base:
                break
            best, batch = batch, batch * 2
        concurrency[strategy] = dict(
            max_batch=best,
            latency_target_s=latency_factor * base,
            tokens_per_s_at_max=best / sec if best else None,
        )
    bar.close()
    return dict(
        rows=rows,
        concurrency=concurrency,
        assisted_generation_refusal=refusal,
        errors=errors,
        transformers_on_mamba_ssm_kernels=hf_kernels,
        preset=preset_name,
        config=vars(model.cfg),
        weights_bytes=weights,
        dtype=str(dtype),
        device_kind=device,
        n_new=n_new,
        prompt_len=prompt_len,
        repeats=repeats,
        checkpoint_interval=checkpoint_interval,
        log_length=log_length,
    )


def _spec_row(runs, workload, strategy, n_new):
    r = runs[len(runs) // 2]
    return dict(
        workload=workload,
        provider="replaylab",
        strategy=strategy,
        batch=1,
        seconds_per_token=spread([x.seconds / n_new for x in runs]),
        acceptance=r.acceptance_rate,
        restores=r.restores,
        rollback_seconds=(r.restore_seconds / r.restores if r.restores else 0.0),
        peak_bytes=r.peak_bytes,
        same_tokens=None,
    )


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
        out.append(
            f"{r['workload']:26s} {r['provider']:12s} {r['strategy']:9s} b={r['batch']:3d} "
            f"{spt * 1e3:8.2f} ms/token ({r['batch'] / spt:8.1f} tok/s){extra}"
        )
    for s, c in result["concurrency"].items():
        out.append(
            f"concurrency {s:9s}: batch {c['max_batch']} within {c['latency_target_s'] * 1e3:.1f} ms/step"
        )
    # refused up to transformers 5.24, accepted from 5.25 (tests/test_generate.py)
    refusal = result["assisted_generation_refusal"]
    out.append(f"transformers assisted generation: {refusal or 'accepted (no refusal)'}")
    out.extend(f"error: {e}" for e in result.get("errors", []))
    return out
