"""The serving engine: preallocated pools indexed by slot, every slot at its own position,
steps of a per-slot number of tokens, per-slot rollback, sequences admitted and retired
between steps, under snapshot, recompute or replay, with steps captured in CUDA graphs.

The teaching ``HybridCache`` grows dictionaries, gathers KV segments and runs the model through
Python on every token; that is what the notebooks read. ``DecodeEngine`` runs the same model
(``HybridLM``) over the fixed buffers of ``serving.pools``, so a step is one graph replay on a
GPU. What each slot holds, on the host and as device tensors the graphs read:

    position   tokens held (KV rows in use); the next token's position
    log_len    replay: entries in the log since the checkpoint
    head       replay: where the log's ring starts
    last       tokens of the last step that a rollback may drop

A step takes (S, T) tokens for S slots and a count per slot (1 <= count <= T): a slot's tokens
past its count are padding, computed and thrown away (a ragged batch padded to the captured T;
slots not in the step get count 0 and are left as they were). Strategies:

- "snapshot": the state is read and written every token; a verify keeps a copy of the state
  after each token (the per-draft-snapshot path), and a rollback copies one back.
- "recompute": the state is read and written every token; a verify keeps one copy of the state
  before it, and a rollback copies it back and re-runs the kept tokens through the model.
- "replay": outputs come from checkpoint + log (``replay_step``: no state write); a rollback is
  a cursor move. Folds sit on a fixed grid: the checkpoint is always at a multiple of L. A
  slot whose log holds L entries at the start of a step folds them into the checkpoint, and a
  step never crosses the grid: a slot may take at most ``room(slot)`` tokens in one step (the
  tokens left before its next fold), so a speculating slot near the grid verifies fewer
  drafts that round. The token at position p is then always computed from the checkpoint at
  L * floor(p / L) and the entries after it, however the tokens were grouped into steps; with
  every fused kernel computing a row of a verify as a single-token step would, that is what
  lets speculative decoding reproduce the engine's own greedy decoding bit for bit. (Folding
  in the middle of a verify cannot do it without a second checkpoint per slot: a rollback to
  before the fold would need the old one back.)

What is served where:

- The reference path (``fused=False``; the default on CPU, where ``graphs=False``) serves every
  family the teaching cache does: Mamba-2 ("M": NemotronH, Bamba), Mamba-1 ("S": Jamba) and
  Gated DeltaNet ("G": Qwen3-Next, Qwen3.5) layers, plain or gated attention with or without
  RoPE, relu2 or SwiGLU MLPs. It runs the teaching modules themselves: each recurrent mixer
  meets, in place of a cache, an adapter whose ``layer(l).advance(**inputs)`` does the pool
  work through the layer's ``RecurrentSpec`` (``prepare`` over each slot's window, the
  token-loop ``scan`` under snapshot / recompute); attention runs its module's ``project`` and
  ``finish`` around ``kv.attend`` at each slot's own positions. Under replay with
  ``use_kernels`` (the default on a GPU) each recurrent layer's outputs come from its pool's
  Triton kernels, one call per layer and step for the whole bucket (``kernels.gdn``,
  ``kernels.mamba1``, ``kernels.replay``: a verify row computed as a single step at its
  position would be, ring logs, per-slot counts), and its folds on the grid from their
  ``fold``; without kernels, from the spec (``outputs`` for the slots of each log length
  together, ``fold``). With the kernels, and under snapshot and recompute, a step reads no
  host value (the per-slot numbers are uploaded before it), so on a GPU each (bucket, T) step
  is a CUDA graph replay here too (``data/graph_probe.json``: tokens and logits equal the
  un-graphed engine's for every family and strategy); replay without kernels groups the slots
  by log length on the host and runs un-graphed. On a GPU it runs row-invariant by
  default (``serving.invariant``: matrix products, last-dim sums and attention through
  kernels whose rows do not depend on the row count), so speculation is lossless there too
  (on the H200 in ``data/bench_engine_families.json`` for every family and strategy; the
  Mamba-1 kernels launch without FMA contraction, else their verify rows parted from single
  steps: ``data/row_invariance_probe_jamba.json``).
- The fused path (``fused=True``, ``graphs``; the default on a GPU for NemotronH layouts:
  Mamba-2, plain attention without RoPE, relu2 MLPs) runs the kernels below. For any other
  layout the defaults on a GPU are the reference path, and ``fused=True`` raises naming what
  the kernels lack (``fused_reason``).

On a GPU the fused path runs ``replaylab.kernels.decode``, which folds each group of
element-wise operations into one kernel, and its matrix products go through
``kernels.matmul.linear`` (``matmul="row_invariant"``), whose rows do not depend on the row
count: cuBLAS's bf16 rows do at batch 64 and 128 on an H200, and a verify through it parts
from decode at the first near-tie. On the H200 (``data/bench_serve.json``) speculative tokens
equal greedy ones bit for bit in 72 of 72 configurations (1b and 8b-layers, every strategy,
batch 1 / 8 / 64, k 1 and 4, acceptance 0.5 and 1.0); the row-invariant product costs 16-19%
of decode throughput there (``data/bench_serve_ragged.json``).

Glossary: S slots in a step, T tokens per step (1 decode, k + 1 verify), L log length, bucket:
the captured batch size (slots 0 .. bucket-1 run; a graph per (bucket, T)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from replaylab.kv import attend
from replaylab.recurrent import LayerState, window_after, windows_per_token
from replaylab.results import measured_log_length
from replaylab.serving.invariant import RowInvariantLinear, row_invariant_attention
from replaylab.serving.pools import KVPool, recurrent_pool
from replaylab.serving.validate import as_drafts, as_int, as_ints, as_token_ids, given

__all__ = ["DecodeEngine", "EngineStats", "STRATEGIES", "unsupported_reason", "fused_reason"]

STRATEGIES = ("snapshot", "recompute", "replay")


@dataclass
class EngineStats:
    steps: int = 0
    verify_steps: int = 0
    folds: int = 0  # slot folds (one slot's L entries into its checkpoint)
    folded_tokens: int = 0
    rollbacks: int = 0  # slots rolled back
    reruns: int = 0  # recompute: forwards that re-ran kept tokens
    rerun_tokens: int = 0
    graph_replays: int = 0
    admitted: int = 0
    retired: int = 0


LAYER_KINDS = {"M": "Mamba-2", "S": "Mamba-1", "G": "Gated DeltaNet", "*": "attention", "-": "MLP"}


def unsupported_reason(cfg):
    """Why the engine cannot serve a model of config ``cfg`` (None: it can). The reference
    path serves every layer kind of ``LAYER_KINDS``, plain or gated attention with or without
    RoPE, relu2 or SwiGLU MLPs."""
    unknown = sorted(set(cfg.pattern) - set(LAYER_KINDS))
    if unknown:
        return (
            f"pattern: layer kinds {unknown} in {cfg.pattern!r} (the engine serves {LAYER_KINDS})"
        )
    if cfg.attention not in ("plain", "gated"):
        return f"attention: {cfg.attention!r} (the engine serves 'plain' and 'gated')"
    if cfg.mlp not in ("relu2", "swiglu"):
        return f"mlp: {cfg.mlp!r} (the engine serves 'relu2' and 'swiglu')"
    return None


def fused_reason(cfg):
    """What the fused path (GPU kernels, CUDA graphs) lacks for a model of config ``cfg``
    (None: nothing; it serves NemotronH layouts: Mamba-2, plain attention without RoPE,
    relu2 MLPs)."""
    missing = [f"{LAYER_KINDS[k]} layers ({k!r})" for k in sorted(set(cfg.pattern) - set("M*-"))]
    if cfg.attention != "plain":
        missing.append(f"{cfg.attention} attention (attention={cfg.attention!r})")
    if cfg.rotary_dim:
        missing.append(f"RoPE (rotary_dim={cfg.rotary_dim})")
    if cfg.mlp != "relu2":
        missing.append(f"{cfg.mlp} MLPs (mlp={cfg.mlp!r})")
    return ", ".join(missing) or None


class DecodeEngine:
    """Decode and verify for up to ``max_batch`` sequences of at most ``max_len`` tokens each.

    model: a ``HybridLM`` (any layout; the fused path: NemotronH layouts). strategy:
    "snapshot", "recompute" or "replay". log_length: replay's L (>= max_verify), or "auto":
    the L of lowest measured amortised decode cost at this batch
    (``results.measured_log_length``). max_verify: the most tokens one step may take
    (k + 1). use_kernels: replay's steps and folds through each family's Triton kernels, for
    the whole bucket at once (default: on a GPU; on CPU they run through Triton's
    interpreter; the pools' logs then keep what the kernels read, so Mamba-1 and Gated
    DeltaNet layers cannot seat a prefix cache). graphs: capture each (bucket, T) step in a CUDA
    graph (default: on a GPU, but for replay without kernels, which reads host values).
    fused: the fused decode kernels (default: on a GPU, for NemotronH layouts; on CPU they
    run through Triton's interpreter, for the tests). matmul: "row_invariant" (default on a GPU; ``kernels.matmul.linear``:
    a row's bits do not depend on the row count, so a verify rounds as decode steps do at
    every batch; on the reference path every ``nn.Linear`` goes there and attention to
    ``kernels.decode.attention``, see ``serving.invariant``) or "torch" (default on CPU;
    cuBLAS on a GPU: faster at some shapes, but its rows change with the row count, and a
    verify through it parts from greedy decoding at near-ties). prefill_chunk: the tokens of a prompt run through
    the model at once in ``admit`` (the spec's scan, chunked for long chunks).
    batch_invariant: the Mamba-2 replay kernels launch alike at every batch (default), so a
    slot's bits do not depend on which other slots share its steps; False: the launch tuned
    per batch (``kernels.replay.LAUNCH``), faster by up to 12% per replay step at batch 1-8.
    (The Gated DeltaNet and Mamba-1 kernels launch alike at every batch already:
    ``kernels.gdn.LAUNCH`` has one entry per kernel, ``kernels.mamba1`` one ``BLOCK_D``.)

    >>> engine = DecodeEngine(model, max_batch=4, max_len=256)       # doctest: +SKIP
    >>> slot, logits = engine.admit(prompt)    # (T0,) -> a slot and its last logits (vocab,)
    >>> logits = engine.step(tokens, counts)   # (S, T), (S,) -> (S, T, vocab)
    >>> engine.rollback(keep)                  # keep the first keep[i] tokens of the last step
    >>> engine.retire(slot)

    A prefix cache over the slots (``serving.prefix.EnginePrefixCache``, reference path) admits
    in place of ``admit``, seating a slot with a held prefix and prefilling from there.
    """

    def __init__(
        self,
        model,
        max_batch,
        max_len,
        strategy="replay",
        log_length=16,
        max_verify=5,
        use_kernels=None,
        graphs=None,
        fused=None,
        matmul=None,
        prefill_chunk=256,
        batch_invariant=True,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        cfg = model.cfg
        reason = unsupported_reason(cfg)
        if reason:
            raise ValueError(f"DecodeEngine: {reason}; use the teaching HybridCache")
        lacks = fused_reason(cfg)
        self.max_batch = as_int("max_batch", max_batch, low=1)
        self.max_len = as_int("max_len", max_len, low=2)
        if log_length == "auto":
            log_length = measured_log_length(self.max_batch)
        self.L = as_int("log_length", log_length, low=1)
        self.max_verify = as_int("max_verify", max_verify, low=1)
        self.prefill_chunk = as_int("prefill_chunk", prefill_chunk, low=1)
        self.batch_invariant = bool(batch_invariant)
        param = next(model.parameters())
        self.model, self.cfg, self.strategy = model, cfg, strategy
        self.dtype, self.device = param.dtype, param.device
        cuda = self.device.type == "cuda"
        self.use_kernels = cuda if use_kernels is None else use_kernels
        graphable = self.use_kernels or strategy != "replay"  # else host reads every step
        self.graphs = (cuda and graphable) if graphs is None else graphs
        self.fused = (cuda and self.use_kernels and not lacks) if fused is None else fused
        if self.fused and lacks:
            raise ValueError(
                f"fused: the fused kernels serve NemotronH layouts and lack {lacks}; "
                f"use fused=False (the reference path serves this model)"
            )
        if self.graphs and not cuda:
            raise ValueError("graphs: CUDA graphs need a CUDA device")
        if self.graphs and strategy == "replay" and not self.use_kernels:
            raise ValueError(
                "graphs: replay without kernels reads each slot's log length on the host "
                "every step, which a CUDA graph cannot; use use_kernels=True or graphs=False"
            )
        if self.fused and not self.use_kernels:
            raise ValueError("fused: the fused path runs the replay kernels; use_kernels=True")
        if matmul is None:
            matmul = "row_invariant" if self.fused or (cuda and self.use_kernels) else "torch"
        self.matmul = matmul
        if self.matmul not in ("torch", "row_invariant"):
            raise ValueError(f"matmul: expected 'torch' or 'row_invariant', got {self.matmul!r}")
        slots, Tm = self.max_batch, self.max_verify
        self.capacity = self.L  # log ring rows: a step never takes a slot past L entries
        layers = model.model.layers
        self.ssm = {  # one pool per recurrent layer, from its spec
            l: recurrent_pool(
                layers[l].mixer,
                slots,
                strategy,
                self.capacity,
                Tm,
                self.dtype,
                self.device,
                self.fused,
                self.use_kernels,
            )
            for l in cfg.recurrent_layers
        }
        for pool in self.ssm.values() if self.batch_invariant else ():
            pool.launch = pool.batch_invariant_launch()
        self._qkv_weight = {  # fused: one matrix product for q, k and v
            l: torch.cat([getattr(layers[l].mixer, f"{n}_proj").weight for n in "qkv"]).detach()
            for l in (cfg.attn_layers if self.fused else ())
        }
        self.kv = {
            l: KVPool(cfg, slots, max_len + Tm, self.dtype, self.device) for l in cfg.attn_layers
        }
        # the host's view of every slot
        self.live = [False] * slots
        self.prefilling = set()  # slots claimed by an unfinished ``begin_admit``
        self.pos, self.log_len, self.head, self.last = ([0] * slots for _ in range(4))
        # what the kernels read, uploaded before each step: log_len (after this step's folds),
        # head (after them), head_pre (before them), fold_len, counts; and positions
        dev = dict(device=self.device)
        self._meta = torch.zeros(5, slots, dtype=torch.int32, **dev)
        self._log_len, self._head, self._head_pre, self._fold_len, self._counts = self._meta
        self._pos = torch.zeros(slots, dtype=torch.long, **dev)
        self._rows = torch.arange(slots, dtype=torch.int32, **dev)
        self._steps = torch.arange(Tm, **dev)
        self._last_tokens = torch.zeros(slots, Tm, dtype=torch.long, **dev)  # recompute
        self._plan = None  # the host's fold plan of the running step (reference path)
        self._graphs = {}  # (bucket, T, folds, save) -> (graph, static tokens, static logits)
        self.buckets = sorted({min(2**i, slots) for i in range(slots.bit_length() + 1)})
        self.stats = EngineStats()

    # --- slots ---------------------------------------------------------------------------
    @property
    def slots(self):
        """The live slots, in order."""
        return [s for s, on in enumerate(self.live) if on]

    @property
    def batch(self):
        return sum(self.live)

    @property
    def position(self):
        """The position every live slot is at (lock-step use); an error if they differ."""
        at = {self.pos[s] for s in self.slots}
        if len(at) != 1:
            raise ValueError(f"position: the live slots are at positions {sorted(at)}")
        return at.pop()

    def room(self, slot):
        """The most tokens ``slot`` may take in its next step: max_verify, and under replay no
        more than are left before its next fold (a step never crosses the fold grid)."""
        return self._room(as_int("slot", slot, 0, self.max_batch - 1))

    def _room(self, slot):
        if self.strategy != "replay":
            return self.max_verify
        held = self.log_len[slot] if self.log_len[slot] < self.L else 0  # L: folded first
        return min(self.max_verify, self.L - held)

    def nbytes_per_slot(self):
        """Bytes one slot holds in the pools (state, windows, logs or copies, KV)."""
        return sum(p.nbytes_per_slot() for p in (*self.ssm.values(), *self.kv.values()))

    @torch.no_grad()
    def admit(self, prompt):
        """Prefill ``prompt`` (T0,) or (1, T0) into the lowest free slot; returns (slot, the
        last logits (vocab,)). Raises if every slot is in use or T0 >= max_len."""
        prompt = self._check_prompt(prompt)
        slot = self._claim()
        logits = self._prefill(slot, prompt.to(self.device))
        self._go_live(slot, prompt.numel())
        return slot, logits

    def begin_admit(self, prompt):
        """Claim the lowest free slot for ``prompt`` (T0,) or (1, T0) and return an
        ``Admission`` that prefills it a chunk at a time (``advance(n)``), so other slots can
        step between chunks; the slot goes live, as ``admit`` leaves it, after the last chunk
        (``serving.admission``)."""
        from replaylab.serving.admission import Admission

        prompt = self._check_prompt(prompt)
        slot = self._claim()
        self.prefilling.add(slot)
        self.pos[slot] = self.max_len  # parked while it prefills (serving.admission)
        return Admission(self, slot, prompt.to(self.device))

    def _check_prompt(self, prompt):
        """``prompt`` (T0,) or (1, T0) ids of any integer dtype -> (T0,) int64, checked."""
        prompt = as_token_ids("prompt", prompt, self.cfg.vocab_size, ("T0",), (1, "T0"))
        prompt = prompt.reshape(-1)
        T0 = prompt.numel()
        if not 1 <= T0 < self.max_len:
            raise ValueError(f"prompt: length {T0}: expected 1 <= length < max_len={self.max_len}")
        return prompt

    def free_slot(self):
        """The slot the next ``admit`` takes (the lowest free one); raises if every slot is in
        use."""
        free = [s for s, on in enumerate(self.live) if not on and s not in self.prefilling]
        if not free:
            raise ValueError(
                f"admit: all max_batch={self.max_batch} slots are in use ({self.batch} live, "
                f"{len(self.prefilling)} prefilling); retire one first"
            )
        return free[0]

    @property
    def n_free(self) -> int:
        """Slots an admission may claim: neither live nor prefilling."""
        return self.max_batch - self.batch - len(self.prefilling)

    def _claim(self):
        """The lowest free slot, its pools cleared and its host values at zero (not yet live)."""
        slot = self.free_slot()
        for pool in (*self.ssm.values(), *self.kv.values()):
            pool.clear(slot)
        self.pos[slot] = self.log_len[slot] = self.head[slot] = self.last[slot] = 0
        return slot

    def _go_live(self, slot, T0):
        """``slot``, prefilled to T0 tokens, starts decoding."""
        self.live[slot], self.pos[slot], self.last[slot] = True, T0, 0
        self.stats.admitted += 1

    def retire(self, slot):
        """Free ``slot``; its memory is cleared when the next sequence is admitted there."""
        slot = as_int("slot", slot, 0, self.max_batch - 1)
        if not self.live[slot]:
            raise ValueError(f"slot: {slot} is not live (live slots: {self.slots})")
        self.live[slot] = False
        self.pos[slot] = self.log_len[slot] = self.head[slot] = self.last[slot] = 0
        self.stats.retired += 1

    def _prefill(self, slot, prompt, start=0, carried=None, block=None, record=None):
        """Run ``prompt[start:]`` ((T0,) ids) through the engine's own pools in chunks of
        ``prefill_chunk`` tokens (each recurrent layer's scan, chunked for long chunks;
        attention over the slot's KV rows); returns the last logits (vocab,). Snapshot and
        recompute end with the state after the prompt. Replay logs every token and folds its
        log L entries at a time with the fold decode uses, so the checkpoint lands on the
        decode grid (the largest multiple of L) with the same bits a decode of those tokens
        would fold to; the state the chunks carry is thrown away.

        start > 0 (a prefix-cache hit): the slot already holds positions [0, start) as decode
        would have them there (KV rows, the state or checkpoint, the conv window, replay's
        ``log_len`` entries from ``head``); ``carried`` is then replay's state at ``start``
        (layer -> (1, *state_shape); default zeros, for start 0). ``block``: chunks also end
        at every multiple of it. ``record`` (a dict): filled with ``states`` {position:
        {layer: LayerState (1, ...)}} at each chunk end on a multiple of ``block`` (copies;
        replay: the checkpoint, folded there) and, under replay, ``entries`` {layer: {field:
        (1, T0 - start, ...)}}: every prefilled token's log entries (the spec's fields only:
        ``EnginePrefixCache`` refuses a Mamba-1 or Gated DeltaNet kernel log)."""
        T0, C = prompt.numel(), self.prefill_chunk
        if carried is None:
            carried = {l: torch.zeros_like(p.state[:1]) for l, p in self.ssm.items()}  # replay
        logged = None
        if record is not None:
            record.setdefault("states", {})
            logged = {l: [] for l in self.ssm} if self.strategy == "replay" else None
        pools = _PoolCache(
            lambda l, inputs: self._prefill_advance(l, inputs, slot, carried, logged)
        )
        pos = start
        while pos < T0:
            end = min(T0, pos + C)
            if block:
                end = min(end, (pos // block + 1) * block)
            h = self.model.model.embeddings(prompt[None, pos:end])
            for i, layer in enumerate(self.model.model.layers):
                x = layer.norm(h)
                if self.cfg.pattern[i] == "*":
                    h = h + self._prefill_attention(i, x, slot, pos)
                else:  # a recurrent mixer through the pools, or an MLP (no memory)
                    h = h + layer.mixer(x, pools)
            if self.strategy == "replay":
                self._prefill_fold_counts(slot, h.shape[1])
            pos = end
            if record is not None and block and pos % block == 0:
                record["states"][pos] = {
                    l: LayerState(p.state[slot : slot + 1].clone(), p.conv[slot : slot + 1].clone())
                    for l, p in self.ssm.items()
                }
        if logged is not None:
            record["entries"] = {
                l: {k: torch.cat([c[k] for c in chunks], 1) for k in self.ssm[l].log}
                for l, chunks in logged.items()
            }
        return self.model.lm_head(self.model.model.norm_f(h[:, -1]))[0]

    def _prefill_advance(self, layer, inputs, slot, carried, logged=None):
        """A prefill chunk through recurrent layer ``layer``'s pools (its mixer's ``inputs``
        for T tokens of ``slot``) -> y: the conv window moves on; snapshot and recompute scan
        from the slot's state, replay from the chunks' carried state and logs the entries
        (and appends them to ``logged[layer]`` when given)."""
        pool, one = self.ssm[layer], slice(slot, slot + 1)
        spec, window = pool.spec, pool.conv[one]
        entries = spec.prepare(window, inputs)
        pool.conv[one] = window_after(window, entries[spec.conv_field])
        if self.strategy != "replay":
            result = spec.scan(pool.state[one], entries)
            pool.state[one] = result.state
        else:
            before = carried[layer]
            result = spec.scan(before, entries)
            carried[layer] = result.state
            entries = pool.log_entries(entries, before)  # GDN kernels: u from the state before
            self._prefill_log(pool, slot, entries)
            if logged is not None:
                logged[layer].append({k: entries[k].to(b.dtype) for k, b in pool.log.items()})
        return result.y

    def _prefill_log(self, pool, slot, entries):
        """Append a chunk's entries to the slot's ring, folding each time it holds L."""
        n, head = self.log_len[slot], self.head[slot]
        T = next(iter(entries.values())).shape[1]
        done = 0
        while done < T:
            m = min(self.L - n, T - done)
            rows = (head + n + torch.arange(m, device=self.device)) % self.capacity
            for k, buf in pool.log.items():
                buf[slot, rows] = entries[k][0, done : done + m].to(buf.dtype)
            n, done = n + m, done + m
            if n == self.L:
                rows = (head + torch.arange(self.L, device=self.device)) % self.capacity
                log = {k: v[slot : slot + 1, rows] for k, v in pool.log.items()}
                pool.state[slot : slot + 1] = self._fold_entries(
                    pool, pool.state[slot : slot + 1], log
                )
                head, n = (head + self.L) % self.capacity, 0

    def _prefill_fold_counts(self, slot, T):
        """The host's log length and head after a chunk of T tokens (every layer did the same)."""
        total = self.log_len[slot] + T
        folds = total // self.L
        self.log_len[slot] = total - folds * self.L
        self.head[slot] = (self.head[slot] + folds * self.L) % self.capacity
        self.stats.folds += folds
        self.stats.folded_tokens += folds * self.L

    def _prefill_attention(self, layer, h, slot, start):
        """The chunk's queries against the slot's KV rows 0 .. start + T - 1 (causal), at
        positions start .. start + T - 1."""
        att, pool = self.model.model.layers[layer].mixer, self.kv[layer]
        end = start + h.shape[1]
        positions = torch.arange(start, end, device=self.device)
        q, k, v, gate = att.project(h, positions)
        pool.k[slot, :, start:end] = k[0].to(pool.k.dtype)
        pool.v[slot, :, start:end] = v[0].to(pool.v.dtype)
        visible = torch.arange(end, device=self.device) <= positions[:, None]  # (T, end)
        one = slice(slot, slot + 1)
        out = attend(q, pool.k[one, :, :end], pool.v[one, :, :end], visible)
        return att.finish(out, gate)

    def _fold_entries(self, pool, state, entries):
        """fold(state (1, *state_shape), entries (1, L, ...)) with the fold decode steps use
        (the pool's kernels under ``use_kernels``, else the spec's)."""
        if not pool.kernels:
            return pool.spec.fold(state, entries)
        one = torch.zeros(1, dtype=torch.int32, device=self.device)
        n = next(iter(entries.values())).shape[1]
        out = state.clone()
        log = {k: t.contiguous() for k, t in entries.items()}
        pool.fold(out, one, log, torch.full_like(one, n), one)
        return out

    # --- one step ------------------------------------------------------------------------
    def _check_slots(self, slots, name="slots"):
        live = self.slots
        if slots is None:
            if not live:
                raise ValueError(f"{name}: no live sequence: admit one (or prefill) first")
            return live
        if not isinstance(slots, (list, tuple, range, torch.Tensor, np.ndarray)):
            raise TypeError(f"{name}: expected a list of live slots {live}, got {given(slots)}")
        slots = [as_int(name, s, 0, self.max_batch - 1) for s in slots]
        for s in slots:
            if not self.live[s]:
                raise ValueError(f"{name}: slot {s} is not live (live slots: {live})")
        if len(set(slots)) != len(slots) or not slots:
            raise ValueError(f"{name}: expected distinct live slots, got {slots}")
        return slots

    def _per_slot(self, name, values, slots, low, high):
        """One int per slot (an int for all); each in [low, high] (high may be per slot)."""
        return as_ints(name, values, [f"slot {s}" for s in slots], low, high)

    @torch.no_grad()
    def step(self, tokens, counts=None, slots=None, check=True):
        """Logits (S, T, vocab) of ``tokens`` (S, T) for ``slots`` (default: every live slot,
        in order), advancing slot i by ``counts[i]`` tokens (1 <= counts[i] <= T, default T;
        the rest of its row is padding). A rollback afterwards applies to this step: slots left
        out of it can no longer roll back an earlier one. ``check=False`` skips the id range
        check, which reads the ids back from the device; shapes are always checked."""
        slots = self._check_slots(slots)
        spec = (("slots", len(slots)), "T")
        tokens = as_token_ids("tokens", tokens, self.cfg.vocab_size, spec, check_range=check)
        T = tokens.shape[1]
        if not 1 <= T <= self.max_verify:
            raise ValueError(
                f"tokens: {T} per step, expected 1 <= T <= max_verify="
                f"{self.max_verify} (the captured verify size)"
            )
        counts = (
            [T] * len(slots) if counts is None else self._per_slot("counts", counts, slots, 1, T)
        )
        for s, c in zip(slots, counts):
            if self.pos[s] + c > self.max_len:
                raise ValueError(
                    f"tokens: slot {s} at position {self.pos[s]} + {c} exceeds max_len={self.max_len}"
                )
            if c > self._room(s):
                raise ValueError(
                    f"counts: slot {s} may take at most room={self._room(s)} tokens in this step "
                    f"(replay folds its log every L={self.L} tokens and a step may not cross a "
                    f"fold), got {c}"
                )
        return self._step(tokens, counts, slots)

    def _step(self, tokens, counts, slots):
        """``step`` after its checks: ``counts`` and ``slots`` lists, tokens (S, T)."""
        T = tokens.shape[1]
        bucket = next(b for b in self.buckets if b > max(slots))
        full = torch.zeros(bucket, T, dtype=torch.long, device=self.device)
        index = torch.tensor(slots, device=self.device)
        full[index] = tokens.to(self.device)
        step_counts = dict(zip(slots, counts))
        folds = self._plan_folds(slots) if self.strategy == "replay" else []
        self._upload(step_counts, folds)
        try:
            logits = self._run(full, bool(folds), save=True)
        except BaseException:  # the saved and draft copies are overwritten: no rollback now
            self.last = [0] * self.max_batch
            raise
        if self.strategy == "recompute":
            self._last_tokens[:bucket, :T] = full
        self.last = [0] * self.max_batch
        for s, c in step_counts.items():
            self.pos[s] += c
            self.last[s] = c
            if self.strategy == "replay":
                self.log_len[s] += c
        self.stats.steps += 1
        self.stats.verify_steps += int(T > 1)
        return logits[index]

    def _plan_folds(self, slots):
        """Replay's fold grid: the slots whose log holds at least L entries fold their oldest L
        (host lengths move now; the kernels read the old head from ``_head_pre``)."""
        folds = [s for s in slots if self.log_len[s] >= self.L]
        self._plan = {s: self.head[s] for s in folds}  # slot -> ring head before the fold
        for s in folds:
            self.head[s] = (self.head[s] + self.L) % self.capacity
            self.log_len[s] -= self.L
        self.stats.folds += len(folds)
        self.stats.folded_tokens += self.L * len(folds)
        return folds

    def _upload(self, step_counts, folds, positions=None):
        """Copy the host's per-slot numbers to the device tensors the step reads."""
        n = self.max_batch
        head_pre = list(self.head)
        for s, h in (self._plan or {}).items():
            head_pre[s] = h
        fold_len = [self.L if s in folds else 0 for s in range(n)]
        counts = [step_counts.get(s, 0) for s in range(n)]
        meta = np.array([self.log_len, self.head, head_pre, fold_len, counts], dtype=np.int32)
        self._meta.copy_(torch.from_numpy(meta), non_blocking=True)  # numpy: the faster build
        pos = np.array(positions or self.pos, dtype=np.int64)
        self._pos.copy_(torch.from_numpy(pos), non_blocking=True)

    def _run(self, tokens, folds, save):
        if self.graphs:
            return self._graph_step(tokens, folds, save)
        return self._forward(tokens, folds, save)

    def rollback(self, keep, slots=None):
        """Keep the first ``keep[i]`` tokens of the last step of ``slots[i]`` (an int: the same
        for every slot; 1 <= keep <= that slot's tokens in the last step) and drop the rest."""
        slots = self._check_slots(slots)
        lasts = [self.last[s] for s in slots]
        for s, n in zip(slots, lasts):
            if n == 0:
                raise ValueError(f"keep: slot {s} took no tokens in the last step: nothing to keep")
        self._rollback(self._per_slot("keep", keep, slots, 1, lasts), slots)

    def _rollback(self, keep, slots):
        """``rollback`` after its checks: ``keep`` and ``slots`` lists."""
        dropped = [(s, k) for s, k in zip(slots, keep) if k < self.last[s]]
        if not dropped:
            return
        index = torch.tensor([s for s, _ in dropped], device=self.device)
        kept = torch.tensor([k - 1 for _, k in dropped], device=self.device)
        for pool in self.ssm.values():
            if self.strategy == "recompute":
                pool.state[index] = pool.saved_state[index]
                pool.conv[index] = pool.saved_conv[index]
                continue
            pool.conv[index] = pool.draft_conv[index, kept]
            if self.strategy == "snapshot":
                pool.state[index] = pool.draft_state[index, kept]
        for s, k in dropped:
            drop = self.last[s] - k
            self.pos[s] -= drop
            self.last[s] = k
            if self.strategy == "replay":  # a cursor move
                self.log_len[s] -= drop
        self.stats.rollbacks += len(dropped)
        if self.strategy == "recompute":
            self._rerun(dropped)

    def _rerun(self, dropped):
        """Recompute: re-run each slot's kept tokens from the state saved before the verify
        (other slots get count 0 and stay as they are)."""
        T = max(k for _, k in dropped)
        bucket = next(b for b in self.buckets if b > max(s for s, _ in dropped))
        positions = list(self.pos)
        for s, k in dropped:
            positions[s] -= k
        self._plan = None
        self._upload(dict(dropped), [], positions)
        self._run(self._last_tokens[:bucket, :T].clone(), False, save=False)
        self.stats.reruns += 1
        self.stats.rerun_tokens += sum(k for _, k in dropped)

    # --- the model over the pools --------------------------------------------------------
    def _forward(self, tokens, folds, save):
        """One step over slots 0 .. bucket-1 (``tokens`` (bucket, T)); reads the uploaded
        per-slot numbers; returns logits (bucket, T, vocab)."""
        bucket, T = tokens.shape
        if folds:
            self._fold(bucket)
        if self.strategy == "recompute" and save and T > 1:
            for pool in self.ssm.values():
                pool.saved_state[:bucket].copy_(pool.state[:bucket])
                pool.saved_conv[:bucket].copy_(pool.conv[:bucket])
        if self.fused:
            return self._forward_fused(tokens)
        if self.matmul == "row_invariant":  # every nn.Linear row-invariant (``invariant``)
            with RowInvariantLinear():
                return self._forward_reference(tokens, bucket, T)
        return self._forward_reference(tokens, bucket, T)

    def _forward_reference(self, tokens, bucket, T):
        """The reference path's forward: the teaching modules over the pools."""
        pools = _PoolCache(lambda l, inputs: self._advance(l, inputs, bucket, T))
        h = self.model.model.embeddings(tokens)
        for i, block in enumerate(self.model.model.layers):
            x = block.norm(h)
            if self.cfg.pattern[i] == "*":
                h = h + self._attention(i, x, bucket, T)
            else:  # a recurrent mixer through the pools, or an MLP (no memory)
                h = h + block.mixer(x, pools)
        return self.model.lm_head(self.model.model.norm_f(h))

    def _fold(self, bucket):
        """Fold L entries of each slot that ``_fold_len`` names into its checkpoint."""
        for pool in self.ssm.values():
            if pool.kernels:  # every slot of the bucket in one launch; fold_len 0: untouched
                log = {k: v[:bucket] for k, v in pool.log.items()}
                pool.fold(
                    pool.state, self._rows[:bucket], log, self._fold_len[:bucket],
                    self._head_pre[:bucket],
                )  # fmt: skip
                continue
            for s, head in self._plan.items():
                rows = (head + torch.arange(self.L, device=self.device)) % self.capacity
                log = {k: v[s : s + 1, rows] for k, v in pool.log.items()}
                pool.state[s : s + 1] = pool.spec.fold(pool.state[s : s + 1], log)

    def _advance(self, layer, inputs, bucket, T):
        """The reference path of recurrent layer ``layer`` for slots 0 .. bucket-1: its mixer's
        ``inputs`` for T tokens per slot -> y. Each slot advances by its count (``_counts``);
        snapshot keeps the state after each token, replay computes y from checkpoint + log
        (the pool's Triton kernels for the whole bucket under ``use_kernels``, else the spec's
        outputs per log length) and appends the counted tokens to the ring; every strategy keeps
        the window after each token (a rollback picks one)."""
        pool = self.ssm[layer]
        spec, window = pool.spec, pool.conv[:bucket]
        entries = spec.prepare(window, inputs)
        counts = self._counts[:bucket].long()
        rows = torch.arange(bucket, device=self.device)
        if self.strategy != "replay":  # the token loop: T steps equal T one-token steps bitwise
            result = spec.scan(pool.state[:bucket], entries, return_states=True)
            if self.strategy == "snapshot" and T > 1:
                pool.draft_state[:bucket, :T].copy_(result.states)
            states = torch.cat([pool.state[:bucket, None], result.states], 1)
            pool.state[:bucket] = states[rows, counts]
            y = result.y
        elif pool.kernels:
            meta = (self._log_len, self._head, self._counts)
            y = pool.replay(entries, self._rows[:bucket], *(m[:bucket] for m in meta))
            others = [f for f in pool.log if f not in pool.kernel_fields]  # Mamba-2: xBC
            self._append_log(pool, entries, others, bucket, T)
        else:
            y = self._replay_outputs(pool, bucket, T, entries)
        if window.shape[1]:
            windows = windows_per_token(window, entries[spec.conv_field])  # (bucket, T, K, C)
            if T > 1:
                pool.draft_conv[:bucket, :T].copy_(windows)
            windows = torch.cat([window[:, None], windows], 1)
            pool.conv[:bucket] = windows[rows, counts]
        return y

    def _replay_outputs(self, pool, bucket, T, entries):
        """y of the new tokens from checkpoint + log (``spec.outputs``: no state written), one
        call per distinct log length among the slots (a lock-step batch: one call); appends
        each slot's counted tokens to its ring."""
        y, held = None, self.log_len[:bucket]
        for n in sorted(set(held)):
            group = [s for s in range(bucket) if held[s] == n]
            rows = torch.tensor(group, device=self.device)
            heads = torch.tensor([self.head[s] for s in group], device=self.device)
            old = (heads[:, None] + torch.arange(n, device=self.device)) % self.capacity
            log = {k: v[rows[:, None], old] for k, v in pool.log.items()}  # (group, n, ...)
            mine = {k: v[rows] for k, v in entries.items()}
            out = pool.spec.outputs(pool.state[rows], log, mine)
            if y is None:
                y = out.new_empty((bucket, *out.shape[1:]))
            y[rows] = out
        self._append_log(pool, entries, list(pool.log), bucket, T)
        return y

    def _append_log(self, pool, entries, fields, bucket, T):
        """Append ``fields`` of each slot's counted tokens (``entries``: field -> (bucket, T,
        ...)) to its ring after its ``_log_len`` entries, for the whole bucket at once, with no
        host read (a CUDA graph can hold it): a padding token rewrites its slot's last counted
        token (the same value to the same row), and a slot left out of the step (count 0)
        rewrites a row with what it holds."""
        if not fields:
            return
        counts = self._counts[:bucket, None].long()
        kept = torch.minimum(self._steps[:T], (counts - 1).clamp(min=0))  # (bucket, T)
        rows = (self._head[:bucket, None] + self._log_len[:bucket, None] + kept) % self.capacity
        slots = self._rows[:bucket, None].long()
        for k in fields:
            buf, new = pool.log[k], entries[k]
            at = kept.view(bucket, T, *(1,) * (new.dim() - 2)).expand_as(new)
            value = new.gather(1, at).to(buf.dtype)
            held = (counts > 0).view(bucket, 1, *(1,) * (new.dim() - 2))
            buf[slots, rows] = torch.where(held, value, buf[slots, rows])

    def _write_kv(self, pool, k, v, bucket, T):
        """k, v (bucket, T, Hkv, Dh) into each slot's rows position .. position + T - 1."""
        at = self._pos[:bucket, None] + self._steps[:T]  # (bucket, T)
        rows = torch.arange(bucket, device=self.device)[:, None]
        pool.k[rows, :, at] = k.to(pool.k.dtype)
        pool.v[rows, :, at] = v.to(pool.v.dtype)
        return at

    def _attention(self, layer, h, bucket, T):
        """The attention module's own math (``project``, ``kv.attend``, ``finish``) at each
        slot's positions, over the rows up to each token's own."""
        att, pool = self.model.model.layers[layer].mixer, self.kv[layer]
        positions = self._pos[:bucket, None] + self._steps[:T]  # (bucket, T)
        q, k, v, gate = att.project(h, positions)
        self._write_kv(pool, k.transpose(1, 2), v.transpose(1, 2), bucket, T)
        if self.matmul == "row_invariant":  # one program per query row
            out = row_invariant_attention(q, pool.k, pool.v, self._pos[:bucket])
        else:
            visible = torch.arange(pool.k.shape[2], device=self.device) <= positions[:, :, None]
            out = attend(q, pool.k[:bucket], pool.v[:bucket], visible[:, None])
        return att.finish(out, gate)

    # --- the fused path (GPU) ------------------------------------------------------------
    def _forward_fused(self, tokens):
        """The forward with the fused kernels: the residual add and the next block's norm are
        one kernel, and so on (see the module docstring)."""
        from replaylab.kernels.decode import add_rmsnorm, relu2

        bucket, T = tokens.shape
        layers = self.model.model.layers
        norms = [block.norm for block in layers[1:]] + [self.model.model.norm_f]
        h, x = add_rmsnorm(
            self.model.model.embeddings(tokens), layers[0].norm.weight, layers[0].norm.eps
        )
        for i, block in enumerate(layers):
            kind = self.cfg.pattern[i]
            if kind == "M":
                out = self._mamba_fused(i, x, bucket, T)
            elif kind == "*":
                out = self._attention_fused(i, x, bucket, T)
            else:
                mlp = block.mixer
                out = self._linear(mlp.down_proj.weight, relu2(self._linear(mlp.up_proj.weight, x)))
            h, x = add_rmsnorm(h, norms[i].weight, norms[i].eps, delta=out)
        return self._linear(self.model.lm_head.weight, x)

    def _linear(self, weight, x):
        """x @ weight.T with the engine's matrix product (see ``matmul``)."""
        if self.matmul == "row_invariant":
            from replaylab.kernels.matmul import linear

            return linear(x, weight)
        return torch.nn.functional.linear(x, weight)

    def _mamba_fused(self, layer, h, bucket, T):
        from replaylab.kernels.decode import conv_step, gated_rmsnorm, state_update

        pool, c = self.ssm[layer], self.cfg
        mixer = pool.mixer
        H, P, N, G = c.ssm_heads, c.ssm_head_dim, c.d_state, c.n_groups
        inner = H * P
        counts = self._counts[:bucket]
        zx = self._linear(mixer.in_proj.weight, h).view(bucket * T, -1)  # gate | xBC | dt
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
        if self.strategy == "replay":  # kernels.replay, each verify row as a single step
            new = dict(x=x, dt=dt, B=Bm, C=Cm)
            y = pool.replay(new, self._rows[:bucket], self._log_len[:bucket], self._head[:bucket],
                            counts)  # fmt: skip
        else:
            y = state_update(
                pool.state,
                x,
                dt,
                Bm,
                Cm,
                pool.A,
                pool.D,
                pool.dt_bias,
                pool.dt_limit,
                drafts=pool.draft_state if self.strategy == "snapshot" and T > 1 else None,
                counts=counts,
            )
        y = gated_rmsnorm(
            y.view(bucket * T, inner), zx[:, :inner], mixer.norm.weight, G, mixer.norm.eps
        )
        return self._linear(mixer.out_proj.weight, y).view(bucket, T, -1)

    def _attention_fused(self, layer, h, bucket, T):
        """Attention over the static KV buffer with ``kernels.decode.attention``: each token
        reads only the rows up to its own slot's position."""
        from replaylab.kernels.decode import attention

        att, pool, c = self.model.model.layers[layer].mixer, self.kv[layer], self.cfg
        Hq, Hkv, Dh = c.attn_heads, c.kv_heads, c.head_dim
        q, k, v = self._linear(self._qkv_weight[layer], h).split(
            [Hq * Dh, Hkv * Dh, Hkv * Dh], dim=-1
        )
        self._write_kv(pool, k.view(bucket, T, Hkv, Dh), v.view(bucket, T, Hkv, Dh), bucket, T)
        out = attention(q.reshape(bucket, T, Hq, Dh), pool.k, pool.v, self._pos[:bucket], Dh**-0.5)
        return self._linear(att.o_proj.weight, out.view(bucket, T, Hq * Dh))

    # --- CUDA graphs ---------------------------------------------------------------------
    def _graph_step(self, tokens, folds, save):
        bucket, T = tokens.shape
        key = (bucket, T, folds, save and self.strategy == "recompute" and T > 1)
        if key not in self._graphs:
            static = tokens.clone()
            saved = self._save_for_capture(bucket)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())  # after the copies above
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: Triton compiles, allocator settles
                    self._forward(static, folds, save)
                    self._restore_after_capture(saved, bucket)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._forward(static, folds, save)
            self._restore_after_capture(saved, bucket)
            self._graphs[key] = (graph, static, out)
        graph, static, out = self._graphs[key]
        static.copy_(tokens)
        graph.replay()
        self.stats.graph_replays += 1
        return out

    def _save_for_capture(self, bucket):
        """The warm-up runs the step for real (capture records without running): keep what it
        overwrites in place (states, windows and, under replay, the log rings: a step's
        appends can land on the ring rows its fold reads, so a second warm-up or the real step
        after them would fold the wrong entries); draft and KV rows past each slot's position
        are rewritten by the real step before anything reads them."""
        return {
            l: (p.state[:bucket].clone(), p.conv[:bucket].clone())
            + tuple(v[:bucket].clone() for v in p.log.values())
            for l, p in self.ssm.items()
        }

    def _restore_after_capture(self, saved, bucket):
        for l, (state, conv, *log) in saved.items():
            pool = self.ssm[l]
            pool.state[:bucket].copy_(state)
            pool.conv[:bucket].copy_(conv)
            for buf, kept in zip(pool.log.values(), log):
                buf[:bucket].copy_(kept)

    # --- lock-step workloads -------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts):
        """Retire every slot and admit the rows of ``prompts`` (B, T0) into slots 0 .. B-1;
        returns their last logits (B, vocab)."""
        prompts, _ = self._check_prompts(prompts)
        for s in self.slots:
            self.retire(s)
        return torch.stack([self.admit(p)[1] for p in prompts])

    def _check_prompts(self, prompts, n_new=1, name="prompts"):
        """``prompts`` (B, T0) ids for ``prefill`` (B slots, the live ones retired first) and
        ``n_new`` greedy tokens after them -> (prompts int64, n_new); nothing changes."""
        prompts = as_token_ids(name, prompts, self.cfg.vocab_size, ("batch", "T0"))
        B, T0 = prompts.shape
        room = self.max_batch - len(self.prefilling)
        if not 1 <= B <= room:
            busy = f" - {len(self.prefilling)} prefilling" if self.prefilling else ""
            raise ValueError(
                f"{name}: batch {B} does not fit the pools: expected 1 <= batch "
                f"<= max_batch={self.max_batch}{busy}"
            )
        if not 1 <= T0 < self.max_len:
            raise ValueError(f"{name}: length {T0}: expected 1 <= length < max_len={self.max_len}")
        n_new = as_int("n_new", n_new, low=1)
        if T0 + n_new - 1 > self.max_len:
            raise ValueError(
                f"n_new: {n_new} tokens after a prompt of {T0} need T0 + n_new - 1 = "
                f"{T0 + n_new - 1} positions: expected at most max_len={self.max_len}"
            )
        return prompts, n_new

    @torch.no_grad()
    def greedy(self, prompts, n_new):
        """Greedy decoding of ``n_new`` tokens after ``prompts`` (B, T0): (B, n_new)."""
        prompts, n_new = self._check_prompts(prompts, n_new)
        logits = self.prefill(prompts)
        out = []
        for i in range(n_new):
            tok = logits.argmax(-1, keepdim=True)
            out.append(tok)
            if i < n_new - 1:
                logits = self.step(tok, check=False)[:, -1]
        return torch.cat(out, 1)

    @torch.no_grad()
    def speculative(self, prompt, n_new, drafter, k=4):
        """Greedy speculative decoding of one sequence with ``drafter.propose(context, k,
        vocab)``: (1, n_new) tokens, equal to ``greedy``'s. Returns (tokens, proposed,
        accepted)."""
        k = self._check_k(k)
        prompt = as_token_ids("prompt", prompt, self.cfg.vocab_size, (1, "T0"))
        prompt, n_new = self._check_prompts(prompt, n_new, name="prompt")
        self._check_drafters([drafter], 1)
        pending = self.prefill(prompt).argmax(-1, keepdim=True)
        return self.speculate(prompt, pending, n_new, drafter, k)

    def _check_k(self, k):
        k = as_int("k", k, low=0)
        if k + 1 > self.max_verify:
            raise ValueError(
                f"k: a verify of k + 1 = {k + 1} tokens exceeds max_verify={self.max_verify}"
            )
        return k

    def _check_drafters(self, drafters, S):
        """``drafters``: a list of S objects with ``propose``."""
        if not isinstance(drafters, (list, tuple)) or len(drafters) != S:
            raise ValueError(
                f"drafters: expected a list of {S}, one per slot, got {given(drafters)}"
            )
        for i, d in enumerate(drafters):
            if not callable(getattr(d, "propose", None)):
                raise TypeError(
                    f"drafters[{i}]: expected a drafter with propose(context, k, vocab), got "
                    f"{given(d)}"
                )

    @torch.no_grad()
    def speculate(self, prompt, pending, n_new, drafter, k=4):
        """The decode part of ``speculative``, after ``prefill(prompt)`` gave the first token
        ``pending`` (1, 1): (tokens (1, n_new), proposed, accepted)."""
        prompt = as_token_ids("prompt", prompt, self.cfg.vocab_size, (1, "T0"))
        tokens, proposed, accepted = self.speculate_batch([prompt[0]], pending, n_new, [drafter], k)
        return tokens[0][None], proposed[0], accepted[0]

    @torch.no_grad()
    def speculate_batch(self, prompts, pending, n_new, drafters, k=4, slots=None):
        """Speculative decoding of the live ``slots`` (default: all) together, each sequence
        accepting its own number of drafts per round: ``prompts`` the prompts (list of (T0,)),
        ``pending`` (S, 1) or (S,) their first tokens, one drafter each. Every round is one
        step of k + 1 tokens per sequence and one rollback with a keep per sequence; a
        finished sequence stops taking part. A round verifies fewer drafts before a fold
        (replay) and near max_len: every slot needs only position + n_new - 1 <= max_len, as
        greedy decoding of n_new tokens does. Returns (list of (n_new,) tokens on the
        engine's device, proposed, accepted), the last two per sequence.

        Everything is checked before the first step; a drafter's proposal (k ids in the
        vocabulary) before the step of its round, so a bad one is refused with the rounds
        before it kept and the engine as they left it."""
        k = self._check_k(k)
        slots = self._check_slots(slots)
        S, vocab = len(slots), self.cfg.vocab_size
        if not isinstance(prompts, (list, tuple)) or len(prompts) != S:
            raise ValueError(f"prompts: expected a list of {S}, one per slot, got {given(prompts)}")
        prompts = [as_token_ids(f"prompts[{i}]", p, vocab, ("T0",)) for i, p in enumerate(prompts)]
        pending = as_token_ids("pending", pending, vocab, (("slots", S), 1), (("slots", S),))
        self._check_drafters(drafters, S)
        n_new = as_int("n_new", n_new, low=1)
        for s in slots:
            if self.pos[s] + n_new - 1 > self.max_len:
                raise ValueError(
                    f"n_new: slot {s} at position {self.pos[s]} cannot take n_new={n_new} tokens: "
                    f"expected position + n_new - 1 <= max_len={self.max_len}"
                )
        outs = [[int(t)] for t in pending.flatten().tolist()]
        # the contexts on the host, a row each: prompt, then the tokens so far; a drafter reads
        # a view (no copy of the whole context every round)
        width = max(p.numel() for p in prompts) + n_new + k + 1
        contexts = torch.zeros(S, width, dtype=torch.long)
        lengths = [p.numel() + 1 for p in prompts]  # each context's tokens so far
        for i, (prompt, first) in enumerate(zip(prompts, outs)):
            contexts[i, : prompt.numel()] = prompt.cpu()
            contexts[i, prompt.numel()] = first[0]
        proposed, accepted = [0] * S, [0] * S
        steps = torch.arange(k + 1)
        while True:
            going = [i for i in range(S) if len(outs[i]) < n_new]
            if not going:
                break
            rows, ks = [], []
            for i in going:
                s = slots[i]
                drafts = drafters[i].propose(contexts[i, : lengths[i]], k, vocab)
                rows.append([outs[i][-1], *as_drafts(f"drafts of slot {s}", drafts, vocab, k)])
                # fewer drafts just before a fold and near max_len
                ks.append(min(k, self._room(s) - 1, self.max_len - self.pos[s] - 1))
            batch, limit = torch.tensor(rows), torch.tensor(ks)
            step_slots = [slots[i] for i in going]
            pred = self._step(batch.to(self.device), [kj + 1 for kj in ks], step_slots)
            pred = pred.argmax(-1).cpu()  # (G, k + 1)
            # accepted: the leading drafts equal to the target's tokens; the tokens taken are
            # the target's first 1 + accepted (an accepted draft is the target's token)
            same = (batch[:, 1:] == pred[:, :k]) & (steps[:k] < limit[:, None])
            taken = same.long().cumprod(1).sum(1)
            index = torch.tensor(going)[:, None].expand(-1, k + 1)
            at = torch.tensor([lengths[i] for i in going])[:, None] + steps  # (G, k + 1)
            new = steps <= taken[:, None]
            contexts[index[new], at[new]] = pred[new]
            for j, (i, a, tokens) in enumerate(zip(going, taken.tolist(), pred.tolist())):
                proposed[i], accepted[i] = proposed[i] + ks[j], accepted[i] + a
                outs[i] += tokens[: a + 1]
                lengths[i] += a + 1
            self._rollback((taken + 1).tolist(), step_slots)
        return [torch.tensor(o[:n_new], device=self.device) for o in outs], proposed, accepted


class _PoolCache:
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
