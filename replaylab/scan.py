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
    """

    y: torch.Tensor
    state: torch.Tensor
    states: torch.Tensor | None = None


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
