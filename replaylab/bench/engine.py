"""The fast decode path end to end (GPU): ``DecodeEngine`` under CUDA graphs for snapshot and
replay, per batch, beside transformers' ``generate`` and mamba-ssm's CUDA-graphed decode loop
on the same layer shapes, all in one run.

Per (preset, strategy, batch) it reports the decode-only time per output token (CUDA events
around ``n_new`` graph steps; prefill excluded; median of ``repeats`` after a warm-up), the
bytes one step must move (``costmodel.decode_step_bytes``: weights once, then per sequence its
state traffic, KV and log reads) over the device-copy bandwidth measured in the same run (the
fraction of the roofline), the GPU-busy fraction from torch.profiler (batch 1 and 64), a
kernel profile (batch 1 and 128), decode-only peak memory and the pools' bytes per sequence;
the fused engine at every batch and the unfused one at batch 1 and 128 (what fusing buys).

The first preset also runs: speculative decoding (batch 1, k=4) with synthetic acceptance
0.5 / 0.8 / 0.95 under both strategies (the snapshot engine keeps a state per draft: the
per-draft-snapshot path); batched verify rounds (batch 8, 64, 128, every sequence keeping
the same count); the largest batch whose engine fits a memory budget (pools sized for
``concurrency_max_len`` tokens, probed with one-token prompts and eager steps: decode-time
capacity); the trained pair of data/models; and the two baselines. Before timing, the engine's
greedy tokens are compared with the teaching cache's, with the logit gap where they part.
"""

from __future__ import annotations

import time

import torch

from replaylab.bench.timing import busy_fraction, copy_bandwidth_gbs, spread
from replaylab.costmodel import decode_step_bytes
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine
from replaylab.serving.engine import AUTO_LOG_LENGTH

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


def _kernel_profile(engine, tok, steps=8, top=8):
    """Which kernels one decode step runs and for how long (torch.profiler, device time):
    kernels per step, device µs per step, and the ``top`` kernels by time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if _device_us(e) > 0]
    total = sum(_device_us(e) for e in events)
    ranked = sorted(events, key=_device_us, reverse=True)[:top]
    return dict(
        kernels_per_step=sum(e.count for e in events) / steps,
        device_us_per_step=total / steps,
        top=[
            dict(name=e.key[:90], us_per_step=_device_us(e) / steps, calls_per_step=e.count / steps)
            for e in ranked
        ],
    ), tok


def _device_us(e):
    return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))


def _pool_bytes_per_sequence(engine):
    """Bytes the engine's pools hold per slot (state, conv, log or drafts, KV)."""
    total = 0
    for pool in engine.ssm.values():
        tensors = [pool.state, pool.conv, pool.draft_conv]
        tensors += list(getattr(pool, "log", {}).values()) + [getattr(pool, "draft_state", None)]
        total += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    for pool in engine.kv.values():
        total += 2 * pool.k.numel() * pool.k.element_size()
    return total / engine.max_batch


