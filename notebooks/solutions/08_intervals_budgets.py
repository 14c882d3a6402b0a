# Reference answers for notebook 08 (format: see 03_branching_strategies.py).

# %% worst_interval
def excess(interval, n=64):
    t = cm.interval_tradeoff(n, interval)
    return t["steps_per_restore"] / (cm.revolve_cost(n, t["states_kept"] - 1) / n)


worst_interval_answer = max((2, 4, 8, 16, 32), key=excess)

# %% cost_eviction_scenario
from replaylab.cache import CacheConfig

cost_cache = HybridCache(model, 1, CacheConfig("snapshot", eviction="cost"))
with torch.no_grad():
    model(torch.randint(0, 128, (1, 12)), cost_cache)
    first_c = cost_cache.snapshot()
    model(torch.randint(0, 128, (1, 6)), cost_cache)
    cost_cache.snapshot()
    model(torch.randint(0, 128, (1, 3)), cost_cache)
    cost_cache.set_budget(cost_cache.total_bytes() - 1)  # one copy goes
    cost_cache.set_budget(None)
    cost_cache.restore(first_c)
eviction_answer = {
    "evicted_position": next(iter(cost_cache.ssm.evicted.values())),
    "tokens_rerun": cost_cache.stats.recomputed_tokens,
}

# %% beam_log_length
bamba = cm.model_costs(PUBLISHED_SHAPES["Bamba 9B"], cm.Workload(), 8.1e9)
best_bamba = cm.best_log_length(bamba, "beam search", range(2, 257))
beam_log_length_answer = (best_bamba, "longer" if best_bamba > optima["beam search"] else "shorter")
