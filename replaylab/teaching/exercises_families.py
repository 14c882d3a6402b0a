"""Checks for notebook 11 ("Beyond Mamba-2"). Each ``check_*`` takes the learner's function,
compares it with the library's reference on random inputs, prints ``PASS ...`` / ``FAIL ...``
with the first mismatch, records the verdict (``replaylab.teaching.exercises.results()``) and
returns True or False. A stub that returns None or raises NotImplementedError is reported as not done;
any other exception is reported as a failure naming it and the learner's line; no check
raises.

Glossary: see ``replaylab.scan`` (Gated DeltaNet: q, k (batch, T, Hk, K), v (batch, T, H, V),
g = log α and β (batch, T, H), state S (batch, H, K, V); Mamba-1: x, Δ (batch, D), A (D, N),
B, C (batch, N), state S (batch, D, N)).
"""

from __future__ import annotations

import torch

from replaylab.checks import max_abs_error
from replaylab.scan import gdn_scan, s6_scan
from replaylab.teaching.grading import NOT_IMPLEMENTED, describe_exception, guarded, report
from replaylab.teaching.kernel_harness import (
    guarded_copy,
    kernel_device,
    poisoned,
    run_kernel_check,
)

__all__ = [
    "check_chunked_fold",
    "check_gdn_step_kernel",
    "check_s6_step_kernel",
    "gdn_fold_inputs",
    "gdn_step_case",
    "s6_step_case",
]


def _done(name, ok, message) -> bool:
    return report(name, ok, message)


def gdn_fold_inputs(batch=2, T=11, Hk=2, H=4, K=8, V=6, seed=0) -> dict:
    """Random Gated DeltaNet log entries and a start state with a trained layer's ranges:
    state (batch, H, K, V), k unit-norm (batch, T, Hk, K), v (batch, T, H, V), g in
    (-0.7, 0] and beta in (0, 1) (batch, T, H)."""
    g_ = torch.Generator().manual_seed(seed)
    k = torch.randn(batch, T, Hk, K, generator=g_)
    return dict(
        state=torch.randn(batch, H, K, V, generator=g_),
        k=k / k.norm(dim=-1, keepdim=True),
        v=torch.randn(batch, T, H, V, generator=g_),
        g=-torch.rand(batch, T, H, generator=g_) * 0.7,
        beta=torch.rand(batch, T, H, generator=g_),
    )


@guarded("chunked_fold")
def check_chunked_fold(fold, atol=1e-4) -> bool:
    """Exercise: ``fold(state, k, v, g, beta, chunk_size) -> state after the T tokens``, by
    the chunked WY / UT form. Compared with the token loop ``replaylab.scan.gdn_scan`` on
    random inputs, for chunk sizes that divide T and that do not (1, 4, T, T + 3)."""
    name = "chunked_fold"
    for case, shape in enumerate([dict(T=11), dict(T=16, Hk=1, H=3, K=4, V=5), dict(T=3)]):
        p = gdn_fold_inputs(seed=case, **shape)
        T = p["k"].shape[1]
        want = gdn_scan(
            torch.zeros_like(p["k"]), p["k"], p["v"], p["g"], p["beta"], initial_state=p["state"]
        ).state
        for chunk in (1, 4, T, T + 3):
            try:
                given = {n: p[n].clone() for n in ("k", "v", "g", "beta")}
                got = fold(p["state"].clone(), *given.values(), chunk)
            except NotImplementedError:
                return _done(name, False, NOT_IMPLEMENTED)
            except Exception as err:  # the learner's code raised: say on which case
                return _done(name, False, f"T={T}, chunk_size={chunk}: {describe_exception(err)}")
            if got is None:
                return _done(name, False, "not yet implemented (the function returned None)")
            changed = [n for n, t in given.items() if not torch.equal(t, p[n])]
            if changed:
                return _done(
                    name,
                    False,
                    f"T={T}, chunk_size={chunk}: your fold changed its input {', '.join(changed)} "
                    "in place; the caller keeps using them (work on copies)",
                )
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape_got = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got)
                return _done(
                    name, False, f"expected a state of shape {tuple(want.shape)}, got {shape_got}"
                )
            err = max_abs_error(got, want)
            if not err <= atol:
                wrong = ~((got.double() - want.double()).abs() <= atol)  # NaN counts as wrong
                bad = wrong.nonzero()[0].tolist()
                heads = [h for h in range(got.shape[1]) if wrong[:, h].any()]
                which = (
                    f"wrong in heads {heads} of {got.shape[1]} (Hk={p['k'].shape[2]} key heads)"
                    if len(heads) < got.shape[1]
                    else "wrong in every head"
                )
                return _done(
                    name,
                    False,
                    f"T={T}, chunk_size={chunk}: max error {err:.2e} > {atol:g}, {which}; first at "
                    f"{tuple(bad)}: {float(got[tuple(bad)]):.5g} vs {float(want[tuple(bad)]):.5g}",
                )
    return _done(
        name,
        True,
        "your fold equals the token loop for every chunk size (the check compares results: "
        "whether you chunked is yours to see)",
    )


