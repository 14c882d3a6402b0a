"""Reference selective scans: the Mamba-2 (SSD) and Mamba-1 (S6) recurrences in plain PyTorch.

The simplest correct version, written as a loop over tokens that calls the one-token step, so
a sequence scan and T single steps perform the same floating-point operations in the same
order (they agree bitwise). Every other implementation in replaylab is checked against this.

Glossary (code name -> paper symbol, shape):

Mamba-2 / SSD form (``ssd_*``), state ``h: (batch, H, P, N)``
    x        x_t      (batch, T, H, P)  input per head (after in_proj and conv)
    dt       Δ_t      (batch, T, H)     step size per head, before bias / softplus / limits
    A        A        (H,)              one negative scalar per head (``-exp(A_log)``)
    B        B_t      (batch, T, G, N)  input projection, shared by the H / G heads of a group
    C        C_t      (batch, T, G, N)  output projection, same sharing as B
    D        D        (H,)              skip connection
    z        z_t      (batch, T, H, P)  optional gate: y <- y * silu(z)
    recurrence:  a_t = exp(Δ_t A);  h_t = a_t h_{t-1} + Δ_t x_t B_t^T;  y_t = h_t C_t + D x_t

Mamba-1 / S6 form (``s6_*``), state ``h: (batch, D, N)``
    u        x_t      (batch, T, D)     input per channel
    dt       Δ_t      (batch, T, D)     step size per channel
    A        A        (D, N)            negative, one value per channel and state index
    B, C     B_t, C_t (batch, T, N)     input-dependent projections, shared by all channels
    Dskip    D        (D,)              skip connection
    recurrence:  h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t;  y_t = h_t C_t + D x_t

dt processing as the real layers do it: ``Δ = clamp(softplus(dt + dt_bias), *dt_limit)``, each
part optional. Arithmetic runs in ``compute_dtype`` (float32 by default; float64 makes the scan
an oracle); outputs come back in the input dtype, states in ``compute_dtype``.

Gated DeltaNet (``gdn_*``), state ``S: (batch, H, K, V)``; full glossary above ``gdn_step``
    q, k     q_t, k_t (batch, T, Hk, K)  unit-norm; q scaled by K^-1/2
    v        v_t      (batch, T, H, V)
    g, beta  log α_t, β_t (batch, T, H)
    recurrence:  S_t = α_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T;  o_t = S_t^T q_t
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replaylab.validation import check_finite, check_same_device, check_tensor

__all__ = ["ScanResult", "process_dt", "ssd_step", "ssd_scan", "s6_step", "s6_scan"]

NO_LIMIT = (0.0, math.inf)


@dataclass
class ScanResult:
    """What a sequence scan returns.

    y:       outputs, shaped like the input x (input dtype)
    state:   the state after the last token (compute dtype)
    states:  every intermediate state, ``(batch, T, *state_shape)``, or None unless requested
    updates: Gated DeltaNet's corrected updates u_t (batch, T, H, V), or None unless requested
    """

    y: torch.Tensor
    state: torch.Tensor
    states: torch.Tensor | None = None
    updates: torch.Tensor | None = None


def process_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=NO_LIMIT, compute_dtype=torch.float32):
    """Δ from the raw dt as the layers do it: add the bias, softplus, clamp to ``dt_limit``."""
    dt = dt.to(compute_dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(compute_dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    if tuple(dt_limit) != NO_LIMIT:
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    return dt


def _expand_groups(t, heads):
    """(batch, G, N) -> (batch, H, N): each group's row serves H / G consecutive heads."""
    groups = t.shape[1]
    return t.repeat_interleave(heads // groups, dim=1)


def _ssd_token(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, cd):
    """One SSD token; the scan calls this per token so both run identical kernels on identical
    shapes (vectorised exp/softplus round differently on other shapes)."""
    heads = x.shape[1]
    opt = lambda t: None if t is None else t.contiguous().to(cd)  # noqa: E731
    delta = process_dt(dt.contiguous(), dt_bias, dt_softplus, dt_limit, cd)
    return _ssd_update(
        state,
        opt(x),
        delta,
        A.to(cd),
        _expand_groups(opt(B), heads),
        _expand_groups(opt(C), heads),
        opt(D),
        opt(z),
    )


def _ssd_update(state, x, delta, A, B, C, D, z):
    """One SSD token in compute dtype. state (b,H,P,N); x,z (b,H,P); delta (b,H); B,C (b,H,N)."""
    decay = torch.exp(delta * A)  # a_t: (b, H)
    state = state * decay[:, :, None, None] + (delta[:, :, None] * x)[..., None] * B[:, :, None, :]
    y = (state * C[:, :, None, :]).sum(-1)  # mul + sum: same order for any layout
    if D is not None:
        y = y + D[:, None] * x
    if z is not None:
        y = y * F.silu(z)
    return y, state


def _check_ssd(x, dt, A, B, C, D, z, dt_bias, state, *, seq: bool):
    lead = ("batch", "T") if seq else ("batch",)
    check_tensor("x", x, (*lead, "H", "P"), floating=True)
    batch, heads, headdim = x.shape[0], x.shape[-2], x.shape[-1]
    dims = {"batch": batch, "H": heads, "P": headdim}
    if seq:
        dims["T"] = x.shape[1]
    check_tensor("dt", dt, (*lead, "H"), dims, floating=True)
    check_tensor("A", A, ("H",), dims, floating=True)
    check_tensor("B", B, (*lead, "G", "N"), dims, dtype=x.dtype)
    dims.update(G=B.shape[-2], N=B.shape[-1])
    if heads % dims["G"]:
        raise ValueError(f"B: G={dims['G']} groups must divide H={heads} heads")
    check_tensor("C", C, (*lead, "G", "N"), dims, dtype=x.dtype)
    if D is not None:
        check_tensor("D", D, ("H",), dims, floating=True)
    if z is not None:
        check_tensor("z", z, tuple(x.shape), dtype=x.dtype)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, ("H",), dims, floating=True)
    if state is not None:
        check_tensor("state", state, ("batch", "H", "P", "N"), dims, floating=True)
    check_same_device(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, state=state)


