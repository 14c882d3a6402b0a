"""How a check launches a learner's Triton kernel and judges it: under Triton's interpreter or
compiled on a GPU (``interpreting``, ``gpu_timing``, ``kernel_device``), the memory traffic and
float arithmetic of a launch (``Traffic``, ``count_traffic``), outputs filled with NaN so an
unwritten element shows (``poisoned``), and the verdict (``run_kernel_check``: launch, compare
with the reference, apply the traffic rules, print, record). The Triton puzzles of notebook 06
(``replaylab.teaching.puzzles``) and the Gated DeltaNet and Mamba-1 step kernels of notebook
11 (``replaylab.teaching.exercises_families``) are built on it; it imports neither.

The traffic count is exact, not an estimate: ``count_traffic`` wraps the interpreter's masked
load and store (``triton.runtime.interpreter.interpreter_builder``) for the duration of a
launch and attributes every element address actually read or written to the tensor holding it.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from replaylab.checks import max_abs_error
from replaylab.teaching.grading import describe_exception, record

__all__ = [
    "TIMING_SIZES",
    "interpreting",
    "gpu_timing",
    "kernel_device",
    "Traffic",
    "count_traffic",
    "poisoned",
    "guarded_copy",
    "run_kernel_check",
]

# where a check times a kernel that passed, on a GPU: one sequence of Nemotron-H 8B's Mamba-2
# layer (replaylab.bench.mamba2_kernels.SHAPE, B and C expanded to the heads) and a log of 16, the
# shape of the launch sweep's batch-1 replay step (data/bench_kernels_sweep.json)
TIMING_SIZES = dict(batch=1, H=128, P=64, N=128, L=16)


def interpreting() -> bool:
    """True when Triton kernels run through the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gpu_timing() -> bool:
    """True when the checks time the learner's kernels: compiled, on a CUDA device."""
    return not interpreting() and torch.cuda.is_available()


def kernel_device() -> str:
    """Where to put tensors for a Triton kernel launched from a notebook or a check: "cuda"
    when a GPU is present and Triton's interpreter is off (a compiled kernel refuses CPU
    tensors), otherwise "cpu" (the interpreter runs over CPU tensors)."""
    return "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"


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


def _first_mismatch(got, want, tol=1e-4):
    bad = ~((got.double() - want.double()).abs() <= tol + tol * want.double().abs())
    if not bad.any():
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    return (
        f"first mismatch at {where}: {float(got[where]):.6g} vs reference {float(want[where]):.6g}"
    )


def _wrong_programs(got, want, grid="(b, h)", tol=1e-4) -> str:
    """Which programs (the launch's grid: (batch, S.shape[1]), its axes named by ``grid``)
    wrote a wrong or missing value, e.g. 'programs (b, h) (1, 0), (1, 1), (1, 2) of 6 are
    wrong, the others right'."""
    bad = ~((got.double() - want.double()).abs() <= tol + tol * want.double().abs())
    per_program = bad.flatten(2).any(-1) if bad.dim() > 2 else bad  # (batch, H)
    wrong = [tuple(int(i) for i in w) for w in per_program.nonzero()]
    total = per_program.numel()
    if len(wrong) == total:
        return f"every program {grid} of the {total} is wrong"
    listed = ", ".join(str(w) for w in wrong)
    return f"programs {grid} {listed} of {total} are wrong, the others right"


def _matches(got, want, tol=1e-4) -> bool:
    return bool(((got.double() - want.double()).abs() <= tol + tol * want.double().abs()).all())


def _time_kernel(kernel, build) -> str:
    """µs per launch of ``kernel`` by ``triton.testing.do_bench`` on the inputs ``build()``
    returns (``args`` as ``run_kernel_check`` takes them) at ``TIMING_SIZES``, as a line to
    print."""
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


