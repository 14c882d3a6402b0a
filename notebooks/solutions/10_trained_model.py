# Reference answers for notebook 10 (format: see 03_branching_strategies.py).

# %% prompt_lookup
def find_draft(context, k):
    for n in range(min(3, len(context) - 1), 0, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # latest earlier occurrence first
            if context[start : start + n] == tail:
                follow = context[start + n : start + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return [context[-1]] * k