def ssd_step(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    compute_dtype=torch.float32,
    check_nonfinite=False,
):
    """One Mamba-2 token: returns ``(y, new_state)``.

    state: (batch, H, P, N); x, z: (batch, H, P); dt: (batch, H); B, C: (batch, G, N);
    A, D, dt_bias: (H,). y: (batch, H, P) in x's dtype; new_state in ``compute_dtype``.
    """
    _check_ssd(x, dt, A, B, C, D, z, dt_bias, state, seq=False)
    if check_nonfinite:
        check_finite(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    y, new_state = _ssd_token(
        state.to(compute_dtype), x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, compute_dtype
    )
    return y.to(x.dtype), new_state


def ssd_scan(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    initial_state=None,
    return_states=False,
    compute_dtype=torch.float32,
    check_nonfinite=False,
) -> ScanResult:
    """Mamba-2 sequence scan from ``initial_state`` (zeros when None).

    x, z: (batch, T, H, P); dt: (batch, T, H); B, C: (batch, T, G, N); A, D, dt_bias: (H,);
    initial_state: (batch, H, P, N). Returns ``ScanResult(y (batch, T, H, P), state
    (batch, H, P, N), states (batch, T, H, P, N) if return_states)``.
    """
    _check_ssd(x, dt, A, B, C, D, z, dt_bias, initial_state, seq=True)
    if check_nonfinite:
        check_finite(
            initial_state=initial_state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias
        )
    cd = compute_dtype
    batch, T, heads, headdim = x.shape
    N = B.shape[-1]
    state = (
        torch.zeros(batch, heads, headdim, N, dtype=cd, device=x.device)
        if initial_state is None
        else initial_state.to(cd)
    )
    ys, states = [], []
    for t in range(T):
        y, state = _ssd_token(
            state,
            x[:, t],
            dt[:, t],
            A,
            B[:, t],
            C[:, t],
            D,
            None if z is None else z[:, t],
            dt_bias,
            dt_softplus,
            dt_limit,
            cd,
        )
        ys.append(y)
        if return_states:
            states.append(state)
    y = torch.stack(ys, 1) if ys else x.new_zeros(x.shape, dtype=cd)
    return ScanResult(y.to(x.dtype), state, torch.stack(states, 1) if return_states and T else None)


def _s6_token(state, u, dt, A, B, C, Dskip, z, dt_bias, dt_softplus, dt_limit, cd):
    """One S6 token; shared by step and scan (see ``_ssd_token``)."""
    opt = lambda t: None if t is None else t.contiguous().to(cd)  # noqa: E731
    delta = process_dt(dt.contiguous(), dt_bias, dt_softplus, dt_limit, cd)
    return _s6_update(state, opt(u), delta, A.to(cd), opt(B), opt(C), opt(Dskip), opt(z))


def _s6_update(state, u, delta, A, B, C, Dskip, z):
    """One S6 token in compute dtype. state (b,D,N); u,delta,z (b,D); A (D,N); B,C (b,N)."""
    state = torch.exp(delta[..., None] * A) * state + (delta * u)[..., None] * B[:, None, :]
    y = (state * C[:, None, :]).sum(-1)
    if Dskip is not None:
        y = y + Dskip * u
    if z is not None:
        y = y * F.silu(z)
    return y, state


def _check_s6(u, dt, A, B, C, Dskip, z, dt_bias, state, *, seq: bool):
    lead = ("batch", "T") if seq else ("batch",)
    check_tensor("u", u, (*lead, "D"), floating=True)
    dims = {"batch": u.shape[0], "D": u.shape[-1]}
    if seq:
        dims["T"] = u.shape[1]
    check_tensor("dt", dt, (*lead, "D"), dims, floating=True)
    check_tensor("A", A, ("D", "N"), dims, floating=True)
    dims["N"] = A.shape[1]
    check_tensor("B", B, (*lead, "N"), dims, dtype=u.dtype)
    check_tensor("C", C, (*lead, "N"), dims, dtype=u.dtype)
    if Dskip is not None:
        check_tensor("Dskip", Dskip, ("D",), dims, floating=True)
    if z is not None:
        check_tensor("z", z, tuple(u.shape), dtype=u.dtype)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, ("D",), dims, floating=True)
    if state is not None:
        check_tensor("state", state, ("batch", "D", "N"), dims, floating=True)
    check_same_device(u=u, dt=dt, A=A, B=B, C=C, Dskip=Dskip, z=z, dt_bias=dt_bias, state=state)