def run_kernel_check(
    name,
    kernel,
    args,
    result,
    want,
    rules,
    labels=None,
    shared=(),
    work_rules=(),
    also=(),
    diagnoses=(),
    outside="",
    error_hint=None,
    timing=None,
    in_place=(),
    grid="(b, h)",
):
    """Launch, compare, count; print a verdict and return True or False.

    args: (name, tensor-or-int) in the kernel's parameter order; result: the name of the output;
    also: (name, expected) of further outputs, compared the same way;
    rules: (description, predicate(traffic)) that must hold for a pass (under the interpreter);
    shared: tensors every sequence's program needs (A, D): read once per sequence; or a dict
    name -> the number of programs that each need every element of it;
    work_rules: functions traffic -> None or the reason the kernel's arithmetic breaks a rule;
    diagnoses: (what the mistake is, the value it gives) of the usual wrong answers: a wrong
    result equal to one of them is reported as that mistake;
    outside: said after a count of accesses outside every tensor (where they come from);
    error_hint: function (error text) -> None or a sentence added when the kernel cannot run;
    timing: function () -> args at ``TIMING_SIZES``; a kernel that passes is timed on a GPU;
    in_place: tensors the kernel updates in place (their floor: read once, written once);
    grid: the names of the launch's two axes in the messages, e.g. "(b, d)" where a program
    owns a channel.
    """
    tensors = {n: v for n, v in args if isinstance(v, torch.Tensor)}
    batch, H = tensors["S"].shape[:2]
    values = [v for _, v in args]
    try:
        if interpreting():
            with count_traffic(**tensors) as traffic:
                traffic.shared_by.update(
                    shared if isinstance(shared, dict) else dict.fromkeys(shared, batch)
                )
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
    problems = [
        f"a store landed outside {labels.get(n, n)} (its guard was written: a wrong offset or "
        "stride, or a mask forgotten on tl.store)"
        for n, t in tensors.items()
        if isinstance(t, torch.Tensor) and not _guard_intact(t)
    ]
    stray_reads = traffic is not None and traffic.unknown
    for output, expected in ((result, want), *also):
        got = tensors[output]
        if torch.isnan(got).any():
            where = tuple(int(i) for i in torch.isnan(got).nonzero()[0])
            cause = (
                ", or computed there from a read outside the inputs (their guards hold NaN)"
                if stray_reads
                else ""
            )
            problems.append(
                f"{labels.get(output, output)} not written everywhere (NaN left at {where}"
                f"{cause}; {_wrong_programs(got, expected, grid)})"
            )
            continue
        mismatch = _first_mismatch(got, expected)
        if mismatch:
            problems.append(
                f"{labels.get(output, output)} differs from the reference: max abs error "
                f"{max_abs_error(got, expected):.2e}; {mismatch} "
                f"({_wrong_programs(got, expected, grid)})"
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


GUARD = 1024  # NaN elements before and after each puzzle tensor


def poisoned(shape, like, guard=GUARD):
    """A NaN-filled fp32 output of ``shape`` on ``like``'s device, inside a buffer with
    ``guard`` NaN elements before and after it: a store past the tensor (a wrong stride, a
    mask forgotten) lands in the guard, which the traffic count reports, not in memory the
    process owns for something else (under the interpreter that aborted the kernel)."""
    n = math.prod(shape)
    buf = torch.full((2 * guard + n,), float("nan"), dtype=torch.float32, device=like.device)
    return buf[guard : guard + n].view(*shape)


def _guard_intact(t) -> bool:
    """Whether the guard around ``t`` (a tensor of ``poisoned`` or ``guarded_copy``, or a view
    of one) still holds only NaN; True for a tensor with no guard. This also catches a stray
    store where no traffic is counted (compiled kernels)."""
    base = t._base
    if base is None or base.dim() != 1 or not t.is_floating_point():
        return True
    start, end = t.storage_offset(), t.storage_offset() + t.numel()
    return bool(torch.isnan(base[:start]).all() and torch.isnan(base[end:]).all())


def guarded_copy(t, guard=GUARD):
    """``t`` copied into the middle of a guard buffer (see ``poisoned``; NaN for floats):
    a contiguous tensor equal to ``t``."""
    fill = float("nan") if t.is_floating_point() else 0
    buf = torch.full((2 * guard + t.numel(),), fill, dtype=t.dtype, device=t.device)
    return buf[guard : guard + t.numel()].view(t.shape).copy_(t)
