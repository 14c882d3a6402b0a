"""Prefix-cache hit rates on the CPU (issue 22): four request workloads served through
``replaylab.prefix.PrefixCache`` per strategy and block size, beside an attention-only ideal;
and (``run_engine_prefix_bench``) the same workloads admitted into the serving engine through
``replaylab.serving.EnginePrefixCache`` against cold admits: hit rate, prefill tokens, bytes,
CPU admit time and the largest logit difference from the cold admit; and
(``run_engine_ttft``) time to first token in the serving engine (GPU): a batch of requests that
share a long prompt, admitted cold and through the prefix cache, per strategy.

Glossary:
    token hit rate    sum of resumed_from / sum of prompt lengths: tokens whose computation the
                      tree saved (recompute: its re-run tokens [r, m) count as computed)
    ideal             an attention-only model's hit rate on the same stream: every matched token
                      a hit (capped at T - 1: the last token is computed for its logits)
    computed          tokens run through the model (prefilled + recomputed)
    bytes held        what the tree holds after the stream (no budget: everything inserted)
"""

from __future__ import annotations

import gc
import math
import time

import torch

from replaylab.prefix import DEFAULT_EVICTION, PREFIX_EVICTION, PrefixCache
from replaylab.validation import as_int

__all__ = [
    "WORKLOADS",
    "workload",
    "run_prefix_bench",
    "budget_sweep",
    "prefix_summary",
    "budget_markdown",
    "run_engine_prefix_bench",
    "engine_prefix_summary",
    "TTFT_PRESETS",
    "run_engine_ttft",
    "prefill_roofline",
    "ttft_summary",
]

WORKLOADS = ("shared_system", "multi_turn", "few_shot", "shared_docs")


def _ids(generator, n):
    return torch.randint(0, 50, (n,), generator=generator).tolist()


def _lengths(generator, n, low, high):
    return torch.randint(low, high + 1, (n,), generator=generator).tolist()


def workload(name, seed=0) -> list[list[int]]:
    """A request stream (lists of token ids, vocabulary 50):
    shared_system  a 200-token system prompt + a user turn of 20-60 tokens, 8 requests
    multi_turn     a 100-token opening, then 6 turns each extending the conversation by 30-60
    few_shot       an instruction and examples of 240 tokens (one of two sets) + a query of
                   15-30 tokens, 8 requests
    shared_docs    one of three 150-token documents + a question of 10-30 tokens, 9 requests
    """
    g = torch.Generator().manual_seed(seed)
    if name == "shared_system":
        system = _ids(g, 200)
        return [system + _ids(g, n) for n in _lengths(g, 8, 20, 60)]
    if name == "multi_turn":
        chat, out = _ids(g, 100), []
        for n in _lengths(g, 6, 30, 60):
            out.append(list(chat))
            chat = chat + _ids(g, n)
        return out
    if name == "few_shot":
        sets = [_ids(g, 240), _ids(g, 240)]
        return [sets[i % 2] + _ids(g, n) for i, n in enumerate(_lengths(g, 8, 15, 30))]
    if name == "shared_docs":
        docs = [_ids(g, 150) for _ in range(3)]
        return [docs[i % 3] + _ids(g, n) for i, n in enumerate(_lengths(g, 9, 10, 30))]
    raise ValueError(f"workload: expected one of {WORKLOADS}, got {name!r}")


def _hit_fields(hits, total) -> dict:
    """What both benches report of a stream's hits: token and ideal (attention-only) hit rates,
    prefill tokens computed, and how many hits stopped for each reason."""
    reasons = {}
    for h in hits:
        reasons[h.limited_by] = reasons.get(h.limited_by, 0) + 1
    return dict(
        token_hit_rate=round(sum(h.resumed_from for h in hits) / total, 4),
        ideal_hit_rate=round(sum(min(h.matched, h.prompt_length - 1) for h in hits) / total, 4),
        computed_tokens=sum(h.computed for h in hits),
        limited_by=reasons,
    )


