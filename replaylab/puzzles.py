"""Triton puzzles for notebook 06: the learner writes three small kernels of the replay path for
one Mamba-2 layer; each ``check_*`` here launches the learner's kernel on random inputs, compares
it with a PyTorch reference built on ``replaylab.scan`` and scores its memory traffic.

The traffic score is a count, not an estimate: under Triton's interpreter (``TRITON_INTERPRET=1``,
which ``import replaylab`` switches on without a GPU) every ``tl.load`` and ``tl.store`` goes
through ``triton.runtime.interpreter.interpreter_builder``; ``count_traffic`` wraps its masked
load and store for the duration of a launch and attributes every element address that is
actually read or written (masked-off lanes excluded) to the tensor that holds it. A kernel that
reads the checkpoint twice scores "read 2.00x". A and D (H,) are needed by the program of head h
of every sequence: the puzzles count them once per sequence (``Traffic.shared_by``), so 1.00x
means each program read its head's entry once. The same wrapper counts the kernel's float
arithmetic by result size (``Traffic.float_ops``): puzzle 2 fails a kernel that updates the
(P, N) state tile per logged token, which moves the same bytes as the hint's P-vector and so
cannot be told from traffic. On a GPU (compiled kernels) the values are still checked and
neither traffic nor arithmetic is counted.

Glossary (puzzle names -> paper symbols, shapes; fp32; groups already expanded to heads, Δ
already processed: positive, one per head and token):
    S        S_c        (batch, H, P, N)   checkpoint state, read only
    log_x    x_s        (batch, L, H, P)   logged inputs since the checkpoint
    log_dt   Δ_s        (batch, L, H)
    log_B    B_s        (batch, L, H, N)
    x, dt    x_t, Δ_t   (batch, H, P), (batch, H)   the new token
    B, C     B_t, C_t   (batch, H, N)
    A, D     A, D       (H,)               decay (negative) and skip, one per head
    y        y_t        (batch, H, P)      output of the new token
    out      S_{c+L}    (batch, H, P, N)   the folded state (puzzle 3)
The grid of every puzzle is ``(batch, H)``: program (b, h) owns head h of sequence b, i.e. the
(P, N) tile S[b, h] and the (P,) row y[b, h].
"""

from __future__ import annotations

import contextlib
import os

import torch

from replaylab.checks import max_abs_error
from replaylab.exercises_common import describe_exception, guarded, record
from replaylab.scan import ssd_scan, ssd_step

__all__ = [
    "PUZZLE_SIZES",
    "Traffic",
    "count_traffic",
    "interpreting",
    "make_case",
    "output_ref",
    "log_output_ref",
    "fold_ref",
    "check_output_kernel",
    "check_log_output_kernel",
    "check_fold_kernel",
]

# tiny on purpose: the interpreter runs each program instance as Python over numpy arrays.
# P and N are distinct powers of two (no masks needed), batch and H are not.
PUZZLE_SIZES = dict(batch=2, H=3, P=4, N=8, L=5)


