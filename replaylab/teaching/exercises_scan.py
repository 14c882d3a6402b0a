"""Checks of notebook 02 (the selective scan): one Mamba-2 step and resuming a scan from a
checkpoint state, each against ``replaylab.scan`` (``ssd_step``, ``ssd_scan``).

Glossary (as in ``replaylab.scan``): state S (batch, H, P, N); x (batch, [T,] H, P);
dt = Δ (batch, [T,] H); A, D (H,); B, C (batch, [T,] G, N); y (batch, [T,] H, P).
"""

from __future__ import annotations

import torch

from replaylab.checks import max_abs_error
from replaylab.scan import ssd_scan, ssd_step
from replaylab.teaching.exercises_common import _difference, _verdict
from replaylab.teaching.grading import guarded


def _random_step_inputs(generator, batch=2, H=4, P=3, N=5, G=2):
    r = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    return dict(
        x=r(batch, H, P),
        dt=r(batch, H).abs(),
        A=-r(H).abs(),
        B=r(batch, G, N),
        C=r(batch, G, N),
        D=r(H),
    )


@guarded("SSD step")
def check_ssd_step(step) -> bool:
    """Exercise: ``step(state, x, dt, A, B, C, D) -> (y, new_state)`` for the Mamba-2 form with
    Δ = dt as given (no bias, no softplus) and no gate. y and new_state are compared separately
    (the message says which is wrong and in which heads)."""
    g = torch.Generator().manual_seed(0)
    inp = _random_step_inputs(g)
    state = torch.randn(2, 4, 3, 5, generator=g)
    out = step(state.clone(), **{name: t.clone() for name, t in inp.items()})
    if out is None:
        return _verdict("SSD step", False, "return (y, new_state)")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return _verdict(
            "SSD step", False, f"return a pair (y, new_state), got {type(out).__name__}"
        )
    dtypes = [f"{what} is {t.dtype}" for what, t in zip(("y", "new_state"), out)
              if isinstance(t, torch.Tensor) and t.dtype != inp["x"].dtype]  # fmt: skip
    if dtypes:
        return _verdict(
            "SSD step", False, f"{', '.join(dtypes)}: expected x's dtype, {inp['x'].dtype}"
        )
    want_y, want_state = ssd_step(state, **inp)
    bad_y = _difference("y", out[0], want_y, head_dim=1)
    bad_state = _difference("new_state", out[1], want_state, head_dim=1)
    if bad_y is None and bad_state is None:
        err = max(max_abs_error(out[0], want_y), max_abs_error(out[1], want_state))
        return _verdict(
            "SSD step", True, f"max abs error {err:.1e} against replaylab.scan.ssd_step"
        )
    if bad_state is None:
        message = (
            f"new_state agrees, y differs: {bad_y}; y_t = C_t . S_t (the state after this "
            "token) + D x_t"
        )
    else:
        message = "; ".join(m for m in (bad_state, bad_y) if m)
    return _verdict("SSD step", False, message + " - against replaylab.scan.ssd_step")


@guarded("resume from a checkpoint")
def check_resume(resume) -> bool:
    """Exercise: ``resume(checkpoint_state, x, dt, A, B, C) -> y`` continues a scan from a
    checkpoint state (batch, H, P, N) over new inputs x (batch, T, H, P) etc."""
    name = "resume from a checkpoint"
    g = torch.Generator().manual_seed(1)
    x, dt = torch.randn(2, 12, 4, 3, generator=g), torch.rand(2, 12, 4, generator=g)
    A = -torch.rand(4, generator=g)
    B, C = torch.randn(2, 12, 2, 5, generator=g), torch.randn(2, 12, 2, 5, generator=g)
    checkpoint = ssd_scan(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7]).state
    after = [t[:, 7:].clone() for t in (x, dt, B, C)]  # the learner's own copies
    got = resume(checkpoint.clone(), after[0], after[1], A.clone(), after[2], after[3])
    if got is None:
        return _verdict(name, False, "return y for the tokens after the checkpoint")
    want = ssd_scan(x, dt, A, B, C).y[:, 7:]
    bad = _difference("y of the 5 tokens after the checkpoint", got, want)
    if bad is None:
        err = max_abs_error(got, want)
        return _verdict(name, True, f"max abs error {err:.1e} against one scan over all 12 tokens")
    from_zero = ssd_scan(x[:, 7:], dt[:, 7:], A, B[:, 7:], C[:, 7:]).y
    if _difference("y", got, from_zero) is None:
        bad += "; it equals a scan of the 5 new tokens from a zero state: start from the checkpoint"
    return _verdict(name, False, f"{bad} - against one scan over all 12 tokens")
