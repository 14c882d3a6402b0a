"""The recurrent-layer interface: what a state store needs to know about one recurrent layer.

A recurrent mixer (Mamba-2 today; Mamba-1 and Gated DeltaNet next) owns a ``RecurrentSpec``.
The spec declares the layer's memory and the operations on it; the stores in
``replaylab.strategies`` keep that memory under a strategy and never read a weight themselves.

Glossary (code name -> meaning, shape):
    LayerState      what one layer carries from token to token for a batch of branches:
        ssm         the recurrent state, (batch, *state_shape), fp32 (Mamba-2: (batch, H, P, N))
        conv        the causal-conv window, the last d_conv - 1 conv inputs,
                    (batch, d_conv - 1, conv_channels), in the cache dtype
    inputs          what the mixer hands the cache for T new tokens (Mamba-2: xBC, dt)
    entries         the per-token log fields the spec derives from the inputs and the window
                    (Mamba-2: xBC, x, dt, B, C), each (batch, T, ...); a replay log keeps them
    fold(S_c, log[:j])   the state after j logged tokens from checkpoint S_c: S_{c+j}

One decode step of a layer, whatever the strategy (``StateStore.advance``):
    entries = spec.prepare(window, inputs)          conv over window + new conv inputs
    y, state = spec.scan(ssm, entries)              the recurrence (or, under replay, outputs
                                                    from checkpoint + log, no state written)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from replaylab.scan import ScanResult

__all__ = [
    "LayerState",
    "RecurrentSpec",
    "ReplayKernels",
    "window_after",
    "windows_per_token",
    "prepared_chunk",
    "nbytes",
]


class LayerState(NamedTuple):
    """One recurrent layer's memory for a batch: ``ssm (batch, *state_shape)`` and
    ``conv (batch, d_conv - 1, conv_channels)``."""

    ssm: torch.Tensor
    conv: torch.Tensor

    def index(self, rows) -> LayerState:
        """The state of branches ``rows`` (a gather: a new tensor)."""
        return LayerState(self.ssm[rows], self.conv[rows])

    def clone(self) -> LayerState:
        return LayerState(self.ssm.clone(), self.conv.clone())

    def nbytes(self) -> int:
        return nbytes(self.ssm, self.conv)


def nbytes(*tensors) -> int:
    """Bytes of the elements of ``tensors`` (not of their storages)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def window_after(window, conv_inputs, view=False):
    """The conv window after appending ``conv_inputs (batch, T, C)`` to ``window
    (batch, K, C)``: its last K rows (K = d_conv - 1; K = 0 keeps nothing). ``view``: where T
    >= K, the last K rows of ``conv_inputs`` as they are (a view where the dtypes agree), for
    a caller that copies the window into a buffer of its own."""
    keep = window.shape[1]
    if not keep:
        return window
    if view and conv_inputs.shape[1] >= keep:
        return conv_inputs[:, -keep:].to(window.dtype)
    return torch.cat([window, conv_inputs.to(window.dtype)], dim=1)[:, -keep:]


def prepared_chunk(spec, window, inputs, prepare=None):
    """A chunk's layer ``inputs`` (field -> (batch, T, ...)) with the entries ``spec.prepare``
    (or ``prepare``, e.g. a serving pool's kernel) derives from them after ``window`` (batch,
    K, C), and the window after the chunk: what a prefill chunk scans (``serving.prefill``, and
    a replay seat that rescans as it did). Where the chunk has at least K tokens the window is
    a view of its conv inputs (``window_after(view=True)``): copy it before they change (the
    callers copy it into their pool)."""
    entries = {**inputs, **(prepare or spec.prepare)(window, inputs)}
    return entries, window_after(window, entries[spec.conv_field], view=True)


def windows_per_token(window, conv_inputs):
    """The conv window after each of the T new tokens: (batch, T, K, C)."""
    keep = window.shape[1]
    full = torch.cat([window, conv_inputs.to(window.dtype)], dim=1)
    if not keep:
        batch, T, channels = conv_inputs.shape
        return window.new_zeros(batch, T, 0, channels)
    return full.unfold(1, keep, 1)[:, 1:].transpose(2, 3)


