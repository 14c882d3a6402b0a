"""The model over the engine's pools: one step of T tokens for slots 0 .. bucket-1, through the
reference path (the teaching modules, each recurrent mixer meeting an adapter in place of a
cache) or the fused path (``serving.fused``), optionally captured in a CUDA graph per
(bucket, T, folds, save); a rollback's copies in one graph per bucket (``graph_rollback``).

A step reads the per-slot numbers the slot table uploaded (``SlotTable.upload``) and no host
value (but replay without kernels, which groups slots by log length on the host), so on a GPU
it is one graph replay; it places the step's token rows at their slots itself (``place``), so
outside the graph there is one copy of the tokens in. ``matmul="row_invariant"`` routes every ``nn.Linear`` and attention
through kernels whose rows do not depend on the row count (``serving.invariant``).

Glossary: bucket the captured batch size, T tokens per step, vocab the vocabulary size.
"""

from __future__ import annotations

import contextlib
import gc

import torch

from replaylab.kv import attend
from replaylab.model import rope_frequencies
from replaylab.recurrent import windows_per_token
from replaylab.serving.invariant import RowInvariantLinear, row_invariant_attention

__all__ = ["ModelRunner", "PoolCache", "capture", "padded_pairs"]


@contextlib.contextmanager
def capture(graph, collect=True):
    """``torch.cuda.graph(graph)`` with Python's cyclic garbage collector kept out of the
    capture. A dead cycle that holds an earlier ``CUDAGraph`` (an engine no longer used) would
    otherwise be collected whenever an allocation inside the capture crosses the collector's
    threshold; the graph's destructor then calls the driver, which a capture forbids, and the
    capture is invalidated. torch collects before a capture only under
    ``torch.compiler.config.force_cudagraph_gc``. ``collect=False`` skips the collection (a
    caller that captures many graphs and collects once before them)."""
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph):
            yield graph
    finally:
        if enabled:
            gc.enable()


