"""Checks of notebook 06 (the replay kernel): questions on ``data/bench_kernels.json`` (the sweep
these checks read), the log room ``kernels.mamba2.replay_step`` accepts, and the log length
that is best measured and by the cost model.

Glossary: L, log_len, the log's length; Lmax, its capacity; T, new tokens per step; ssu,
``selective_state_update``; amortised decode, step + fold(L) / L.
"""

from __future__ import annotations

import torch

from replaylab.teaching.exercises_common import _answer, _done, whole_number
from replaylab.teaching.grading import describe_exception, guarded
from replaylab.teaching.kernel_harness import kernel_device


@guarded("largest log where replay_step beats ssu at batch {batch}")
def check_largest_winning_log(answer, batch=32) -> bool:
    """Notebook 06: from ``data/bench_kernels.json`` (H200), the largest measured log length at
    which ``replay_step`` decodes (T=1) faster than ``selective_state_update`` at ``batch``.
    At batch 32 the longest measured log loses (at 128 every measured length wins, so the
    largest of them was the answer, guessable without reading a row)."""
    from replaylab.results import load_bench

    rows = [r for r in load_bench()["rows"] if "us" in r and r["batch"] == batch and r["T"] == 1]
    ssu = next(r["us"] for r in rows if r["provider"] == "ssu")
    want = max(r["log_len"] for r in rows if r["provider"] == "replay_step" and r["us"] < ssu)
    return _answer(
        f"largest log where replay_step beats ssu at batch {batch}",
        answer,
        want,
        f"filter rows by provider, batch={batch}, T=1 and compare 'us' with the ssu row",
    )


@guarded("largest log_len that leaves room for T tokens")
def check_largest_log_len(answer, Lmax=16, T=2) -> bool:
    """Notebook 06: the largest ``log_len`` at which ``replay_step`` can still append T=2 new
    tokens to a log of capacity Lmax=16. The check calls the reference with ``answer`` (must
    work) and ``answer + 1`` (must be refused)."""
    from replaylab.kernels.mamba2 import replay_step

    name = "largest log_len that leaves room for T tokens"
    if answer is None:
        return _done(name, False, "no answer yet (replace None with your answer)")
    H, P, N, G = 2, 4, 8, 1
    device = kernel_device()

    def attempt(n):
        g = torch.Generator().manual_seed(0)
        r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
        replay_step(
            r(1, H, P, N),
            torch.zeros(1, dtype=torch.int32, device=device),
            r(1, Lmax, H, P),
            r(1, Lmax, H),
            r(1, Lmax, G, N),
            r(1, Lmax, G, N),
            torch.tensor([n], dtype=torch.int32, device=device),
            r(1, T, H, P),
            r(1, T, H),
            r(1, T, G, N),
            r(1, T, G, N),
            -torch.rand(H).to(device),
        )

    n = whole_number(answer)
    if n is None:
        return _done(name, False, f"{answer!r}: expected a whole number of entries")
    try:
        attempt(n)
    except ValueError as err:
        return _done(name, False, f"{n}: replay_step refused it ({err})")
    try:
        attempt(n + 1)
    except ValueError:
        return _done(name, True, f"{n}: accepted, and {n + 1} is refused")
    return _done(name, False, f"{n}: {n + 1} is accepted too; look for a larger one")


@guarded("best log length at batch {batch} (measured, cost model)")
def check_best_log_length(answer, batch=8, max_L=64) -> bool:
    """Notebook 06: at ``batch``, the pair (measured L with the lowest amortised decode time,
    step + fold(L) / L, in ``data/bench_kernels.json``; the integer L in 1..max_L at which the
    cost model's amortised bytes, ``kernel_bytes`` of replay_step over a log of L plus fold(L)
    / L for the benchmark's layer shape, are lowest)."""
    from replaylab.bench.mamba2_kernels import SHAPE, amortised_decode
    from replaylab.costmodel import kernel_bytes
    from replaylab.results import load_bench

    name = f"best log length at batch {batch} (measured, cost model)"
    bench = load_bench()
    shape = bench.get("shape") or SHAPE
    rows = [r for r in amortised_decode(bench) if r["batch"] == batch]
    measured = min(rows, key=lambda r: r["amortised_us"])["L"]

    def amortised(L):
        step = kernel_bytes("replay_step", batch, L, 1, **shape)
        return step + kernel_bytes("fold", batch, L, 0, **shape) / L

    model = min(range(1, max_L + 1), key=amortised)
    if answer is not None and answer is not Ellipsis:
        try:
            given, answer = answer, tuple(whole_number(v) for v in answer)
            if None in answer:
                return _done(name, False, f"{given!r}: expected whole numbers")
        except (TypeError, ValueError) as err:
            return _done(
                name,
                False,
                f"{answer!r}: expected a pair (measured_L, model_L); {describe_exception(err)}",
            )
    return _answer(
        name,
        answer,
        (measured, model),
        "measured: the row of amortised_decode(bench) at this batch with the least "
        "amortised_us; model: the L in 1..64 minimising kernel_bytes('replay_step', batch, L, "
        "1, **bench['shape']) + kernel_bytes('fold', batch, L, 0, **bench['shape']) / L",
    )
