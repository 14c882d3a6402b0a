"""Triton kernels for Mamba-1 (Jamba's S6 layer), each beside a PyTorch reference with the same
signature: replay's ``replay_step`` / ``replay_step_ref`` and ``fold`` / ``fold_ref``, and the
snapshot and recompute strategies' step ``state_update`` / ``state_update_ref`` (the state read
and written every token, as mamba-ssm's ``selective_state_update``).

Glossary (code name -> paper symbol, shape):
    states     S_c       (S, D, N) fp32       checkpoint states, one slot per checkpoint
    slots                (batch,) int32       the slot each sequence reads; forked branches
                                              may share one slot
    log_x      x_s       (batch, Lmax, D)     logged scan inputs since the checkpoint (a ring)
    log_dt     dt_s      (batch, Lmax, D)     raw dt (before bias and softplus)
    log_B      B_s       (batch, Lmax, N)     (C is not logged: past outputs are not recomputed)
    log_len              (batch,) int32       valid log entries per sequence
    log_head             (batch,) int32       entry i of sequence b is row (head + i) % Lmax
    x, dt      x_t, dt_t (batch, T, D)        the T new tokens (T = 1 decode, k + 1 verify)
    B, C       B_t, C_t  (batch, T, N)
    A          A         (D, N) fp32          -exp(A_log): one decay per channel and state index
    D          D         (D,)                 skip connection
    dt_bias              (D,)                 Δ = softplus(dt + dt_bias)

Recurrence: S_t = exp(Δ_t ⊙ A) ⊙ S_{t-1} + Δ_t x_t B_tᵀ;  y_t = S_t C_t + D ⊙ x_t.
The decay is elementwise over (D, N) (not one scalar per head as in Mamba-2), so the kernels
run the recurrence itself: one program per (sequence, block of BLOCK_D channels) reads its
(BLOCK_D, N) tile of S_c once, steps it through the log and the new tokens in registers (fp32)
and writes each new token's y. ``replay_step`` writes no state; ``fold`` writes S_{c+j};
``state_update`` steps the current state S_t itself (no log) and writes it back.
A verify row is computed by exactly the operations a one-token step at its position performs
(same update, same order), so T tokens in one call equal T single steps bit for bit. All
three share one update (``_s6_update``), so a snapshot step and a replay step of the same
token from the same state give the same bits (for inputs already in the log's dtypes, which
``replay_step`` rounds its new tokens to and ``state_update`` takes as they come). The kernels launch with ``enable_fp_fusion=False``, so the compiler cannot contract a product and
a sum into one FMA differently in the unrolled new-token updates and in the looped log
updates (why: ``data/row_invariance_probe_jamba.json``, described in data/README.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replaylab.kernels.decode import write_kept_states
from replaylab.kernels.mamba2 import _ring_rows
from replaylab.scan import s6_scan
from replaylab.validation import check_tensor

__all__ = [
    "replay_step", "replay_step_ref", "fold", "fold_ref", "state_update", "state_update_ref",
    "BLOCK_D", "NUM_WARPS",
]  # fmt: skip

BLOCK_D = 32  # channels per program (mamba-ssm's selective_state_update picks 32 at N <= 16)
NUM_WARPS = 4


@triton.jit
def _load_token(x_ptr, dt_ptr, B_ptr, offs_d, offs_n, md, mn, i, n):
    """Token i's x, raw dt (BLOCK_D,) and B (BLOCK_N,) in fp32; zeros unless i < n."""
    ok_d, ok_n = md & ((offs_d * 0 + i) < n), mn & ((offs_n * 0 + i) < n)
    x = tl.load(x_ptr + offs_d, mask=ok_d, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + offs_d, mask=ok_d, other=0.0).to(tl.float32)
    B = tl.load(B_ptr + offs_n, mask=ok_n, other=0.0).to(tl.float32)
    return x, dt, B