def s6_step(
    state,
    u,
    dt,
    A,
    B,
    C,
    Dskip=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    compute_dtype=torch.float32,
    check_nonfinite=False,
):
    """One Mamba-1 token: returns ``(y, new_state)``.

    state: (batch, D, N); u, dt, z: (batch, D); A: (D, N); B, C: (batch, N); Dskip, dt_bias: (D,).
    """
    _check_s6(u, dt, A, B, C, Dskip, z, dt_bias, state, seq=False)
    if check_nonfinite:
        check_finite(state=state, u=u, dt=dt, A=A, B=B, C=C, Dskip=Dskip, z=z, dt_bias=dt_bias)
    y, new_state = _s6_token(
        state.to(compute_dtype),
        u,
        dt,
        A,
        B,
        C,
        Dskip,
        z,
        dt_bias,
        dt_softplus,
        dt_limit,
        compute_dtype,
    )
    return y.to(u.dtype), new_state


def s6_scan(
    u,
    dt,
    A,
    B,
    C,
    Dskip=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    initial_state=None,
    return_states=False,
    compute_dtype=torch.float32,
    check_nonfinite=False,
) -> ScanResult:
    """Mamba-1 sequence scan from ``initial_state`` (zeros when None).

    u, dt, z: (batch, T, D); A: (D, N); B, C: (batch, T, N); Dskip, dt_bias: (D,);
    initial_state: (batch, D, N). Returns ``ScanResult(y (batch, T, D), state (batch, D, N),
    states (batch, T, D, N) if return_states)``.
    """
    _check_s6(u, dt, A, B, C, Dskip, z, dt_bias, initial_state, seq=True)
    if check_nonfinite:
        check_finite(
            initial_state=initial_state,
            u=u,
            dt=dt,
            A=A,
            B=B,
            C=C,
            Dskip=Dskip,
            z=z,
            dt_bias=dt_bias,
        )
    cd = compute_dtype
    batch, T, channels = u.shape
    state = (
        torch.zeros(batch, channels, A.shape[1], dtype=cd, device=u.device)
        if initial_state is None
        else initial_state.to(cd)
    )
    ys, states = [], []
    for t in range(T):
        y, state = _s6_token(
            state,
            u[:, t],
            dt[:, t],
            A,
            B[:, t],
            C[:, t],
            Dskip,
            None if z is None else z[:, t],
            dt_bias,
            dt_softplus,
            dt_limit,
            cd,
        )
        ys.append(y)
        if return_states:
            states.append(state)
    y = torch.stack(ys, 1) if ys else u.new_zeros(u.shape, dtype=cd)
    return ScanResult(y.to(u.dtype), state, torch.stack(states, 1) if return_states and T else None)


