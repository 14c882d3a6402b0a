"""Triton puzzles for notebook 06, a ladder of six: the learner writes small kernels, from a
load and a store up to the replay step of one Mamba-2 layer; each ``check_*`` here launches the
learner's kernel on random inputs, compares it with a PyTorch reference built on
``replaylab.scan`` (float64 where it is computed here) and scores its memory traffic.

    1  check_copy_kernel          copy a state tile: program ids, strides, masks
    2  check_reduce_kernel        S C: a reduction over N in one program
    3  check_state_update_kernel  one token's state update in place: the snapshot write
    4  check_output_kernel        the output from the checkpoint, empty log
    5  check_fold_kernel          the fold: the state after the log, written once
    6  check_log_output_kernel    the replay step: the output after the log, no state write

The traffic score is a count, not an estimate: under Triton's interpreter (``TRITON_INTERPRET=1``,
which ``import replaylab`` switches on without a GPU) every ``tl.load`` and ``tl.store`` goes
through ``triton.runtime.interpreter.interpreter_builder``; ``count_traffic`` wraps its masked
load and store for the duration of a launch and attributes every element address that is
actually read or written (masked-off lanes excluded) to the tensor that holds it. A kernel that
reads the checkpoint twice scores "read 2.00x". A and D (H,) are needed by the program of head h
of every sequence: the puzzles count them once per sequence (``Traffic.shared_by``), so 1.00x
means each program read its head's entry once. The same wrapper counts the kernel's float
arithmetic by result size (``Traffic.float_ops``): puzzle 6 fails a kernel that updates the
(P, N) state tile per logged token, which moves the same bytes as the hint's P-vector and so
cannot be told from traffic. On a GPU (compiled kernels) the values are still checked and
neither traffic nor arithmetic is counted; instead each check that passes times the kernel
with ``triton.testing.do_bench`` at ``TIMING_SIZES`` (one sequence of Nemotron-H 8B's layer, a
log of 16: the shape of the challenge at the end of notebook 06) and prints µs per launch.

Glossary (puzzle names -> paper symbols, shapes; fp32; groups already expanded to heads, Δ
already processed: positive, one per head and token):
    S        S_c        (batch, H, P, N)   checkpoint state, read only (puzzle 3: S_{t-1},
                                           updated in place to S_t)
    log_x    x_s        (batch, L, H, P)   logged inputs since the checkpoint
    log_dt   Δ_s        (batch, L, H)
    log_B    B_s        (batch, L, H, N)
    x, dt    x_t, Δ_t   (batch, H, P), (batch, H)   the new token
    B, C     B_t, C_t   (batch, H, N)
    A, D     A, D       (H,)               decay (negative) and skip, one per head
    y        y_t        (batch, H, P)      output of the new token (puzzle 2: S_c C_t alone)
    out      S_{c+L}    (batch, H, P, N)   the folded state (puzzle 5); the copy (puzzle 1)
The grid of every puzzle is ``(batch, H)``: program (b, h) owns head h of sequence b, i.e. the
(P, N) tile S[b, h] and the (P,) row y[b, h].
"""

from __future__ import annotations

import torch
import triton

from replaylab.scan import ssd_scan, ssd_step
from replaylab.teaching.grading import guarded
from replaylab.teaching.kernel_harness import (
    TIMING_SIZES,
    Traffic,
    count_traffic,
    guarded_copy,
    interpreting,
    kernel_device,
    poisoned,
    run_kernel_check,
)

# TIMING_SIZES, Traffic, count_traffic and interpreting belong to the harness; they are named
# here too because notebook 06 reaches them as puzzles.*
__all__ = [
    "PUZZLE_SIZES",
    "COPY_SIZES",
    "TIMING_SIZES",
    "Traffic",
    "count_traffic",
    "interpreting",
    "make_case",
    "strided_state",
    "reduce_ref",
    "state_update_ref",
    "output_ref",
    "log_output_ref",
    "fold_ref",
    "check_copy_kernel",
    "check_reduce_kernel",
    "check_state_update_kernel",
    "check_output_kernel",
    "check_fold_kernel",
    "check_log_output_kernel",
]

