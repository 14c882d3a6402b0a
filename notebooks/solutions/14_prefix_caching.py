# Reference answers for notebook 14 (format: see 03_branching_strategies.py).

# %% prefix_lookup
def my_lookup(root, tokens, block_size):
    """The longest held prefix of tokens and the node holding its last token (see the stub)."""
    node, m, found = root, 0, None
    while True:
        want = tokens[m : m + block_size]
        best, c = None, 0
        for child in node.children:  # the child with the longest common prefix
            n = 0
            while n < min(len(child.tokens), len(want)) and child.tokens[n] == want[n]:
                n += 1
            if n > c:
                best, c = child, n
        if best is None:
            return m, found
        m, found = m + c, best
        if c < block_size or len(best.tokens) < block_size:
            return m, found  # the match ends inside this block (or at a tail node)
        node = best


# %% state_at
def my_state_at(checkpoint, log, g, p, params):
    """Fold the first p - g logged entries onto the checkpoint S_g (see the stub)."""
    A, _, dt_bias, (lo, hi) = params
    H = checkpoint.shape[0]
    state = checkpoint.clone()
    for i in range(p - g):  # entry i is token g + i
        delta = torch.nn.functional.softplus(log["dt"][i] + dt_bias).clamp(lo, hi)  # (H,)
        a = torch.exp(delta * A)  # (H,)
        B = log["B"][i].repeat_interleave(H // log["B"].shape[1], dim=0)  # (G, N) -> (H, N)
        x = log["x"][i]  # (H, P)
        state = a[:, None, None] * state + (delta[:, None] * x)[:, :, None] * B[:, None, :]
    return state


# %% resume_points
s = RESUME_SCENARIO
m, T, b, ci = s["shared"], s["T"], s["block_size"], s["checkpoint_interval"]
resume_answer = {
    "replay": (m, T - m),  # resumes at the match: the grid state + a fold of m - 192 entries
    "snapshot": (m // b * b, T - m // b * b),  # the last grid position <= m
    "recompute": (m // ci * ci, T - m // ci * ci),  # re-runs [128, m), prefills [m, T)
}


# %% align_zero_block
align_zero_answer = next(  # the first block size, in increasing order, with no hit
    b
    for b in ALIGN_BLOCKS
    if token_hit_rate(serve_stream(model, "snapshot", workload("shared_system"), b)[0]) == 0
)


# %% offgrid_extra_tokens
run = ttft[1]  # the off-grid run: align resumes at the grid point below the match, replay at it
offgrid_answer = (
    run["shared_tokens"] - run["shared_tokens"] // run["block_size"] * run["block_size"]
)


# %% chunk_resume_extra_tokens
# replay resumes at the match, replay:chunk at the multiple of the chunk below it
chunk_answer = chunk_run["shared_tokens"] % chunk_run["prefill_chunk"]


# %% stream_bound
# in the rows of section 7, snapshot's failed probe is over the wait bound and within the TPOT
# bound on every workload; replay's too, but on few_shot, where its p99 TPOT broke first
bound_answer = {"snapshot": "wait", "replay_other": "few_shot"}