# the step puzzle: tiny, since the interpreter runs each program as Python over numpy arrays
GDN_STEP_SIZES = dict(batch=2, H=3, K=8, V=4, n=5)

_GDN_LABELS = dict(
    S="checkpoint S",
    log_k="log k",
    log_u="log u",
    log_g="log g",
    q="new q",
    k="new k",
    v="new v",
    g="new g",
    beta="new beta",
    o="output o",
    u="new u",
)


def gdn_step_case(seed=0, device=None, **sizes) -> dict:
    """The step puzzle's inputs (fp32, heads already expanded: one key per value head) and its
    expected outputs, from n + 1 random tokens: S (batch, H, K, V); the log of the first n,
    log_k (batch, n, H, K), log_u (batch, n, H, V) (their corrected updates, by the token
    recurrence), log_g (batch, n, H); the last token q, k (batch, H, K), v (batch, H, V), g,
    beta (batch, H); want_o: its output by ``replaylab.scan.gdn_scan`` in float64 from S;
    want_u: its corrected update. On ``device`` (default: the GPU when one runs the kernels
    natively, else the CPU for the interpreter); drawn on the CPU, so the case is the same."""
    from replaylab.kernels.gdn import corrected_updates

    device = device or kernel_device()

    z = {**GDN_STEP_SIZES, **sizes}
    batch, H, K, V, n = z["batch"], z["H"], z["K"], z["V"], z["n"]
    gen = torch.Generator().manual_seed(seed)
    unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731
    q = unit(torch.randn(batch, n + 1, H, K, generator=gen)) * K**-0.5
    k = unit(torch.randn(batch, n + 1, H, K, generator=gen))
    v = torch.randn(batch, n + 1, H, V, generator=gen)
    g = -torch.rand(batch, n + 1, H, generator=gen) * 0.7
    beta = torch.rand(batch, n + 1, H, generator=gen)
    S = torch.randn(batch, H, K, V, generator=gen) * 0.5
    u, _ = corrected_updates(S, k, v, g, beta)
    f64 = [t.double() for t in (q, k, v, g, beta)]
    o = gdn_scan(*f64, initial_state=S.double(), compute_dtype=torch.float64).y
    case = dict(
        S=S,
        log_k=k[:, :n].contiguous(),
        log_u=u[:, :n].contiguous(),
        log_g=g[:, :n].contiguous(),
        q=q[:, n].contiguous(),
        k=k[:, n].contiguous(),
        v=v[:, n].contiguous(),
        g=g[:, n].contiguous(),
        beta=beta[:, n].contiguous(),
        want_o=o[:, n].float(),
        want_u=u[:, n],
    )
    # each inside a guard buffer: a store past a tensor lands in the guard, not in memory the
    # process owns (under the interpreter that aborted the kernel)
    return {name: guarded_copy(t.contiguous().to(device)) for name, t in case.items()}


@guarded("GDN step kernel")
def check_gdn_step_kernel(kernel, seed=0) -> bool:
    """``kernel[(batch, H)](S, log_k, log_u, log_g, q, k, v, g, beta, o, u, n, H, K, V)``
    writes the new token's output o (batch, H, V) and corrected update u (batch, H, V) from
    the checkpoint and the n logged tokens (``gdn_step_case``). Pass: both correct, S read
    exactly once and never written, o and u written once, the log and the token not written."""
    c = gdn_step_case(seed)
    batch, H, K, V = c["S"].shape
    n = c["log_k"].shape[1]
    o, u = poisoned((batch, H, V), c["S"]), poisoned((batch, H, V), c["S"])
    names = ("S", "log_k", "log_u", "log_g", "q", "k", "v", "g", "beta")
    args = [(m, c[m]) for m in names] + [("o", o), ("u", u), ("n", n), ("H", H), ("K", K), ("V", V)]
    rules = [
        ("the checkpoint is read exactly once", lambda t: abs(t.times_read("S") - 1) < 1e-9),
        ("no state is written", lambda t: t.written["S"] == 0),
        ("o is written exactly once", lambda t: abs(t.times_written("o") - 1) < 1e-9),
        ("u is written exactly once", lambda t: abs(t.times_written("u") - 1) < 1e-9),
        (
            "the log and the token are not written",
            lambda t: all(t.written[m] == 0 for m in names if m != "S"),
        ),
    ]
    return run_kernel_check(
        "GDN step kernel",
        kernel,
        args,
        "o",
        c["want_o"],
        rules,
        labels=_GDN_LABELS,
        also=[("u", c["want_u"])],
    )


# the Mamba-1 snapshot step: tiny, as the GDN step (the interpreter runs every program)
S6_STEP_SIZES = dict(batch=2, D=6, N=4)

