"""Input checks of the serving engine, the scheduler and the engine's prefix cache, run at the
top of each public method before anything changes: a refused call leaves every pool tensor and
host number as it was. Each error names the argument, what was given and what is allowed:
``TypeError`` for the wrong kind of value (a list or a float tensor where integer ids go, a
float where an int goes), ``ValueError`` for the right kind outside what is allowed.

Ids may come in any integer dtype (int64, int32, int16, uint8, ...) and leave as int64; ints
may be Python ints, numpy integer scalars or 0-d integer tensors and leave as Python ints.

Glossary: spec, a shape such as ``(("slots", 2), "T")``: an int is a fixed size, a string a
named size of any length, a (name, int) pair a fixed size shown with its name.
"""

from __future__ import annotations

import operator

import torch

from replaylab.validation import as_int

__all__ = ["as_int", "as_token_ids", "as_ints", "as_drafts", "given", "is_int"]


def given(value, limit=60) -> str:
    """What ``value`` is, for an error message: a tensor's dtype and shape, else its type and
    (shortened) repr."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def is_int(value) -> bool:
    """An int, a numpy integer scalar or a 0-d integer tensor (not a bool)."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return False
    if isinstance(value, torch.Tensor) and value.dim():  # a 1-element tensor is a list of one
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _show(spec) -> str:
    parts = [f"{d[0]}={d[1]}" if isinstance(d, tuple) else str(d) for d in spec]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _fits(shape, spec) -> bool:
    if len(shape) != len(spec):
        return False
    fixed = [d[1] if isinstance(d, tuple) else d for d in spec]
    return all(isinstance(f, str) or f == n for f, n in zip(fixed, shape))


def _where(index, shape) -> str:
    if len(shape) == 1:
        return f"at index {index[0]}"
    if len(shape) == 2:
        return f"at row {index[0]}" + (f", column {index[1]}" if shape[1] > 1 else "")
    return f"at index {tuple(index)}"


def as_token_ids(name, value, vocab, *specs, check_range=True) -> torch.Tensor:
    """``value``: an integer tensor of token ids whose shape fits one of ``specs`` (see the
    glossary) with every id in [0, vocab) -> the same ids as int64, on the same device.
    ``check_range=False`` skips the range check (it reads the ids back from the device)."""

    def allowed():  # for the messages only: a speculation round checks every drafter's ids
        return " or ".join(_show(s) for s in specs)

    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{name}: expected an integer tensor of token ids {allowed()}, got {given(value)}"
        )
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise TypeError(
            f"{name}: expected an integer tensor of token ids {allowed()}, got dtype {value.dtype}"
        )
    if not any(_fits(tuple(value.shape), s) for s in specs):
        raise ValueError(
            f"{name}: expected token ids of shape {allowed()}, got shape {tuple(value.shape)}"
        )
    ids = value.long()
    if check_range and ids.numel():
        if ids.device.type == "cpu":  # numpy's reductions: no tensor dispatch
            host = ids.numpy()
            low, high = int(host.min()), int(host.max())
        else:
            low, high = torch.stack(ids.aminmax()).tolist()  # one read back
        if low < 0 or high >= vocab:
            at = ((ids < 0) | (ids >= vocab)).nonzero()[0].tolist()
            raise ValueError(_outside(name, int(ids[tuple(at)]), _where(at, ids.shape), vocab))
    return ids


def _outside(name, token, where, vocab) -> str:
    return f"{name}: token id {token} {where} is outside the vocabulary [0, {vocab})"


def as_ints(name, values, labels, low, high) -> list[int]:
    """One int per label (``labels``: a list of strings such as "slot 3"; ``values``: one int
    for all, or a sequence, 1-d tensor or array of one per label), each in [low, high]
    (``high``: an int, or a list of one per label)."""
    n = len(labels)
    if is_int(values):
        values = [values] * n
    elif isinstance(values, torch.Tensor) or hasattr(values, "__array__"):
        if values.ndim != 1:
            raise ValueError(
                f"{name}: expected one int or {n} values (one per slot), got {given(values)}"
            )
        values = list(values)
    elif not isinstance(values, (list, tuple, range)):
        raise TypeError(
            f"{name}: expected an int or a list of {n} ints (one per slot), got {given(values)}"
        )
    if len(values) != n:
        raise ValueError(f"{name}: expected {n} values, one per slot, got {len(values)}")
    highs = high if isinstance(high, list) else [high] * n
    return [as_int(f"{name} of {lab}", v, low, hi) for lab, v, hi in zip(labels, values, highs)]


def as_drafts(name, value, vocab, k=None) -> list[int]:
    """A drafter's proposal: ``k`` ids (any number when None) as a tensor (k,) or (1, k) of
    any integer dtype, or a list of ints, each in [0, vocab) -> a list of ints."""
    if (  # the usual proposal, a (k,) integer tensor on the host: read it once
        isinstance(value, torch.Tensor)
        and value.device.type == "cpu"
        and value.dim() == 1
        and (k is None or value.shape[0] == k)
        and not (value.dtype == torch.bool or value.is_floating_point() or value.is_complex())
    ):
        ids = value.tolist()
        if all(0 <= token < vocab for token in ids):
            return ids
    if isinstance(value, (list, tuple)) and all(is_int(v) for v in value):
        value = torch.tensor([operator.index(v) for v in value], dtype=torch.long)
    size = "k" if k is None else ("k", k)
    ids = as_token_ids(name, value, vocab, (size,), (1, size), check_range=False)
    ids = ids.reshape(-1).tolist()  # checked on the host: a drafter's few ids, every round
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise ValueError(_outside(name, token, f"at index {i}", vocab))
    return ids
