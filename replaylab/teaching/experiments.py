"""Small live measurements the notebooks run on the tiny model: each returns plain rows (dicts)
that a notebook prints or plots. Byte and token counts are exact; seconds depend on the machine.

``interval`` here is the one knob the notebooks turn: recompute's checkpoint interval and
replay's log length L together (``_config``).
"""

from __future__ import annotations

import time

import torch

from replaylab.cache import CacheConfig
from replaylab.decoding import SyntheticDrafter, greedy, speculative
from replaylab.strategies import STRATEGY_NAMES

__all__ = [
    "compare_strategies",
    "snapshot_memory_vs_draft_length",
    "budget_outcomes",
    "restore_cost_vs_distance",
    "speculative_vs_prediction",
    "gain_vs_attention_live",
    "TINY_DIMS",
]


def _config(strategy, interval, **options) -> CacheConfig:
    return CacheConfig(strategy, checkpoint_interval=interval, log_length=interval, **options)


def compare_strategies(
    model, prompt, n_new, acceptance, k=4, interval=8, seed=0, strategies=STRATEGY_NAMES
) -> list[dict]:
    """Speculative decoding with a synthetic drafter of the given acceptance under each
    strategy; one row per strategy: same tokens as greedy?, acceptance, restores, peak bytes,
    recomputed tokens, restore seconds (measured, machine-dependent)."""
    reference = greedy(model, prompt, n_new, strategies[0])
    full = torch.cat([prompt, reference.tokens], 1)
    rows = []
    for strategy in strategies:
        run = speculative(
            model,
            prompt,
            n_new,
            SyntheticDrafter(full, acceptance, seed),
            k=k,
            cache=_config(strategy, interval),
        )
        rows.append(
            dict(
                strategy=strategy,
                same_tokens_as_greedy=bool(torch.equal(run.tokens, reference.tokens)),
                acceptance_rate=round(run.acceptance_rate, 3),
                restores=run.restores,
                peak_bytes=run.peak_bytes,
                recomputed_tokens=run.recomputed_tokens,
                restore_seconds=run.restore_seconds,
            )
        )
    return rows


def snapshot_memory_vs_draft_length(
    model,
    prompt,
    n_new,
    draft_lengths,
    acceptance=0.7,
    strategies=("snapshot", "replay"),
    interval=8,
    seed=0,
):
    """Peak bytes held by component while speculating, for each draft length k."""
    reference = torch.cat([prompt, greedy(model, prompt, n_new).tokens], 1)
    rows = []
    for k in draft_lengths:
        for strategy in strategies:
            run = speculative(
                model,
                prompt,
                n_new,
                SyntheticDrafter(reference, acceptance, seed),
                k=k,
                cache=_config(strategy, interval),
            )
            rows.append(
                dict(k=k, strategy=strategy, peak_bytes=run.peak_bytes, restores=run.restores)
            )
    return rows


def budget_outcomes(
    model,
    prompt,
    n_new,
    budget_fractions,
    k=4,
    acceptance=0.5,
    strategy="snapshot",
    interval=4,
    seed=0,
):
    """Speculative decoding under a byte budget (a fraction of the unbudgeted peak), for each
    eviction policy: evictions, restores that had to rebuild an evicted copy, tokens re-run,
    and whether the tokens still equal greedy decoding."""
    ref_tokens = greedy(model, prompt, n_new).tokens
    reference = torch.cat([prompt, ref_tokens], 1)
    free = speculative(
        model,
        prompt,
        n_new,
        SyntheticDrafter(reference, acceptance, seed),
        k=k,
        cache=_config(strategy, interval),
    )
    rows = []
    for fraction in budget_fractions:
        for policy in ("lru", "cost"):
            budget = int(free.peak_bytes * fraction)
            run = speculative(
                model,
                prompt,
                n_new,
                SyntheticDrafter(reference, acceptance, seed),
                k=k,
                cache=_config(strategy, interval, budget_bytes=budget, eviction=policy),
            )
            s = run.stats
            rows.append(
                dict(
                    budget_fraction=fraction,
                    policy=policy,
                    budget_bytes=budget,
                    evictions=s.evictions,
                    fallback_restores=s.fallback_restores,
                    recomputed_tokens=s.recomputed_tokens,
                    same_tokens=bool(torch.equal(run.tokens, ref_tokens)),
                    restore_seconds=s.restore_seconds,
                )
            )
    return rows


