"""A prefix cache for the serving engine: the teaching prefix cache's radix tree
(``replaylab.prefix.PrefixTree``: matching, the resume plan, ``PrefixHit``, insertion, one byte
budget and its eviction) over a ``DecodeEngine``'s slots.

    engine = DecodeEngine(model, max_batch=8, max_len=512, strategy="replay", log_length=16)
    prefix = EnginePrefixCache(engine, block_size=32, budget_bytes=2**24)
    slot, logits, hit = prefix.admit(prompt)    # in place of engine.admit(prompt)

``admit`` seats a free slot with what the tree holds of the prompt, exactly as decode would
have the slot there, prefills the rest from that position (``DecodeEngine._prefill`` from a
start) and inserts the prompt's blocks. What a slot is seated with, for the longest held
prefix m and u = min(m, T - 1) (the last token is always computed, for its logits):

    every strategy   KV rows [0, r) of every attention layer (r: the resumed position below)
    replay           r = u (``resume="chunk"``: u rounded down to a multiple of the engine's
                     prefill chunk C, [g, r) scanned a chunk at a time as the prefill did, so
                     the slot holds the cold prefill's bits and its ring is empty):
                     the state at the grid point g = b * floor(u / b) (a node's end
                     state), the block's entries [g, c) (derived from the node's inputs)
                     folded L at a time into it
                     (c = L * floor(u / L): the decode grid, since b is a multiple of L), the
                     entries [c, u) in the log ring (log_len = u - c, head 0), the conv window
                     after u (rebuilt from the node's conv inputs); if that block's log was
                     evicted, r = g
    snapshot         r = the last grid point <= u: the state and conv window held there (vLLM's
                     mamba_cache_mode=align); [r, T) prefilled
    recompute        the same seat as snapshot; the tokens [r, u) are the recomputed ones,
                     [u, T) the prefilled (one forward runs both)

The ``PrefixHit`` is the teaching cache's: ``resumed_from`` r, ``folded`` (replay) the tree's
logged entries the seat used (r - g: folded onto the decode grid, the rest put in the ring;
under ``resume="chunk"`` scanned),
``recomputed`` (recompute) u - r, ``prefilled`` the rest, ``match_stop`` and ``limited_by``
why reuse stopped ("unique tokens", "evicted", "not on the grid", "end of prompt").

What the tree holds per node of tokens [g, g + b): per attention layer the KV rows, per
recurrent layer the state and conv window at g + b (full blocks; replay: the checkpoint, which
sits there since g + b is on the fold grid), under replay every token's inputs to the layer
(``RecurrentPool.node_fields``: the spec's ``input_fields``, Mamba-2's xBC and dt, about half
its log entry), from which a seat derives the ring's entries (the pool's ``prepare`` from the
window at g, the node's start) and the conv window. All are copies taken after the prefill: a slot's later decode,
verify, rollback or retire never changes the tree, and a seat copies out of it (copy on write).
The prompt's tail shorter than a block is held too (KV, and replay's entries), so replay
resumes inside it; snapshot and recompute cannot.

Allowed block sizes: replay, multiples of the engine's L below max_len (grid positions are then
fold positions); snapshot and recompute, 1 .. max_len - 1. Others are refused naming the
allowed values; a budget under one block, a prompt of max_len tokens or more, ids outside the
vocabulary are refused with the tree and the engine unchanged.

The fused path is served too: its log keeps the kernels' fields (x, dt, B, C), which a seat
derives from the node's inputs as the reference path's are; so is Gated DeltaNet's kernel log,
whose corrected updates u a seat computes from the inputs and the state at g by the scan the
prefill logs them with (``RecurrentPool.logged_scan``). So are CUDA graphs: seating a slot
writes the pools in place, where the captured steps read them.

Glossary: b block_size, L the engine's log length, m matched, u usable, r resumed from, g a
grid position (a multiple of b), c a fold position (a multiple of L).
"""

from __future__ import annotations

import math

import torch

from replaylab.prefix import DEFAULT_EVICTION, PREFIX_EVICTION, PrefixHit, PrefixTree, _Node
from replaylab.serving.admission import Admission
from replaylab.serving.engine import DecodeEngine
from replaylab.serving.validate import as_int, given

__all__ = ["EnginePrefixCache", "PrefixAdmission", "PrefixHit", "allowed_block_sizes"]


def allowed_block_sizes(engine) -> list[int]:
    """The block sizes an ``EnginePrefixCache`` over ``engine`` serves: under replay the
    multiples of L below max_len, else 1 .. max_len - 1."""
    step = engine.policy.block_step()
    return list(range(step, engine.max_len, step))