def interpreting() -> bool:
    """True when Triton kernels run through the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class Traffic:
    """Bytes each named tensor had read and written during a launch (see ``count_traffic``)."""

    def __init__(self, tensors: dict):
        self.tensors = dict(tensors)
        self.read = {name: 0 for name in tensors}
        self.written = {name: 0 for name in tensors}
        self.loads = {name: 0 for name in tensors}  # tl.load calls that touched the tensor
        self.stores = {name: 0 for name in tensors}
        self.unknown = 0  # bytes at addresses outside every named tensor
        # programs that each need every element of a tensor (1 unless set): A and D (H,) are
        # needed by the program of head h of every sequence, so they are read once per sequence
        self.shared_by = {name: 1 for name in tensors}
        # float arithmetic (add, sub, mul, div, fma) by the number of elements of its result,
        # summed over the programs: what the kernel computes, which traffic cannot show
        self.float_ops: dict[int, int] = {}

    def _ranges(self):
        for name, t in self.tensors.items():
            start = t.data_ptr()
            yield name, start, start + t.numel() * t.element_size(), t.element_size()

    def _add(self, addresses, into, calls):
        import numpy as np

        addresses = np.asarray(addresses, dtype=np.uint64).ravel()
        seen = np.zeros(addresses.shape, dtype=bool)
        for name, lo, hi, size in self._ranges():
            inside = (addresses >= lo) & (addresses < hi)
            n = int(inside.sum())
            if n:
                into[name] += n * size
                calls[name] += 1
                seen |= inside
        self.unknown += int((~seen).sum())

    def times_read(self, name) -> float:
        """Bytes read from ``name`` over its size times the programs that need each element
        (``shared_by``): 1.0 is 'read once' (by each program that needs it)."""
        t = self.tensors[name]
        return self.read[name] / (t.numel() * t.element_size() * self.shared_by[name])

    def float_ops_at_least(self, size) -> int:
        """Float operations whose result has at least ``size`` elements, over all programs."""
        return sum(n for s, n in self.float_ops.items() if s >= size)

    def times_written(self, name) -> float:
        t = self.tensors[name]
        return self.written[name] / (t.numel() * t.element_size())

    def total_bytes(self) -> int:
        return sum(self.read.values()) + sum(self.written.values())

    def lines(self, labels: dict | None = None) -> list[str]:
        """One line per tensor, e.g. 'checkpoint S: read 1.00x (6 tl.load), written 0x'."""
        labels = labels or {}
        out = []
        for name in self.tensors:
            r, w = self.times_read(name), self.times_written(name)
            shared = self.shared_by[name]
            per = (
                f"; each element is needed by {shared} programs: 1.00x = once by each"
                if shared > 1
                else ""
            )
            read = f"read {r:.2f}x ({self.loads[name]} tl.load{per})" if r else "read 0x"
            written = f"written {w:.2f}x ({self.stores[name]} tl.store)" if w else "written 0x"
            out.append(f"{labels.get(name, name)}: {read}, {written}")
        return out

    def once_bytes(self) -> int:
        """Bytes moved if every named tensor were touched exactly once (inputs read, outputs
        written; a shared tensor once by each program that needs it): the floor for a kernel
        over this data."""
        return sum(
            t.numel() * t.element_size() * self.shared_by[name]
            for name, t in self.tensors.items()
            if t is not None
        )


@contextlib.contextmanager
def count_traffic(**tensors):
    """Count what kernels launched inside the block read and write of each named tensor.

    Usage: ``with count_traffic(S=S, y=y) as traffic: kernel[grid](...)``; then
    ``traffic.times_read("S")``. Needs the interpreter (``interpreting()``); raises otherwise.
    """
    if not interpreting():
        raise RuntimeError(
            "count_traffic: Triton's interpreter is off (TRITON_INTERPRET is not 1); traffic is "
            "counted only when kernels run through the interpreter"
        )
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    traffic = Traffic(tensors)
    load, store = builder.create_masked_load, builder.create_masked_store
    binary, fma = builder.binary_op, builder.create_fma

    def count_float(result):
        if result.dtype.is_floating():
            size = int(result.data.size)
            traffic.float_ops[size] = traffic.float_ops.get(size, 0) + 1
        return result

    def counted_binary(lhs, rhs, op):  # create_fadd, create_fmul, ... all call binary_op
        return count_float(binary(lhs, rhs, op))

    def counted_fma(x, y, z):
        return count_float(fma(x, y, z))

    def counted_load(ptrs, mask, other, *args, **kwargs):
        traffic._add(ptrs.data[mask.data.astype(bool)], traffic.read, traffic.loads)
        return load(ptrs, mask, other, *args, **kwargs)

    def counted_store(ptrs, value, mask, *args, **kwargs):
        traffic._add(ptrs.data[mask.data.astype(bool)], traffic.written, traffic.stores)
        return store(ptrs, value, mask, *args, **kwargs)

    builder.create_masked_load, builder.create_masked_store = counted_load, counted_store
    builder.binary_op, builder.create_fma = counted_binary, counted_fma
    try:
        yield traffic
    finally:
        # the instance attributes shadowed the class methods; removing them restores those
        del builder.create_masked_load, builder.create_masked_store
        del builder.binary_op, builder.create_fma


def make_case(seed=0, device=None, **sizes) -> dict:
    """Random fp32 inputs of the puzzles (shapes in the module docstring), ``PUZZLE_SIZES``
    unless overridden. Δ in (0.05, 1.05), A in (-1.5, -0.1): decays that neither vanish nor
    stay at 1, so a wrong exponent shows."""
    s = {**PUZZLE_SIZES, **sizes}
    batch, H, P, N, L = s["batch"], s["H"], s["P"], s["N"], s["L"]
    device = device or ("cpu" if interpreting() or not torch.cuda.is_available() else "cuda")
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
    return {k: v.to(device) for k, v in case.items()}


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
    """Puzzle 1: y (batch, H, P) of the new token straight after the checkpoint (empty log)."""
    y, _ = ssd_step(case["S"], case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"])
    return y


def log_output_ref(case) -> torch.Tensor:
    """Puzzle 2: y (batch, H, P) of the new token after the L logged tokens."""
    y, _ = ssd_step(_fold(case), case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"])
    return y


def fold_ref(case) -> torch.Tensor:
    """Puzzle 3: S_{c+L} (batch, H, P, N) from the checkpoint and the whole log."""
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


def _first_mismatch(got, want, tol=1e-4):
    bad = ~((got.double() - want.double()).abs() <= tol + tol * want.double().abs())
    if not bad.any():
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    return (
        f"first mismatch at {where}: {float(got[where]):.6g} vs reference {float(want[where]):.6g}"
    )


def _wrong_programs(got, want, tol=1e-4) -> str:
    """Which programs (b, h) wrote a wrong or missing value, e.g. 'programs (b, h) (1, 0),
    (1, 1), (1, 2) of 6 are wrong, the others right'."""
    bad = ~((got.double() - want.double()).abs() <= tol + tol * want.double().abs())
    per_program = bad.flatten(2).any(-1)  # (batch, H)
    wrong = [tuple(int(i) for i in w) for w in per_program.nonzero()]
    total = per_program.numel()
    if len(wrong) == total:
        return f"every program (b, h) of the {total} is wrong"
    listed = ", ".join(str(w) for w in wrong)
    return f"programs (b, h) {listed} of {total} are wrong, the others right"