@triton.jit
def _s6_update(S, A, bias, x, dt, B):
    """One token on a (BLOCK_D, BLOCK_N) tile: S <- exp(Δ ⊙ A) ⊙ S + Δ x Bᵀ, Δ = softplus(dt +
    bias) (fp32). Every path (log, new tokens, fold) calls this, so all round alike."""
    d = dt + bias
    delta = tl.where(d > 20.0, d, tl.log(1.0 + tl.exp(tl.minimum(d, 20.0))))
    return tl.exp(delta[:, None] * A) * S + (delta * x)[:, None] * B[None, :]


@triton.jit
def _tile(pid_d, D, N, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program pid_d's channels and state indices, their masks, and its (BLOCK_D, BLOCK_N)
    tile's offsets into a (D, N) state and mask."""
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md, mn = offs_d < D, offs_n < N
    return offs_d, offs_n, md, mn, offs_d[:, None] * N + offs_n[None, :], md[:, None] & mn[None, :]


@triton.jit
def _new_token(S, A, bias, Dk, x, dt, B, C, y, new, D, N, offs_d, offs_n, md, mn):
    """New token row ``new`` of (batch * T) on the tile: S stepped by it (``_s6_update``), its
    y = S C + D ⊙ x stored; returns S. Replay's new tokens and the snapshot step both run it."""
    x_t, dt_t, B_t = _load_token(x + new * D, dt + new * D, B + new * N,
                                 offs_d, offs_n, md, mn, 0, 1)  # fmt: skip
    S = _s6_update(S, A, bias, x_t, dt_t, B_t)
    C_t = tl.load(C + new * N + offs_n, mask=mn, other=0.0).to(tl.float32)
    out = tl.sum(S * C_t[None, :], axis=1) + Dk * x_t
    tl.store(y + new * D + offs_d, out.to(y.dtype.element_ty), mask=md)
    return S


@triton.jit
def _fold_log(S, A, bias, log_x, log_dt, log_B, b, head, n, Lmax, D, N, offs_d, offs_n, md, mn):
    """S after log entries 0 .. n-1 of sequence b (ring rows (head + i) % Lmax), oldest first.
    Four entries' loads are issued before their four updates (one memory latency per four
    entries, not per entry); an update past the end is discarded whole, so the arithmetic is
    that of one entry at a time."""
    for i in range(0, n, 4):
        row0 = offs_d[:, None] * 0 + i  # entry i as a tile, for the discards
        r0 = b * Lmax + (head + i) % Lmax
        r1 = b * Lmax + (head + i + 1) % Lmax
        r2 = b * Lmax + (head + i + 2) % Lmax
        r3 = b * Lmax + (head + i + 3) % Lmax
        x0, d0, B0 = _load_token(log_x + r0 * D, log_dt + r0 * D, log_B + r0 * N,
                                 offs_d, offs_n, md, mn, i, n)  # fmt: skip
        x1, d1, B1 = _load_token(log_x + r1 * D, log_dt + r1 * D, log_B + r1 * N,
                                 offs_d, offs_n, md, mn, i + 1, n)  # fmt: skip
        x2, d2, B2 = _load_token(log_x + r2 * D, log_dt + r2 * D, log_B + r2 * N,
                                 offs_d, offs_n, md, mn, i + 2, n)  # fmt: skip
        x3, d3, B3 = _load_token(log_x + r3 * D, log_dt + r3 * D, log_B + r3 * N,
                                 offs_d, offs_n, md, mn, i + 3, n)  # fmt: skip
        S = _s6_update(S, A, bias, x0, d0, B0)  # entry i < n: the loop bound
        S = tl.where(row0 + 1 < n, _s6_update(S, A, bias, x1, d1, B1), S)
        S = tl.where(row0 + 2 < n, _s6_update(S, A, bias, x2, d2, B2), S)
        S = tl.where(row0 + 3 < n, _s6_update(S, A, bias, x3, d3, B3), S)
    return S


@triton.jit
def _replay_step_kernel(
    states,  # (S, D, N) fp32 checkpoints, read only
    slots,  # (batch,) slot each sequence reads
    log_x,  # (batch, Lmax, D) ring; the new x appended when APPEND
    log_dt,  # (batch, Lmax, D) ring; raw dt
    log_B,  # (batch, Lmax, N) ring
    log_len,  # (batch,) valid entries
    log_head,  # (batch,) ring row of entry 0
    append_count,  # (batch,) tokens t < append_count[b] are appended (T when absent)
    x,  # (batch, T, D) new inputs, in the log's dtype
    dt,  # (batch, T, D) raw dt, in the log's dtype
    B,  # (batch, T, N) in the log's dtype
    C,  # (batch, T, N)
    A,  # (D, N) fp32
    Dskip,  # (D,)
    dt_bias,  # (D,)
    y,  # (batch, T, D) output
    Lmax,
    D,
    N,  # sizes
    T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    APPEND: tl.constexpr,
    HAS_COUNT: tl.constexpr,
):
    b, pid_d = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + b).to(tl.int64)
    L = tl.load(log_len + b)
    head = tl.load(log_head + b)
    n_append = tl.load(append_count + b) if HAS_COUNT else T
    offs_d, offs_n, md, mn, tile, mtile = _tile(pid_d, D, N, BLOCK_D, BLOCK_N)
    A_t = tl.load(A + tile, mask=mtile, other=0.0).to(tl.float32)
    bias = tl.load(dt_bias + offs_d, mask=md, other=0.0).to(tl.float32)
    Dk = tl.load(Dskip + offs_d, mask=md, other=0.0).to(tl.float32)
    S = tl.load(states + slot * D * N + tile, mask=mtile, other=0.0)  # the one read of S_c
    S = _fold_log(S, A_t, bias, log_x, log_dt, log_B, b, head, L, Lmax, D, N,
                  offs_d, offs_n, md, mn)  # fmt: skip
    for t in tl.static_range(T):  # the new tokens, each as a one-token step would run it
        new = b * T + t
        S = _new_token(S, A_t, bias, Dk, x, dt, B, C, y, new, D, N, offs_d, offs_n, md, mn)
        if APPEND:
            row = b * Lmax + (head + L + t) % Lmax
            keep = md & ((offs_d * 0 + t) < n_append)  # padding leaves the ring alone
            tl.store(log_x + row * D + offs_d, tl.load(x + new * D + offs_d, mask=md), mask=keep)
            tl.store(log_dt + row * D + offs_d, tl.load(dt + new * D + offs_d, mask=md), mask=keep)
            owner = mn & ((offs_n * 0 + pid_d) == 0) & ((offs_n * 0 + t) < n_append)  # one writes B
            tl.store(log_B + row * N + offs_n, tl.load(B + new * N + offs_n, mask=mn), mask=owner)


