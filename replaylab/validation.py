"""Input checks shared by the library. Every failure names the argument, what it got and what
was expected: ``TypeError`` when the kind of value is wrong (a float where an int goes, a list
where a tensor goes, a boolean mask where indices go), ``ValueError`` when the value is of the
right kind but outside what is allowed (a shape, a range, NaN)."""

from __future__ import annotations

import math
import numbers
import operator

import torch

__all__ = [
    "check_tensor",
    "check_same_device",
    "check_finite",
    "branch_indices",
    "fork_indices",
    "as_int",
    "as_real",
    "check_token_ids",
    "as_power_of_two",
]


def check_tensor(name, t, spec, dims=None, *, dtype=None, floating=False):
    """Check ``t`` against a shape spec such as ``("batch", "T", "H")`` or ``(2, 5, 3)``.

    Named sizes already in ``dims`` must match; names not yet in ``dims`` are bound there.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dims = {} if dims is None else dims
    sizes = [f"{s}={dims[s]}" if isinstance(s, str) and s in dims else str(s) for s in spec]
    expected = "(" + ", ".join(sizes) + ")"
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


def check_sizes_agree(specs):
    """``specs``: (name, tensor or None, shape spec of named sizes) triples. Every tensor has
    its spec's number of dims, and each named size is the same in every tensor that has it;
    a disagreement lists the size in each tensor, so the odd one out is named."""
    sizes = {}
    for name, t, spec in specs:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != len(spec):
            raise ValueError(
                f"{name}: expected {len(spec)} dims ({', '.join(spec)}), got shape {tuple(t.shape)}"
            )
        for size, dim in zip(t.shape, spec):
            sizes.setdefault(dim, {})[name] = size
    for dim, by_name in sizes.items():
        if len(set(by_name.values())) > 1:
            each = ", ".join(f"{n} {v}" for n, v in by_name.items())
            raise ValueError(f"{dim}: the tensors disagree on this size: {each}")
    return {dim: next(iter(v.values())) for dim, v in sizes.items()}


def as_flag(name, value, none_ok=False):
    """``value``: True or False (or None where ``none_ok``); a truthy string or int is refused."""
    if not (isinstance(value, bool) or (none_ok and value is None)):
        allowed = "None, True or False" if none_ok else "True or False"
        raise TypeError(f"{name}: expected {allowed}, got {value!r}")
    return value


def check_hybrid_model(model, name="model"):
    """``model``: a replaylab ``HybridLM`` (one built here or loaded by ``replaylab.hf``), known
    by its ``cfg`` and ``cache_spec``."""
    if not (hasattr(model, "cfg") and callable(getattr(model, "cache_spec", None))):
        raise TypeError(
            f"{name}: expected a replaylab HybridLM (replaylab.model.HybridLM or one that "
            f"replaylab.hf loaded), got {type(model).__name__}"
        )


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


def as_int(name, value, low=None, high=None) -> int:
    """``value`` as a Python int (ints, numpy ints and 0-d integer tensors; not bools, floats or
    strings) with ``low <= value <= high`` where given."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name}: expected an integer, got a boolean {value!r}")
    if isinstance(value, torch.Tensor) and value.dim():
        raise TypeError(f"{name}: expected an integer, got a tensor of shape {tuple(value.shape)}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name}: expected an integer, got {type(value).__name__} {value!r}"
        ) from None
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = (
            f"{'' if low is None else f'{low} <= '}{name}{'' if high is None else f' <= {high}'}"
        )
        raise ValueError(f"{name}: expected {bounds}, got {number}")
    return number


def as_real(name, value, low=None, high=None, *, above=None, unit="", finite=True) -> float:
    """``value`` as a Python float (ints, floats, numpy scalars, 0-d tensors; not bools, strings
    or None), not NaN, finite unless ``finite`` is False, with ``low <= value <= high`` and
    ``value > above`` where given; ``unit`` names what it counts in the message."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool:
        value = value.item()  # a 0-d tensor, as as_int takes one
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number{unit}, got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    bounds = " and ".join(
        b
        for b in (
            None if above is None else f"> {above:g}",
            None if low is None else f">= {low:g}",
            None if high is None else f"<= {high:g}",
        )
        if b
    )
    if (
        math.isnan(number)
        or (finite and math.isinf(number))
        or (above is not None and not number > above)
        or (low is not None and number < low)
        or (high is not None and number > high)
    ):
        kind = "a finite number" if finite else "a number"
        raise ValueError(
            f"{name}: expected {kind}{unit}{' ' + bounds if bounds else ''}, got {number:g}"
        )
    return number


def as_power_of_two(name, value, low=1) -> int:
    """``value`` as an int that is a power of two, at least ``low`` (a Triton block size)."""
    number = as_int(name, value)
    if number < low or number & (number - 1):
        raise ValueError(f"{name}: expected a power of two >= {low}, got {number}")
    return number


def check_token_ids(input_ids, batch, vocab_size):
    """``input_ids``: an integer tensor (batch, T) of ids in ``[0, vocab_size)``."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids: expected a torch.Tensor of token ids (batch, T), got "
            f"{type(input_ids).__name__}"
        )
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise TypeError(f"input_ids: expected an integer tensor, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[0] != batch:
        raise ValueError(
            f"input_ids: expected shape (batch={batch}, T), got {tuple(input_ids.shape)}"
        )
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(
            f"input_ids: expected ids in [0, {vocab_size}), got values from "
            f"{int(input_ids.min())} to {int(input_ids.max())}"
        )


def branch_indices(indices, batch, device):
    """``indices`` (a sequence of ints or an integer tensor) as a 1-d long tensor of branch
    numbers in ``[0, batch)`` (for reorder)."""
    if isinstance(indices, torch.Tensor):
        if indices.dtype == torch.bool:
            raise TypeError(
                "indices: expected branch numbers, got a boolean mask (use "
                "mask.nonzero().flatten() for the branches it selects)"
            )
        if indices.is_floating_point() or indices.is_complex():
            raise TypeError(f"indices: expected integers, got dtype {indices.dtype}")
    elif isinstance(indices, (list, tuple, range)):
        indices = [as_int(f"indices[{i}]", v) for i, v in enumerate(indices)]
    else:
        raise TypeError(
            f"indices: expected a list or tensor of branch numbers, got {type(indices).__name__}"
        )
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
    n = as_int("n", n, low=1)
    return torch.arange(batch, device=device).repeat_interleave(n)
