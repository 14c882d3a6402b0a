"""Comparing results: one ``assert_close`` with tolerances chosen by dtype, reporting the
largest error, used by the tests, the notebooks and the exercise checks."""

from __future__ import annotations

import torch

__all__ = ["TOLERANCES", "max_abs_error", "assert_close"]

# (atol, rtol) for results computed from inputs of this dtype, accumulated in fp32
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


def max_abs_error(actual, expected) -> float:
    """Largest absolute difference, computed in float64."""
    return float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0


def assert_close(actual, expected, *, dtype=None, atol=None, rtol=None, name="value") -> float:
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` everywhere; return the max error.

    ``dtype`` picks the tolerances (default: the dtype of ``actual``); atol/rtol override them.
    """
    if actual.shape != expected.shape:
        raise AssertionError(
            f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        )
    d_atol, d_rtol = TOLERANCES[dtype or actual.dtype]
    atol, rtol = d_atol if atol is None else atol, d_rtol if rtol is None else rtol
    a, e = actual.double(), expected.double()
    err = max_abs_error(a, e)
    bad = ~((a - e).abs() <= atol + rtol * e.abs())
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {a.numel()} values differ; max abs "
            f"error {err:.3e} (atol {atol:g}, rtol {rtol:g}); first at {where}: "
            f"{float(a[where]):.6g} vs {float(e[where]):.6g}"
        )
    return err
