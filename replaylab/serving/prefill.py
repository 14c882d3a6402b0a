"""A prompt through the engine's own pools, a chunk at a time (``DecodeEngine.admit``,
``serving.admission``, ``serving.prefix``): each recurrent layer's scan (its strategy's
``prefill_scan``), attention over the slot's KV rows, the MLPs as they are.

Snapshot and recompute end with the state after the prompt. Replay logs every token and keeps
its checkpoint on the decode grid (the largest multiple of L reached): a chunk that ends on the
grid takes the scan's state there, and a chunk that ends off it (with chunks a multiple of L,
only a prompt's last) folds its entries up to the grid with the fold decode uses; the entries
past it stay in the log.

Under ``prefill_kernels`` on the fused path (NemotronH and Bamba layouts, ``layouts.fused_prefill``;
Gated DeltaNet layouts prefill as above) a chunk runs the
fused decode's kernels instead (``_chunk_fused``): the residual add and the next norm in one
kernel, the gated norm and the MLP's activation in one each, and the Mamba-2 scan in one launch
(``kernels.ssd_chunked``); the strategy's scan and attention stay those above. Under
``prefill_kernels`` on either path a Mamba-2 layer's conv is one launch too (``kernels.conv``,
through the pool's ``prepare``), and each attention layer's chunk is one call of torch's
fused attention (``_fused_attend``) instead of ``kv.attend``.

Shapes: prompt (T0,) ids; a chunk's hidden (1, C, D); logits (vocab,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replaylab.kv import attend
from replaylab.recurrent import LayerState, prepared_chunk
from replaylab.serving.invariant import RowInvariantLinear
from replaylab.serving.layouts import fused_prefill
from replaylab.serving.runner import PoolCache

__all__ = ["prefill", "prefill_many"]


def prefill(engine, slot, prompt, start=0, carried=None, block=None, record=None):
    """Run ``prompt[start:]`` ((T0,) ids) through ``engine``'s pools for ``slot`` in chunks of
    ``prefill_chunk`` tokens; returns the last logits (vocab,).

    start > 0 (a prefix-cache hit): the slot already holds positions [0, start) as decode
    would have them there (KV rows, the state or checkpoint, the conv window, replay's
    ``log_len`` entries from ``head``); ``carried`` is then replay's state at ``start``
    (layer -> (1, *state_shape); default zeros, for start 0). ``block``: chunks also end at
    every multiple of it. ``record`` (a dict): filled with ``states`` {position: {layer:
    LayerState (1, ...)}} at each chunk end on a multiple of ``block`` (copies; replay: the
    checkpoint, the scan's state there) and, under replay, ``entries`` {layer: {field: (1, T0 - start,
    ...)}}: every prefilled token's ``node_fields`` (its inputs to the layer; views of the
    chunk's projections where it took one chunk: copy what is kept)."""
    e, policy = engine, engine.policy
    model, cfg = e.model, e.cfg
    T0, C = prompt.numel(), e.prefill_chunk
    if carried is None:
        carried = {l: torch.zeros_like(p.state[:1]) for l, p in e.ssm.items()}  # replay
    logged = None
    if record is not None:
        record.setdefault("states", {})
        logged = policy.prefill_logged()
    pools = PoolCache(lambda l, inputs: _advance(e, l, inputs, slot, carried, logged))
    pos = start
    while pos < T0:
        end = min(T0, pos + C)
        if block:
            end = min(end, (pos // block + 1) * block)
        if e.fused and e.prefill_kernels and fused_prefill(cfg):
            x = _chunk_fused(e, prompt[None, pos:end], [(slot, pos, end - pos, carried, logged)])
        else:
            h = model.model.embeddings(prompt[None, pos:end])
            for i, layer in enumerate(model.model.layers):
                x = layer.norm(h)
                if cfg.pattern[i] == "*":
                    h = h + _attention(e, i, x, slot, pos)
                else:  # a recurrent mixer through the pools, or an MLP (no memory)
                    h = h + layer.mixer(x, pools)
            x = model.model.norm_f(h)
        policy.prefill_chunk_done(slot, end - pos)
        pos = end
        if record is not None and block and pos % block == 0:
            record["states"][pos] = {
                l: LayerState(p.state[slot : slot + 1].clone(), p.conv[slot : slot + 1].clone())
                for l, p in e.ssm.items()
            }
    if logged is not None:
        # a lone chunk's entries are views of its projections: whoever keeps them copies them
        # (a prefix node in ``node_log``; an interleaved admission, across steps, at once)
        record["entries"] = {
            l: {
                k: torch.cat([c[k] for c in chunks], 1) if len(chunks) > 1 else chunks[0][k]
                for k in e.ssm[l].node_fields
            }
            for l, chunks in logged.items()
        }
    return model.lm_head(x[:, -1])[0]


def prefill_many(engine, slots, prompts):
    """Whole prompts ((T_i,) ids, each T_i <= ``prefill_chunk``) into ``slots`` at once (a
    fresh slot each, start 0): their tokens concatenated (1, sum T_i) for the embeddings,
    norms, matrix products and MLPs, and split per slot for each recurrent layer's conv and
    scan and each attention layer. Every product and row sum is row-invariant
    (``serving.invariant``), so a prompt's bits do not depend on the prompts beside it
    (``DecodeEngine(batched_admission=True)`` admits a lone prompt this way too). Returns
    the last logits of each prompt (P, vocab)."""
    e, model, cfg = engine, engine.model, engine.cfg
    segments = [
        (slot, 0, p.numel(), {l: torch.zeros_like(q.state[:1]) for l, q in e.ssm.items()}, None)
        for slot, p in zip(slots, prompts)
    ]
    ids = torch.cat([p.reshape(-1) for p in prompts])[None]
    with RowInvariantLinear(every_device=True, row_by_row=True):
        if e.fused and e.prefill_kernels and fused_prefill(cfg):
            x = _chunk_fused(e, ids, segments)
        else:
            pools = PoolCache(lambda l, inputs: _advance_each(e, l, inputs, segments))
            h = model.model.embeddings(ids)
            for i, layer in enumerate(model.model.layers):
                x = layer.norm(h)
                if cfg.pattern[i] == "*":
                    h = h + _attention_each(e, i, x, segments)
                else:
                    h = h + layer.mixer(x, pools)
            x = model.model.norm_f(h)
        for slot, _, T, _, _ in segments:
            e.policy.prefill_chunk_done(slot, T)
        ends = torch.tensor([T for _, _, T, _, _ in segments]).cumsum(0) - 1
        return model.lm_head(x[0, ends.to(x.device)])


def _advance_each(engine, layer, inputs, segments):
    """``_advance`` of each segment (slot, start, T, carried, logged) of the concatenated
    ``inputs`` (1, sum T, ...): the outputs concatenated again."""
    outs, at = [], 0
    for slot, _, T, carried, logged in segments:
        part = {k: v[:, at : at + T] for k, v in inputs.items()} if len(segments) > 1 else inputs
        outs.append(_advance(engine, layer, part, slot, carried, logged))
        at += T
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)


def _attention_each(engine, layer, x, segments):
    """``_attention`` of each segment (slot, start, T, ...) of the concatenated x (1, sum T,
    D), at its positions start .. start + T - 1."""
    outs, at = [], 0
    for slot, start, T, _, _ in segments:
        outs.append(_attention(engine, layer, x[:, at : at + T] if len(segments) > 1 else x,
                               slot, start))  # fmt: skip
        at += T
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)