def run_prefix_bench(model, block_sizes=(16, 64, 256), strategies=None, log=print) -> dict:
    """For each workload, strategy and block size: token hit rate, computed tokens, bytes held
    and the reasons reuse stopped, beside the attention-only ideal."""
    strategies = strategies or ("replay", "snapshot", "recompute")
    rows = []
    for name in WORKLOADS:
        stream = workload(name)
        total = sum(len(t) for t in stream)
        max_len = max(len(t) for t in stream)
        for block in block_sizes:
            for strategy in strategies:
                prefix = PrefixCache(model, strategy, block_size=block, max_len=max(max_len, block))
                hits = [prefix.serve(tokens).hit for tokens in stream]
                row = dict(
                    workload=name,
                    strategy=strategy,
                    block_size=block,
                    requests=len(stream),
                    prompt_tokens=total,
                    **_hit_fields(hits, total),
                    folded_tokens=sum(h.folded for h in hits),
                    recomputed_tokens=sum(h.recomputed for h in hits),
                    bytes_held=prefix.held_bytes,
                    block_bytes=prefix.block_bytes,
                )
                rows.append(row)
                log(
                    f"{name:13s} b={block:4d} {strategy:9s} hit {row['token_hit_rate']:.3f} "
                    f"(ideal {row['ideal_hit_rate']:.3f}) computed {row['computed_tokens']:5d} "
                    f"bytes {row['bytes_held']}"
                )
    return {"model": "replaylab.testing.tiny_hybrid", "rows": rows}


def budget_sweep(
    model, budgets, block_sizes=(16, 64), strategies=None, eviction=DEFAULT_EVICTION, log=print
) -> list:
    """Token hit rate at equal bytes: every workload, strategy and block size under each byte
    budget in ``budgets``, the trees evicting by ``eviction`` (``prefix.PREFIX_EVICTION``; a
    budget under one block of a strategy, ``floor_bytes``, is skipped and recorded as such)."""
    if eviction not in PREFIX_EVICTION:
        raise ValueError(f"eviction: expected one of {PREFIX_EVICTION}, got {eviction!r}")
    strategies = strategies or ("replay", "snapshot", "recompute")
    rows = []
    for name in WORKLOADS:
        stream = workload(name)
        total = sum(len(t) for t in stream)
        max_len = max(max(len(t) for t in stream), *block_sizes)
        for block in block_sizes:
            for strategy in strategies:
                for budget in budgets:
                    row = dict(workload=name, strategy=strategy, block_size=block, budget=budget)
                    try:
                        prefix = PrefixCache(
                            model,
                            strategy,
                            block_size=block,
                            max_len=max_len,
                            budget_bytes=budget,
                            eviction=eviction,
                        )
                    except ValueError as err:
                        rows.append(dict(row, skipped=str(err)))
                        continue
                    hits = [prefix.serve(tokens).hit for tokens in stream]
                    row.update(
                        token_hit_rate=round(sum(h.resumed_from for h in hits) / total, 4),
                        computed_tokens=sum(h.computed for h in hits),
                        bytes_held=prefix.held_bytes,
                        evicted_stops=sum(h.match_stop == "evicted" for h in hits),
                    )
                    rows.append(row)
                    log(
                        f"{name:13s} b={block:4d} {strategy:9s} budget {budget:8d} "
                        f"hit {row['token_hit_rate']:.3f}"
                    )
    return rows


def budget_markdown(sweep, a="replay", b="snapshot") -> list[str]:
    """``budget_sweep``'s rows as the markdown table ``data/PREFIX.md`` shows: one line per
    (workload, block size), one column per budget, "a / b" token hit rates ("refused": the
    budget is under one block of that strategy)."""
    budgets = sorted({r["budget"] for r in sweep})
    cell = {(r["workload"], r["block_size"], r["strategy"], r["budget"]): r for r in sweep}

    def rate(key):
        row = cell.get(key)
        return (
            "-"
            if row is None
            else "refused"
            if "skipped" in row
            else f"{row['token_hit_rate']:.3f}"
        )

    lines = [
        "| workload, block | " + " | ".join(f"{x / 1000:g} kB" for x in budgets) + " |",
        "|---" * (len(budgets) + 1) + "|",
    ]
    for name, block in dict.fromkeys((r["workload"], r["block_size"]) for r in sweep):
        pairs = [f"{rate((name, block, a, x))} / {rate((name, block, b, x))}" for x in budgets]
        lines.append(f"| {name}, {block} | " + " | ".join(pairs) + " |")
    return lines


