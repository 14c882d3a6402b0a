"""The fused path's forward (GPU; on CPU through Triton's interpreter, for the tests): NemotronH
and Bamba layouts (Mamba-2, plain attention with or without RoPE, relu2 or SwiGLU MLPs),
Qwen3-Next / Qwen3.5 layouts (Gated DeltaNet, gated attention with partial RoPE, SwiGLU MLPs)
and Jamba's (Mamba-1: its mixer's own math over the pools, the rest as above) through
``replaylab.kernels.decode``,
which folds each group of element-wise operations into one kernel (the residual add and the
next block's norm are one kernel, and so on). Matrix products go through ``linear``: with
``matmul="row_invariant"`` ``kernels.matmul.linear``, whose rows do not depend on the row
count, so a verify rounds as decode steps do.

Shapes: tokens (bucket, T); hidden (bucket, T, D); logits (bucket, T, vocab).
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch

__all__ = ["forward_fused", "linear"]


def forward_fused(runner, tokens):
    """Logits (bucket, T, vocab) of ``tokens`` (bucket, T) over ``runner``'s engine's pools."""
    from replaylab.kernels.decode import add_rmsnorm

    e = runner.engine
    bucket, T = tokens.shape
    layers = runner.model.model.layers
    norms = [block.norm for block in layers[1:]] + [runner.model.model.norm_f]
    h, x = add_rmsnorm(
        runner.model.model.embeddings(tokens), layers[0].norm.weight, layers[0].norm.eps
    )
    gated = runner.cfg.attention == "gated"
    for i, kind in enumerate(runner.cfg.pattern):
        if kind == "M":
            out = _mamba(runner, i, x, bucket, T)
        elif kind == "G":
            with _row_sums(e):
                out = _gdn(runner, i, x, bucket, T)
        elif kind == "S":
            with _row_sums(e):
                out = _mamba1(runner, i, x, bucket, T)
        elif kind == "*" and gated:
            with _row_sums(e):
                out = _gated_attention(runner, i, x, bucket, T)
        elif kind == "*":
            out = _attention(runner, i, x, bucket, T)
        else:
            out = mlp(runner, i, x, lambda w, v: linear(e, w, v))
        h, x = add_rmsnorm(h, norms[i].weight, norms[i].eps, delta=out)
    return linear(e, runner.model.lm_head.weight, x)


def mlp(runner, layer, x, product):
    """An MLP through the fused kernels: relu2 (NemotronH) or SwiGLU (Bamba: the gate's and
    up's products, then one kernel; their weights are not stacked into one matrix, which would
    hold a second copy of both); ``product(weight, x)`` the matrix product."""
    from replaylab.kernels.decode import relu2, swiglu

    block = runner.model.model.layers[layer].mixer
    if runner.cfg.mlp == "swiglu":
        hidden = swiglu(product(block.gate_proj.weight, x), product(block.up_proj.weight, x))
    else:
        hidden = relu2(product(block.up_proj.weight, x))
    return product(block.down_proj.weight, hidden)


def linear(engine, weight, x):
    """x @ weight.T with the engine's matrix product (see ``DecodeEngine``'s ``matmul``)."""
    if engine.matmul == "row_invariant":
        from replaylab.kernels.matmul import linear as row_invariant_linear

        return row_invariant_linear(x, weight)
    return torch.nn.functional.linear(x, weight)


def _mamba(runner, layer, h, bucket, T):
    """A Mamba-2 layer: in_proj, the conv step (windows after each token kept for a
    rollback), the strategy's state update (``EngineStrategy.mamba_fused``), the gated norm and
    out_proj."""
    from replaylab.kernels.decode import conv_step, gated_rmsnorm

    e = runner.engine
    pool, c = e.ssm[layer], runner.cfg
    mixer = pool.mixer
    H, P, N, G = c.ssm_heads, c.ssm_head_dim, c.d_state, c.n_groups
    inner = H * P
    counts = e.table.counts_d[:bucket]
    zx = linear(e, mixer.in_proj.weight, h).view(bucket * T, -1)  # gate | xBC | dt
    x, Bm, Cm, dt = conv_step(
        zx,
        pool.conv[:bucket],
        pool.conv_weight,
        pool.conv_bias,
        inner,
        inner + c.conv_dim,
        inner,
        G * N,
        H,
        T,
        drafts=pool.draft_conv if T > 1 else None,
        counts=counts,
    )
    x, Bm, Cm = x.view(bucket, T, H, P), Bm.view(bucket, T, G, N), Cm.view(bucket, T, G, N)
    y = e.policy.mamba_fused(pool, x, dt, Bm, Cm, counts, T)
    y = gated_rmsnorm(
        y.view(bucket * T, inner), zx[:, :inner], mixer.norm.weight, G, mixer.norm.eps
    )
    return linear(e, mixer.out_proj.weight, y).view(bucket, T, -1)


def _attention(runner, layer, h, bucket, T):
    """Attention over the static KV buffer with ``kernels.decode.attention``: each token reads
    only the rows up to its own slot's position; with RoPE (Bamba) q and k rotated in place at
    those positions first (``kernels.decode.rope_``)."""
    from replaylab.kernels.decode import attention, rope_

    e = runner.engine
    att, pool, c = runner.model.model.layers[layer].mixer, e.kv[layer], runner.cfg
    Hq, Hkv, Dh = c.attn_heads, c.kv_heads, c.head_dim
    qkv = linear(e, runner.qkv_weight[layer], h)
    if c.rotary_dim:
        rope_(qkv.view(bucket * T, -1), Hq + Hkv, Dh, runner.inv_freq, e.table.pos_d[:bucket], T)
    q, k, v = qkv.split([Hq * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
    runner.write_kv(pool, k.view(bucket, T, Hkv, Dh), v.view(bucket, T, Hkv, Dh), bucket, T)
    out = attention(q.reshape(bucket, T, Hq, Dh), pool.k, pool.v, e.table.pos_d[:bucket], Dh**-0.5)
    return linear(e, att.o_proj.weight, out.view(bucket, T, Hq * Dh))


def _row_sums(engine):
    """Where the teaching modules run (Gated DeltaNet's and gated attention's norms, the whole
    Mamba-1 mixer): their products and sums over the last dim row by row
    (``serving.invariant``) under the row-invariant product, so a verify rounds as single
    steps do; else as they are."""
    if engine.matmul != "row_invariant":
        return contextlib.nullcontext()
    from replaylab.serving.invariant import RowInvariantLinear

    return RowInvariantLinear(every_device=engine.device.type == "cpu")


def _gdn(runner, layer, h, bucket, T):
    """A Gated DeltaNet layer (Qwen3-Next, Qwen3.5): its four input products, the recurrence
    inputs in one launch (``_gdn_entries``), the recurrence through the engine's pools and
    strategy (``ModelRunner.advance``, as on the reference path), the per-head norm then gate
    in one kernel (``gated_rmsnorm(norm_first=True)``), out_proj."""
    from replaylab.kernels.decode import gated_rmsnorm

    e, s = runner.engine, runner.cfg.gdn
    mixer = runner.model.model.layers[layer].mixer
    inputs = {n: linear(e, getattr(mixer, f"in_proj_{n}").weight, h) for n in ("qkv", "a", "b")}
    z = linear(e, mixer.in_proj_z.weight, h).reshape(bucket * T, -1)
    o = runner.advance(layer, inputs, bucket, T, prepare=partial(_gdn_entries, mixer))
    assert o.shape == (bucket, T, s.v_heads, s.v_head_dim), o.shape  # rows of heads x V below
    o = o.to(h.dtype).reshape(bucket * T, -1).contiguous()
    normed = gated_rmsnorm(o, z, mixer.norm.weight, s.v_heads, mixer.norm.eps, norm_first=True)
    return linear(e, mixer.out_proj.weight, normed.view(bucket, T, -1))


def _mamba1(runner, layer, h, bucket, T):
    """A Mamba-1 layer (Jamba): the mixer's own math, its products row-invariant under
    ``_row_sums`` (in_proj, x_proj with the dt / B / C norms, dt_proj, out_proj), its conv and
    selective update through the engine's pools and strategy (``ModelRunner.pools``, with
    Mamba-1's step kernel under ``use_kernels``), as on the reference path."""
    return runner.model.model.layers[layer].mixer(h, runner.pools(bucket, T))