class ReplayKernels(ABC):
    """Fast replay operations for one layer family over preallocated log buffers.

    ``checkpoint``: (slots, *state_shape) fp32 checkpoint states; ``rows`` (batch,) int32: the
    slot each branch reads (forked branches share one); ``log``: field -> buffer
    (batch, capacity, ...), of which the first ``n`` entries are in use.
    """

    @staticmethod
    def fold_targets(checkpoint, rows, upto: int):
        """What a kernel fold of every branch into a fresh buffer takes: (out (batch,
        *state_shape) fp32, source slots ``rows`` and destination slots 0..batch-1 as int32,
        fold lengths (batch,) int32 all ``upto``)."""
        batch, device = rows.numel(), checkpoint.device
        i32 = dict(dtype=torch.int32, device=device)
        out = torch.empty((batch, *checkpoint.shape[1:]), device=device)
        return (
            out,
            rows.to(torch.int32),
            torch.arange(batch, **i32),
            torch.full((batch,), upto, **i32),
        )

    @abstractmethod
    def fold(self, checkpoint, rows, log, upto: int):
        """S_{c+upto} for every branch: (batch, *state_shape) fp32."""

    @abstractmethod
    def step(self, checkpoint, rows, log, n: int, entries):
        """Outputs y of the T new tokens in ``entries`` from checkpoint + log[:n], with no
        state written; appends the kernel's fields of ``entries`` to ``log`` at n (the caller
        has made room and appends the other fields), and may add fields it derives to
        ``entries`` for ``logged``. Returns y, or None where the kernel does not apply (then
        the store folds and calls ``prefill``)."""

    def prefill(self, start, entries: dict):
        """A forward the step does not take (a prefill, or a first token after a fold to an
        empty log), scanned from state ``start`` (batch, *state_shape): its outputs y and the
        log entries its tokens keep, by default the spec's scan and ``entries`` themselves."""
        return self.spec.scan(start, entries).y, entries

    def logged(self, entries: dict) -> dict:
        """The log entries kept for the tokens of a ``step``: ``entries`` itself, unless the
        kernels log something derived (Gated DeltaNet: the corrected updates u, which its
        ``step`` adds to ``entries``)."""
        return entries


class RecurrentSpec(ABC):
    """A recurrent layer's memory and the operations the stores use on it.

    Subclasses set ``family`` (a name), ``state_shape`` (per sequence), ``conv_shape``
    ``(d_conv - 1, conv_channels)``, ``log_fields`` (the entry names a replay log keeps),
    ``conv_field`` (the entry whose last d_conv - 1 rows are the conv window),
    ``input_fields`` (the inputs ``prepare`` takes, from which it derives every entry; None
    where not stated) and ``kernels`` (a ``ReplayKernels`` or None).
    """

    family: str
    state_shape: tuple[int, ...]
    conv_shape: tuple[int, int]
    log_fields: tuple[str, ...]
    conv_field: str
    input_fields: tuple[str, ...] | None = None
    kernels: ReplayKernels | None = None
    state_dtype = torch.float32

    def zero_state(self, batch, dtype, device) -> LayerState:
        """The memory before the first token: zeros, state in fp32, window in ``dtype``."""
        return LayerState(
            torch.zeros((batch, *self.state_shape), dtype=self.state_dtype, device=device),
            torch.zeros((batch, *self.conv_shape), dtype=dtype, device=device),
        )

    @abstractmethod
    def params(self):
        """The layer's processed parameters (for Mamba-2: A = -exp(A_log), D, dt_bias, dt
        limits), the one function the forward pass and every store use."""

    @abstractmethod
    def prepare(self, window, inputs: dict) -> dict:
        """Log entries (field -> (batch, T, ...)) of T new tokens from the conv ``window``
        (batch, d_conv - 1, C) and the mixer's ``inputs``."""

    @abstractmethod
    def scan(self, state, entries: dict, return_states=False) -> ScanResult:
        """The recurrence over ``entries`` from ``state`` (batch, *state_shape): outputs y,
        the final state and, if asked, every intermediate state (batch, T, *state_shape)."""

    def scan_prompt(self, state, entries: dict) -> ScanResult:
        """``scan`` of a prompt chunk (the serving engine's prefill) in the family's chunked
        form at any length where it has one: matrix products, not a token loop; it agrees with
        ``scan`` to rounding."""
        return self.scan(state, entries)

    def fold(self, state, log: dict):
        """S_{c+j} = fold(S_c, log[:j]): the state after the j logged tokens in ``log``."""
        return self.scan(state, log).state

    def outputs(self, state, log: dict, entries: dict):
        """Outputs of new tokens from checkpoint ``state`` and the ``log`` since it (reference:
        fold, then scan the new tokens)."""
        return self.scan(self.fold(state, log), entries).y
