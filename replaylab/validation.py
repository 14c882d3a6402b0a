"""Input checks shared by the library: every failure is a ValueError that names the argument,
what it got and what was expected."""

from __future__ import annotations

import torch

__all__ = ["check_tensor", "check_same_device", "check_finite", "branch_indices", "fork_indices"]


def check_tensor(name, t, spec, dims=None, *, dtype=None, floating=False):
    """Check ``t`` against a shape spec such as ``("batch", "T", "H")`` or ``(2, 5, 3)``.

    Named sizes already in ``dims`` must match; names not yet in ``dims`` are bound there.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims = {} if dims is None else dims
    expected = (
        "("
        + ", ".join(f"{s}={dims[s]}" if isinstance(s, str) and s in dims else str(s) for s in spec)
        + ")"
    )
    if t.dim() != len(spec):
        raise ValueError(
            f"{name}: expected {len(spec)} dims with shape {expected}, got shape {tuple(t.shape)}"
        )
    for size, want in zip(t.shape, spec):
        if isinstance(want, str):
            if want in dims and dims[want] != size:
                raise ValueError(f"{name}: expected shape {expected}, got {tuple(t.shape)}")
            dims.setdefault(want, size)
        elif size != want:
            raise ValueError(f"{name}: expected shape {expected}, got {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (to match the input), got {t.dtype}")
    return dims


def check_same_device(**tensors):
    """All given (non-None) tensors live on one device."""
    devices = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"tensors must be on one device, got {listing}")


def check_finite(**tensors):
    """Raise if any given (non-None) tensor holds NaN or inf."""
    for name, t in tensors.items():
        if t is not None and not torch.isfinite(t).all():
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(
                f"{name}: {bad} of {t.numel()} values are NaN or inf; expected finite values"
            )


def branch_indices(indices, batch, device):
    """``indices`` as a 1-d long tensor of branch numbers in ``[0, batch)`` (for reorder)."""
    indices = torch.as_tensor(indices, dtype=torch.long, device=device)
    if (
        indices.dim() != 1
        or not indices.numel()
        or int(indices.min()) < 0
        or int(indices.max()) >= batch
    ):
        raise ValueError(
            f"indices: expected a non-empty 1-d list of values in [0, {batch}), "
            f"got {indices.tolist()}"
        )
    return indices


def fork_indices(n, batch, device):
    """Indices that turn each of ``batch`` branches into ``n`` consecutive ones."""
    if n < 1:
        raise ValueError(f"n: expected n >= 1, got {n}")
    return torch.arange(batch, device=device).repeat_interleave(n)