def prefix_summary(result) -> list[str]:
    lines = ["workload       block  replay  snapshot  recompute  ideal"]
    table = {}
    for r in result["rows"]:
        key = (r["workload"], r["block_size"])
        table.setdefault(key, {"ideal": r["ideal_hit_rate"]})[r["strategy"]] = r["token_hit_rate"]
    for (name, block), v in table.items():
        lines.append(
            f"{name:13s} {block:6d}  {v.get('replay', float('nan')):.3f}   "
            f"{v.get('snapshot', float('nan')):.3f}     {v.get('recompute', float('nan')):.3f}"
            f"     {v['ideal']:.3f}"
        )
    return lines


def run_engine_prefix_bench(
    model,
    block_sizes=(16, 64, 256),
    strategies=None,
    log_length=16,
    prefill_chunk=256,
    workloads=WORKLOADS,
    log=print,
) -> dict:
    """Each workload admitted request by request (one slot, retired after its admission) into
    a ``DecodeEngine`` through an ``EnginePrefixCache`` (no byte budget), per strategy and
    block size, and into a twin engine cold. Per row: token hit rate (sum of resumed_from /
    prompt tokens), the ideal (attention-only), prefill tokens computed, bytes held, the
    seconds of all admissions with the cache and cold (CPU, one process: a TTFT proxy without
    queueing; noisy on a shared machine), and the largest |logit| difference from the cold
    admit of the same prompt. The admissions with the cache run chunks that end on every block
    boundary (to copy the block-end states), so at small blocks on the CPU they pay more
    per-chunk overhead than a cold admit's chunks of ``prefill_chunk``."""
    from replaylab.serving import DecodeEngine, EnginePrefixCache

    strategies = strategies or ("replay", "snapshot", "recompute")
    rows = []
    for name in workloads:
        stream = workload(name)
        total = sum(len(t) for t in stream)
        max_len = max(max(len(t) for t in stream), *block_sizes) + 1
        for strategy in strategies:
            kw = dict(log_length=log_length, max_verify=1, prefill_chunk=prefill_chunk)
            cold = DecodeEngine(model, 1, max_len, strategy, **kw)
            cold_logits, t0 = [], time.perf_counter()
            for tokens in stream:
                slot, logits = cold.admit(torch.tensor(tokens))
                cold_logits.append(logits)
                cold.retire(slot)
            cold_s = time.perf_counter() - t0
            for block in block_sizes:
                engine = DecodeEngine(model, 1, max_len, strategy, **kw)
                prefix = EnginePrefixCache(engine, block_size=block)
                hits, err, t0 = [], 0.0, time.perf_counter()
                for tokens, want in zip(stream, cold_logits):
                    slot, logits, hit = prefix.admit(tokens)
                    engine.retire(slot)
                    hits.append(hit)
                    err = max(err, float((logits - want).abs().max()))
                prefix_s = time.perf_counter() - t0
                row = dict(
                    workload=name,
                    strategy=strategy,
                    block_size=block,
                    log_length=log_length,
                    requests=len(stream),
                    prompt_tokens=total,
                    **_hit_fields(hits, total),
                    cold_computed_tokens=total,
                    bytes_held=prefix.held_bytes,
                    block_bytes=prefix.block_bytes,
                    admit_s=round(prefix_s, 4),
                    cold_admit_s=round(cold_s, 4),
                    max_logit_diff_vs_cold=err,
                )
                rows.append(row)
                log(
                    f"{name:13s} b={block:4d} {strategy:9s} hit {row['token_hit_rate']:.3f} "
                    f"(ideal {row['ideal_hit_rate']:.3f}) computed {row['computed_tokens']:5d}"
                    f"/{total} admit {prefix_s:.3f}s cold {cold_s:.3f}s diff {err:.1e}"
                )
    return {"model": "replaylab.testing.tiny_hybrid", "engine_rows": rows}


