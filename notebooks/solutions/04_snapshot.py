# Reference answers for notebook 04 (format: see 03_branching_strategies.py).

# %% cost_eviction
def cheapest_to_rebuild(items):
    """The key of the kept copy with the fewest tokens to its next older kept copy (0 when
    none is older); ties to the least recently used."""
    positions = sorted(item.position for item in items)

    def rebuild_cost(item):
        older = [p for p in positions if p < item.position]
        return (item.position - (older[-1] if older else 0), item.last_used)

    return min(items, key=rebuild_cost).key


# %% copy_bytes
cfg = model.cfg
n_ssm = len(cfg.ssm_layers)
state_bytes = cfg.ssm_heads * cfg.ssm_head_dim * cfg.d_state * 4  # fp32
conv_channels = cfg.ssm_heads * cfg.ssm_head_dim + 2 * cfg.n_groups * cfg.d_state
conv_bytes = (cfg.d_conv - 1) * conv_channels * next(model.parameters()).element_size()
copy_bytes_answer = n_ssm * (state_bytes + conv_bytes)

# %% rerun_high_acceptance
from replaylab.teaching.experiments import budget_outcomes

high = budget_outcomes(model, prompt, n_new=24, budget_fractions=[0.9, 0.7, 0.5], acceptance=0.9)
rerun_answer = (max(r["evictions"] for r in high), max(r["recomputed_tokens"] for r in high))