def _chunk_fused(engine, ids, segments):
    """One chunk (1, T) ids through the fused decode's kernels -> the final norm's output (1,
    T, D): ``serving.fused.forward_fused``'s order of kernels, with the slots' pools; the
    tokens of ``segments`` (slot, start, tokens, carried, logged), one after another (a
    single prompt: one segment, at its chunk's start). The matrix products are torch's, as the reference
    prefill's, unless the caller routes them (``prefill_many``)."""
    from replaylab.kernels.decode import add_rmsnorm, gated_rmsnorm
    from replaylab.serving.fused import mlp

    e, model, c = engine, engine.model, engine.cfg
    layers = model.model.layers
    norms = [block.norm for block in layers[1:]] + [model.model.norm_f]
    h, x = add_rmsnorm(model.model.embeddings(ids), layers[0].norm.weight, layers[0].norm.eps)
    T = ids.shape[1]
    for i, block in enumerate(layers):
        kind = c.pattern[i]
        if kind == "M":
            mixer, inner = block.mixer, c.ssm_heads * c.ssm_head_dim
            zx = F.linear(x, mixer.in_proj.weight)
            gate, xBC, dt = zx.split([inner, c.conv_dim, c.ssm_heads], dim=-1)
            y = _advance_each(e, i, {"xBC": xBC, "dt": dt}, segments)
            y = gated_rmsnorm(y.reshape(T, inner).contiguous(), gate.reshape(T, inner),
                              mixer.norm.weight, c.n_groups, mixer.norm.eps)  # fmt: skip
            out = F.linear(y, mixer.out_proj.weight)[None]
        elif kind == "*":
            out = _attention_each(e, i, x, segments)
        else:
            out = mlp(e.runner, i, x, lambda w, v: F.linear(v, w))
        h, x = add_rmsnorm(h, norms[i].weight, norms[i].eps, delta=out)
    return x


