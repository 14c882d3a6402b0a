"""Row-invariant arithmetic for the engine's reference path (the families the fused kernels do
not serve: Bamba, Jamba, Qwen3-Next, Qwen3.5).

Speculation is lossless only if a verify of k + 1 tokens rounds each of its rows as a decode
step of one token would. On a GPU the teaching modules' matrix products do not: cuBLAS picks
its kernel, tile and split of the reduction by the row count, so the B(k + 1) rows of a
verify and the B rows of a decode step round differently, and bf16 near-ties part the
tokens. ``row_invariant_linear()`` routes every ``F.linear`` of the forward (each
``nn.Linear`` calls it) to ``kernels.matmul.linear``, whose launch depends on the weight's
shape alone; attention goes to ``kernels.decode.attention`` (one program per query row).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["RowInvariantLinear", "row_invariant_attention"]


class RowInvariantLinear(TorchFunctionMode):
    """Inside ``with RowInvariantLinear():`` each ``F.linear(x, W, b)`` runs as
    ``kernels.matmul.linear(x, W) + b``: row i of the result has the same bits whatever the
    number of rows. Every other function runs unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            from replaylab.kernels.matmul import linear

            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            out = linear(x, weight)
            return out if bias is None else out + bias
        return func(*args, **kwargs)


def row_invariant_attention(q, k_pool, v_pool, positions):
    """Causal attention of T new tokens per slot over the slots' KV rows, one program per
    (slot, head, token): q (bucket, heads, T, Dh), k_pool / v_pool (slots, Hkv, rows, Dh)
    holding rows 0 .. positions[s] + T - 1 of slots 0 .. bucket-1, positions (bucket,) int64
    (the position of each slot's token 0); scaled by Dh^-1/2 as ``kv.attend``. Returns
    (bucket, T, heads * Dh)."""
    from replaylab.kernels.decode import attention

    bucket, heads, T, Dh = q.shape
    q_rows = q.transpose(1, 2).contiguous()  # (bucket, T, heads, Dh)
    out = attention(q_rows, k_pool, v_pool, positions.contiguous(), Dh**-0.5)
    return out.reshape(bucket, T, heads * Dh)