def _run(
    name, kernel, args, result, want, rules, labels=_LABELS, shared=(), work_rules=(), also=()
):
    """Launch, compare, count; print a verdict and return True or False.

    args: (name, tensor-or-int) in the kernel's parameter order; result: the name of the output;
    also: (name, expected) of further outputs, compared the same way;
    rules: (description, predicate(traffic)) that must hold for a pass (under the interpreter);
    shared: tensors every sequence's program needs (A, D): read once per sequence;
    work_rules: functions traffic -> None or the reason the kernel's arithmetic breaks a rule.
    """
    tensors = {n: v for n, v in args if isinstance(v, torch.Tensor)}
    batch, H = tensors["S"].shape[:2]
    values = [v for _, v in args]
    try:
        if interpreting():
            with count_traffic(**tensors) as traffic:
                traffic.shared_by.update({n: batch for n in shared})
                kernel[(batch, H)](*values)
        else:
            traffic = None
            kernel[(batch, H)](*values)
    except NotImplementedError:
        print(f"FAIL {name}: not yet implemented")
        return record(name, False)
    except Exception as err:  # a learner's kernel may fail to run: report, do not raise
        print(f"FAIL {name}: the kernel could not run: {describe_exception(err)}")
        return record(name, False)
    problems = []
    for output, expected in ((result, want), *also):
        got = tensors[output]
        if torch.isnan(got).any():
            where = tuple(int(i) for i in torch.isnan(got).nonzero()[0])
            problems.append(
                f"{labels[output]} not written everywhere (NaN left at {where}; "
                f"{_wrong_programs(got, expected)})"
            )
            continue
        mismatch = _first_mismatch(got, expected)
        if mismatch:
            problems.append(
                f"{labels[output]} differs from the reference: max abs error "
                f"{max_abs_error(got, expected):.2e}; {mismatch} "
                f"({_wrong_programs(got, expected)})"
            )
    if traffic is not None:
        for description, ok in rules:
            if not ok(traffic):
                problems.append(f"traffic rule broken: {description}")
        for rule in work_rules:
            reason = rule(traffic)
            if reason:
                problems.append(f"rule broken: {reason}")
        if traffic.unknown:
            problems.append(f"{traffic.unknown} accesses outside every input and output")
    ok = not problems
    print(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok else ": " + "; ".join(problems)))
    if traffic is not None:
        print("  traffic: " + "\n           ".join(traffic.lines(labels)))
        print(
            f"  total bytes moved: {traffic.total_bytes()} (every tensor touched once: "
            f"{traffic.once_bytes()})"
        )
    else:
        print("  traffic: not counted (compiled kernel; set TRITON_INTERPRET=1 to count)")
    return record(name, ok)


