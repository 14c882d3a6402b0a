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

import contextlib
import os

import torch
import triton

from replaylab.checks import max_abs_error
from replaylab.exercises_common import describe_exception, guarded, record
from replaylab.scan import ssd_scan, ssd_step

__all__ = [
    "PUZZLE_SIZES",
    "COPY_SIZES",
    "TIMING_SIZES",
    "gpu_timing",
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
# where a check times a kernel that passed, on a GPU: one sequence of Nemotron-H 8B's Mamba-2
# layer (replaylab.bench.kernels.SHAPE, B and C expanded to the heads) and a log of 16, the
# shape of the launch sweep's batch-1 replay step (data/bench_kernels_sweep.json)
TIMING_SIZES = dict(batch=1, H=128, P=64, N=128, L=16)


def interpreting() -> bool:
    """True when Triton kernels run through the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gpu_timing() -> bool:
    """True when the checks time the learner's kernels: compiled, on a CUDA device."""
    return not interpreting() and torch.cuda.is_available()


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
        # tensors a kernel must both read and write (a state updated in place): their floor is
        # one read and one write
        self.in_place: set[str] = set()
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
        written; a shared tensor once by each program that needs it; one updated in place read
        once and written once): the floor for a kernel over this data."""
        return sum(
            t.numel()
            * t.element_size()
            * self.shared_by[name]
            * (2 if name in self.in_place else 1)
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


def strided_state(S, guard=1024) -> torch.Tensor:
    """Puzzle 1's input: the values of S (batch, H, P, N) stored n-major, as a transposed view
    (strides (H P N, P N, 1, P), not S's own (H P N, P N, N, 1)), inside a buffer with ``guard``
    NaN elements before and after it, so a kernel that loads or stores lanes outside the
    tensor (a mask forgotten) touches the guard, which the traffic count reports, not memory
    the process owns for something else."""
    batch, H, P, N = S.shape
    buf = torch.full((2 * guard + S.numel(),), float("nan"), dtype=S.dtype, device=S.device)
    inner = buf[guard : guard + S.numel()].view(batch, H, N, P)
    inner.copy_(S.transpose(2, 3))
    return inner.transpose(2, 3)


def _guarded_output(shape, like, guard=1024) -> torch.Tensor:
    """A NaN-poisoned contiguous output inside a NaN guard (see ``strided_state``)."""
    n = 1
    for d in shape:
        n *= d
    buf = torch.full((2 * guard + n,), float("nan"), dtype=torch.float32, device=like.device)
    return buf[guard : guard + n].view(*shape)


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


def _matches(got, want, tol=1e-4) -> bool:
    return bool(((got.double() - want.double()).abs() <= tol + tol * want.double().abs()).all())


def _time_kernel(kernel, build) -> str:
    """µs per launch of ``kernel`` by ``triton.testing.do_bench`` on the inputs ``build()``
    returns (``args`` as ``_run`` takes them) at ``TIMING_SIZES``, as a line to print."""
    import triton.testing

    args = build()
    tensors = {n: v for n, v in args if isinstance(v, torch.Tensor)}
    batch, H = tensors["S"].shape[:2]
    values = [v for _, v in args]
    ms = triton.testing.do_bench(lambda: kernel[(batch, H)](*values))
    sizes = ", ".join(f"{k} {v}" for k, v in TIMING_SIZES.items())
    return (
        f"  time: {ms * 1e3:.2f} µs per launch on {torch.cuda.get_device_name()} ({sizes}; "
        "triton.testing.do_bench)"
    )


def _run(
    name,
    kernel,
    args,
    result,
    want,
    rules,
    labels=_LABELS,
    shared=(),
    work_rules=(),
    also=(),
    diagnoses=(),
    outside="",
    error_hint=None,
    timing=None,
    in_place=(),
):
    """Launch, compare, count; print a verdict and return True or False.

    args: (name, tensor-or-int) in the kernel's parameter order; result: the name of the output;
    also: (name, expected) of further outputs, compared the same way;
    rules: (description, predicate(traffic)) that must hold for a pass (under the interpreter);
    shared: tensors every sequence's program needs (A, D): read once per sequence;
    work_rules: functions traffic -> None or the reason the kernel's arithmetic breaks a rule;
    diagnoses: (what the mistake is, the value it gives) of the usual wrong answers: a wrong
    result equal to one of them is reported as that mistake;
    outside: said after a count of accesses outside every tensor (where they come from);
    error_hint: function (error text) -> None or a sentence added when the kernel cannot run;
    timing: function () -> args at ``TIMING_SIZES``; a kernel that passes is timed on a GPU;
    in_place: tensors the kernel updates in place (their floor: read once, written once).
    """
    tensors = {n: v for n, v in args if isinstance(v, torch.Tensor)}
    batch, H = tensors["S"].shape[:2]
    values = [v for _, v in args]
    try:
        if interpreting():
            with count_traffic(**tensors) as traffic:
                traffic.shared_by.update({n: batch for n in shared})
                traffic.in_place.update(in_place)
                kernel[(batch, H)](*values)
        else:
            traffic = None
            kernel[(batch, H)](*values)
    except NotImplementedError:
        print(f"FAIL {name}: not yet implemented")
        return record(name, False)
    except Exception as err:  # a learner's kernel may fail to run: report, do not raise
        hint = error_hint(describe_exception(err)) if error_hint else None
        print(
            f"FAIL {name}: the kernel could not run: {describe_exception(err)}"
            + (f" ({hint})" if hint else "")
        )
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
            if output == result:
                problems += [
                    f"it equals {what}" for what, value in diagnoses if _matches(got, value)
                ]
    if traffic is not None:
        for description, ok in rules:
            if not ok(traffic):
                problems.append(f"traffic rule broken: {description}")
        for rule in work_rules:
            reason = rule(traffic)
            if reason:
                problems.append(f"rule broken: {reason}")
        if traffic.unknown:
            problems.append(
                f"{traffic.unknown} accesses outside every input and output"
                + (f" ({outside})" if outside else "")
            )
    ok = not problems
    print(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok else ": " + "; ".join(problems)))
    if traffic is not None:
        print("  traffic: " + "\n           ".join(traffic.lines(labels)))
        both = "".join(f"; {labels.get(n, n)} read once and written once" for n in in_place)
        print(
            f"  total bytes moved: {traffic.total_bytes()} (every tensor touched once: "
            f"{traffic.once_bytes()}{both})"
        )
    else:
        print("  traffic: not counted (compiled kernel; set TRITON_INTERPRET=1 to count)")
    if ok and timing is not None and gpu_timing():
        try:  # the verdict stands whatever the timing does
            print(_time_kernel(kernel, timing))
        except Exception as err:  # e.g. a kernel that does not compile at the larger sizes
            print(f"  time: not measured ({describe_exception(err)})")
    return record(name, ok)


def _poisoned(shape, like):
    return torch.full(shape, float("nan"), dtype=torch.float32, device=like.device)


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
    out = _guarded_output((batch, H, P, N), S) if guard else torch.empty_like(c["S"])
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
    return _run(
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
    y = _poisoned((batch, H, P), c["S"])
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
    return _run(
        "puzzle 2 (reduce over N: S C)",
        kernel,
        _reduce_args(c),
        "y",
        reduce_ref(c),
        rules,
        diagnoses=diagnoses,
        error_hint=_shape_hint,
        timing=lambda: _reduce_args(make_case(seed, **TIMING_SIZES)),
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
    return _run(
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


def _output_args(c):
    batch, H, P, N = c["S"].shape
    y = _poisoned((batch, H, P), c["S"])
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
    return _run(
        "puzzle 4 (output from the checkpoint)",
        kernel,
        _output_args(c),
        "y",
        output_ref(c),
        rules,
        shared=("A", "D"),
        error_hint=_shape_hint,
        timing=lambda: _output_args(make_case(seed, **TIMING_SIZES)),
    )


# ---- puzzle 5: the fold

_FOLD_NAMES = ("S", "log_x", "log_dt", "log_B", "A")


def _fold_args(c):
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    out = _poisoned((batch, H, P, N), c["S"])
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
    return _run(
        "puzzle 5 (the fold)",
        kernel,
        _fold_args(c),
        "out",
        fold_ref(c),
        rules,
        shared=("A",),
        timing=lambda: _fold_args(make_case(seed, **TIMING_SIZES)),
    )


# ---- puzzle 6: the replay step

_STEP_NAMES = ("S", "log_x", "log_dt", "log_B", "x", "dt", "B", "C", "A", "D")


def _step_args(c):
    batch, H, P, N = c["S"].shape
    L = c["log_x"].shape[1]
    y = _poisoned((batch, H, P), c["S"])
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

    return _run(
        "puzzle 6 (the replay step: the log loop)",
        kernel,
        _step_args(c),
        "y",
        log_output_ref(c),
        rules,
        shared=("A", "D"),
        work_rules=(no_tile_per_token,),
        error_hint=_shape_hint,
        timing=lambda: _step_args(make_case(seed, **TIMING_SIZES)),
    )
