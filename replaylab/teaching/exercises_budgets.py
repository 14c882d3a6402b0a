"""Checks of notebook 08 (intervals and budgets): the interval furthest above the optimal
(revolve) schedule, cost-aware eviction in section 3's scenario (run live), and beam search's
best log length.

Glossary: n, the chain's steps; interval, checkpoint spacing; revolve_cost, the optimum's steps
with as many states kept.
"""

from __future__ import annotations

import torch

from replaylab.shapes import PUBLISHED_SHAPES
from replaylab.teaching.exercises_common import _answer, _done, whole_number
from replaylab.teaching.grading import guarded


@guarded("interval furthest above the optimum")
def check_worst_interval(answer, n=64, intervals=(2, 4, 8, 16, 32)) -> bool:
    """Notebook 08: of ``intervals``, the one whose steps per restore is the largest multiple
    of the optimum (``revolve_cost``) with as many states kept, for an n-step chain."""
    from replaylab.costmodel import interval_tradeoff, revolve_cost

    def ratio(i):
        t = interval_tradeoff(n, i)
        return t["steps_per_restore"] / (revolve_cost(n, t["states_kept"] - 1) / n)

    want = max(intervals, key=ratio)
    return _answer(
        "interval furthest above the optimum",
        answer,
        want,
        "divide each interval's steps per restore by the optimum's in the table",
    )


@guarded("cost-aware eviction in section 3")
def check_cost_eviction_scenario(answer, model) -> bool:
    """Notebook 08: section 3's scenario under eviction="cost": the position of the copy the
    squeezed budget evicts (the snapshots at 12 and 18, or a per-token copy of the last
    forward), and how many tokens ``restore(first)`` re-runs. ``answer``:
    {"evicted_position": ..., "tokens_rerun": ...}; the scenario runs live."""
    from replaylab.cache import CacheConfig, HybridCache

    name = "cost-aware eviction in section 3"
    keys = {"evicted_position", "tokens_rerun"}
    if answer is Ellipsis:
        answer = None
    if isinstance(answer, dict):  # keys in any case, as the other answers' words
        answer = {k.strip().lower() if isinstance(k, str) else k: v for k, v in answer.items()}
    if answer is not None and (
        isinstance(answer, (int, float, str))
        or set(answer) != keys  # what cannot be iterated raises: ``guarded`` reports it
        or not isinstance(answer, dict)
    ):
        return _done(name, False, f"{answer!r}: expected a dict with the keys {sorted(keys)}")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 21), generator=g)
    cache = HybridCache(model, 1, CacheConfig("snapshot", eviction="cost"))
    with torch.no_grad():
        model(ids[:, :12], cache)
        first = cache.snapshot()
        model(ids[:, 12:18], cache)
        cache.snapshot()
        model(ids[:, 18:], cache)
        cache.set_budget(cache.total_bytes() - 1)
        cache.set_budget(None)
        cache.restore(first)
    (position,) = cache.ssm.evicted.values()  # the squeeze evicts one copy
    want = {"evicted_position": position, "tokens_rerun": cache.stats.recomputed_tokens}
    got = None
    if answer is not None:
        got = {k: whole_number(v) for k, v in answer.items()}
        if None in got.values():
            return _done(name, False, f"{answer!r}: expected whole numbers")
    return _answer(
        name,
        got,
        want,
        "re-run section 3 with CacheConfig('snapshot', eviction='cost'), then read "
        "cache.ssm.evicted (key: position) and cache.stats.recomputed_tokens",
    )


@guarded("beam search's best log length for Bamba 9B")
def check_beam_log_length(answer) -> bool:
    """Notebook 08: the best replay log length for beam search on Bamba 9B's shape
    (``costmodel.best_log_length`` over L = 2..256), and whether it is "longer" or "shorter"
    than Nemotron-H 8B's. Answer: (L, "longer" or "shorter")."""
    from replaylab import costmodel as cm

    def best(name):
        m = cm.model_costs(PUBLISHED_SHAPES[name], cm.Workload(), 8e9)
        return cm.best_log_length(m, "beam search", range(2, 257))

    bamba, nemotron = best("Bamba 9B"), best("Nemotron-H 8B")
    want = (bamba, "longer" if bamba > nemotron else "shorter")
    return _answer(
        "beam search's best log length for Bamba 9B",
        None if answer is None else tuple(answer),
        want,
        "build cm.model_costs for Bamba 9B's shape and call cm.best_log_length(m, 'beam search', "
        "range(2, 257)); compare the state / log-entry ratio of the two shapes",
    )
