"""Prefix-cache hit rates on the CPU (issue 22): four request workloads served through
``replaylab.prefix.PrefixCache`` per strategy and block size, beside an attention-only ideal;
and (``run_engine_prefix_bench``) the same workloads admitted into the serving engine through
``replaylab.serving.EnginePrefixCache`` against cold admits: hit rate, prefill tokens, bytes,
CPU admit time and the largest logit difference from the cold admit.

Glossary:
    token hit rate    sum of resumed_from / sum of prompt lengths: tokens whose computation the
                      tree saved (recompute: its re-run tokens [r, m) count as computed)
    ideal             an attention-only model's hit rate on the same stream: every matched token
                      a hit (capped at T - 1: the last token is computed for its logits)
    computed          tokens run through the model (prefilled + recomputed)
    bytes held        what the tree holds after the stream (no budget: everything inserted)
"""

from __future__ import annotations

import time

import torch

from replaylab.prefix import PrefixCache

__all__ = [
    "WORKLOADS",
    "workload",
    "run_prefix_bench",
    "budget_sweep",
    "prefix_summary",
    "run_engine_prefix_bench",
    "engine_prefix_summary",
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


def budget_sweep(model, budgets, block_sizes=(16, 64), strategies=None, log=print) -> list:
    """Token hit rate at equal bytes: every workload, strategy and block size under each byte
    budget in ``budgets`` (LRU eviction; a budget under one block of a strategy is skipped and
    recorded as such)."""
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
                            model, strategy, block_size=block, max_len=max_len, budget_bytes=budget
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