def _concurrency(model, strategy, budget_bytes, max_len, k, log_length):
    """Largest batch whose engine (pools, a verify of k + 1 tokens and a decode step, eager)
    fits in ``budget_bytes`` beyond the weights: a search over batch with the allocator
    capped at weights + budget. Returns (batch, pool bytes per sequence)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    total = torch.cuda.get_device_properties(0).total_memory
    probe = DecodeEngine(model, 1, max_len, strategy, log_length, max_verify=k + 1, graphs=False)
    per_seq = _pool_bytes_per_sequence(probe)
    del probe

    def fits(batch):
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, (weights + budget_bytes) / total))
        try:
            engine = DecodeEngine(
                model, batch, max_len, strategy, log_length, max_verify=k + 1, graphs=False
            )
            tok = engine.prefill(torch.zeros(batch, 1, dtype=torch.long, device="cuda"))
            tok = tok.argmax(-1, keepdim=True)
            engine.step(torch.cat([tok] * (k + 1), 1), check=False)
            engine.rollback(1)
            engine.step(tok, check=False)
            torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            engine = None  # noqa: F841
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(1.0)

    lo, hi = 0, max(1, int(budget_bytes / per_seq) + 1)  # hi: what the pools alone allow
    while fits(hi) and hi < 1 << 16:
        lo, hi = hi, hi * 2
    while hi - lo > max(1, lo // 64):  # to within 1.5%
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, per_seq


def _trained_pair_speculative(n_new=64, k=4):
    """The trained target and draft (data/models) on the GPU: greedy engine decode against
    speculative decoding with the draft model, under both strategies, on a held-out prompt."""
    import gzip

    from replaylab.decoding import ModelDrafter
    from replaylab.generate import load_checkpoint, load_tokenizer
    from replaylab.results import DATA_DIR

    root = DATA_DIR / "models"
    target = load_checkpoint(root / "replaylab-code-10m", device="cuda", dtype=torch.bfloat16)
    draft = load_checkpoint(root / "replaylab-code-draft", device="cuda", dtype=torch.bfloat16)
    tokenizer = load_tokenizer(root / "replaylab-code-10m")
    text = gzip.open(root / "heldout.txt.gz", "rt").read()[:400]
    prompt = torch.tensor([tokenizer.encode(text).ids[:64]], device="cuda")
    rows = []
    for strategy in ("snapshot", "replay"):
        engine = DecodeEngine(
            target, 1, prompt.shape[1] + n_new + k + 2, strategy, 16, max_verify=k + 1
        )
        for mode in ("greedy", "speculative"):
            runs = []
            for i in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if mode == "greedy":
                    tokens = engine.greedy(prompt, n_new)
                else:
                    tokens, proposed, accepted = engine.speculative(
                        prompt, n_new, ModelDrafter(draft, "replay"), k=k
                    )
                torch.cuda.synchronize()
                if i:
                    runs.append((time.perf_counter() - t0) / n_new)
            if mode == "greedy":
                reference = tokens
            row = dict(
                preset="trained pair (10M target, draft)",
                strategy=strategy,
                batch=1,
                workload=f"{mode} k={k}" if mode != "greedy" else "greedy",
                seconds_per_token=spread(runs),
                includes_prefill=True,
            )
            if mode == "speculative":
                row.update(
                    acceptance=accepted / proposed,
                    same_tokens_as_greedy=bool(torch.equal(tokens, reference)),
                )
            rows.append(row)
    return rows


def _check_tokens(model, strategy, log_length, n_new=32):
    """The engine (graphs on) against the teaching cache (kernels on): same greedy tokens? The
    fused kernels round differently, so where a sequence parts, the teaching model's gap
    between its two best logits there is recorded beside the median gap over all positions
    (a near-tie, or a real difference?)."""
    from replaylab.cache import CacheConfig
    from replaylab.decoding import greedy

    if log_length == "auto":
        log_length = AUTO_LOG_LENGTH
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=g).cuda()
    ref = greedy(model, prompts, n_new, CacheConfig(strategy, log_length=log_length)).tokens
    engine = DecodeEngine(model, 2, 16 + n_new + 8, strategy, log_length=log_length)
    got = engine.greedy(prompts, n_new)
    with torch.no_grad():
        logits = model(torch.cat([prompts, ref], 1), None)[:, 15:-1].float()
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[..., 0] - top2[..., 1]  # (2, n_new)
    parted = []
    for b in range(2):
        diff = (got[b] != ref[b]).nonzero()
        if len(diff):
            i = int(diff[0])
            parted.append(dict(sequence=b, at_token=i, top2_gap=float(gaps[b, i])))
    return dict(
        same_sequences=int((got == ref).all(-1).sum()),
        of=2,
        tokens=n_new,
        same_token_fraction=float((got == ref).float().mean()),
        parted=parted,
        median_top2_gap=float(gaps.median()),
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


def _batched_verify_rounds(model, strategy, batch, alphas, prompt_len, k=4, rounds=24):
    """Speculative rounds at ``batch``, all sequences in step: each round verifies k + 1
    tokens (CUDA graph) and rolls back to the tokens that acceptance ``alpha`` keeps on
    average, 1 + round(sum_i alpha^i) (the engine holds one position for every slot, so all
    sequences keep the same count). Measured: milliseconds per round, folds and rollbacks
    included; derived: tokens per second = batch x tokens kept per round / round time."""
    rows = []
    for alpha in alphas:
        kept = 1 + round(sum(alpha**i for i in range(1, k + 1)))
        engine = DecodeEngine(
            model,
            batch,
            prompt_len + (rounds + 4) * kept + k + 2,
            strategy,
            "auto",
            max_verify=k + 1,
        )
        g = torch.Generator().manual_seed(6)
        prompts = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len), generator=g).cuda()
        drafts = torch.randint(0, model.cfg.vocab_size, (batch, k + 1), generator=g).cuda()
        engine.prefill(prompts)
        for _ in range(2):  # warm-up: graph capture
            engine.step(drafts, check=False)
            engine.rollback(kept)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(rounds):
            engine.step(drafts, check=False)
            engine.rollback(kept)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / rounds
        rows.append(
            dict(
                strategy=strategy,
                batch=batch,
                workload=f"batched verify rounds k={k} a={alpha}",
                tokens_kept_per_round=kept,
                ms_per_round=ms,
                seconds_per_token=dict(median=ms * 1e-3 / kept, runs=1),
                tokens_per_s=batch * kept / (ms * 1e-3),
                folds=engine.stats.folds,
                log_length=engine.L,
            )
        )
        del engine
    return rows


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
    if n_new < 2:  # a token's time is (n_new tokens - 1 token) / (n_new - 1)
        return [
            dict(provider="mamba-ssm generate(cg=True)", error=f"n_new: {n_new}, needs 2 or more")
        ], None
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
    log_length="auto",
    baselines=True,
    progress=True,
    unfused_batches=(1, 128),
    profile_batches=(1, 128),
    concurrency_budget_gib=24,
    concurrency_max_len=2048,
):
    """Every measurement of the module docstring, for each preset; the first preset also runs
    the speculative rows, the baselines, the concurrency search and the trained pair."""
    from tqdm.auto import tqdm

    from replaylab.bench.peers import use_mamba_ssm_kernels_in_transformers

    hf_kernels = use_mamba_ssm_kernels_in_transformers()
    measured = [copy_bandwidth_gbs(methods=True) for _ in range(3)]  # clocks ramp up first
    methods = {m: max(found[m] for _, found in measured) for m in measured[0][1]}
    bw = max(methods.values()) * 1e9
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
            runs_per_batch = [(b, True) for b in batches]
            runs_per_batch += [(b, False) for b in unfused_batches if b in batches]
            for batch, fused in tqdm(
                runs_per_batch, desc=f"{name} {strategy}", disable=not progress
            ):
                torch.cuda.empty_cache()
                try:
                    max_len = prompt_len + (repeats + 2) * n_new + 16
                    engine = DecodeEngine(model, batch, max_len, strategy, log_length, fused=fused)
                    g = torch.Generator().manual_seed(5)
                    prompts = torch.randint(
                        0, model.cfg.vocab_size, (batch, prompt_len), generator=g
                    ).cuda()
                    tok = engine.prefill(prompts).argmax(-1, keepdim=True)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()  # decode only: prefill excluded
                    _, tok = _decode_ms(engine, tok, n_new)  # warm-up: graph capture
                    runs = []
                    for _ in range(repeats):
                        ms, tok = _decode_ms(engine, tok, n_new)
                        runs.append(ms * 1e-3)
                    peak = torch.cuda.max_memory_allocated() - weights
                    busy, tok = busy_fraction(engine, tok) if batch in (1, 64) else (None, tok)
                    profile = None
                    if fused and batch in profile_batches:
                        profile, tok = _kernel_profile(engine, tok)
                    spt = spread(runs)
                    context = engine.position - n_new // 2
                    moved = decode_step_bytes(
                        model.cfg, strategy, batch, context, engine.L, weights
                    )
                    rows.append(
                        dict(
                            preset=name,
                            strategy=strategy,
                            fused=fused,
                            batch=batch,
                            seconds_per_token=spt,
                            tokens_per_s=batch / spt["median"],
                            bytes_per_step=moved,
                            roofline_fraction=moved / bw / spt["median"],
                            gpu_busy=busy,
                            decode_peak_bytes_per_sequence=peak / batch,
                            pool_bytes_per_sequence=_pool_bytes_per_sequence(engine),
                            log_length=engine.L,
                            folds=engine.stats.folds,
                            profile=profile,
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
            for strategy in ("snapshot", "replay"):
                for batch in [b for b in batches if b in (8, 64, 128)]:
                    try:
                        for r in _batched_verify_rounds(
                            model, strategy, batch, (0.5, 0.8, 0.95), prompt_len
                        ):
                            rows.append(dict(preset=name, **r))
                    except Exception as err:  # noqa: BLE001
                        errors.append(f"verify rounds {strategy} b={batch}: {err}"[:400])
            for strategy in ("snapshot", "replay"):
                try:
                    conc, per_seq = _concurrency(
                        model,
                        strategy,
                        concurrency_budget_gib * 2**30,
                        concurrency_max_len,
                        4,
                        log_length,
                    )
                    rows.append(
                        dict(
                            preset=name,
                            strategy=strategy,
                            workload="concurrency",
                            budget_gib=concurrency_budget_gib,
                            max_len=concurrency_max_len,
                            k=4,
                            max_batch=conc,
                            pool_bytes_per_sequence=per_seq,
                        )
                    )
                except Exception as err:  # noqa: BLE001
                    errors.append(f"concurrency {strategy}: {type(err).__name__}: {err}"[:400])
            try:
                rows.extend(_trained_pair_speculative())
            except Exception as err:  # noqa: BLE001
                errors.append(f"trained pair: {type(err).__name__}: {err}"[:400])
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
                                16,  # no log: snapshot's bytes
                                mweights,
                            )
                            r["roofline_fraction"] = moved / bw / r["seconds_per_token"]["median"]
                        rows.append(dict(preset=name, **r))
                except Exception as err:  # noqa: BLE001
                    errors.append(f"mamba-ssm: {type(err).__name__}: {err}"[:400])
        del model
        torch.cuda.empty_cache()
    return dict(
        copy_bandwidth_methods_gbs=methods,
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
        if r.get("workload") == "concurrency":
            lines.append(
                f"{r['preset']} {r['strategy']}: {r['max_batch']} sequences in "
                f"{r['budget_gib']} GiB (max_len {r['max_len']}, k={r['k']}; pools "
                f"{r['pool_bytes_per_sequence'] / 2**20:.1f} MiB per sequence)"
            )
            continue
        if "error" in r:
            lines.append(
                f"{r['preset']} {r.get('strategy', r.get('provider'))} b={r['batch']}: {r['error']}"
            )
            continue
        who = r.get("workload") or r.get("provider") or f"engine {r['strategy']}"
        if r.get("fused") is False:
            who += " unfused"
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