def engine_prefix_summary(result) -> list[str]:
    lines = ["workload       block  strategy   hit    ideal  computed  admit_s / cold_s  diff"]
    for r in result["engine_rows"]:
        lines.append(
            f"{r['workload']:13s} {r['block_size']:6d}  {r['strategy']:9s} "
            f"{r['token_hit_rate']:.3f}  {r['ideal_hit_rate']:.3f}  "
            f"{r['computed_tokens']:5d}/{r['prompt_tokens']}  "
            f"{r['admit_s']:.3f} / {r['cold_admit_s']:.3f}  {r['max_logit_diff_vs_cold']:.1e}"
        )
    return lines


# run_engine_ttft's sizes: "cpu" is the smoke run (the tiny preset, seconds); "gpu" the issue's
# target shape (Nemotron-H 8B layer shapes, a shared prompt of 2,048 tokens, batch 32)
TTFT_PRESETS = {
    "cpu": dict(
        model="tiny",
        shared_tokens=96,
        suffix_tokens=(4, 12),
        batch=4,
        block_size=32,
        log_length=8,
        prefill_chunk=64,
        warm_up=1,
        passes=1,
        prefill_kernels=None,
        fused=False,
        gc="default",
    ),
    "gpu": dict(
        model="8b-layers",
        shared_tokens=2048,
        suffix_tokens=(32, 128),
        batch=32,
        block_size=512,
        log_length=16,
        prefill_chunk=256,
        warm_up=1,
        passes=2,
        prefill_kernels=None,
        fused=False,
        gc="default",
    ),
}


def prefill_roofline(engine, tokens, copy_gbs, matrix_tflops, prompts=1) -> dict:
    """The two-term roofline of one cold prefill of ``tokens`` prompt tokens into ``engine``:
    max(bytes / copy bandwidth, FLOPs / matrix rate), seconds; with ``prompts`` > 1, of that
    many such prompts prefilled in one pass (every term but the weights' bytes times
    ``prompts``: the weights are read once).

    FLOPs: 2 x every matrix weight but the LM head's per token (``serve.matrix_weights``: every
    2-D parameter, Mamba-1's A_log (D, N) included), the LM head once (the first token's
    logits), per attention layer the causal triangle of QKᵀ and PV, 2 x 2 x heads x head_dim x
    T(T+1)/2, and per recurrent layer 5 FLOPs per state element per token (Mamba's state update
    h ← a·h + B xᵀ and read-out C·h; Gated DeltaNet's delta rule needs about 7-8, so there it
    is a floor), counted at the matrix rate too (so the roofline is the faster, the share the
    stricter). Bytes: the weights once (the embedding table's T rows only), each attention
    layer's keys and values written for T positions, each recurrent layer's state and conv
    window written once. A prefill in chunks reads the weights once a chunk and each chunk
    reads the keys and values before it; the roofline charges neither."""
    from replaylab.bench.serve import matrix_weights

    model, t = engine.model, int(tokens)
    n = as_int("prompts", prompts, low=1)
    head = model.lm_head.weight
    embed = model.model.embeddings.weight
    flops = 2 * (matrix_weights(model) - head.numel()) * t + 2 * head.numel()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if head is not embed:
        weights -= embed.numel() * embed.element_size()
    nbytes = t * embed[0].numel() * embed.element_size()
    for pool in engine.kv.values():
        flops += 2 * model.cfg.attn_heads * model.cfg.head_dim * t * (t + 1)
        nbytes += t * 2 * pool.k[0, :, 0].nbytes
    for pool in engine.ssm.values():
        flops += 5 * pool.state[0].numel() * t
        nbytes += pool.state[0].nbytes + pool.conv[0].nbytes
    flops, nbytes = n * flops, weights + n * nbytes
    flop_s = flops / (matrix_tflops * 1e12)
    byte_s = nbytes / (copy_gbs * 1e9)
    return dict(
        flops=int(flops),
        bytes=int(nbytes),
        flop_seconds=flop_s,
        byte_seconds=byte_s,
        seconds=max(flop_s, byte_s),
        binds="flops" if flop_s >= byte_s else "bytes",
    )


def _spread_s(values) -> dict:
    from replaylab.serving.request import percentile

    return dict(
        median=percentile(values, 50),
        p90=percentile(values, 90),
        values=[round(v, 6) for v in values],
    )


def _device_allocs(device) -> int:
    """Device memory allocations (``cudaMalloc``) the caching allocator has made so far on a
    GPU; 0 elsewhere."""
    if device.type != "cuda":
        return 0
    return torch.cuda.memory_stats(device).get("num_device_alloc", 0)