@triton.jit
def _fold_kernel(
    states,  # (S, D, N) fp32, read at src_slots
    src_slots,  # (batch,)
    dest,  # (S', D, N) fp32, written at dest_slots (may be states)
    dest_slots,  # (batch,)
    log_x,  # (batch, Lmax, D)
    log_dt,  # (batch, Lmax, D)
    log_B,  # (batch, Lmax, N)
    fold_len,  # (batch,) entries to fold; 0 in place: the program returns at once
    log_head,  # (batch,)
    A,  # (D, N)
    dt_bias,  # (D,)
    Lmax,
    D,
    N,
    separate,  # 1: dest is not states (every row writes), 0: in place
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b, pid_d = tl.program_id(0), tl.program_id(1)
    src = tl.load(src_slots + b).to(tl.int64)
    dst = tl.load(dest_slots + b).to(tl.int64)
    J = tl.load(fold_len + b)
    if (J > 0) | (src != dst) | (separate != 0):
        head = tl.load(log_head + b)
        offs_d, offs_n, md, mn, tile, mtile = _tile(pid_d, D, N, BLOCK_D, BLOCK_N)
        A_t = tl.load(A + tile, mask=mtile, other=0.0).to(tl.float32)
        bias = tl.load(dt_bias + offs_d, mask=md, other=0.0).to(tl.float32)
        S = tl.load(states + src * D * N + tile, mask=mtile, other=0.0)
        S = _fold_log(S, A_t, bias, log_x, log_dt, log_B, b, head, J, Lmax, D, N,
                      offs_d, offs_n, md, mn)  # fmt: skip
        tl.store(dest + dst * D * N + tile, S, mask=mtile)


@triton.jit
def _state_update_kernel(
    state,  # (S, D, N) fp32 current states, rows 0 .. batch-1 read and written in place
    x,  # (batch, T, D)
    dt,  # (batch, T, D) raw dt
    B,  # (batch, T, N)
    C,  # (batch, T, N)
    A,  # (D, N) fp32
    Dskip,  # (D,)
    dt_bias,  # (D,)
    y,  # (batch, T, D) output
    drafts,  # (S, max_verify, D, N) fp32: the state after each token (KEEP_DRAFTS)
    counts,  # (batch,) int32: the state written is the one after counts[b] tokens (HAS_COUNTS)
    D,
    N,
    max_verify,
    T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KEEP_DRAFTS: tl.constexpr,
    HAS_COUNTS: tl.constexpr,
):
    b, pid_d = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs_d, offs_n, md, mn, tile, mtile = _tile(pid_d, D, N, BLOCK_D, BLOCK_N)
    A_t = tl.load(A + tile, mask=mtile, other=0.0).to(tl.float32)
    bias = tl.load(dt_bias + offs_d, mask=md, other=0.0).to(tl.float32)
    Dk = tl.load(Dskip + offs_d, mask=md, other=0.0).to(tl.float32)
    S = tl.load(state + b * D * N + tile, mask=mtile, other=0.0)
    kept = S  # the state after counts[b] tokens (HAS_COUNTS; 0: the state read)
    n = tl.load(counts + b) if HAS_COUNTS else T
    for t in tl.static_range(T):  # each token as a one-token step runs it
        new = b * T + t
        S = _new_token(S, A_t, bias, Dk, x, dt, B, C, y, new, D, N, offs_d, offs_n, md, mn)
        if KEEP_DRAFTS:
            tl.store(drafts + (b * max_verify + t) * D * N + tile, S, mask=mtile)
        if HAS_COUNTS:
            kept = tl.where(n == t + 1, S, kept)
    if HAS_COUNTS:
        S = kept
    tl.store(state + b * D * N + tile, S, mask=mtile)


def _int32(name, t, batch):
    if not isinstance(t, torch.Tensor) or t.shape != (batch,) or t.dtype != torch.int32:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected int32 of shape ({batch},), got {got}")


def _in_range(name, t, lo, hi):
    """Values of ``t`` in [lo, hi] (inclusive)."""
    if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
        raise ValueError(f"{name}: expected values in [{lo}, {hi}], got {t.tolist()}")


def _check_common(states, log_x, log_dt, log_B, A, dt_bias, dims, device):
    """Shapes, dtypes and devices shared by both kernels; ``dims`` holds batch, D and N."""
    check_tensor("states", states, ("S", "D", "N"), dims)
    if states.dtype != torch.float32:
        raise ValueError(f"states: expected float32 checkpoint states, got {states.dtype}")
    check_tensor("log_x", log_x, ("batch", "Lmax", "D"), dims, floating=True)
    check_tensor("log_dt", log_dt, ("batch", "Lmax", "D"), dims, floating=True)
    check_tensor("log_B", log_B, ("batch", "Lmax", "N"), dims, floating=True)
    check_tensor("A", A, ("D", "N"), dims, floating=True)
    if A.dtype != torch.float32:
        raise ValueError(f"A: expected float32 (-exp(A_log)), got {A.dtype}")
    check_tensor("dt_bias", dt_bias, ("D",), dims, floating=True)
    named = dict(states=states, log_x=log_x, log_dt=log_dt, log_B=log_B, A=A, dt_bias=dt_bias)
    for name, t in named.items():
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (read by row offsets)")
        if t.device != device:
            raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if dims["batch"] * dims["Lmax"] * dims["D"] >= 2**31:
        raise ValueError(
            f"log: batch {dims['batch']} x Lmax {dims['Lmax']} x D {dims['D']} elements exceed "
            f"the kernels' 32-bit offsets (2**31)"
        )


def _head(log_head, batch, device):
    return torch.zeros(batch, dtype=torch.int32, device=device) if log_head is None else log_head


def _check_step(states, slots, log_x, log_dt, log_B, log_len, x, dt, B, C, A, D, dt_bias,
                log_head, append_count, append):  # fmt: skip
    dims = {}
    check_tensor("x", x, ("batch", "T", "D"), dims, floating=True)
    check_tensor("dt", dt, ("batch", "T", "D"), dims, floating=True)
    check_tensor("B", B, ("batch", "T", "N"), dims, floating=True)
    check_tensor("C", C, ("batch", "T", "N"), dims, floating=True)
    check_tensor("D", D, ("D",), dims, floating=True)
    _check_common(states, log_x, log_dt, log_B, A, dt_bias, dims, x.device)
    batch, T, Lmax = dims["batch"], dims["T"], dims["Lmax"]
    for name, t in (("slots", slots), ("log_len", log_len), ("log_head", log_head)):
        _int32(name, t, batch)
    _in_range("slots", slots, 0, states.shape[0] - 1)
    _in_range("log_len", log_len, 0, Lmax)
    _in_range("log_head", log_head, 0, Lmax - 1)
    if append_count is not None:
        _int32("append_count", append_count, batch)
        _in_range("append_count", append_count, 0, T)
    if append:
        ends = log_len + (T if append_count is None else append_count)
        if batch and int(ends.max()) > Lmax:
            raise ValueError(
                f"log_len: appending needs log_len + tokens appended <= Lmax={Lmax}, got "
                f"log_len {log_len.tolist()} + {T if append_count is None else append_count.tolist()}"
            )


def replay_step(
    states,
    slots,
    log_x,
    log_dt,
    log_B,
    log_len,
    x,
    dt,
    B,
    C,
    A,
    D,
    dt_bias,
    *,
    log_head=None,
    append_count=None,
    append=True,
    check=True,
    block_d=None,
    num_warps=None,
):
    """Outputs y (batch, T, D) of T new tokens from checkpoint ``states[slots[b]]`` and the
    log (``log_len[b]`` entries from ring row ``log_head[b]``), writing no state.

    With ``append`` the new x, dt and B go to the ring after the log (entry log_len + t);
    ``append_count`` (batch,) int32 appends only tokens t < append_count[b] (padding of a
    ragged batch appends nothing; None: all T). ``log_len`` is not moved: the caller advances
    it (one cursor is shared by all layers). New inputs are rounded to the log's dtypes first,
    so a verify reads what single steps would read back from the log. ``check=False`` skips
    the checks, which read values back from the device (needed inside a CUDA graph capture).
    ``block_d`` / ``num_warps``: launch shape (default ``BLOCK_D`` / ``NUM_WARPS``).
    """
    head = _head(log_head, x.shape[0], x.device)
    if check:
        _check_step(states, slots, log_x, log_dt, log_B, log_len, x, dt, B, C, A, D, dt_bias,
                    head, append_count, append)  # fmt: skip
    batch, T, Dn = x.shape
    Lmax, N = log_x.shape[1], B.shape[-1]
    y = torch.empty((batch, T, Dn), dtype=x.dtype, device=x.device)  # outputs in x's dtype
    x = x.to(log_x.dtype).contiguous()
    dt = dt.to(log_dt.dtype).contiguous()
    B = B.to(log_B.dtype).contiguous()
    BD = min(block_d or BLOCK_D, triton.next_power_of_2(Dn))
    grid = (batch, triton.cdiv(Dn, BD))
    counted = append_count is not None
    _replay_step_kernel[grid](
        states,
        slots,
        log_x,
        log_dt,
        log_B,
        log_len,
        head,
        append_count if counted else log_len,
        x,
        dt,
        B,
        C.contiguous(),
        A,
        D.contiguous(),
        dt_bias,
        y,
        Lmax,
        Dn,
        N,
        T=T,
        BLOCK_D=BD,
        BLOCK_N=triton.next_power_of_2(N),
        APPEND=append,
        HAS_COUNT=counted,
        num_warps=num_warps or NUM_WARPS,
        enable_fp_fusion=False,  # no FMA contraction: unrolled and looped updates round alike
    )
    return y


def _check_fold(states, src_slots, dest, dest_slots, log_x, log_dt, log_B, fold_len, A,
                dt_bias, log_head):  # fmt: skip
    dims = {}
    check_tensor("log_x", log_x, ("batch", "Lmax", "D"), dims, floating=True)
    check_tensor("log_B", log_B, ("batch", "Lmax", "N"), dims, floating=True)
    _check_common(states, log_x, log_dt, log_B, A, dt_bias, dims, log_x.device)
    check_tensor("dest", dest, ("S'", "D", "N"), dict(dims))
    if dest.dtype != torch.float32 or not dest.is_contiguous() or dest.device != log_x.device:
        raise ValueError(
            f"dest: expected contiguous float32 on {log_x.device}, got {dest.dtype} on "
            f"{dest.device}{'' if dest.is_contiguous() else ' (not contiguous)'}"
        )
    batch, Lmax = dims["batch"], dims["Lmax"]
    for name, t in (("src_slots", src_slots), ("dest_slots", dest_slots), ("fold_len", fold_len),
                    ("log_head", log_head)):  # fmt: skip
        _int32(name, t, batch)
    _in_range("src_slots", src_slots, 0, states.shape[0] - 1)
    _in_range("dest_slots", dest_slots, 0, dest.shape[0] - 1)
    _in_range("fold_len", fold_len, 0, Lmax)
    _in_range("log_head", log_head, 0, Lmax - 1)
    same = dest.untyped_storage().data_ptr() == states.untyped_storage().data_ptr()
    src, dst, j = src_slots.tolist(), dest_slots.tolist(), fold_len.tolist()
    writes = [b for b in range(batch) if not same or j[b] > 0 or src[b] != dst[b]]
    targets = [dst[b] for b in writes]
    if len(set(targets)) < len(targets):
        raise ValueError(f"dest_slots: rows that write must write distinct slots, got {dst}")
    if same:  # in place: a slot written by one row may not be read by another
        for b in writes:
            readers = [r for r in range(batch) if r != b and src[r] == dst[b]]
            if readers:
                raise ValueError(
                    f"dest_slots: row {b} writes slot {dst[b]} that row {readers[0]} reads "
                    f"(src_slots {src}, dest_slots {dst})"
                )


def fold(
    states,
    src_slots,
    dest,
    dest_slots,
    log_x,
    log_dt,
    log_B,
    fold_len,
    A,
    dt_bias,
    *,
    log_head=None,
    check=True,
    block_d=None,
    num_warps=None,
):
    """Write S_{c+j} = the state after the first j = ``fold_len[b]`` log entries, from
    S_c = ``states[src_slots[b]]``, to ``dest[dest_slots[b]]``. ``dest`` may be ``states``
    (in place, e.g. equal slots); a row with j = 0 folding in place reads and writes nothing.
    The ring keeps its entries: the caller moves ``log_head`` by j and ``log_len`` down by j.
    Returns ``dest``. ``check=False`` skips the checks (see ``replay_step``)."""
    batch, Lmax, Dn = log_x.shape
    N = log_B.shape[-1]
    head = _head(log_head, batch, log_x.device)
    if check:
        _check_fold(states, src_slots, dest, dest_slots, log_x, log_dt, log_B, fold_len, A,
                    dt_bias, head)  # fmt: skip
    BD = min(block_d or BLOCK_D, triton.next_power_of_2(Dn))
    same = dest.untyped_storage().data_ptr() == states.untyped_storage().data_ptr()
    _fold_kernel[(batch, triton.cdiv(Dn, BD))](
        states,
        src_slots,
        dest,
        dest_slots,
        log_x,
        log_dt,
        log_B,
        fold_len,
        head,
        A,
        dt_bias,
        Lmax,
        Dn,
        N,
        0 if same else 1,
        BLOCK_D=BD,
        BLOCK_N=triton.next_power_of_2(N),
        num_warps=num_warps or NUM_WARPS,
        enable_fp_fusion=False,  # as replay_step: each update rounds as the step's do
    )
    return dest


def _check_state_update(state, x, dt, B, C, A, D, dt_bias, drafts, counts):
    dims = {}
    check_tensor("x", x, ("batch", "T", "D"), dims, floating=True)
    check_tensor("dt", dt, ("batch", "T", "D"), dims, floating=True)
    check_tensor("B", B, ("batch", "T", "N"), dims, floating=True)
    check_tensor("C", C, ("batch", "T", "N"), dims, floating=True)
    check_tensor("state", state, ("S", "D", "N"), dims)
    check_tensor("A", A, ("D", "N"), dims, floating=True)
    check_tensor("D", D, ("D",), dims, floating=True)
    check_tensor("dt_bias", dt_bias, ("D",), dims, floating=True)
    batch, T = dims["batch"], dims["T"]
    if state.dtype != torch.float32 or not state.is_contiguous():
        got = f"{state.dtype}{'' if state.is_contiguous() else ' (not contiguous)'}"
        raise ValueError(f"state: expected a contiguous float32 pool, got {got}")
    if dims["S"] < batch:
        raise ValueError(f"state: {dims['S']} rows, need one per sequence ({batch})")
    if A.dtype != torch.float32:
        raise ValueError(f"A: expected float32 (-exp(A_log)), got {A.dtype}")
    if drafts is not None:
        check_tensor("drafts", drafts, ("slots", "max_verify", "D", "N"), dims)
        if drafts.dtype != torch.float32 or not drafts.is_contiguous():
            raise ValueError(f"drafts: expected a contiguous float32 pool, got {drafts.dtype}")
        if dims["slots"] < batch or dims["max_verify"] < T:
            raise ValueError(
                f"drafts: {dims['slots']} slots x {dims['max_verify']} tokens, need at least "
                f"({batch}, {T})"
            )
    if counts is not None:
        _int32("counts", counts, batch)
        _in_range("counts", counts, 0, T)
    named = dict(state=state, x=x, dt=dt, B=B, C=C, A=A, D=D, dt_bias=dt_bias, drafts=drafts,
                 counts=counts)  # fmt: skip
    for name, t in named.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device}, got {t.device}")