def _gdn_entries(mixer, window, inputs):
    """``GatedDeltaNetSpec.prepare``'s entries (qkv, q, k, v, g, beta) from one launch of
    ``kernels.gdn_inputs.prepare`` instead of the mixer's conv, norms and gates."""
    from replaylab.kernels.gdn_inputs import prepare

    s = mixer.settings
    weight = mixer.conv1d.weight[:, 0]  # (conv_dim, d_conv)
    fields = prepare(inputs["qkv"], window, weight, inputs["a"], inputs["b"], mixer.A_log,
                     mixer.dt_bias, s.k_heads, s.k_head_dim)  # fmt: skip
    return dict(zip(("q", "k", "v", "g", "beta"), fields), qkv=inputs["qkv"])


def _gated_attention(runner, layer, h, bucket, T):
    """Gated attention (Qwen3-Next, Qwen3.5): q (with its output gate), k and v in one product,
    the per-head q / k norms, RoPE on the first ``rotary_dim`` dims (``kernels.decode.rope_``),
    attention over the static KV buffer, then out * sigmoid(gate) and o_proj."""
    from replaylab.kernels.decode import attention, rope_

    e = runner.engine
    att, pool, c = runner.model.model.layers[layer].mixer, e.kv[layer], runner.cfg
    Hq, Hkv, Dh = c.attn_heads, c.kv_heads, c.head_dim
    qkv = linear(e, runner.qkv_weight[layer], h)
    qg, k, v = qkv.split([Hq * 2 * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
    q, gate = qg.view(bucket, T, Hq, 2 * Dh).chunk(2, dim=-1)
    q, k = att.q_norm(q), att.k_norm(k.view(bucket, T, Hkv, Dh))
    qk = torch.cat([q.reshape(bucket * T, Hq * Dh), k.reshape(bucket * T, Hkv * Dh)], -1)
    if c.rotary_dim:
        rope_(qk, Hq + Hkv, Dh, runner.inv_freq, e.table.pos_d[:bucket], T)
    q, k = qk.split([Hq * Dh, Hkv * Dh], dim=-1)
    runner.write_kv(pool, k.view(bucket, T, Hkv, Dh), v.view(bucket, T, Hkv, Dh), bucket, T)
    out = attention(q.view(bucket, T, Hq, Dh), pool.k, pool.v, e.table.pos_d[:bucket], Dh**-0.5)
    out = out.view(bucket, T, Hq * Dh) * torch.sigmoid(gate.reshape(bucket, T, Hq * Dh))
    return linear(e, att.o_proj.weight, out)