def _upload(tokens, device):
    """``tokens`` (a list of ids) as a (T,) int64 tensor on ``device``: on a GPU through pinned
    memory without waiting for the device (a pageable copy waits for the work queued before
    it)."""
    ids = torch.tensor(tokens, dtype=torch.long, pin_memory=device.type == "cuda")
    return ids.to(device, non_blocking=True)


def _sizes(values) -> str:
    if len(values) <= 12:
        return ", ".join(map(str, values))
    return f"{values[0]}, {values[1]}, {values[2]}, ..., {values[-1]}"


def _entry_bytes(pool) -> int:
    """Bytes a prefix node keeps of one token for recurrent layer ``pool``."""
    return sum(
        math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        for shape, dtype in pool.node_layout().values()
    )


class EnginePrefixCache(PrefixTree):
    """A prefix tree over ``engine`` (a ``DecodeEngine``, reference or fused path, with or
    without CUDA graphs) under the engine's strategy.

    block_size    the grid (see the module docstring for the sizes each strategy serves)
    budget_bytes  cap on KV + states + logs held by the tree (None: no cap); at least one
                  full block's bytes (``floor_bytes``; under "logs-first" and "lru-fit",
                  without its log)
    eviction      "lru-fit" (default: after the logs of extended blocks, full leaves' logs, a
                  leaf that cannot fit beside its ancestors, tails, then full leaves; least
                  recently used first within each), "lru" (whole leaves), "cost" (the leaf
                  saving fewest prefill tokens per byte) or "logs-first" (replay: every log
                  before any leaf, so a hit never resumes before align's)
    resume        replay: "match" (default: at the match, the block's entries folded onto the
                  decode grid) or "chunk" (at the last multiple of the engine's prefill_chunk
                  C <= the match, the block's entries scanned a chunk at a time as a prefill
                  scans them: a hit's logits are then the cold prefill's bit for bit, for up to
                  C - 1 more tokens computed, where the tree's blocks were themselves
                  prefilled on the chunk grid: by ``admit``, or a ``Scheduler`` whose
                  ``prefill_per_step`` is at least C). Under replay "chunk" needs block_size a
                  multiple of C and C a multiple of L; snapshot and recompute resume on the
                  block grid either way

    ``admit(prompt)`` -> (slot, last logits (vocab,), ``PrefixHit``). The slot decodes,
    speculates, rolls back and retires through the engine as any other.
    """

    def __init__(
        self, engine, block_size=None, budget_bytes=None, eviction=DEFAULT_EVICTION, resume="match"
    ):
        if not isinstance(engine, DecodeEngine):
            raise TypeError(f"engine: expected a DecodeEngine, got {given(engine)}")
        if eviction not in PREFIX_EVICTION:
            raise ValueError(f"eviction: expected one of {PREFIX_EVICTION}, got {eviction!r}")
        if resume not in ("match", "chunk"):
            raise ValueError(f"resume: expected 'match' or 'chunk', got {resume!r}")
        for l, pool in engine.ssm.items():
            if pool.log and not pool.seats_from_log:
                raise ValueError(
                    f"use_kernels: the prefix cache seats slots from the spec's input fields "
                    f"or its log fields {pool.spec.log_fields}, but layer {l}'s spec names no "
                    f"input fields and its Triton replay "
                    f"log ({pool.spec.family}) keeps {tuple(pool.log)}; build the engine with "
                    f"use_kernels=False for a prefix cache"
                )
        self.engine, self.strategy, self.eviction = engine, engine.strategy, eviction
        self.max_len = engine.max_len
        self.vocab_size = engine.cfg.vocab_size
        allowed = allowed_block_sizes(engine)
        b = as_int("block_size", engine.L if block_size is None else block_size)
        if b not in allowed:
            raise ValueError(
                f"block_size: the engine's {self.strategy} strategy serves block sizes "
                f"{engine.policy.block_rule()}: {_sizes(allowed)}; got {b}"
            )
        self.block_size = self.interval = b
        C = engine.prefill_chunk
        if resume == "chunk" and self.strategy == "replay":
            if b % C:
                raise ValueError(
                    f"resume='chunk' resumes on the prefill's chunk grid: block_size={b} must "
                    f"be a multiple of the engine's prefill_chunk={C}"
                )
            if C % engine.L:
                raise ValueError(
                    f"resume='chunk' resumes on the prefill's chunk grid: the engine's "
                    f"prefill_chunk={C} must be a multiple of its log_length L={engine.L}"
                )
            for l, pool in engine.ssm.items():
                if not pool.spec.input_fields:
                    raise ValueError(
                        f"resume='chunk' rescans a block from its inputs; layer {l}'s spec "
                        f"({pool.spec.family}) names no input fields; use resume='match'"
                    )
        self.resume = resume
        self.resume_step = C if resume == "chunk" and self.strategy == "replay" else 1
        self.block_bytes = self._block_bytes()
        self._init_tree(budget_bytes)

    # --- sizes and validation ----------------------------------------------------------------
    def _block_bytes(self) -> int:
        """Bytes of one full node, from the pools' shapes: KV rows, state + conv window, and
        replay's b node entries (``RecurrentPool.node_layout``) (``tests/test_engine_prefix.py`` checks a real node's); sets
        ``block_log_bytes`` to the last part."""
        e, b = self.engine, self.block_size
        kv = sum(2 * p.k[0, :, :b].numel() * p.k.element_size() for p in e.kv.values())
        state = sum(
            p.state[0].numel() * p.state.element_size() + p.conv[0].numel() * p.conv.element_size()
            for p in e.ssm.values()
        )
        log = sum(b * _entry_bytes(p) for p in e.ssm.values() if p.log)
        self.block_log_bytes = log
        return kv + state + log

    @property
    def max_prompt(self) -> int:
        return self.engine.max_len - 1

    def _length_error(self, n) -> str:
        return (
            f"prompt: expected 1..{self.max_prompt} tokens (fewer than the engine's max_len="
            f"{self.max_len}), got {n}"
        )

    # --- admission ---------------------------------------------------------------------------
    @torch.no_grad()
    def admit(self, prompt):
        """Admit ``prompt`` ((T,) or (1, T) ids, or a list) into the engine's lowest free slot,
        reusing the longest prefix the tree holds; insert its blocks and evict to the budget.
        Returns (slot, the last logits (vocab,), ``PrefixHit``). Raises, with the engine and
        the tree unchanged, for bad ids or length or when every slot is in use."""
        tokens = self._check_prompt(prompt)
        e = self.engine
        e.free_slot()  # raises when every slot is in use
        plan = self._plan(tokens)
        ids = _upload(tokens, e.device)
        slot = e._claim()
        carried = self._seat(slot, plan)
        record = {}
        logits = e._prefill(
            slot, ids, start=plan.resumed, carried=carried, block=self.block_size, record=record
        )
        e._go_live(slot, len(tokens))
        hit = self._hit(len(tokens), plan)
        self._insert(
            tokens, lambda seg, g, parent: self._make_node(seg, g, parent, slot, plan, record)
        )
        self._evict_to_budget()
        return slot, logits, hit

    @torch.no_grad()
    def begin_admit(self, prompt):
        """``admit`` a chunk at a time, for interleaved prefill: claim the lowest free slot,
        seat it with the longest prefix the tree holds and return a ``PrefixAdmission``
        (``serving.admission.Admission``: ``advance(n)`` prefills the next n tokens; its
        ``hit`` is the ``PrefixHit``). The prompt's blocks are inserted when its last chunk is
        in. Raises, with the engine and the tree unchanged, as ``admit`` does."""
        tokens = self._check_prompt(prompt)
        e = self.engine
        e.free_slot()  # raises when every slot is in use
        plan = self._plan(tokens)
        slot = e._claim()
        carried = self._seat(slot, plan)
        for node in plan.path:  # in use until the prompt is in: the last eviction candidates
            node.last_used = next(self._clock)
        e.prefilling.add(slot)
        e.pos[slot] = e.max_len  # parked while it prefills (serving.admission)
        ids = _upload(tokens, e.device)
        return PrefixAdmission(self, slot, ids, tokens, plan, carried)

    def _seat(self, slot, plan):
        """Write the held prefix [0, r) into ``slot`` (see the module docstring); returns
        replay's state at r per layer (what the prefill's scan carries from there)."""
        e, b = self.engine, self.block_size
        path, r, j = plan.path, plan.r, plan.j
        upto = r + j
        blocks = [node for node in path if node.start < upto]  # blocks 0, 1, ... up to upto
        ends = [min(node.end, upto) - node.start for node in blocks]
        if sum(ends) != upto:
            raise RuntimeError(f"the seat's blocks hold {sum(ends)} positions, not {upto}")
        for layer, pool in e.kv.items():
            if not blocks:
                break
            for i, rows in enumerate((pool.k, pool.v)):  # one launch each, not one a block
                parts = [node.kv[layer][i][:, :, :n] for node, n in zip(blocks, ends)]
                torch.cat(parts, 2, out=rows[slot : slot + 1, :, :upto])
        state = self._grid_state(path, r)  # layer -> LayerState (1, ...), None at 0: zeros
        c = e.policy.seat_point(upto, r)  # replay: the decode grid's fold position
        one = slice(slot, slot + 1)
        carried = {}
        for layer, pool in e.ssm.items():  # the tree's tensors are read, never written
            ssm = state[layer].ssm if state else torch.zeros_like(pool.state[one])
            conv = state[layer].conv if state else torch.zeros_like(pool.conv[one])
            if j and self.resume_step > 1:  # as the prefill scanned [r, upto): its bits
                held = path[r // b].log[layer]
                ssm, conv = e.policy.seat_layer_by_scan(pool, held, ssm, conv, j, self.resume_step)
                carried[layer] = ssm
            else:
                ssm, conv, carried[layer] = e.policy.seat_layer(
                    pool, layer, path, b, ssm, conv, r, c, upto, j, slot
                )
            pool.state[one] = ssm
            pool.conv[one] = conv
        e.policy.seat_cursor(slot, upto, c)
        e.pos[slot] = upto
        return carried

    def _make_node(self, seg, g, parent, slot, plan, record):
        """The node of tokens ``seg`` at g, copied out of ``slot`` after its prefill: KV rows,
        the end state the prefill recorded (full blocks), replay's entries (those before the
        resumed position from the tree's node the slot was seated from, the rest recorded)."""
        e, b = self.engine, self.block_size
        end = g + len(seg)
        node = _Node(g, tuple(seg), parent)
        for layer, pool in e.kv.items():
            node.kv[layer] = (
                pool.k[slot : slot + 1, :, g:end].clone(),
                pool.v[slot : slot + 1, :, g:end].clone(),
            )
        if len(seg) == b:  # the prefill's copies, the record's alone
            node.end_state = dict(record["states"][end])
        e.policy.node_log(node, g, end, b, plan, record)
        return node


class PrefixAdmission(Admission):
    """A prompt seated from a prefix cache's tree and prefilled a chunk at a time (made by
    ``EnginePrefixCache.begin_admit``): ``done`` starts at the resumed position, ``hit`` is the
    ``PrefixHit``, and the prompt's blocks go into the tree (then the budget is enforced) when
    the last chunk is in. ``inserted``: whether they did; not when a node the seat came from
    was evicted while the prompt prefilled (its blocks could not be rebuilt from the slot)."""

    def __init__(self, cache, slot, ids, tokens, plan, carried):
        super().__init__(cache.engine, slot, ids)
        self.cache, self.tokens, self.plan = cache, tokens, plan
        self.done = plan.resumed
        self._carried = carried
        self.hit = cache._hit(len(tokens), plan)
        self.inserted = False
        self._record, self._entries = {"states": {}}, []

    def advance(self, n) -> bool:
        """``Admission.advance``; under ``resume="chunk"`` a chunk must end on a multiple of the
        engine's prefill_chunk or at the prompt's end (the blocks it inserts are then
        prefilled as a cold admission's are), else it is refused before anything runs."""
        step = self.cache.resume_step
        if step > 1 and not (self.finished or self.aborted):
            end = min(self.T0, self.done + as_int("n", n, low=1))
            if end < self.T0 and end % step:
                raise ValueError(
                    f"n: under resume='chunk' a chunk ends on a multiple of the engine's "
                    f"prefill_chunk={step} or at the prompt's end ({self.T0}); {n} tokens from "
                    f"{self.done} end at {end}"
                )
        return super().advance(n)

    def _prefill_to(self, end):
        record = {}
        logits = self.engine._prefill(
            self.slot, self.prompt[:end], start=self.done, carried=self._carried,
            block=self.cache.block_size, record=record,
        )  # fmt: skip
        self._record["states"].update(record["states"])
        if "entries" in record:  # copies: a lone chunk's are views of its projections
            self._entries.append(
                {l: {k: t.clone() for k, t in f.items()} for l, f in record["entries"].items()}
            )
        return logits

    def _finished(self):
        cache, plan = self.cache, self.plan
        if self._entries:  # replay: every prefilled token's entries, chunk after chunk
            self._record["entries"] = {
                layer: {k: torch.cat([c[layer][k] for c in self._entries], 1) for k in fields}
                for layer, fields in self._entries[0].items()
            }
        held = {id(n) for n in cache.nodes()}
        seated = [n for n in plan.path if n.start < plan.resumed]
        folded = plan.path[plan.r // cache.block_size] if plan.j else None
        if any(id(n) not in held for n in seated) or (folded is not None and folded.log is None):
            return  # evicted while prefilling: this prompt teaches the tree nothing
        cache._insert(
            self.tokens,
            lambda seg, g, parent: cache._make_node(seg, g, parent, self.slot, plan, self._record),
        )
        cache._evict_to_budget()
        self.inserted = True