class _CollectorClock:
    """Seconds Python's cyclic garbage collector ran (every generation) while registered in
    ``gc.callbacks``."""

    def __init__(self):
        self.seconds, self._start = 0.0, None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None


def _first_token(fn, device, allocs=None, collector=None):
    """(fn()'s result, seconds until its logits' greedy token is on the host): the clock is
    read after ``torch.cuda.synchronize()`` on both sides on a GPU; the token id's copy to the
    host waits for the logits as a server's first sampled token would. ``allocs`` (a list):
    appended with the device allocations the call made (``_device_allocs``); ``collector``
    (a list): appended with the seconds the garbage collector ran inside the call."""
    from replaylab.bench.timing import sync

    sync(device)
    before = _device_allocs(device)
    clock = _CollectorClock()
    gc.callbacks.append(clock)
    try:
        t0 = time.perf_counter()
        out = fn()
        logits = out[1]
        int(logits.argmax())
        sync(device)
        seconds = time.perf_counter() - t0
    finally:
        gc.callbacks.remove(clock)
    if allocs is not None:
        allocs.append(_device_allocs(device) - before)
    if collector is not None:
        collector.append(round(clock.seconds, 6))
    return out, seconds


def _cold_admits(engine, prompts, device, allocs=None, collector=None):
    """Admit every prompt cold into ``engine`` (kept live until all are in, then retired):
    (first-token logits (vocab,) per prompt, seconds to first token per prompt); ``allocs``,
    ``collector``: see ``_first_token``."""
    out = [
        _first_token(lambda t=t: engine.admit(torch.tensor(t)), device, allocs, collector)
        for t in prompts
    ]
    for (slot, _), _ in out:
        engine.retire(slot)
    return [logits for (_, logits), _ in out], [s for _, s in out]


def _prefix_admits(cache, shared, prompts, device, allocs=None, collector=None):
    """Warm ``cache`` (an ``EnginePrefixCache``) with ``shared`` alone (admitted, retired),
    then admit every prompt through it (kept live until all are in, then retired):
    ([((slot, logits, hit), seconds)] per prompt, the warming admit's seconds); ``allocs``,
    ``collector``: see ``_first_token`` (the prompts' admits, not the warming one)."""
    (slot, _, _), warm_s = _first_token(lambda: cache.admit(shared), device)
    cache.engine.retire(slot)
    out = [_first_token(lambda t=t: cache.admit(t), device, allocs, collector) for t in prompts]
    for (slot, _, _), _ in out:
        cache.engine.retire(slot)
    return out, warm_s


def _cold_roofline(roofs, passes) -> dict | None:
    """The cold admissions against their two-term rooflines (``roofs``: ``prefill_roofline``
    per prompt, or None): each pass's share, the roofline's seconds for the whole batch over
    the pass's cold seconds, and their median (``share``)."""
    if roofs is None:
        return None
    total = sum(r["seconds"] for r in roofs)
    shares = [total / sum(times) for times in passes]
    flop_s, byte_s = sum(r["flop_seconds"] for r in roofs), sum(r["byte_seconds"] for r in roofs)
    return dict(
        flop_seconds=flop_s,
        byte_seconds=byte_s,
        binds="flops" if flop_s >= byte_s else "bytes",
        pass_shares=shares,
        share=_spread_s(shares)["median"],
    )


