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


# %% gdn_step_kernel
import triton
import triton.language as tl


@triton.jit
def gdn_step_kernel(S, log_k, log_u, log_g, q, k, v, g, beta, o, u, n, H,
                    K: tl.constexpr, V: tl.constexpr):
    """Program (b, h): o[b, h] and u[b, h] of the new token from S[b, h] and the n logged
    tokens. S is read once and never written."""
    b, h = tl.program_id(0), tl.program_id(1)
    ks, vs = tl.arange(0, K), tl.arange(0, V)
    q_t = tl.load(q + (b * H + h) * K + ks)
    k_t = tl.load(k + (b * H + h) * K + ks)
    log_gamma = tl.load(g + b * H + h)  # log γ_t: the whole log's decays and the token's
    for s in range(n):
        log_gamma += tl.load(log_g + (b * n + s) * H + h)
    read_q = tl.zeros([V], dtype=tl.float32)  # Σ_s (γ_t / γ_s) (k_s · q_t) u_s
    read_k = tl.zeros([V], dtype=tl.float32)  # Σ_s (γ_t / γ_s) (k_s · k_t) u_s
    run = 0.0  # log γ_s
    for s in range(n):
        run += tl.load(log_g + (b * n + s) * H + h)
        w = tl.exp(log_gamma - run)
        k_s = tl.load(log_k + ((b * n + s) * H + h) * K + ks)
        u_s = tl.load(log_u + ((b * n + s) * H + h) * V + vs)
        read_q += w * tl.sum(k_s * q_t) * u_s
        read_k += w * tl.sum(k_s * k_t) * u_s
    tile = tl.load(S + ((b * H + h) * K + ks[:, None]) * V + vs[None, :])  # the one read
    gamma = tl.exp(log_gamma)
    v_t = tl.load(v + (b * H + h) * V + vs)
    u_t = tl.load(beta + b * H + h) * (v_t - gamma * tl.sum(tile * k_t[:, None], 0) - read_k)
    o_t = gamma * tl.sum(tile * q_t[:, None], 0) + read_q + tl.sum(k_t * q_t) * u_t
    tl.store(u + (b * H + h) * V + vs, u_t)
    tl.store(o + (b * H + h) * V + vs, o_t)


# %% s6_step_kernel
import triton
import triton.language as tl


@triton.jit
def s6_step_kernel(S, x, delta, A, B, C, Dskip, y, D, N: tl.constexpr):
    """Program (b, d): channel d of sequence b through one token, its row of S in place."""
    b, d = tl.program_id(0), tl.program_id(1)
    ns = tl.arange(0, N)
    row = (b * D + d) * N + ns
    x_t, delta_t = tl.load(x + b * D + d), tl.load(delta + b * D + d)
    s = tl.load(S + row)  # the one read
    s = tl.exp(delta_t * tl.load(A + d * N + ns)) * s + delta_t * x_t * tl.load(B + b * N + ns)
    tl.store(S + row, s)  # the one write
    tl.store(y + b * D + d, tl.sum(s * tl.load(C + b * N + ns)) + tl.load(Dskip + d) * x_t)
