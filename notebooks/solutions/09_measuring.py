# Reference answers for notebook 09 (format: see 03_branching_strategies.py).

# %% state_share
def share_at(name, tokens=65536):
    m = memory_per_sequence(PUBLISHED_SHAPES[name], tokens)
    return m["ssm_state"] / sum(m.values())


falcon = share_at("Falcon-H1 7B")
state_share_answer = (falcon, "more" if falcon > share_at("Nemotron-H 8B") else "less")

# %% recompute_half
half = speculative(model, one, 48, SyntheticDrafter(reference, 0.5, seed=0), k=4, cache="recompute")
recompute_half_answer = (half.restores, half.recomputed_tokens)
