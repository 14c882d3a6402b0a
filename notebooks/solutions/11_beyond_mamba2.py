# Reference answers for notebook 11 (format: see 03_branching_strategies.py).

# %% chunked_fold
def chunked_fold(state, k, v, g, beta, chunk_size):
    """The Gated DeltaNet state after the T tokens, chunk by chunk in the WY / UT form."""
    heads = v.shape[2]
    k = k.repeat_interleave(heads // k.shape[2], dim=2)  # (b, T, H, K)
    k, v, g, beta = (t.transpose(1, 2).float() for t in (k, v, g, beta))  # heads first
    S = state.float()
    for start in range(0, k.shape[2], chunk_size):
        kc, vc = k[:, :, start : start + chunk_size], v[:, :, start : start + chunk_size]
        bc = beta[:, :, start : start + chunk_size, None]
        log_gamma = g[:, :, start : start + chunk_size].cumsum(-1)  # log γ_t
        C = kc.shape[2]
        below = torch.ones(C, C, dtype=torch.bool).tril()
        ratio = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(~below, -torch.inf)
        ratio = ratio.exp()  # γ_t / γ_s for s <= t
        A = (bc * (kc @ kc.transpose(-1, -2)) * ratio).tril(-1)
        system = torch.eye(C) + A
        gamma = log_gamma.exp()[..., None]
        right = bc * vc - (bc * gamma * kc) @ S  # diag(β) V - diag(βγ) K S_0
        U = torch.linalg.solve_triangular(system, right, upper=False, unitriangular=True)
        to_end = (log_gamma[..., -1:] - log_gamma).exp()[..., None]  # γ_C / γ_s
        S = log_gamma[..., -1].exp()[..., None, None] * S + (to_end * kc).transpose(-1, -2) @ U
    return S