def _ttft_row(t, hits, prefix, engine, warm_s, prompt_tokens, device, roofs=None) -> dict:
    """One strategy's result so far: ``t`` its passes' times, device allocations and worst
    logit agreement; ``hits``, ``prefix`` (the tree), ``warm_s`` from the last pass; ``roofs``
    the cold prompts' ``prefill_roofline`` (None: no rates)."""
    cold = [v for times in t["cold"] for v in times]
    hit = [v for times in t["prefix"] for v in times]
    gpu = device.type == "cuda"
    return dict(
        cold_roofline=_cold_roofline(roofs, t["cold"]),
        cold_ttft_s=_spread_s(cold),
        prefix_ttft_s=_spread_s(hit),
        speedup=round(_spread_s(cold)["median"] / _spread_s(hit)["median"], 3),
        pass_medians=dict(
            cold_s=[_spread_s(v)["median"] for v in t["cold"]],
            prefix_s=[_spread_s(v)["median"] for v in t["prefix"]],
        ),
        warm_admit_s=round(warm_s, 6),
        cold_device_allocs=t["cold_allocs"] if gpu else None,
        prefix_device_allocs=t["prefix_allocs"] if gpu else None,
        cold_collector_s=t["cold_gc"],
        prefix_collector_s=t["prefix_gc"],
        cold_computed_tokens=prompt_tokens,
        prefix_computed_tokens=sum(h.computed for h in hits),
        **{k: v for k, v in _hit_fields(hits, prompt_tokens).items() if k != "computed_tokens"},
        bytes_held=prefix.held_bytes,
        block_bytes=prefix.block_bytes,
        pool_bytes_per_slot=engine.nbytes_per_slot(),
        max_abs_logit_diff=t["diff"],
        max_logit_diff_over_scale=t["diff"] / t["scale"],
        first_tokens_agree=t["agree"],
    )