# --------------------------------------------------------------------------------------------
# The SSD chunked (matrix / "dual") form of the Mamba-2 scan
# --------------------------------------------------------------------------------------------
#
# Same recurrence as ``ssd_scan``, computed chunk by chunk with matrix products instead of a
# token loop (Mamba-2 paper, section 6; mamba-ssm's ``ssd_minimal_discrete``). With
# l_t = Δ_t A (log decay) and L_c the running sum of l inside chunk c:
#     inside a chunk:   y_t = sum_{s<=t} exp(L_t - L_s) (C_t . B_s) Δ_s x_s     (a masked matmul)
#     chunk state:      S_c = sum_s exp(L_last - L_s) Δ_s x_s B_s^T
#     between chunks:   S_after = exp(L_last) S_before + S_c; y_t += exp(L_t) C_t . S_before
# The floating-point order differs from the token loop, so it agrees to rounding, not bitwise:
# the teaching cache uses it only for long inputs (``Mamba2Spec.CHUNKED_MIN_TOKENS``), the serving
# engine's prefill for every prompt chunk (``Mamba2Spec.scan_prompt``).

__all__ += ["ssd_chunked_scan", "segsum"]


def segsum(l):
    """Stable segment sums of ``l (..., T)``: out[..., t, s] = l[s+1] + ... + l[t] for s <= t,
    -inf above the diagonal (so exp(out) is the causal decay matrix)."""
    T = l.shape[-1]
    rep = l[..., None].expand(*l.shape, T)  # rep[..., t, s] = l[t]
    below = torch.tril(torch.ones(T, T, dtype=torch.bool, device=l.device), -1)
    sums = rep.masked_fill(~below, 0).cumsum(-2)
    keep = torch.tril(torch.ones(T, T, dtype=torch.bool, device=l.device))
    return sums.masked_fill(~keep, -math.inf)


def ssd_chunked_scan(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    initial_state=None,
    chunk_size=64,
    compute_dtype=torch.float32,
) -> ScanResult:
    """``ssd_scan`` in the chunked (matrix) form: same arguments and results (no intermediate
    states), a loop over T / chunk_size chunks instead of T tokens. Differentiable.

    x, z: (batch, T, H, P); dt: (batch, T, H); B, C: (batch, T, G, N); A, D, dt_bias: (H,);
    initial_state: (batch, H, P, N). Returns ``ScanResult(y, state)``.
    """
    _check_ssd(x, dt, A, B, C, D, z, dt_bias, initial_state, seq=True)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
    cd = compute_dtype
    batch, T, heads, headdim = x.shape
    N = B.shape[-1]
    state = (
        torch.zeros(batch, heads, headdim, N, dtype=cd, device=x.device)
        if initial_state is None
        else initial_state.to(cd)
    )
    if T == 0:
        return ScanResult(x.new_zeros(x.shape), state)
    delta = process_dt(dt, dt_bias, dt_softplus, dt_limit, cd)  # (b, T, H)
    rep = heads // B.shape[2]
    Bh = B.to(cd).repeat_interleave(rep, dim=2)  # (b, T, H, N)
    Ch = C.to(cd).repeat_interleave(rep, dim=2)
    xd = x.to(cd) * delta[..., None]  # Δ_s x_s
    pad = -T % chunk_size  # zero Δ and x: decay 1, nothing added, so padding changes nothing
    if pad:
        xd, Bh, Ch = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xd, Bh, Ch))
        delta = F.pad(delta, (0, 0, 0, pad))
    n, L = (T + pad) // chunk_size, chunk_size
    # (b, n, L, H, ...) chunks; log decays l (b, H, n, L) and their running sums
    xd, Bh, Ch = (t.reshape(batch, n, L, heads, -1) for t in (xd, Bh, Ch))
    l = (delta * A.to(cd)).reshape(batch, n, L, heads).permute(0, 3, 1, 2)
    L_cum = l.cumsum(-1)
    decay_in = torch.exp(segsum(l))  # (b, H, n, L, L)
    y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Ch, Bh, decay_in, xd)
    to_end = torch.exp(L_cum[..., -1:] - L_cum)  # (b, H, n, L)
    chunk_states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bh, to_end, xd)
    chunk_decay = torch.exp(L_cum[..., -1])  # (b, H, n)
    before = []
    for c in range(n):
        before.append(state)
        state = chunk_decay[:, :, c, None, None] * state + chunk_states[:, c]
    before = torch.stack(before, 1)  # (b, n, H, P, N): state entering each chunk
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, before, torch.exp(L_cum))
    y = y.reshape(batch, n * L, heads, headdim)[:, :T]
    if D is not None:
        y = y + D.to(cd)[:, None] * x.to(cd)
    if z is not None:
        y = y * F.silu(z.to(cd))
    return ScanResult(y.to(x.dtype), state)