def state_update(
    state, x, dt, B, C, A, D, dt_bias, *, drafts=None, counts=None, check=True, block_d=None,
    num_warps=None,
):  # fmt: skip
    """The snapshot / recompute step of a Mamba-1 layer: for each of the T new tokens
    S <- exp(Δ ⊙ A) ⊙ S + Δ x Bᵀ and y = S C + D ⊙ x, Δ = softplus(dt + dt_bias), written back
    to ``state`` (rows 0 .. batch-1 of a (S, D, N) fp32 pool). With ``drafts``
    (S', max_verify, D, N) fp32 the state after each token is kept (a snapshot's rollback);
    with ``counts`` (batch,) int32 the state written is the one after counts[b] tokens (0:
    unchanged), the other tokens being a ragged step's padding (their y is still computed).
    x, dt (batch, T, D) with dt raw; B, C (batch, T, N); A (D, N) fp32; D, dt_bias (D,).
    Returns y (batch, T, D) in x's dtype. ``check=False`` skips the checks, which read
    ``counts`` back from the device (needed inside a CUDA graph capture)."""
    if check:
        _check_state_update(state, x, dt, B, C, A, D, dt_bias, drafts, counts)
    batch, T, Dn = x.shape
    N = B.shape[-1]
    y = torch.empty((batch, T, Dn), dtype=x.dtype, device=x.device)
    BD = min(block_d or BLOCK_D, triton.next_power_of_2(Dn))
    _state_update_kernel[(batch, triton.cdiv(Dn, BD))](
        state,
        x.contiguous(),
        dt.contiguous(),
        B.contiguous(),
        C.contiguous(),
        A.contiguous(),
        D.contiguous(),
        dt_bias.contiguous(),
        y,
        state if drafts is None else drafts,
        state if counts is None else counts,
        Dn,
        N,
        1 if drafts is None else drafts.shape[1],
        T=T,
        BLOCK_D=BD,
        BLOCK_N=triton.next_power_of_2(N),
        KEEP_DRAFTS=drafts is not None,
        HAS_COUNTS=counts is not None,
        num_warps=num_warps or NUM_WARPS,
        enable_fp_fusion=False,  # as replay_step: each update rounds as replay's do
    )
    return y


