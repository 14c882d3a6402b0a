"""Checks for the notebooks' exercises. Each ``check_*`` takes the learner's answer, compares it
with the library, prints a verdict and returns True or False. A stub that returns None is
reported as not done yet rather than raising, so an unfinished notebook still runs."""

from __future__ import annotations

import torch

from replaylab.checks import max_abs_error
from replaylab.scan import ssd_scan, ssd_step
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence

__all__ = ["check_conv_state_bytes", "check_kv_truncate", "check_ssd_step", "check_resume"]


def _verdict(ok, message):
    print(("correct: " if ok else "not yet: ") + message)
    return ok


def check_conv_state_bytes(answer) -> bool:
    """Exercise: conv-state bytes of one Nemotron-H 8B sequence (bf16), over all its SSM layers."""
    if answer is None:
        return _verdict(False, "return a number of bytes")
    want = memory_per_sequence(PUBLISHED_SHAPES["Nemotron-H 8B"], 1)["conv_state"]
    return _verdict(
        int(answer) == want,
        f"{int(answer):,} bytes"
        + ("" if int(answer) == want else " - count channels x (d_conv - 1) x 2 bytes x layers"),
    )


def check_kv_truncate(truncate) -> bool:
    """Exercise: ``truncate(keys, p)`` keeps positions [0, p) of keys (batch, Hkv, T, Dh)."""
    keys = torch.randn(2, 3, 9, 4)
    got = truncate(keys, 5)
    if got is None:
        return _verdict(False, "return the truncated keys")
    ok = got.shape == (2, 3, 5, 4) and torch.equal(got, keys[:, :, :5])
    return _verdict(ok, f"shape {tuple(got.shape)}" + ("" if ok else ", expected (2, 3, 5, 4)"))


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


def check_ssd_step(step) -> bool:
    """Exercise: ``step(state, x, dt, A, B, C, D) -> (y, new_state)`` for the Mamba-2 form with
    Δ = dt as given (no bias, no softplus) and no gate."""
    g = torch.Generator().manual_seed(0)
    inp = _random_step_inputs(g)
    state = torch.randn(2, 4, 3, 5, generator=g)
    out = step(state.clone(), **inp)
    if out is None:
        return _verdict(False, "return (y, new_state)")
    want_y, want_state = ssd_step(state, **inp)
    err = max(max_abs_error(out[0], want_y), max_abs_error(out[1], want_state))
    return _verdict(err < 1e-4, f"max abs error {err:.1e} against replaylab.scan.ssd_step")


def check_resume(resume) -> bool:
    """Exercise: ``resume(checkpoint_state, x, dt, A, B, C) -> y`` continues a scan from a
    checkpoint state (batch, H, P, N) over new inputs x (batch, T, H, P) etc."""
    g = torch.Generator().manual_seed(1)
    x, dt = torch.randn(2, 12, 4, 3, generator=g), torch.rand(2, 12, 4, generator=g)
    A = -torch.rand(4, generator=g)
    B, C = torch.randn(2, 12, 2, 5, generator=g), torch.randn(2, 12, 2, 5, generator=g)
    checkpoint = ssd_scan(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7]).state
    got = resume(checkpoint.clone(), x[:, 7:], dt[:, 7:], A, B[:, 7:], C[:, 7:])
    if got is None:
        return _verdict(False, "return y for the tokens after the checkpoint")
    want = ssd_scan(x, dt, A, B, C).y[:, 7:]
    err = max_abs_error(got, want)
    return _verdict(err < 1e-4, f"max abs error {err:.1e} against one scan over all 12 tokens")