# --------------------------------------------------------------------------------------------
# Mamba-1 closed form, and the Gated DeltaNet recurrences (Qwen3-Next, Qwen3.5)
# --------------------------------------------------------------------------------------------
#
# Mamba-1 (``s6_fold``, ``s6_replay_outputs``): with l_t = Δ_t ⊙ A (D, N), elementwise,
#     S_{c+j} = exp(l_1 + ... + l_j) ⊙ S_c + sum_{s<=j} exp(l_{s+1} + ... + l_j) ⊙ Δ_s x_s B_s^T
# so the state after j logged tokens, and any new output y_t = S_t C_t + D x_t, need one read
# of the checkpoint S_c plus the log: the Mamba-2 argument with a decay per channel and state
# index instead of per head.
#
# Gated DeltaNet (``gdn_*``), state S: (batch, H, K, V) per layer (H value heads; S maps a key
# to a value, o = S^T q; transformers' and fla's layout):
#     q, k     q_t, k_t   (batch, T, Hk, K)  L2-normalised; q also scaled by K^-1/2; each of
#                                            the Hk heads serves H / Hk consecutive value heads
#     v        v_t        (batch, T, H, V)
#     g        log α_t    (batch, T, H)      α_t = exp(g_t) in (0, 1]: the gate (decay)
#     beta     β_t        (batch, T, H)      the delta rule's step size, in (0, 1)
#     recurrence:  S_t = α_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T;   o_t = S_t^T q_t
# (the S_t = α_t S_{t-1}(I - β_t k_t k_t^T) + β_t v_t k_t^T is the transpose).
#     chunked (WY / UT) form, chunk of m tokens from S_0, γ_t = α_1 ... α_t inside the chunk
#     (notebook 11's names: M, not A, so that A stays the Mamba decay):
#         u_t = β_t (v_t - α_t S_{t-1}^T k_t)  solves (I + M) U = diag(β) V - diag(βγ) K S_0,
#         M[t, s] = β_t (γ_t / γ_s) k_t . k_s (s < t): a unit lower-triangular solve;
#         o_t = γ_t S_0^T q_t + sum_{s<=t} (γ_t / γ_s)(q_t . k_s) u_s;
#         S_m = γ_m S_0 + sum_s (γ_m / γ_s) k_s u_s^T.
#     backward query recursion (``gdn_replay_outputs``): S_t^T q = S_{t-1}^T q' + β_t (k_t . q) v_t
#         with q' = α_t (q - β_t k_t (k_t . q)); carried from t down to the checkpoint c it
#         gives S_t^T q from one read of S_c, O(L (K + V)) per head and no state written.

__all__ += [
    "s6_fold",
    "s6_replay_outputs",
    "gdn_step",
    "gdn_scan",
    "gdn_chunked_scan",
    "gdn_replay_outputs",
]


def _s6_log_decay(dt, A, dt_bias, dt_softplus, dt_limit, cd):
    """Δ (b, T, D) and l = Δ ⊙ A (b, T, D, N) in compute dtype."""
    delta = process_dt(dt, dt_bias, dt_softplus, dt_limit, cd)
    return delta, delta[..., None] * A.to(cd)