def run_engine_ttft(
    preset="cpu",
    device=None,
    strategies=("replay", "snapshot", "recompute"),
    seed=0,
    log=print,
    checkpoint=None,
    rates=None,
    **overrides,
) -> dict:
    """Time to first token in the serving engine, cold against a prefix hit, per strategy.

    A ``DecodeEngine`` (graphs=False; the reference path unless ``fused``; the prefill,
    which TTFT times, runs the engine's ``prefill_kernels`` (None: its default; False: the
    teaching modules on either path);
    bf16 on a GPU) of ``batch`` slots. Requests: one shared prompt of ``shared_tokens``
    ids + a unique suffix of ``suffix_tokens`` = (low, high) ids each (uniform, seeded),
    ``batch`` of them. Every strategy's engine is built and run through ``warm_up`` rounds of
    the same calls on other ids with the same lengths (kernels compiled and loaded for every
    shape the timed calls meet, the allocator warm) before any is timed. Then ``passes`` timed passes, the strategies in the given order and
    reversed in turn (``pass_orders``), so no strategy is always timed first: per strategy the
    ``batch`` requests admitted cold (``engine.admit``, every slot kept live, so the last admit
    runs beside batch - 1 live slots; then retired); then an ``EnginePrefixCache`` of
    ``block_size`` (no byte budget) warmed with the shared prompt alone (admitted and
    retired) and the ``batch`` requests admitted through it. Each admit is timed until its
    first token is on the host (``_first_token``); the prefix admit's time includes the seat
    (copies out of the tree, replay's fold), the prefill of the rest and the insertion of the
    request's blocks into the tree.

    Per strategy: ``cold_ttft_s`` and ``prefix_ttft_s`` (median, p90, every value of every
    pass, pass after pass), their ``speedup`` (cold median / prefix median), each pass's
    medians (``pass_medians``), on a GPU the device allocations (``cudaMalloc``) each admit
    made, in the same order (``cold_device_allocs``, ``prefix_device_allocs``; None on CPU),
    the seconds Python's garbage collector ran inside each admit (``cold_collector_s``,
    ``prefix_collector_s``; ``gc="freeze"``: ``gc.freeze()`` once every engine is warm, as a
    server would after start-up, so the collector no longer rescans that heap; unfrozen after
    where nothing was frozen before, ``gc_frozen_before``), prefill tokens computed (cold: every prompt
    token; prefix: ``PrefixHit.computed``), the token hit rate, the bytes the tree holds,
    ``max_abs_logit_diff`` of each request's first-token logits from its cold admit (and
    that over the largest cold |logit|) and how many first tokens (greedy) agree. The
    requests' ``suffix_lengths`` are recorded in order with the per-request times.
    ``overrides``: any ``TTFT_PRESETS`` field; ``checkpoint``: called with the result so far
    after each strategy's pass (the CLI writes it, so a cut run keeps what it measured).
    ``max_abs_logit_diff`` and ``first_tokens_agree`` are the worst over the passes.
    A strategy "replay:chunk" is replay with its prefix cache under ``resume="chunk"``.
    ``cold_roofline``: the cold admissions against their two-term roofline
    (``prefill_roofline`` per prompt, summed over the batch, over each pass's cold seconds;
    ``rates`` = (copy GB/s, matrix TFLOP/s), measured at the start on a GPU when None, and
    recorded as ``rates``; on CPU without ``rates`` None)."""
    from replaylab.bench.stream import _model, preset_config
    from replaylab.serving import DecodeEngine, EnginePrefixCache

    run = preset_config(TTFT_PRESETS, preset, overrides)
    lo, hi = run["suffix_tokens"]
    if not 1 <= lo <= hi:
        raise ValueError(f"suffix_tokens: expected 1 <= low <= high, got {run['suffix_tokens']}")
    if run["gc"] not in ("default", "freeze"):
        raise ValueError(f"gc: expected 'default' or 'freeze', got {run['gc']!r}")
    passes = run["passes"]
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes: expected an integer >= 1, got {passes!r}")
    for label in strategies:
        if label not in ("replay", "snapshot", "recompute", "replay:chunk"):
            raise ValueError(
                f"strategies: expected replay, snapshot, recompute, or replay:chunk (a prefix "
                f"cache under resume='chunk'), got {label!r}"
            )

    if rates is not None:
        given = rates
        try:
            rates = () if isinstance(given, str) else tuple(float(v) for v in given)
        except (TypeError, ValueError):
            rates = ()
        if len(rates) != 2 or not all(0 < v < math.inf for v in rates):
            raise ValueError(
                f"rates: expected (copy GB/s > 0, matrix TFLOP/s > 0), two finite numbers, "
                f"got {given!r}"
            )

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = _model(run["model"], device)
    vocab, n, S = model.cfg.vocab_size, run["batch"], run["shared_tokens"]
    g = torch.Generator().manual_seed(seed)

    def requests(lengths=None):
        shared = torch.randint(0, vocab, (S,), generator=g).tolist()
        if lengths is None:
            lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
        return shared, [
            shared + torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths
        ]

    def cache(engine, label):
        """The prefix cache of strategy ``label`` ("replay:chunk": ``resume="chunk"``)."""
        return EnginePrefixCache(engine, block_size=run["block_size"],
                                 resume=label.partition(":")[2] or "match")  # fmt: skip

    shared, prompts = requests()
    lengths = [len(p) - S for p in prompts]
    # other ids, the timed prompts' lengths: every shape the timed admits meet is seen once
    # (a matrix product's first kernel of a shape loads lazily, about 5-50 ms on a GPU)
    rounds = [requests(lengths) for _ in range(run["warm_up"])]
    max_len = S + hi + 1
    result = dict(
        kind="prefix-ttft",
        preset=preset,
        **{k: v for k, v in run.items() if k != "warm_up"},
        warm_up_rounds=run["warm_up"],
        device_type=device.type,
        dtype=str(next(model.parameters()).dtype),
        max_len=max_len,
        prompt_tokens=sum(map(len, prompts)),
        suffix_lengths=lengths,
        clock="time.perf_counter around each admit, torch.cuda.synchronize() before and after on "
        "a GPU, until the first token's id is on the host",
        strategies={},
    )
    if rates is None and device.type == "cuda":
        from replaylab.bench.serve import matrix_rate_tflops
        from replaylab.bench.timing import copy_bandwidth_gbs

        rates = copy_bandwidth_gbs(), max(matrix_rate_tflops() for _ in range(3))
        torch.cuda.empty_cache()  # the probes' buffers: the admits' allocations start as before
    if rates is not None:
        copy_gbs, matrix_tflops = rates
        result["rates"] = dict(copy_gbs=copy_gbs, matrix_tflops=matrix_tflops)
    t_start = time.perf_counter()
    engines = {}
    with torch.no_grad():
        for label in strategies:  # every engine built and warm before any is timed
            engines[label] = engine = DecodeEngine(
                model, n, max_len, label.partition(":")[0], log_length=run["log_length"],
                max_verify=1, prefill_chunk=run["prefill_chunk"], fused=run["fused"],
                graphs=False, prefill_kernels=run["prefill_kernels"],
            )  # fmt: skip
            for w_shared, w_prompts in rounds:
                _cold_admits(engine, w_prompts, device)
                untimed = cache(engine, label)
                _prefix_admits(untimed, w_shared, w_prompts, device)
                del untimed  # its tree holds the engine too
    orders = [list(strategies)[:: 1 if p % 2 == 0 else -1] for p in range(passes)]
    result["pass_orders"] = orders
    timed = {
        s: dict(
            cold=[],
            prefix=[],
            cold_allocs=[],
            prefix_allocs=[],
            cold_gc=[],
            prefix_gc=[],
            diff=0.0,
            scale=0.0,
            agree=n,
        )  # fmt: skip
        for s in strategies
    }
    # what a server does once started: the heap so far never rescanned (objects frozen before,
    # by the caller or a library, stay frozen after)
    result["gc_frozen_before"] = frozen_before = gc.get_freeze_count()
    if run["gc"] == "freeze":
        gc.collect()
        gc.freeze()
    try:
        for order in orders:
            for strategy in order:
                engine, t = engines[strategy], timed[strategy]
                with torch.no_grad():
                    cold_logits, cold_s = _cold_admits(
                        engine, prompts, device, t["cold_allocs"], t["cold_gc"]
                    )
                    prefix = cache(engine, strategy)
                    out, warm_s = _prefix_admits(
                        prefix, shared, prompts, device, t["prefix_allocs"], t["prefix_gc"]
                    )
                t["cold"].append(cold_s)
                t["prefix"].append([s for _, s in out])
                pairs = [(lg.float(), c.float()) for ((_, lg, _), _), c in zip(out, cold_logits)]
                t["diff"] = max(t["diff"], *(float((a - b).abs().max()) for a, b in pairs))
                t["scale"] = max(t["scale"], *(float(b.abs().max()) for _, b in pairs))
                agree = sum(int(a.argmax()) == int(b.argmax()) for a, b in pairs)
                t["agree"] = min(t["agree"], agree)
                hits = [hit for (_, _, hit), _ in out]
                roofs = None
                if rates is not None:
                    roofs = [prefill_roofline(engine, len(p), copy_gbs, matrix_tflops)
                             for p in prompts]  # fmt: skip
                row = _ttft_row(
                    t, hits, prefix, engine, warm_s, result["prompt_tokens"], device, roofs
                )
                result["strategies"][strategy] = row
                if checkpoint is not None:
                    checkpoint(result)
                log(
                    f"[{time.perf_counter() - t_start:6.1f} s] pass {len(t['cold'])} {strategy:9s} "
                    f"TTFT cold {1e3 * _spread_s(cold_s)['median']:.2f} ms, prefix "
                    f"{1e3 * _spread_s(t['prefix'][-1])['median']:.2f} ms; computed "
                    f"{row['prefix_computed_tokens']}/{row['cold_computed_tokens']}"
                )
                del prefix, out, cold_logits, pairs
    finally:
        if run["gc"] == "freeze" and not frozen_before:
            gc.unfreeze()
    result["strategies"] = {s: result["strategies"][s] for s in strategies}
    del engines
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    return result