def state_update_ref(
    state, x, dt, B, C, A, D, dt_bias, *, drafts=None, counts=None, check=True, block_d=None,
    num_warps=None,
):  # fmt: skip
    """PyTorch reference of ``state_update``: the reference scan (fp32) over the T tokens."""
    if check:
        _check_state_update(state, x, dt, B, C, A, D, dt_bias, drafts, counts)
    result = s6_scan(x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True,
                     initial_state=state[: x.shape[0]], return_states=True)  # fmt: skip
    write_kept_states(state, result.states, drafts, counts)
    return result.y


def replay_step_ref(
    states,
    slots,
    log_x,
    log_dt,
    log_B,
    log_len,
    x,
    dt,
    B,
    C,
    A,
    D,
    dt_bias,
    *,
    log_head=None,
    append_count=None,
    append=True,
    check=True,
    block_d=None,
    num_warps=None,
):
    """PyTorch reference of ``replay_step``: the reference scan (fp32) over the log from the
    checkpoint, then over the new tokens; appends as ``replay_step`` does."""
    if check:
        _check_step(states, slots, log_x, log_dt, log_B, log_len, x, dt, B, C, A, D, dt_bias,
                    _head(log_head, x.shape[0], x.device), append_count, append)  # fmt: skip
    batch, T, _ = x.shape
    Lmax = log_x.shape[1]
    new = dict(x=x.to(log_x.dtype), dt=dt.to(log_dt.dtype), B=B.to(log_B.dtype))
    ys = []
    for b in range(batch):
        n = int(log_len[b])
        rows = _ring_rows(log_head, b, n + T, Lmax, x.device)
        old = rows[:n]
        state = s6_scan(
            log_x[b : b + 1, old],
            log_dt[b : b + 1, old],
            A,
            log_B[b : b + 1, old],
            log_B[b : b + 1, old],  # C: shapes only the discarded outputs
            dt_bias=dt_bias,
            dt_softplus=True,
            initial_state=states[int(slots[b])][None],
        ).state
        ys.append(
            s6_scan(
                new["x"][b : b + 1],
                new["dt"][b : b + 1],
                A,
                new["B"][b : b + 1],
                C[b : b + 1],
                D,
                dt_bias=dt_bias,
                dt_softplus=True,
                initial_state=state,
            ).y
        )
    if append:  # after all reads
        for b in range(batch):
            n = int(log_len[b])
            rows = _ring_rows(log_head, b, n + T, Lmax, x.device)[n:]
            kept = T if append_count is None else int(append_count[b])
            for log, name in ((log_x, "x"), (log_dt, "dt"), (log_B, "B")):
                log[b, rows[:kept]] = new[name][b, :kept]
    return torch.cat(ys).to(x.dtype)


def fold_ref(
    states,
    src_slots,
    dest,
    dest_slots,
    log_x,
    log_dt,
    log_B,
    fold_len,
    A,
    dt_bias,
    *,
    log_head=None,
    check=True,
    block_d=None,
    num_warps=None,
):
    """PyTorch reference of ``fold``: the reference scan (fp32) over the first j entries."""
    batch, Lmax, _ = log_x.shape
    if check:
        _check_fold(states, src_slots, dest, dest_slots, log_x, log_dt, log_B, fold_len, A,
                    dt_bias, _head(log_head, batch, log_x.device))  # fmt: skip
    folded = []
    for b in range(batch):
        rows = _ring_rows(log_head, b, int(fold_len[b]), Lmax, log_x.device)
        folded.append(
            s6_scan(
                log_x[b : b + 1, rows],
                log_dt[b : b + 1, rows],
                A,
                log_B[b : b + 1, rows],
                log_B[b : b + 1, rows],
                dt_bias=dt_bias,
                dt_softplus=True,
                initial_state=states[int(src_slots[b])][None],
            ).state[0]
        )
    for b, s in enumerate(folded):  # write after all reads: a dest may be another row's source
        dest[int(dest_slots[b])] = s
    return dest