def s6_fold(
    state,
    u,
    dt,
    A,
    B,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    compute_dtype=torch.float32,
):
    """The Mamba-1 state after T tokens from ``state`` by the closed form (no token loop).

    state: (batch, D, N); u, dt: (batch, T, D); A: (D, N); B: (batch, T, N); dt_bias: (D,).
    Returns (batch, D, N) in ``compute_dtype``; equals ``s6_scan(...).state`` to rounding.
    """
    _check_s6(u, dt, A, B, B, None, None, dt_bias, state, seq=True)
    cd = compute_dtype
    state = state.to(cd)
    if u.shape[1] == 0:
        return state
    delta, l = _s6_log_decay(dt, A, dt_bias, dt_softplus, dt_limit, cd)
    # decay from token s to the end: l_{s+1} + ... + l_T (a reverse running sum, no cancellation)
    to_end = l.flip(1).cumsum(1).flip(1) - l
    total = to_end[:, 0] + l[:, 0]
    inputs = (delta * u.to(cd))[..., None] * B.to(cd)[:, :, None, :]  # Δ_s x_s B_s^T
    return torch.exp(total) * state + (torch.exp(to_end) * inputs).sum(1)


def s6_replay_outputs(
    state,
    log,
    new,
    A,
    Dskip=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=NO_LIMIT,
    *,
    compute_dtype=torch.float32,
):
    """Mamba-1 outputs of new tokens from checkpoint ``state`` and the ``log`` since it, with
    one read of the state and no state written (the closed form).

    state: (batch, D, N); ``log`` and ``new``: dicts with u, dt (batch, n / T, D), B
    (batch, n, N) and (``new`` only) C (batch, T, N). Returns y (batch, T, D) in u's dtype,
    equal to ``s6_scan(new, initial_state=s6_scan(log, state).state).y`` to rounding.
    """
    cd = compute_dtype
    n = log["u"].shape[1]
    u = torch.cat([log["u"], new["u"]], 1)
    dt = torch.cat([log["dt"], new["dt"]], 1)
    B = torch.cat([log["B"], new["B"]], 1)
    _check_s6(u, dt, A, B, B, Dskip, None, dt_bias, state, seq=True)
    delta, l = _s6_log_decay(dt, A, dt_bias, dt_softplus, dt_limit, cd)
    inputs = (delta * u.to(cd))[..., None] * B.to(cd)[:, :, None, :]  # (b, n+T, D, N)
    state, ys = state.to(cd), []
    for t in range(n, u.shape[1]):  # each new token reads the checkpoint and the log up to it
        # l_{s+1} + ... + l_t for every s <= t: a reverse running sum (no cancellation)
        to_t = l[:, : t + 1].flip(1).cumsum(1).flip(1) - l[:, : t + 1]
        S_t = torch.exp(to_t[:, 0] + l[:, 0]) * state + (torch.exp(to_t) * inputs[:, : t + 1]).sum(
            1
        )
        ys.append((S_t * new["C"][:, t - n].to(cd)[:, None, :]).sum(-1))  # (b, D)
    y = torch.stack(ys, 1) if ys else new["u"].new_zeros(new["u"].shape, dtype=cd)
    if Dskip is not None:
        y = y + Dskip.to(cd) * new["u"].to(cd)
    return y.to(new["u"].dtype)


def _check_gdn(q, k, v, g, beta, state, *, seq: bool):
    lead = ("batch", "T") if seq else ("batch",)
    check_tensor("q", q, (*lead, "Hk", "K"), floating=True)
    dims = {"batch": q.shape[0], "Hk": q.shape[-2], "K": q.shape[-1]}
    if seq:
        dims["T"] = q.shape[1]
    check_tensor("k", k, (*lead, "Hk", "K"), dims, floating=True)
    check_tensor("v", v, (*lead, "H", "V"), dims, floating=True)
    if dims["H"] % dims["Hk"]:
        raise ValueError(f"v: H={dims['H']} value heads must be a multiple of Hk={dims['Hk']}")
    check_tensor("g", g, (*lead, "H"), dims, floating=True)
    check_tensor("beta", beta, (*lead, "H"), dims, floating=True)
    if state is not None:
        check_tensor("state", state, ("batch", "H", "K", "V"), dims, floating=True)
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state)