# tiny on purpose: the interpreter runs each program instance as Python over numpy arrays.
# P and N are distinct powers of two (no masks needed), batch and H are not.
PUZZLE_SIZES = dict(batch=2, H=3, P=4, N=8, L=5)
# puzzle 1 (the copy): P and N that are not powers of two, so the tile needs masks
COPY_SIZES = dict(PUZZLE_SIZES, P=5, N=6)


def make_case(seed=0, device=None, **sizes) -> dict:
    """Random fp32 inputs of the puzzles (shapes in the module docstring), ``PUZZLE_SIZES``
    unless overridden. Δ in (0.05, 1.05), A in (-1.5, -0.1): decays that neither vanish nor
    stay at 1, so a wrong exponent shows."""
    s = {**PUZZLE_SIZES, **sizes}
    batch, H, P, N, L = s["batch"], s["H"], s["P"], s["N"], s["L"]
    device = device or kernel_device()
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    case = dict(
        S=r(batch, H, P, N),
        log_x=r(batch, L, H, P),
        log_dt=torch.rand(batch, L, H, generator=g) + 0.05,
        log_B=r(batch, L, H, N),
        x=r(batch, H, P),
        dt=torch.rand(batch, H, generator=g) + 0.05,
        B=r(batch, H, N),
        C=r(batch, H, N),
        A=-(torch.rand(H, generator=g) * 1.4 + 0.1),
        D=r(H),
    )
    # each input inside a guard too: a stray store into an input cannot reach other memory
    return {k: guarded_copy(v.to(device)) for k, v in case.items()}


def strided_state(S) -> torch.Tensor:
    """Puzzle 1's input: the values of S (batch, H, P, N) stored n-major, as a transposed view
    (strides (H P N, P N, 1, P), not S's own (H P N, P N, N, 1)), inside a NaN guard buffer
    (``kernel_harness.guarded_copy``), so a kernel that loads or stores lanes outside the
    tensor (a mask forgotten) touches the guard, which the check reports, not memory the
    process owns for something else."""
    return guarded_copy(S.transpose(2, 3).contiguous()).transpose(2, 3)


def reduce_ref(case) -> torch.Tensor:
    """Puzzle 2: y (batch, H, P) = S C, y[b, h, p] = Σ_n S[b, h, p, n] C[b, h, n] (float64)."""
    return torch.einsum("bhpn,bhn->bhp", case["S"].double(), case["C"].double()).float()


def state_update_ref(case) -> torch.Tensor:
    """Puzzle 3: S_t = e^{Δ_t A} S_{t-1} + Δ_t x_t B_t^T (batch, H, P, N), one token's
    update of every head's state (float64; ``replaylab.scan.ssd_step`` computes the same)."""
    S, x, dt, B, A = (case[k].double() for k in ("S", "x", "dt", "B", "A"))
    decay = torch.exp(dt * A)[..., None, None]  # (batch, H, 1, 1): one scalar per head
    return (decay * S + (dt[..., None] * x)[..., None] * B[:, :, None, :]).float()


def _fold(case):
    """S_{c+L} by the reference scan (C of the log only shapes discarded outputs)."""
    log_B = case["log_B"]
    return ssd_scan(
        case["log_x"],
        case["log_dt"],
        case["A"],
        log_B,
        torch.zeros_like(log_B),
        initial_state=case["S"],
    ).state