class ModelRunner:
    """Runs ``engine``'s model over its pools (``engine.ssm``, ``engine.kv``) under its strategy
    (``engine.policy``) and slot table (``engine.table``)."""

    def __init__(self, engine):
        self.engine = engine
        self.model, self.cfg = engine.model, engine.cfg
        self.captured = {}  # (bucket, T, folds, save) -> (graph, tokens in, logits, placed)
        self.rollbacks = {}  # bucket -> (graph, (2, bucket) slots and kept tokens in)
        self.placed = None  # the last step's tokens at their slots (bucket, T)
        layers = self.model.model.layers
        self.qkv_weight = {  # fused: one matrix product for q, k and v
            l: torch.cat([getattr(layers[l].mixer, f"{n}_proj").weight for n in "qkv"]).detach()
            for l in (self.cfg.attn_layers if engine.fused else ())
        }
        rope = engine.fused and self.cfg.rotary_dim and self.cfg.attn_layers
        self.inv_freq = (  # the fused RoPE's: the attention modules' frequencies
            rope_frequencies(self.cfg, engine.device) if rope else None
        )

    def run(self, tokens, bucket, folds, save):
        """Logits (bucket, T, vocab) of ``tokens`` (S, T): slot s takes row ``src_row_d[s]``
        (uploaded), a slot the step leaves out zeros (count 0)."""
        if self.engine.graphs:
            return self.graph_step(tokens, bucket, folds, save)
        rows = torch.zeros(self.engine.table.size + 1, tokens.shape[1], dtype=tokens.dtype,
                           device=tokens.device)  # fmt: skip
        rows[: tokens.shape[0]] = tokens
        return self.forward(rows, bucket, folds, save)

    def place(self, rows, bucket):
        """(bucket, T) tokens at their slots from ``rows`` (slots + 1, T), the step's tokens
        then zeros: slot s takes row ``src_row_d[s]``."""
        return rows.index_select(0, self.engine.table.src_row_d[:bucket])

    # --- the reference path -------------------------------------------------------------
    def forward(self, rows, bucket, folds, save):
        """One step over slots 0 .. bucket-1 of the step's token ``rows`` (``place``); reads
        the uploaded per-slot numbers; returns logits (bucket, T, vocab)."""
        e = self.engine
        tokens = self.placed = self.place(rows, bucket)
        T = tokens.shape[1]
        if folds:
            e.policy.fold(bucket)
        e.policy.before_forward(bucket, T, save)
        if e.fused:
            from replaylab.serving.fused import forward_fused

            return forward_fused(self, tokens)
        if e.matmul == "row_invariant":  # every nn.Linear row-invariant (``invariant``)
            with RowInvariantLinear():
                return self.forward_reference(tokens, bucket, T)
        return self.forward_reference(tokens, bucket, T)

    def forward_reference(self, tokens, bucket, T):
        """The reference path's forward: the teaching modules over the pools."""
        pools = self.pools(bucket, T)
        h = self.model.model.embeddings(tokens)
        for i, block in enumerate(self.model.model.layers):
            x = block.norm(h)
            if self.cfg.pattern[i] == "*":
                h = h + self.attention(i, x, bucket, T)
            else:  # a recurrent mixer through the pools, or an MLP (no memory)
                h = h + block.mixer(x, pools)
        return self.model.lm_head(self.model.model.norm_f(h))

    def pools(self, bucket, T):
        """The cache a teaching mixer's ``forward(h, cache)`` takes: its layer advances
        through the engine's pools (``advance``) for slots 0 .. bucket-1, T tokens each."""
        return PoolCache(lambda layer, inputs: self.advance(layer, inputs, bucket, T))

    def advance(self, layer, inputs, bucket, T, prepare=None):
        """Recurrent layer ``layer`` for slots 0 .. bucket-1: its mixer's ``inputs`` for T tokens
        per slot -> y. The strategy advances the state (``EngineStrategy.advance``); every
        strategy keeps the window after each token (a rollback picks one). ``prepare(window,
        inputs) -> entries`` stands in for the spec's own (the fused path's kernel)."""
        e = self.engine
        pool = e.ssm[layer]
        spec, window = pool.spec, pool.conv[:bucket]
        entries = (prepare or spec.prepare)(window, inputs)
        counts = e.table.counts_d[:bucket].long()
        rows = torch.arange(bucket, device=e.device)
        y = e.policy.advance(pool, entries, bucket, T)
        if window.shape[1]:
            windows = windows_per_token(window, entries[spec.conv_field])  # (bucket, T, K, C)
            if T > 1:
                pool.draft_conv[:bucket, :T].copy_(windows)
            windows = torch.cat([window[:, None], windows], 1)
            pool.conv[:bucket] = windows[rows, counts]
        return y

    def write_kv(self, pool, k, v, bucket, T):
        """k, v (bucket, T, Hkv, Dh) into each slot's rows position .. position + T - 1."""
        table = self.engine.table
        at = table.pos_d[:bucket, None] + table.steps_d[:T]  # (bucket, T)
        rows = torch.arange(bucket, device=self.engine.device)[:, None]
        pool.k[rows, :, at] = k.to(pool.k.dtype)
        pool.v[rows, :, at] = v.to(pool.v.dtype)
        return at

    def attention(self, layer, h, bucket, T):
        """The attention module's own math (``project``, ``kv.attend``, ``finish``) at each
        slot's positions, over the rows up to each token's own."""
        e, table = self.engine, self.engine.table
        att, pool = self.model.model.layers[layer].mixer, e.kv[layer]
        positions = table.pos_d[:bucket, None] + table.steps_d[:T]  # (bucket, T)
        q, k, v, gate = att.project(h, positions)
        self.write_kv(pool, k.transpose(1, 2), v.transpose(1, 2), bucket, T)
        if e.matmul == "row_invariant":  # one program per query row
            out = row_invariant_attention(q, pool.k, pool.v, table.pos_d[:bucket])
        else:
            visible = torch.arange(pool.k.shape[2], device=e.device) <= positions[:, :, None]
            out = attend(q, pool.k[:bucket], pool.v[:bucket], visible[:, None])
        return att.finish(out, gate)

    # --- CUDA graphs ---------------------------------------------------------------------
    def graph_step(self, tokens, bucket, folds, save):
        S, T = tokens.shape
        key = (bucket, T, folds, self.engine.policy.saves(save, T))
        if key not in self.captured:
            static = torch.zeros(self.engine.table.size + 1, T, dtype=tokens.dtype,
                                 device=tokens.device)  # fmt: skip
            static[:S].copy_(tokens)  # the last row stays zero (``place``)
            saved = self._save_for_capture(bucket)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())  # after the copies above
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton compiles, allocator settles
                    self.forward(static, bucket, folds, save)
                    self._restore_after_capture(saved, bucket)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with capture(graph):
                out = self.forward(static, bucket, folds, save)
            self._restore_after_capture(saved, bucket)
            self.captured[key] = (graph, static, out, self.placed)
            self.engine.stats.graph_captures += 1
        graph, static, out, self.placed = self.captured[key]
        static[:S].copy_(tokens)
        graph.replay()
        self.engine.stats.graph_replays += 1
        return out

    def graph_rollback(self, pair, bucket):
        """The strategy's rollback of slots ``pair[0]`` to after their token ``pair[1]`` ((2,
        n) int64 on the host, n <= bucket distinct slots below ``bucket``) as one graph launch,
        captured per bucket: the pairs are padded to the bucket with copies of the first (a
        slot written twice takes the same rows twice)."""
        if bucket not in self.rollbacks:
            static = torch.zeros(2, bucket, dtype=torch.long, device=self.engine.device)
            graph = torch.cuda.CUDAGraph()
            with capture(graph):  # index copies only: nothing to compile or warm up
                self.engine.policy.rollback(static[0], static[1])
            self.rollbacks[bucket] = (graph, static)
            self.engine.stats.graph_captures += 1
        graph, static = self.rollbacks[bucket]
        static.copy_(padded_pairs(pair, bucket))
        graph.replay()

    def _save_for_capture(self, bucket):
        """The warm-up runs the step for real (capture records without running): keep what it
        overwrites in place (states, windows and, under replay, the log rings: a step's
        appends can land on the ring rows its fold reads, so a second warm-up or the real step
        after them would fold the wrong entries); draft and KV rows past each slot's position
        are rewritten by the real step before anything reads them."""
        return {
            l: (p.state[:bucket].clone(), p.conv[:bucket].clone())
            + tuple(v[:bucket].clone() for v in p.log.values())
            for l, p in self.engine.ssm.items()
        }

    def _restore_after_capture(self, saved, bucket):
        for l, (state, conv, *log) in saved.items():
            pool = self.engine.ssm[l]
            pool.state[:bucket].copy_(state)
            pool.conv[:bucket].copy_(conv)
            for buf, kept in zip(pool.log.values(), log):
                buf[:bucket].copy_(kept)


def padded_pairs(pair, bucket):
    """(2, bucket): ``pair`` ((2, n), 1 <= n <= bucket) and then copies of its first column;
    a rollback that copies from buffers it does not write gives the same pools either way."""
    padded = pair[:, :1].expand(2, bucket).clone()
    padded[:, : pair.shape[1]] = pair
    return padded


class PoolCache:
    """What a recurrent mixer meets on the engine's reference path, in place of a cache:
    ``layer(l).advance(**inputs)`` runs ``advance(l, inputs)``, the engine's pool work for
    the running step or prefill chunk. An MLP ignores it."""

    def __init__(self, advance):
        self._advance = advance

    def layer(self, index):
        return _PoolLayer(self._advance, index)


class _PoolLayer:
    __slots__ = ("_advance", "index")

    def __init__(self, advance, index):
        self._advance, self.index = advance, index

    def advance(self, **inputs):
        return self._advance(self.index, inputs)
