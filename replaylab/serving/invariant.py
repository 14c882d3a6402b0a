"""Row-invariant arithmetic for the engine's reference path (Bamba, Jamba, Qwen3-Next and
Qwen3.5 off the fused path) and for the teaching modules the fused path still runs (Gated
DeltaNet's and gated attention's norms, the Mamba-1 mixer, ``serving.fused``).

Speculation is lossless only if a verify of k + 1 tokens rounds each of its rows as a decode
step of one token would. On a GPU the teaching modules' matrix products do not: cuBLAS picks
its kernel, tile and split of the reduction by the row count, so the B(k + 1) rows of a
verify and the B rows of a decode step round differently, and bf16 near-ties part the
tokens; so do torch's row reductions at some row counts (the RMSNorms,
``tools/row_invariance_probe.py``). ``RowInvariantLinear`` routes every ``F.linear`` of the
forward (each ``nn.Linear`` calls it) to ``kernels.matmul.linear``, whose reduction depends on
the weight's shape alone (its tile on the row count too), and every sum or mean over the last
dim to ``kernels.matmul.row_sum``; attention goes to ``kernels.decode.attention`` (one program
per query row).
"""

from __future__ import annotations

import os

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["RowInvariantLinear", "row_invariant_attention"]


_SUMS = {torch.sum, torch.Tensor.sum, torch.mean, torch.Tensor.mean}


def _triton_runs(x):
    """Whether Triton can launch on x: a GPU tensor, or a CPU one under the interpreter (on a
    GPU machine the interpreter is off, and a CPU engine's products and sums go row by row
    through torch instead, as invariant to the rows beside them)."""
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _last_dim_only(x, args, kwargs):
    """Whether a sum / mean call reduces x's last dim alone, with no dtype or output given."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    extra = set(kwargs) - {"dim", "keepdim"}
    return isinstance(dim, int) and dim in (-1, x.dim() - 1) and not extra and len(args) <= 3


class RowInvariantLinear(TorchFunctionMode):
    """Inside ``with RowInvariantLinear():`` each ``F.linear(x, W, b)`` runs as
    ``kernels.matmul.linear(x, W) + b``, and on a GPU each floating ``sum`` / ``mean`` over
    the last dim (the norms, the L2 normalisation of Gated DeltaNet's q and k) as
    ``kernels.matmul.row_sum``: row i of the result has the same bits whatever the number of
    rows. ``every_device=True``: the sums on CPU tensors too (through Triton's interpreter; the
    fused path's tests, where torch's CPU sums round by the row count). ``row_by_row=True``:
    on CPU each row's product is its own (1, K) product, whose bits depend neither on the row
    count nor on the row's place among the rows (the interpreter's blocks round a row by its
    place in them; ``prefill_many`` seats prompts at any offset). CPU tensors with the
    interpreter off (a CPU engine on a GPU machine) take both row by row through torch. Every
    other function runs unchanged."""

    def __init__(self, every_device=False, row_by_row=False):
        super().__init__()
        self.every_device, self.row_by_row = every_device, row_by_row

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            from replaylab.kernels.matmul import linear

            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if (self.row_by_row or not _triton_runs(x)) and not x.is_cuda and x.numel():
                rows = x.reshape(-1, x.shape[-1])
                out = torch.stack([func(row[None], weight)[0] for row in rows])
                out = out.reshape(*x.shape[:-1], weight.shape[0])
            else:
                out = linear(x, weight)
            return out if bias is None else out + bias
        if func in _SUMS and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            on_device = x.is_cuda or self.every_device
            if on_device and x.is_floating_point() and x.dim() and _last_dim_only(x, args, kwargs):
                if _triton_runs(x):
                    from replaylab.kernels.matmul import row_sum

                    out = row_sum(x)
                else:  # each row alone, fp32 accumulation as row_sum's
                    rows = x.reshape(-1, x.shape[-1])
                    out = torch.stack([row.float().sum() for row in rows]).to(x.dtype)
                    out = out.reshape(x.shape[:-1])
                if func in (torch.mean, torch.Tensor.mean):
                    out = out / x.shape[-1]
                keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
                return out.unsqueeze(-1) if keepdim else out
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
