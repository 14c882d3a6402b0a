# Reference answers for notebook 13 (format: see 03_branching_strategies.py).

# %% rollback_cursor
def my_rollback_cursor(pos, log_len, last, keep):
    """The cursor after a rollback: each slot drops last - keep tokens (see the stub)."""
    new_pos, new_log_len = [], []
    for p, n, lst, k in zip(pos, log_len, last, keep):
        drop = lst - k
        new_pos.append(p - drop)
        new_log_len.append(n - drop)
    return new_pos, new_log_len


# %% provisional_room
def my_provisional_room(pos, log_len, L, max_len):
    """Tokens a draft slot may take and give back by a cursor move (see the stub)."""
    held = log_len if log_len < L else 0  # a full log is folded first, by the next step
    return min(L - held, max_len - pos)


# %% admission_rule
def my_admissible(needs, used, budget, free_slots):
    """How many requests from the head of the queue to admit (see the stub)."""
    n = 0
    for need in needs:
        if n == free_slots or used + need > budget:
            break  # first come, first served: the rest wait behind this one
        used += need
        n += 1
    return n


# %% best_k
def my_best_k(acceptance, seconds):
    """The k with the most tokens a second (see the stub)."""
    rates = [sum(acceptance**i for i in range(k + 1)) / t for k, t in enumerate(seconds)]
    return max(range(len(rates)), key=lambda k: (rates[k], -k))  # a tie: the smaller k


# %% accepted
def my_accepted(drafts, predicted, n_drafts):
    """The drafts each row keeps (see the stub)."""
    import numpy as np

    k = drafts.shape[1]
    same = (drafts == predicted[:, :k]) & (np.arange(k) < n_drafts[:, None])
    return same.cumprod(1).sum(1)  # the leading run of matches