def output_ref(case) -> torch.Tensor:
    """Puzzle 4: y (batch, H, P) of the new token straight after the checkpoint (empty log)."""
    y, _ = ssd_step(case["S"], case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"])
    return y


def log_output_ref(case) -> torch.Tensor:
    """Puzzle 6: y (batch, H, P) of the new token after the L logged tokens."""
    y, _ = ssd_step(_fold(case), case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"])
    return y


def fold_ref(case) -> torch.Tensor:
    """Puzzle 5: S_{c+L} (batch, H, P, N) from the checkpoint and the whole log."""
    return _fold(case)


_LABELS = dict(
    S="checkpoint S",
    log_x="log x",
    log_dt="log dt",
    log_B="log B",
    x="new x",
    dt="new dt",
    B="new B",
    C="new C",
    A="A",
    D="D",
    y="output y",
    out="folded state out",
)
_COPY_LABELS = dict(S="state S", out="copy out")
_UPDATE_LABELS = dict(_LABELS, S="state S")


def _once(name, what):
    """A traffic rule: ``name`` moved exactly once (``what`` is "read" or "written")."""
    count = Traffic.times_read if what == "read" else Traffic.times_written
    return lambda t: abs(count(t, name) - 1) < 1e-9


def _untouched(names):
    """A traffic rule: none of ``names`` is written."""
    return lambda t: all(t.written[n] == 0 for n in names)


def _shape_hint(text):
    """For a kernel that could not run because two blocks' shapes disagree."""
    if "shape" in text.lower() or "broadcast" in text.lower():
        return (
            "two blocks of different shapes met: the tile is (P, N), rows p and columns n; "
            "tl.sum(tile, axis=1) sums over n and gives a (P,) vector, axis=0 sums over p"
        )
    return None


# ---- puzzle 1: copy a state tile


def _copy_args(c, guard=True):
    S = strided_state(c["S"]) if guard else c["S"].transpose(2, 3).contiguous().transpose(2, 3)
    batch, H, P, N = S.shape
    out = poisoned((batch, H, P, N), S) if guard else torch.empty_like(c["S"])
    blocks = triton.next_power_of_2(P), triton.next_power_of_2(N)
    return [
        ("S", S),
        ("out", out),
        *zip(("stride_b", "stride_h", "stride_p", "stride_n"), S.stride()),
        ("H", H),
        ("P", P),
        ("N", N),
        ("BLOCK_P", blocks[0]),
        ("BLOCK_N", blocks[1]),
    ]


@guarded("puzzle 1 (copy a state tile)")
def check_copy_kernel(kernel, seed=0) -> bool:
    """Puzzle 1. ``kernel[(batch, H)](S, out, stride_b, stride_h, stride_p, stride_n, H, P, N,
    BLOCK_P, BLOCK_N)`` copies S (batch, H, P, N), stored with the strides it is given (here
    n-major: ``strided_state``), into the contiguous out (batch, H, P, N): program (b, h) loads
    the tile S[b, h] and stores it at out[b, h]. P and N (``COPY_SIZES``) are not powers of
    two; BLOCK_P, BLOCK_N are the powers of two above them, so lanes p >= P, n >= N must be
    masked off. Pass: out equals S, S read exactly once, out written exactly once, nothing
    outside the two tensors touched."""
    c = make_case(seed, **COPY_SIZES)
    args = _copy_args(c)
    S = args[0][1]
    rules = [
        ("S is read exactly once", _once("S", "read")),
        ("out is written exactly once", _once("out", "written")),
        ("S is not written", lambda t: t.written["S"] == 0),
        ("out is not read", lambda t: t.read["out"] == 0),
    ]
    diagnoses = [
        (
            "S read as if it were contiguous (offset ((b H + h) P + p) N + n): use the strides "
            "given, stride_p and stride_n, not P and N",
            S.transpose(2, 3).contiguous().view(S.shape),  # S's memory, read in its order
        ),
    ]
    return run_kernel_check(
        "puzzle 1 (copy a state tile)",
        kernel,
        args,
        "out",
        c["S"],
        rules,
        labels=_COPY_LABELS,
        diagnoses=diagnoses,
        outside="lanes p >= P or n >= N are not masked off: pass mask= to tl.load and tl.store; "
        "an unmasked store also writes into the next row's or the next program's place",
        timing=lambda: _copy_args(make_case(seed, **TIMING_SIZES), guard=False),
    )


# ---- puzzle 2: a reduction over N


def _reduce_args(c):
    batch, H, P, N = c["S"].shape
    y = poisoned((batch, H, P), c["S"])
    return [("S", c["S"]), ("C", c["C"]), ("y", y), ("H", H), ("P", P), ("N", N)]


@guarded("puzzle 2 (reduce over N: S C)")
def check_reduce_kernel(kernel, seed=0) -> bool:
    """Puzzle 2. ``kernel[(batch, H)](S, C, y, H, P, N)`` writes y (batch, H, P) = S C,
    y[b, h, p] = Σ_n S[b, h, p, n] C[b, h, n]: the state term S_c C_t of the output, a
    (P, N) tile times an N-vector, summed over n in one program. Pass: y correct, S and C read
    exactly once, y written exactly once, S and C not written."""
    c = make_case(seed)
    batch, H, P, N = c["S"].shape
    rules = [
        ("S is read exactly once", _once("S", "read")),
        ("C is read exactly once", _once("C", "read")),
        ("y is written exactly once", _once("y", "written")),
        ("S and C are not written", _untouched(("S", "C"))),
    ]
    S, C = c["S"].double(), c["C"].double()
    diagnoses = [
        (
            "S read n-major, as if stored (N, P): S[b, h, p, n] sits at ((b H + h) P + p) N + n",
            torch.einsum("bhnp,bhn->bhp", S.reshape(batch, H, N, P), C).float(),
        ),
        (
            "S times C of sequence 0 for every sequence (C's batch offset forgotten)",
            torch.einsum("bhpn,hn->bhp", S, C[0]).float(),
        ),
    ]
    return run_kernel_check(
        "puzzle 2 (reduce over N: S C)",
        kernel,
        _reduce_args(c),
        "y",
        reduce_ref(c),
        rules,
        diagnoses=diagnoses,
        error_hint=_shape_hint,
        timing=lambda: _reduce_args(make_case(seed, **TIMING_SIZES)),
        labels=_LABELS,
    )


# ---- puzzle 3: one token's state update, in place


def _update_args(c):
    batch, H, P, N = c["S"].shape
    names = ("S", "x", "dt", "B", "A")
    return [(n, c[n]) for n in names] + [("H", H), ("P", P), ("N", N)]


@guarded("puzzle 3 (one state update: the snapshot write)")
def check_state_update_kernel(kernel, seed=0) -> bool:
    """Puzzle 3. ``kernel[(batch, H)](S, x, dt, B, A, H, P, N)`` updates S (batch, H, P, N)
    in place by one token: S[b, h] <- e^{Δ_t A} S[b, h] + Δ_t x_t B_t^T, with Δ_t = dt[b, h],
    A = A[h] (one scalar decay per head, broadcast over the tile), x_t = x[b, h] (P,) and
    B_t = B[b, h] (N,) (an outer product). What a snapshot decode step does to the state, and
    selective_state_update too. Pass: S correct, read exactly once and written exactly once,
    the token's inputs not written."""
    c = make_case(seed)
    want = state_update_ref(c)
    S0, x, dt, B, A = (c[k].double() for k in ("S", "x", "dt", "B", "A"))
    decay = torch.exp(dt * A)[..., None, None]
    outer = x[..., :, None] * B[:, :, None, :]  # x_t B_t^T, without Δ_t
    diagnoses = [
        (
            "the decay applied after the outer product, e^{Δ A} (S + Δ x B^T): the new token's "
            "input is not decayed, add it after scaling S",
            (decay * (S0 + dt[..., None, None] * outer)).float(),
        ),
        ("Δ_t left out of the input term, e^{Δ A} S + x B^T", (decay * S0 + outer).float()),
        (
            "the decay of head 0 for every head (A's offset h forgotten)",
            (torch.exp(dt * A[0])[..., None, None] * S0 + dt[..., None, None] * outer).float(),
        ),
    ]
    rules = [
        ("S is read exactly once", _once("S", "read")),
        ("S is written exactly once (once per token: the snapshot write)", _once("S", "written")),
        ("the token's inputs are not written", _untouched(("x", "dt", "B", "A"))),
    ]
    return run_kernel_check(
        "puzzle 3 (one state update: the snapshot write)",
        kernel,
        _update_args(c),
        "S",
        want,
        rules,
        labels=_UPDATE_LABELS,
        shared=("A",),
        in_place=("S",),
        diagnoses=diagnoses,
        error_hint=_shape_hint,
        timing=lambda: _update_args(make_case(seed, **TIMING_SIZES)),
    )


# ---- puzzle 4: the output from the checkpoint


def _replay_y(c, L=None, log_write_decayed=False, new_write_decayed=False, new_dt_decay=False):
    """y (batch, H, P) of the new token after the first L logged tokens (all by default; 0 for
    puzzle 4), carried as the P-vector v_s = S_s C_t (float64). The flags give a usual mistake's
    y instead, for the FAIL diagnoses: ``log_write_decayed`` a logged token's write decayed by
    its own a_s, a_s (v + w_s); ``new_write_decayed`` the same for the new token;
    ``new_dt_decay`` every logged token decayed by the new token's Δ_t instead of its own Δ_s."""
    S, x, dt, B, C, A, D = (c[k].double() for k in ("S", "x", "dt", "B", "C", "A", "D"))
    L = c["log_x"].shape[1] if L is None else L
    v = torch.einsum("bhpn,bhn->bhp", S, C)
    for s in range(L):
        d_s = c["log_dt"][:, s].double()  # (batch, H)
        a = torch.exp((dt if new_dt_decay else d_s) * A)[..., None]
        w = (d_s * (c["log_B"][:, s].double() * C).sum(-1))[..., None] * c["log_x"][:, s].double()
        v = a * (v + w) if log_write_decayed else a * v + w
    a_t = torch.exp(dt * A)[..., None]
    w_t = (dt * (B * C).sum(-1))[..., None] * x
    v = a_t * (v + w_t) if new_write_decayed else a_t * v + w_t
    return (v + D[:, None] * x).float()


_OWN_WRITE = (
    "a write is decayed by the decays of the tokens after it, never by its own: "
    "v_s = a_s v_(s-1) + Δ_s (B_s · C_t) x_s, not a_s (v_(s-1) + ...)"
)


def _output_args(c):
    batch, H, P, N = c["S"].shape
    y = poisoned((batch, H, P), c["S"])
    names = ("S", "x", "dt", "B", "C", "A", "D")
    return [(n, c[n]) for n in names] + [("y", y), ("H", H), ("P", P), ("N", N)]


@guarded("puzzle 4 (output from the checkpoint)")
def check_output_kernel(kernel, seed=0) -> bool:
    """Puzzle 4. ``kernel[(batch, H)](S, x, dt, B, C, A, D, y, H, P, N)`` writes y (batch, H, P)
    = e^{Δ_t A} (S_c C_t) + Δ_t (B_t · C_t) x_t + D x_t: the output of the first token after a
    checkpoint, with no state written. Pass: y correct, S read exactly once, nothing written
    but y, y written once."""
    c = make_case(seed)
    names = ("S", "x", "dt", "B", "C", "A", "D")
    rules = [
        ("the checkpoint is read exactly once", _once("S", "read")),
        ("no state is written", lambda t: t.written["S"] == 0),
        ("y is written exactly once", _once("y", "written")),
        ("inputs are not written", _untouched(names)),
    ]
    diagnoses = [
        (
            "the decay applied to the new token's input term too, e^{Δ A} (S C + Δ (B · C) x) "
            f"+ D x: {_OWN_WRITE}; y = e^{{Δ A}} (S C) + Δ (B · C) x + D x",
            _replay_y(c, L=0, new_write_decayed=True),
        ),
    ]
    return run_kernel_check(
        "puzzle 4 (output from the checkpoint)",
        kernel,
        _output_args(c),
        "y",
        output_ref(c),
        rules,
        diagnoses=diagnoses,
        shared=("A", "D"),
        error_hint=_shape_hint,
        timing=lambda: _output_args(make_case(seed, **TIMING_SIZES)),
        labels=_LABELS,
    )


# ---- puzzle 5: the fold

_FOLD_NAMES = ("S", "log_x", "log_dt", "log_B", "A")


def _fold_args(c):
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    out = poisoned((batch, H, P, N), c["S"])
    return [(n, c[n]) for n in _FOLD_NAMES] + [
        ("out", out),
        ("L", L),
        ("H", H),
        ("P", P),
        ("N", N),
    ]


@guarded("puzzle 5 (the fold)")
def check_fold_kernel(kernel, seed=0) -> bool:
    """Puzzle 5. ``kernel[(batch, H)](S, log_x, log_dt, log_B, A, out, L, H, P, N)`` writes
    out (batch, H, P, N) = S_{c+L} = fold(S_c, log[:L]). Pass: out correct, S read exactly once
    and never written, out written exactly once (the state stays in registers across the log)."""
    c = make_case(seed)
    rules = [
        ("the checkpoint is read exactly once", _once("S", "read")),
        ("the checkpoint is not written", lambda t: t.written["S"] == 0),
        ("out is written exactly once", _once("out", "written")),
        ("out is not read back", lambda t: t.read["out"] == 0),
        ("the log is not written", _untouched(_FOLD_NAMES)),
    ]
    return run_kernel_check(
        "puzzle 5 (the fold)",
        kernel,
        _fold_args(c),
        "out",
        fold_ref(c),
        rules,
        shared=("A",),
        timing=lambda: _fold_args(make_case(seed, **TIMING_SIZES)),
        labels=_LABELS,
    )


# ---- puzzle 6: the replay step

_STEP_NAMES = ("S", "log_x", "log_dt", "log_B", "x", "dt", "B", "C", "A", "D")


def _step_args(c):
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    y = poisoned((batch, H, P), c["S"])
    return [(n, c[n]) for n in _STEP_NAMES] + [
        ("y", y),
        ("L", L),
        ("H", H),
        ("P", P),
        ("N", N),
    ]


@guarded("puzzle 6 (the replay step: the log loop)")
def check_log_output_kernel(kernel, seed=0) -> bool:
    """Puzzle 6, the replay step. ``kernel[(batch, H)](S, log_x, log_dt, log_B, x, dt, B, C, A,
    D, y, L, H, P, N)`` writes y (batch, H, P) of the new token after the L logged ones, from
    the checkpoint and the log, writing no state. Pass: y correct, S read exactly once, nothing
    written but y, y written once, and no (P, N) tile updated per logged token (fewer than L
    float operations on (P, N)-sized values per program: the hint's P-vector v_s = S_s C_t;
    traffic alone cannot tell, since a tile kept in registers moves the same bytes). The log's
    read count is scored: 1.00x is the fewest possible."""
    c = make_case(seed)
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    rules = [
        ("the checkpoint is read exactly once", _once("S", "read")),
        ("no state is written", lambda t: t.written["S"] == 0),
        ("y is written exactly once", _once("y", "written")),
        ("inputs and log are not written", _untouched(_STEP_NAMES)),
    ]

    def no_tile_per_token(t):
        tile_ops = t.float_ops_at_least(P * N) / (batch * H)
        if tile_ops < L:
            return None
        return (
            f"the (P, N) state tile is updated per logged token: {tile_ops:.0f} float operations "
            f"on (P, N) = ({P}, {N}) values per program for L = {L} logged tokens (fewer than L "
            "allowed); carry the P-vector v_s = S_s C_t instead (the hint)"
        )

    diagnoses = [
        (
            "each logged token's write decayed by its own a_s = e^{Δ_s A} and the new "
            f"token's by its own e^{{Δ_t A}}: {_OWN_WRITE}",
            _replay_y(c, log_write_decayed=True, new_write_decayed=True),
        ),
        (
            f"each logged token's write decayed by its own a_s = e^{{Δ_s A}}: {_OWN_WRITE}",
            _replay_y(c, log_write_decayed=True),
        ),
        (
            f"the new token's write decayed by its own e^{{Δ_t A}}: {_OWN_WRITE}",
            _replay_y(c, new_write_decayed=True),
        ),
        (
            "the logged tokens decayed by the new token's Δ_t: logged token s decays by its own "
            "a_s = e^{Δ_s A} (log_dt[b, s, h]), the new token by e^{Δ_t A}",
            _replay_y(c, new_dt_decay=True),
        ),
    ]
    return run_kernel_check(
        "puzzle 6 (the replay step: the log loop)",
        kernel,
        _step_args(c),
        "y",
        log_output_ref(c),
        rules,
        diagnoses=diagnoses,
        shared=("A", "D"),
        work_rules=(no_tile_per_token,),
        error_hint=_shape_hint,
        timing=lambda: _step_args(make_case(seed, **TIMING_SIZES)),
        labels=_LABELS,
    )