@torch.no_grad()
def restore_cost_vs_distance(model, strategy, interval=16, prompt_len=32, seed=0):
    """Go back to each position inside the last checkpoint interval and take one more step:
    tokens re-run (recompute), logged tokens folded (replay), and seconds for restore + step."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (1, prompt_len + interval), generator=g)
    base = prompt_len  # a checkpoint (recompute) / fold point (replay) sits here
    rows = []
    for offset in range(0, interval + 1, max(1, interval // 8)):
        cache = _config(strategy, interval).build(model, 1)
        model(ids[:, :base], cache)
        handle = cache.snapshot()
        model(ids[:, base:], cache)
        folded_before = cache.stats.folded_tokens
        target = base + offset
        t0 = time.perf_counter()
        cache.restore(target if strategy != "snapshot" or offset else handle)
        model(ids[:, target : target + 1] if target < ids.shape[1] else ids[:, -1:], cache)
        seconds = time.perf_counter() - t0
        cache.release(handle)
        rows.append(
            dict(
                strategy=strategy,
                distance=offset,
                recomputed_tokens=cache.stats.recomputed_tokens,
                folded_tokens=cache.stats.folded_tokens - folded_before,
                seconds=seconds,
            )
        )
    return rows


def speculative_vs_prediction(
    model, prompt, n_new, k, acceptance, strategy="replay", interval=8, seed=0
):
    """A live synthetic-drafter run next to the cost model: acceptance, tokens per round,
    restores, and the SSM-side peak bytes. Rows: quantity, predicted, measured, factor."""
    from replaylab import costmodel as cm

    reference = torch.cat([prompt, greedy(model, prompt, n_new).tokens], 1)
    run = speculative(
        model,
        prompt,
        n_new,
        SyntheticDrafter(reference, acceptance, seed),
        k=k,
        cache=_config(strategy, interval),
    )
    rounds = run.proposed / k
    m = cm.model_costs(
        cm.shape_from_config(model.cfg),
        cm.Workload(k=k, interval=interval, act_bytes=next(model.parameters()).element_size()),
        sum(p.numel() for p in model.parameters()),
    )
    if strategy == "replay":
        held = cm.bytes_held(m, "replay", log_entries=max(interval - 1, k + 1))
    else:
        held = cm.bytes_held(m, "snapshot", copies=k + 2)
    peak = run.stats.peak_by_component
    measured_ssm = sum(peak.get(c, 0) for c in held)
    ea = cm.expected_accepted(k, acceptance)
    rows = [
        ("accepted drafts per round", ea, run.accepted / rounds),
        ("tokens per round", ea + 1, n_new / rounds),
        ("restores per round", 1 - acceptance**k, run.restores / rounds),
        ("peak SSM-side bytes", sum(held.values()), measured_ssm),
    ]
    return [
        dict(quantity=q, predicted=p, measured=v, factor=(v / p if p else float("nan")))
        for q, p, v in rows
    ]


def _tiny_dims():
    from replaylab.model import PRESETS

    return {k: v for k, v in PRESETS["tiny"].items() if k != "pattern"}


TINY_DIMS = _tiny_dims()  # the tiny preset's layer sizes, without its pattern


def _kv_rows_allocated(first, final, block=64):
    """KV rows ``LayerKV`` has allocated once ``final`` positions are held, after a prefill of
    ``first``: it allocates what the prefill needs, then grows to max(need, 2 x capacity,
    block) whenever an append does not fit (``replaylab.kv.LayerKV.append``)."""
    rows = max(first, block) if first > 0 else 0
    while final > rows:
        rows = max(final, 2 * rows, block)
    return rows


def gain_vs_attention_live(
    patterns, prompt_len=192, rounds=3, k=4, log_length=16, seed=0, dims=None
) -> list[dict]:
    """The first caveat, live on CPU: for each layer pattern a tiny model (``TINY_DIMS``, the
    tiny preset's layer sizes), speculative decoding under snapshot and under replay with every
    draft accepted (so the run, and its peak, are deterministic): the peak bytes each cache
    held (KV included, as ``HybridCache`` counts them), beside the cost model's prediction for
    the same shape (``costmodel.speculative_held`` with the KV rows the cache allocates,
    ``_kv_rows_allocated``). Rows:
    pattern, attention_share, measured and predicted bytes per strategy, memory gain
    (snapshot / replay) measured and predicted."""
    from replaylab import costmodel as cm
    from replaylab.model import HybridConfig, HybridLM

    if rounds * (k + 1) < log_length - 1:
        raise ValueError(
            f"rounds: {rounds} rounds of {k + 1} tokens do not fill a log of {log_length} "
            f"entries, so replay's peak would not be the one the cost model counts"
        )
    rows = []
    for pattern in patterns:
        cfg = HybridConfig(pattern=pattern, **(dims or TINY_DIMS))
        model = HybridLM(cfg, seed=seed).eval()
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), generator=g)
        n_new = 1 + rounds * (k + 1)
        reference = torch.cat([prompt, greedy(model, prompt, n_new).tokens], 1)
        shape = cm.shape_from_config(cfg)
        esize = next(model.parameters()).element_size()
        m = cm.model_costs(
            shape,
            cm.Workload(k=k, interval=log_length, state_bytes=esize, act_bytes=esize),
            0,
        )
        row = dict(pattern=pattern, attention_share=cm.attention_share(shape))
        kv_rows = _kv_rows_allocated(prompt_len, prompt_len + n_new - 1)
        for strategy in ("snapshot", "replay"):
            run = speculative(
                model,
                prompt,
                n_new,
                SyntheticDrafter(reference, 1.0, seed),
                k=k,
                cache=_config(strategy, log_length),
            )
            row[f"{strategy}_measured"] = run.peak_bytes
            row[f"{strategy}_predicted"] = cm.speculative_held(
                m, strategy, k=k, log_length=log_length, context_len=kv_rows
            )
        row["gain_measured"] = row["snapshot_measured"] / row["replay_measured"]
        row["gain_predicted"] = row["snapshot_predicted"] / row["replay_predicted"]
        rows.append(row)
    return rows