def ttft_summary(result) -> list[str]:
    lines = [
        f"shared prompt {result['shared_tokens']} + suffix {result['suffix_tokens']}, batch "
        f"{result['batch']}, block {result['block_size']} ({result['device_type']}, {result['dtype']})",
        "strategy     cold TTFT ms (p50/p90)  prefix TTFT ms (p50/p90)  speedup  computed  hit    diff/scale  agree  cold/roofline",
    ]
    for strategy, r in result["strategies"].items():
        c, p = r["cold_ttft_s"], r["prefix_ttft_s"]
        lines.append(
            f"{strategy:12s}{1e3 * c['median']:9.2f} / {1e3 * c['p90']:<9.2f}  "
            f"{1e3 * p['median']:9.2f} / {1e3 * p['p90']:<9.2f}   {r['speedup']:6.1f}x  "
            f"{r['prefix_computed_tokens']:5d}/{r['cold_computed_tokens']}  {r['token_hit_rate']:.3f}  "
            f"{r['max_logit_diff_over_scale']:.1e}    {r['first_tokens_agree']}/{result['batch']}"
            + (f"  {r['cold_roofline']['share']:.0%} ({r['cold_roofline']['binds']})"
               if r.get("cold_roofline") else "")
        )  # fmt: skip
    return lines