def _gdn_heads(t, heads, cd):
    """(..., Hk, K) -> (..., H, K) in compute dtype: each key head serves H / Hk value heads."""
    return t.to(cd).repeat_interleave(heads // t.shape[-2], dim=-2)


def _gdn_token(state, q, k, v, g, beta):
    """One token in compute dtype. state (b,H,K,V); q,k (b,H,K); v (b,H,V); g, beta (b,H)."""
    state = torch.exp(g)[..., None, None] * state  # α_t S_{t-1}
    predicted = (state * k[..., None]).sum(-2)  # (α_t S_{t-1})^T k_t: (b, H, V)
    correction = beta[..., None] * (v - predicted)  # β_t (v_t - S^T k_t)
    state = state + k[..., None] * correction[..., None, :]
    return (state * q[..., None]).sum(-2), state


def gdn_step(state, q, k, v, g, beta, *, compute_dtype=torch.float32):
    """One Gated DeltaNet token: returns ``(o, new_state)``.

    state: (batch, H, K, V); q, k: (batch, Hk, K); v: (batch, H, V); g, beta: (batch, H).
    o: (batch, H, V) in v's dtype; new_state in ``compute_dtype``.
    """
    _check_gdn(q, k, v, g, beta, state, seq=False)
    cd, H = compute_dtype, v.shape[1]
    o, new = _gdn_token(
        state.to(cd), _gdn_heads(q, H, cd), _gdn_heads(k, H, cd), v.to(cd), g.to(cd), beta.to(cd)
    )
    return o.to(v.dtype), new


def gdn_scan(
    q, k, v, g, beta, *, initial_state=None, return_states=False, compute_dtype=torch.float32
) -> ScanResult:
    """The Gated DeltaNet recurrence token by token from ``initial_state`` (zeros when None).

    q, k: (batch, T, Hk, K); v: (batch, T, H, V); g, beta: (batch, T, H); initial_state:
    (batch, H, K, V). Returns ``ScanResult(o (batch, T, H, V), state (batch, H, K, V), states
    (batch, T, H, K, V) if return_states)``.
    """
    _check_gdn(q, k, v, g, beta, initial_state, seq=True)
    cd = compute_dtype
    batch, T, H, V = v.shape
    K = q.shape[-1]
    state = (
        torch.zeros(batch, H, K, V, dtype=cd, device=v.device)
        if initial_state is None
        else initial_state.to(cd)
    )
    qh, kh = _gdn_heads(q, H, cd), _gdn_heads(k, H, cd)
    ys, states = [], []
    for t in range(T):
        o, state = _gdn_token(
            state, qh[:, t], kh[:, t], v[:, t].to(cd), g[:, t].to(cd), beta[:, t].to(cd)
        )
        ys.append(o)
        if return_states:
            states.append(state)
    y = torch.stack(ys, 1) if ys else v.new_zeros(v.shape, dtype=cd)
    return ScanResult(y.to(v.dtype), state, torch.stack(states, 1) if return_states and T else None)


def gdn_chunked_scan(
    q,
    k,
    v,
    g,
    beta,
    *,
    initial_state=None,
    chunk_size=16,
    compute_dtype=torch.float32,
    return_updates=False,
) -> ScanResult:
    """``gdn_scan`` in the chunked WY / UT form: per chunk one unit lower-triangular solve and
    a few matrix products, then one state update (no token loop). ``q=None`` folds only: the
    final state, with y None. Agrees with ``gdn_scan`` to rounding, not bitwise.

    q, k: (batch, T, Hk, K); v: (batch, T, H, V); g, beta: (batch, T, H); initial_state:
    (batch, H, K, V). Returns ``ScanResult(o (batch, T, H, V) or None, state)``; with
    ``return_updates`` also ``updates``: the corrected updates u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t)
    (batch, T, H, V) in the compute dtype, which the chunk form solves for anyway (what a
    replay log of the Gated DeltaNet kernels keeps).
    """
    _check_gdn(k if q is None else q, k, v, g, beta, initial_state, seq=True)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
    cd = compute_dtype
    batch, T, H, V = v.shape
    K = k.shape[-1]
    state = (
        torch.zeros(batch, H, K, V, dtype=cd, device=v.device)
        if initial_state is None
        else initial_state.to(cd)
    )
    # (b, H, T, ...) layout for the matrix products
    heads_first = lambda t: t.transpose(1, 2)  # noqa: E731
    kh = heads_first(_gdn_heads(k, H, cd))
    qh = None if q is None else heads_first(_gdn_heads(q, H, cd))
    vh, gh, bh = heads_first(v.to(cd)), heads_first(g.to(cd)), heads_first(beta.to(cd))
    outs, updates = [], []
    for start in range(0, T, chunk_size):
        sl = slice(start, min(start + chunk_size, T))
        kc, vc, bc = kh[:, :, sl], vh[:, :, sl], bh[:, :, sl, None]
        gamma_log = gh[:, :, sl].cumsum(-1)  # log γ_t inside the chunk: (b, H, C)
        C = kc.shape[2]
        lower = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
        # ratio[t, s] = γ_t / γ_s for s <= t, 0 above (masked before exp: no overflow)
        ratio = torch.exp(
            (gamma_log[..., :, None] - gamma_log[..., None, :]).masked_fill(~lower, -math.inf)
        )
        kk = kc @ kc.transpose(-1, -2)
        system = torch.eye(C, dtype=cd, device=v.device) + (bc * kk * ratio).tril(-1)
        gamma = torch.exp(gamma_log)[..., None]  # (b, H, C, 1)
        rhs = torch.cat([bc * vc, bc * gamma * kc], -1)  # [β V | βγ K]
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u = solved[..., :V] - solved[..., V:] @ state  # U = Ũ - W S_0: (b, H, C, V)
        if return_updates:
            updates.append(u)
        if qh is not None:
            qc = qh[:, :, sl]
            outs.append(gamma * (qc @ state) + ((qc @ kc.transpose(-1, -2)) * ratio) @ u)
        to_end = torch.exp(gamma_log[..., -1:] - gamma_log)[..., None]  # γ_C / γ_s
        state = (
            torch.exp(gamma_log[..., -1])[..., None, None] * state
            + (to_end * kc).transpose(-1, -2) @ u
        )
    u = None
    if return_updates:
        u = torch.cat(updates, 2).transpose(1, 2) if updates else vh.new_zeros(v.shape)
    if qh is None:
        return ScanResult(None, state, updates=u)
    y = torch.cat(outs, 2) if outs else vh.new_zeros(vh.shape)
    return ScanResult(y.transpose(1, 2).to(v.dtype), state, updates=u)


def gdn_replay_outputs(state, log, new, *, compute_dtype=torch.float32):
    """Gated DeltaNet outputs of T new tokens from checkpoint ``state`` and the ``log`` of the n
    tokens since it, by the backward query recursion: one read of ``state``, no state written.

    state: (batch, H, K, V); ``log``: dict with k (batch, n, Hk, K), v (batch, n, H, V), g and
    beta (batch, n, H); ``new``: the same fields of the T new tokens plus q (batch, T, Hk, K).
    Returns o (batch, T, H, V) in v's dtype, equal to gdn_scan from the folded state to rounding.
    Work: O((n + T) T (K + V)) per head.
    """
    cd = compute_dtype
    k = torch.cat([log["k"], new["k"]], 1)
    v = torch.cat([log["v"], new["v"]], 1)
    g = torch.cat([log["g"], new["g"]], 1)
    beta = torch.cat([log["beta"], new["beta"]], 1)
    q = new["q"]
    _check_gdn(k, k, v, g, beta, state, seq=True)
    check_tensor("q", q, (k.shape[0], new["k"].shape[1], *k.shape[2:]), floating=True)
    n, H = log["k"].shape[1], v.shape[2]
    T = q.shape[1]
    kh, vh = _gdn_heads(k, H, cd), v.to(cd)  # (b, n+T, H, ...)
    alpha, bh = torch.exp(g.to(cd)), beta.to(cd)
    query = _gdn_heads(q, H, cd).clone()  # (b, T, H, K): one query per new token
    acc = vh.new_zeros(v.shape[0], T, H, v.shape[-1])
    position = torch.arange(n, n + T, device=v.device)  # where each new token sits
    for s in range(n + T - 1, -1, -1):  # back from the newest token to the checkpoint
        active = (position >= s)[None, :, None, None].to(cd)  # queries at or after token s
        kq = (kh[:, s, None] * query).sum(-1, keepdim=True)  # k_s . q: (b, T, H, 1)
        acc = acc + active * bh[:, s, None, :, None] * kq * vh[:, s, None]
        carried = alpha[:, s, None, :, None] * (
            query - bh[:, s, None, :, None] * kq * kh[:, s, None]
        )
        query = active * carried + (1 - active) * query
    o = acc + torch.einsum("bthk,bhkv->bthv", query, state.to(cd))
    return o.to(v.dtype)
