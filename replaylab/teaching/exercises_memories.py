"""Checks of notebook 01 (the two memories): the conv state's bytes of one Nemotron-H 8B
sequence, and truncating a KV cache to its first p positions.

Glossary: keys (batch, Hkv, T, Dh); p, the positions kept; d_conv, the conv window.
"""

from __future__ import annotations

import torch

from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence
from replaylab.teaching.exercises_common import _verdict, whole_number
from replaylab.teaching.grading import guarded


@guarded("conv-state bytes")
def check_conv_state_bytes(answer) -> bool:
    """Exercise: conv-state bytes of one Nemotron-H 8B sequence (bf16), over all its SSM layers."""
    if answer is None:
        return _verdict("conv-state bytes", False, "return a number of bytes")
    n = whole_number(answer)
    if n is None:
        return _verdict("conv-state bytes", False, f"{answer!r}: expected a whole number of bytes")
    want = memory_per_sequence(PUBLISHED_SHAPES["Nemotron-H 8B"], 1)["conv_state"]
    return _verdict(
        "conv-state bytes",
        n == want,
        f"{n:,} bytes"
        + ("" if n == want else " - count channels x (d_conv - 1) x 2 bytes x layers"),
    )


@guarded("KV truncate")
def check_kv_truncate(truncate) -> bool:
    """Exercise: ``truncate(keys, p)`` keeps positions [0, p) of keys (batch, Hkv, T, Dh).
    Each case hands the learner its own copy of the keys and compares with the original, so
    an answer that changes its input in place is judged by what it returns."""
    keys = torch.randn(2, 3, 9, 4)
    for p in (5, 1, 9, 0):
        got = truncate(keys.clone(), p)
        if got is None:
            return _verdict("KV truncate", False, "return the truncated keys")
        if not isinstance(got, torch.Tensor):
            return _verdict("KV truncate", False, f"return a tensor, got {type(got).__name__}")
        if got.shape != (2, 3, p, 4):
            return _verdict(
                "KV truncate",
                False,
                f"keys (2, 3, 9, 4) truncated to p={p} gave shape {tuple(got.shape)}, expected "
                f"(2, 3, {p}, 4): positions are dim 2 (batch, Hkv, T, Dh)",
            )
        if not torch.equal(got, keys[:, :, :p]):
            return _verdict(
                "KV truncate",
                False,
                f"p={p}: shape (2, 3, {p}, 4) but not the keys of positions 0..{p - 1} (keep "
                "the first p, in order)",
            )
    return _verdict(
        "KV truncate", True, "p = 5, 1, 9 and 0: the keys of positions 0..p-1, shape (2, 3, p, 4)"
    )
