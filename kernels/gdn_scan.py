"""The Gated DeltaNet prompt scan in one launch: the token recurrence
(``replaylab.scan.gdn_scan``) as a Triton kernel that also writes the corrected updates a
replay log keeps, for the serving engine's prompt chunks.

One program per (sequence, value head, block of BLOCK_V value channels) walks the tokens in
order, holding its columns of the state S (K x BLOCK_V, fp32) in registers. Per token, with
α_t = exp(g_t):

    u_t = β_t (v_t - α_t S_{t-1}^T k_t)     the corrected update (what replay logs)
    S_t = α_t S_{t-1} + k_t u_t^T
    o_t = S_t^T q_t

so the whole chunk is one launch a layer, where PyTorch's chunked form launches some hundred
operations a chunk of 16 tokens. Value heads share key heads: head h reads key head
h // (H / Hk).

    q, k: (batch, T, Hk, K)  v: (batch, T, H, V)  g, beta: (batch, T, H)
    initial_state: (batch, H, K, V)
    -> o (batch, T, H, V) in v's dtype, final state (batch, H, K, V) fp32, u (batch, T, H, V)
       fp32

Under ``TRITON_INTERPRET=1`` it runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replaylab.scan import ScanResult
from replaylab.validation import as_power_of_two, check_tensor

__all__ = ["gdn_prompt_scan"]


@triton.jit
def _gdn_scan_kernel(
    q, k, v, g, beta, o, u, state,
    T, H, K, V, heads_per_key,
    sq_b, sq_t, sq_h, sq_k,
    sk_b, sk_t, sk_h, sk_k,
    sv_b, sv_t, sv_h, sv_v,
    sg_b, sg_t, sg_h,
    sbeta_b, sbeta_t, sbeta_h,
    so_b, so_t, so_h, so_v,
    su_b, su_t, su_h, su_v,
    sS_b, sS_h, sS_k, sS_v,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HAS_STATE: tl.constexpr,
    WRITE_U: tl.constexpr,
):  # fmt: skip
    bh, vb = tl.program_id(0), tl.program_id(1)
    b, h = (bh // H).to(tl.int64), bh % H  # int64: b * stride may pass 2**31
    hk = h // heads_per_key
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mk, mv = offs_k < K, offs_v < V
    s_ptr = state + b * sS_b + h * sS_h + offs_k[:, None] * sS_k + offs_v[None, :] * sS_v
    if HAS_STATE:
        S = tl.load(s_ptr, mask=mk[:, None] & mv[None, :], other=0.0).to(tl.float32)
    else:
        S = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    # int64: t * stride may pass 2**31 in a long prompt (tl.cast: a stride of 1 is constexpr)
    sq_t, sk_t, sv_t, so_t, su_t = (
        tl.cast(sq_t, tl.int64), tl.cast(sk_t, tl.int64), tl.cast(sv_t, tl.int64),
        tl.cast(so_t, tl.int64), tl.cast(su_t, tl.int64),
    )  # fmt: skip
    sg_t, sbeta_t = tl.cast(sg_t, tl.int64), tl.cast(sbeta_t, tl.int64)
    for t in range(T):
        kt = tl.load(k + b * sk_b + t * sk_t + hk * sk_h + offs_k * sk_k, mask=mk, other=0.0)
        qt = tl.load(q + b * sq_b + t * sq_t + hk * sq_h + offs_k * sq_k, mask=mk, other=0.0)
        vt = tl.load(v + b * sv_b + t * sv_t + h * sv_h + offs_v * sv_v, mask=mv, other=0.0)
        alpha = tl.exp(tl.load(g + b * sg_b + t * sg_t + h * sg_h).to(tl.float32))
        bt = tl.load(beta + b * sbeta_b + t * sbeta_t + h * sbeta_h).to(tl.float32)
        kt, qt = kt.to(tl.float32), qt.to(tl.float32)
        S = alpha * S
        predicted = tl.sum(S * kt[:, None], 0)  # (α_t S_{t-1})^T k_t, (BLOCK_V,)
        ut = bt * (vt.to(tl.float32) - predicted)
        S = S + kt[:, None] * ut[None, :]
        ot = tl.sum(S * qt[:, None], 0)
        tl.store(o + b * so_b + t * so_t + h * so_h + offs_v * so_v,
                 ot.to(o.dtype.element_ty), mask=mv)  # fmt: skip
        if WRITE_U:
            tl.store(u + b * su_b + t * su_t + h * su_h + offs_v * su_v, ut, mask=mv)
    tl.store(s_ptr, S, mask=mk[:, None] & mv[None, :])


def gdn_prompt_scan(
    q, k, v, g, beta, *, initial_state=None, return_updates=False, block_v=None, num_warps=4
) -> ScanResult:
    """``replaylab.scan.gdn_scan`` in one Triton launch: shapes in the module docstring;
    returns ``ScanResult(o, state)`` with the state in fp32, and with ``return_updates`` its
    ``updates`` u (fp32). ``block_v``: value channels a program holds (default min(64, V))."""
    if v.dim() != 4:
        raise ValueError(f"v: expected (batch, T, H, V), got shape {tuple(v.shape)}")
    batch, T, H, V = v.shape
    if k.dim() != 4 or k.shape[:2] != (batch, T):
        raise ValueError(f"k: expected (batch={batch}, T={T}, Hk, K), got {tuple(k.shape)}")
    Hk, K = k.shape[2], k.shape[3]
    if Hk < 1 or H % Hk:
        raise ValueError(f"k: its {Hk} key heads must divide the {H} value heads")
    check_tensor("q", q, (batch, T, Hk, K))
    check_tensor("g", g, (batch, T, H))
    check_tensor("beta", beta, (batch, T, H))
    if initial_state is not None:
        check_tensor("initial_state", initial_state, (batch, H, K, V))
    if block_v is not None:
        block_v = as_power_of_two("block_v", block_v)
    device = v.device
    o = torch.empty_like(v)
    u = torch.empty(batch, T, H, V, dtype=torch.float32, device=device) if return_updates else o
    state = torch.zeros(batch, H, K, V, dtype=torch.float32, device=device)
    if initial_state is not None:
        state.copy_(initial_state)
    if T > 0:
        block_v = block_v or min(64, triton.next_power_of_2(V))
        _gdn_scan_kernel[(batch * H, triton.cdiv(V, block_v))](
            q, k, v, g, beta, o, u, state,
            T, H, K, V, H // Hk,
            *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
            *o.stride(), *u.stride(), *state.stride(),
            BLOCK_K=triton.next_power_of_2(K), BLOCK_V=block_v,
            HAS_STATE=initial_state is not None, WRITE_U=return_updates, num_warps=num_warps,
        )  # fmt: skip
    return ScanResult(o, state, updates=u if return_updates else None)