def _poisoned(shape, like):
    return torch.full(shape, float("nan"), dtype=torch.float32, device=like.device)


@guarded("puzzle 1 (output from the checkpoint)")
def check_output_kernel(kernel, seed=0) -> bool:
    """Puzzle 1. ``kernel[(batch, H)](S, x, dt, B, C, A, D, y, H, P, N)`` writes y (batch, H, P)
    = e^{Δ_t A} (S_c C_t) + Δ_t (B_t · C_t) x_t + D x_t: the output of the first token after a
    checkpoint, with no state written. Pass: y correct, S read exactly once, nothing written
    but y, y written once."""
    c = make_case(seed)
    batch, H, P, N = c["S"].shape
    y = _poisoned((batch, H, P), c["S"])
    names = ("S", "x", "dt", "B", "C", "A", "D")
    args = [(n, c[n]) for n in names] + [("y", y), ("H", H), ("P", P), ("N", N)]
    rules = [
        ("the checkpoint is read exactly once", lambda t: abs(t.times_read("S") - 1) < 1e-9),
        ("no state is written", lambda t: t.written["S"] == 0),
        ("y is written exactly once", lambda t: abs(t.times_written("y") - 1) < 1e-9),
        ("inputs are not written", lambda t: all(t.written[n] == 0 for n in names)),
    ]
    return _run(
        "puzzle 1 (output from the checkpoint)",
        kernel,
        args,
        "y",
        output_ref(c),
        rules,
        shared=("A", "D"),
    )


@guarded("puzzle 2 (the log loop)")
def check_log_output_kernel(kernel, seed=0) -> bool:
    """Puzzle 2. ``kernel[(batch, H)](S, log_x, log_dt, log_B, x, dt, B, C, A, D, y, L, H, P,
    N)`` writes y (batch, H, P) of the new token after the L logged ones, from the checkpoint
    and the log, writing no state. Pass: y correct, S read exactly once, nothing written but y,
    y written once, and no (P, N) tile updated per logged token (fewer than L float operations
    on (P, N)-sized values per program: the hint's P-vector v_s = S_s C_t; traffic alone cannot
    tell, since a tile kept in registers moves the same bytes). The log's read count is scored:
    1.00x is the fewest possible."""
    c = make_case(seed)
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    y = _poisoned((batch, H, P), c["S"])
    names = ("S", "log_x", "log_dt", "log_B", "x", "dt", "B", "C", "A", "D")
    args = [(n, c[n]) for n in names] + [("y", y), ("L", L), ("H", H), ("P", P), ("N", N)]
    rules = [
        ("the checkpoint is read exactly once", lambda t: abs(t.times_read("S") - 1) < 1e-9),
        ("no state is written", lambda t: t.written["S"] == 0),
        ("y is written exactly once", lambda t: abs(t.times_written("y") - 1) < 1e-9),
        ("inputs and log are not written", lambda t: all(t.written[n] == 0 for n in names)),
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

    return _run(
        "puzzle 2 (the log loop)",
        kernel,
        args,
        "y",
        log_output_ref(c),
        rules,
        shared=("A", "D"),
        work_rules=(no_tile_per_token,),
    )


@guarded("puzzle 3 (the fold)")
def check_fold_kernel(kernel, seed=0) -> bool:
    """Puzzle 3. ``kernel[(batch, H)](S, log_x, log_dt, log_B, A, out, L, H, P, N)`` writes
    out (batch, H, P, N) = S_{c+L} = fold(S_c, log[:L]). Pass: out correct, S read exactly once
    and never written, out written exactly once (the state stays in registers across the log)."""
    c = make_case(seed)
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    out = _poisoned((batch, H, P, N), c["S"])
    names = ("S", "log_x", "log_dt", "log_B", "A")
    args = [(n, c[n]) for n in names] + [("out", out), ("L", L), ("H", H), ("P", P), ("N", N)]
    rules = [
        ("the checkpoint is read exactly once", lambda t: abs(t.times_read("S") - 1) < 1e-9),
        ("the checkpoint is not written", lambda t: t.written["S"] == 0),
        ("out is written exactly once", lambda t: abs(t.times_written("out") - 1) < 1e-9),
        ("out is not read back", lambda t: t.read["out"] == 0),
        ("the log is not written", lambda t: all(t.written[n] == 0 for n in names)),
    ]
    return _run("puzzle 3 (the fold)", kernel, args, "out", fold_ref(c), rules, shared=("A",))