def _advance(engine, layer, inputs, slot, carried, logged=None):
    """A prefill chunk through recurrent layer ``layer``'s pools (its mixer's ``inputs`` for T
    tokens of ``slot``) -> y: the conv window moves on; the strategy scans."""
    pool, one = engine.ssm[layer], slice(slot, slot + 1)
    # the inputs stay in the entries: what a prefix node keeps
    entries, pool.conv[one] = prepared_chunk(pool.spec, pool.conv[one], inputs, pool.prepare)
    return engine.policy.prefill_scan(pool, layer, slot, entries, carried, logged)


def _attention(engine, layer, h, slot, start):
    """The chunk's queries against the slot's KV rows 0 .. start + T - 1 (causal), at
    positions start .. start + T - 1: ``kv.attend``, or under ``prefill_kernels`` torch's
    fused attention (``_fused_attend``)."""
    att, pool = engine.model.model.layers[layer].mixer, engine.kv[layer]
    end = start + h.shape[1]
    fused = engine.prefill_kernels
    rotates = engine.cfg.rotary_dim  # q and k rotate at the positions: one tensor for both
    positions = start if fused and not rotates else torch.arange(start, end, device=h.device)
    q, k, v, gate = att.project(h, positions)
    pool.k[slot, :, start:end] = k[0].to(pool.k.dtype)
    pool.v[slot, :, start:end] = v[0].to(pool.v.dtype)
    one = slice(slot, slot + 1)
    keys, values = pool.k[one, :, :end], pool.v[one, :, :end]
    if fused:
        return att.finish(_fused_attend(q, keys, values), gate)
    visible = torch.arange(end, device=engine.device) <= positions[:, None]  # (T, end)
    return att.finish(attend(q, keys, values, visible), gate)


def _fused_attend(q, keys, values):
    """``kv.attend`` of q (1, heads, T, Dh) at positions rows - T .. rows - 1 over ``keys``,
    ``values`` (1, Hkv, rows, Dh): query i sees rows 0 .. rows - T + i. One call of
    ``F.scaled_dot_product_attention`` with a lower-right causal bias (flash attention on a
    GPU in 16 bits; elsewhere the mask is materialised), its scores kept in fp32 where
    ``kv.attend`` rounds them to q's dtype first. Returns (1, T, heads * Dh)."""
    from torch.nn.attention.bias import causal_lower_right

    batch, heads, T, Dh = q.shape
    mask = causal_lower_right(T, keys.shape[2])
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(batch, T, heads * Dh)