_S6_LABELS = dict(
    S="state S",
    x="new x",
    delta="new Δ",
    A="A",
    B="new B",
    C="new C",
    Dskip="D (skip)",
    y="output y",
)


def s6_step_case(seed=0, device=None, **sizes) -> dict:
    """The Mamba-1 snapshot step's inputs (fp32) and expected results: S (batch, D, N); the
    token's x and Δ (batch, D) (Δ > 0: the dt projection and softplus already applied); A
    (D, N) < 0; B, C (batch, N); Dskip (D,); want_S, the state after the token, and want_y
    (batch, D), by ``replaylab.scan.s6_scan`` in float64. On ``device`` (default as
    ``gdn_step_case``)."""
    device = device or kernel_device()
    z = {**S6_STEP_SIZES, **sizes}
    batch, D, N = z["batch"], z["D"], z["N"]
    gen = torch.Generator().manual_seed(seed)
    case = dict(
        S=torch.randn(batch, D, N, generator=gen),
        x=torch.randn(batch, D, generator=gen),
        delta=0.05 + torch.rand(batch, D, generator=gen),
        A=-(0.2 + 2 * torch.rand(D, N, generator=gen)),
        B=torch.randn(batch, N, generator=gen),
        C=torch.randn(batch, N, generator=gen),
        Dskip=torch.randn(D, generator=gen),
    )
    f64 = {k: t.double() for k, t in case.items()}
    result = s6_scan(f64["x"][:, None], f64["delta"][:, None], f64["A"], f64["B"][:, None],
                     f64["C"][:, None], f64["Dskip"], initial_state=f64["S"],
                     compute_dtype=torch.float64)  # fmt: skip
    case.update(want_S=result.state.float(), want_y=result.y[:, 0].float())
    # each inside a guard buffer: a store past a tensor lands in the guard, not in memory the
    # process owns (under the interpreter that aborted the kernel)
    return {name: guarded_copy(t.contiguous().to(device)) for name, t in case.items()}


def _s6_mistakes(c):
    """The usual wrong answers' y (float64 -> fp32), for the FAIL diagnoses."""
    S, x, delta, A, B, C, Dskip = (
        c[k].double() for k in ("S", "x", "delta", "A", "B", "C", "Dskip")
    )
    write = (delta * x)[..., None] * B[:, None, :]
    right = torch.exp(delta[..., None] * A) * S + write

    def y(state):
        return ((state * C[:, None, :]).sum(-1) + Dskip * x).float()

    return [
        ("y from the state before the update, S_(t-1) C_t + D x_t: y reads the new state S_t",
         y(S)),
        ("Δ_t left out of the input term: e^{Δ A} S + x B^T",
         y(torch.exp(delta[..., None] * A) * S + x[..., None] * B[:, None, :])),
        ("the decay of channel 0 for every channel (A's row offset d * N forgotten)",
         y(torch.exp(delta[..., None] * A[0]) * S + write)),
        ("y without the skip term D x_t", ((right * C[:, None, :]).sum(-1)).float()),
    ]  # fmt: skip


@guarded("Mamba-1 snapshot step kernel")
def check_s6_step_kernel(kernel, seed=0) -> bool:
    """``kernel[(batch, D)](S, x, delta, A, B, C, Dskip, y, D, N)`` steps the Mamba-1 state
    S (batch, D, N) through one token in place, S <- e^{Δ A} S + Δ x B^T elementwise per
    channel (A (D, N): every element its own decay), and writes y = S C + D x (batch, D)
    from the new state (``s6_step_case``). Pass: S and y correct, S read exactly once and
    written exactly once (the snapshot write: one update per element), y written once, the
    token's inputs not written."""
    c = s6_step_case(seed)
    batch, D, N = c["S"].shape
    y = poisoned((batch, D), c["S"])
    names = ("S", "x", "delta", "A", "B", "C", "Dskip")
    inputs = names[1:]
    args = [(m, c[m]) for m in names] + [("y", y), ("D", D), ("N", N)]
    rules = [
        ("S is read exactly once", lambda t: abs(t.times_read("S") - 1) < 1e-9),
        ("S is written exactly once (the snapshot write)", lambda t: abs(t.times_written("S") - 1) < 1e-9),
        ("y is written exactly once", lambda t: abs(t.times_written("y") - 1) < 1e-9),
        ("the token's inputs are not written", lambda t: all(t.written[m] == 0 for m in inputs)),
    ]  # fmt: skip
    return run_kernel_check(
        "Mamba-1 snapshot step kernel",
        kernel,
        args,
        "y",
        c["want_y"],
        rules,
        labels=_S6_LABELS,
        shared=dict(A=batch, Dskip=batch, B=D, C=D),  # B_t and C_t: each channel's program
        in_place=("S",),
        also=[("S", c["want_S"])],
        diagnoses=_s6_mistakes(c),
        grid="(b, d)",
    )
