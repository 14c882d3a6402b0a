"""The serving engine: preallocated pools indexed by slot, every slot at its own position,
steps of a per-slot number of tokens, per-slot rollback, sequences admitted and retired between
steps, under any registered strategy, with steps captured in CUDA graphs.

``DecodeEngine`` ties the parts together and checks every input before anything changes:

    serving.slots        SlotTable: host positions, counts, the rollback cursor, device uploads
    serving.pools        the buffers of each recurrent layer (by family) and attention layer
    serving.strategies   one class per strategy: its buffers, save, rollback and fold
    serving.runner       ModelRunner: the reference forward and CUDA graphs
    serving.fused        the fused forward (GPU kernels)
    serving.prefill      a prompt through the pools, a chunk at a time
    serving.batched_admission  short prompts admitted together, in one prefill
    serving.provisional  a draft engine's steps given back (replay)
    serving.speculation  batched speculative decoding and acceptance

A step takes (S, T) tokens for S slots and a count per slot (1 <= count <= T): a slot's tokens
past its count are padding, computed and thrown away; slots not in the step get count 0 and are
left as they were.

Glossary: S slots in a step, T tokens per step (1 decode, k + 1 verify), L log length, bucket:
the captured batch size (slots 0 .. bucket-1 run; a graph per (bucket, T)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaylab.serving.batched_admission import admit_many
from replaylab.serving.checks import (
    check_prompt,
    check_prompts,
    check_slot,
    check_slots,
    check_step,
    per_slot,
)
from replaylab.serving.cursor import provisional_room
from replaylab.serving.layouts import (
    DEFAULT_SNAPSHOT_HINT,
    LAYER_KINDS,
    default_strategy,
    fused_reason,
    paths,
    unsupported_reason,
)
from replaylab.serving.pools import KVPool, recurrent_pool
from replaylab.serving.prefill import prefill as run_prefill
from replaylab.serving.prefill import prefill_many
from replaylab.serving.provisional import provisional
from replaylab.serving.runner import ModelRunner
from replaylab.serving.slots import SlotTable
from replaylab.serving.speculation import check_drafters, check_k, speculate_batch
from replaylab.serving.strategies import STRATEGIES, strategy_class
from replaylab.serving.validate import as_int, as_token_ids
from replaylab.validation import as_flag, check_hybrid_model

__all__ = [
    "DecodeEngine",
    "EngineStats",
    "STRATEGIES",
    "AUTO_LOG_LENGTH",
    "LAYER_KINDS",
    "unsupported_reason",
    "fused_reason",
]

# "auto" L: lowest amortised decode cost at every batch of `bench kernels` (bench_kernels.json)
AUTO_LOG_LENGTH = 16


@dataclass
class EngineStats:
    steps: int = 0
    verify_steps: int = 0
    folds: int = 0  # grid points a slot's checkpoint moved past (L entries each; a prefill
    # chunk that ends on the grid moves it by its scan, with no fold launch)
    folded_tokens: int = 0
    rollbacks: int = 0  # slots rolled back
    reruns: int = 0  # recompute: forwards that re-ran kept tokens
    rerun_tokens: int = 0
    graph_replays: int = 0
    graph_captures: int = 0  # CUDA graphs captured: steps (each after two eager runs), rollbacks
    admitted: int = 0
    retired: int = 0


def _table_field(name, doc):
    return property(lambda self: getattr(self.table, name), doc=doc)


class DecodeEngine:
    """Decode and verify for up to ``max_batch`` sequences of at most ``max_len`` tokens each.

    model: a ``HybridLM`` (any layout of ``LAYER_KINDS``, on either path). strategy: a name
    of ``serving.strategies`` ("snapshot", "recompute", "replay"; default
    ``layouts.default_strategy``: snapshot for Mamba-1 layouts with the kernels, replay
    otherwise). log_length: replay's L, or "auto" (``AUTO_LOG_LENGTH``). max_verify: the most
    tokens one step may take (k + 1). log_capacity: replay's log ring rows per slot, L
    (default: a step never passes the fold grid, so a verify just before a fold takes fewer
    drafts) up to L + min(max_verify - 1, L) (a verify may pass the grid, its fold waits for the
    next step; at L + max_verify - 1 drafts never shrink; (capacity - L) entries more per slot,
    and with the kernels a second state per slot). Bit-exact: a verify row past the grid is
    computed from the checkpoint after the slot's first L entries, folded into a scratch state
    by decode's fold, as a decode step there would read it (a second fold and replay launch per
    layer and step); opt-in until timed on a GPU. use_kernels: replay through each family's
    Triton kernels, for the whole bucket at once (default: on a GPU). graphs: capture each
    (bucket, T) step in a CUDA graph (default: on a GPU, where the strategy's steps read no
    host value). fused: the fused decode kernels (``serving.fused``; default: on a GPU, for
    NemotronH layouts; Bamba's, Jamba's, Qwen3-Next's and Qwen3.5's opt-in). matmul: "row_invariant"
    (``kernels.matmul.linear`` and ``serving.invariant``: a row's bits do not depend on the row
    count, so a verify rounds as decode steps do; default on a GPU) or "torch" (default on CPU).
    prefill_chunk: prompt tokens run through the model at once.
    prefill_kernels: the prompt chunks' recurrent scan through the family's Triton kernel
    (Mamba-2: ``kernels.ssd_chunked``, and its conv through ``kernels.conv`` in the prefill
    and a replay seat; Mamba-1: ``kernels.s6_scan``; Gated DeltaNet:
    ``kernels.gdn_scan``, with replay's corrected updates in the same launch) under every
    strategy, and on the fused path the chunks through its norm and MLP kernels; with any of
    these, every attention layer's prefill in one call of torch's fused attention. True: every
    family's; default: on a GPU, the families whose pools say ``prompt_kernel_default``
    (Mamba-2; the others' are opt-in until timed in the engine), the fused attention (every
    layout) and, on the fused path, its norm and MLP kernels (``serving.prefill._chunk_fused``);
    on CPU, off.
    step_kernels: with ``use_kernels``, snapshot's and recompute's state update of the whole
    bucket in one launch of the family's step kernel (``state_update`` in ``kernels.mamba1``,
    ``kernels.decode``, ``kernels.gdn``) instead of the spec's token loop on the reference
    path (the fused path's Mamba-2 layers always run ``kernels.decode.state_update``). True or
    default: every family's (the pools' ``step_kernel_default``); False: none.
    batch_invariant: the recurrent kernels launch alike at every batch (default), so a slot's
    bits do not depend on which other slots share its steps; False: the Mamba-2 launches tuned
    per batch (``kernels.mamba2.LAUNCH``, ``kernels.decode.LAUNCH_STATE_UPDATE``).
    batched_admission: ``admit_many`` prefills its short prompts in one pass, ``admit`` a lone
    one the same way, with row-invariant products (``serving.batched_admission``). Default
    False (each prompt alone, torch's products): opt-in until timed on a GPU.

    >>> engine = DecodeEngine(model, max_batch=4, max_len=256)       # doctest: +SKIP
    >>> slot, logits = engine.admit(prompt)    # (T0,) -> a slot and its last logits (vocab,)
    >>> logits = engine.step(tokens, counts)   # (S, T), (S,) -> (S, T, vocab)
    >>> engine.rollback(keep)                  # keep the first keep[i] tokens of the last step
    >>> engine.retire(slot)
    """

    def __init__(
        self,
        model,
        max_batch,
        max_len,
        strategy=None,
        log_length=16,
        max_verify=5,
        use_kernels=None,
        graphs=None,
        fused=None,
        matmul=None,
        prefill_chunk=256,
        batch_invariant=True,
        prefill_kernels=None,
        log_capacity=None,
        step_kernels=None,
        batched_admission=False,
    ):
        check_hybrid_model(model)
        cfg = model.cfg
        switches = dict(use_kernels=use_kernels, graphs=graphs, fused=fused,
                        prefill_kernels=prefill_kernels, step_kernels=step_kernels)  # fmt: skip
        strict = dict(batch_invariant=batch_invariant, batched_admission=batched_admission)
        for name, value in (*switches.items(), *strict.items()):
            if not (isinstance(value, bool) or (value is None and name not in strict)):
                allowed = "True or False" if name in strict else "None, True or False"
                raise ValueError(f"{name}: expected {allowed}, got {value!r}")
        chosen = strategy is None
        if chosen:  # use_kernels' default, as ``paths`` fills it in
            kernels = next(model.parameters()).is_cuda if use_kernels is None else use_kernels
            strategy = default_strategy(cfg, bool(kernels) and step_kernels is not False)
        # what the errors of replay-only features add when the engine chose snapshot itself
        self.strategy_hint = DEFAULT_SNAPSHOT_HINT if chosen and strategy == "snapshot" else ""
        kind = strategy_class(strategy)
        reason = unsupported_reason(cfg)
        if reason:
            raise ValueError(f"DecodeEngine: {reason}; use the teaching HybridCache")
        self.max_batch = as_int("max_batch", max_batch, low=1)
        self.max_len = as_int("max_len", max_len, low=2)
        self.L = as_int(
            "log_length", AUTO_LOG_LENGTH if log_length == "auto" else log_length, low=1
        )
        self.max_verify = as_int("max_verify", max_verify, low=1)
        self.prefill_chunk = as_int("prefill_chunk", prefill_chunk, low=1)
        self.batch_invariant, self.batched_admission = batch_invariant, batched_admission
        param = next(model.parameters())
        self.model, self.cfg, self.strategy = model, cfg, strategy
        self.dtype, self.device = param.dtype, param.device
        self.use_kernels, self.graphs, self.fused, self.matmul = paths(
            kind, cfg, self.device, use_kernels, graphs, fused, matmul
        )
        slots, Tm = self.max_batch, self.max_verify
        self.capacity = self._log_capacity(log_capacity, kind)  # log ring rows per slot
        layers = model.model.layers
        shape = (slots, kind, self.capacity, Tm, self.dtype, self.device, self.fused)
        self.ssm = {  # one pool per recurrent layer, from its spec
            l: recurrent_pool(layers[l].mixer, *shape, self.use_kernels)
            for l in cfg.recurrent_layers
        }
        for pool in self.ssm.values() if self.batch_invariant else ():
            pool.launch = pool.batch_invariant_launch()
        cuda = self.device.type == "cuda"
        self.prefill_kernels = cuda if prefill_kernels is None else prefill_kernels
        for pool in self.ssm.values():
            wanted = pool.prompt_kernel_default if prefill_kernels is None else True
            pool.prompt_kernel = self.prefill_kernels and wanted and pool.serves_prompt_kernel
            wanted = pool.step_kernel_default if step_kernels is None else bool(step_kernels)
            served = self.use_kernels and pool.serves_step_kernel and not kind.logged
            pool.step_kernel = wanted and served
        self.kv = {
            l: KVPool(cfg, slots, max_len + Tm, self.dtype, self.device) for l in cfg.attn_layers
        }
        self.table = SlotTable(slots, Tm, self.L, kind.logged, self.device, self.capacity)
        self.policy = kind(self)
        self.runner = ModelRunner(self)
        self.stats = EngineStats()
        self._limits = {}  # slot -> the position ``provisional`` lets it reach

    def _log_capacity(self, log_capacity, kind):
        """Replay's ring rows per slot: L .. L + min(max_verify - 1, L) (default L)."""
        if log_capacity is None:
            return self.L
        if not kind.logged:
            raise ValueError(
                f"log_capacity: only replay keeps a log; the {self.strategy!r} strategy takes "
                f"none (leave log_capacity=None), got {log_capacity!r}{self.strategy_hint}"
            )
        top = self.L + min(self.max_verify - 1, self.L)
        return as_int("log_capacity", log_capacity, self.L, top)

    # --- the slot table's views (lists shared with it) -------------------------------------
    live = _table_field("live", "Whether each slot holds a decoding sequence.")
    prefilling = _table_field("prefilling", "Slots claimed by an unfinished ``begin_admit``.")
    pos = _table_field("pos", "Tokens each slot holds (its next token's position).")
    log_len = _table_field("log_len", "Replay: entries in each slot's log since its checkpoint.")
    head = _table_field("head", "Replay: where each slot's log ring starts.")
    last = _table_field("last", "Tokens each slot took in the last step.")
    buckets = _table_field("buckets", "The captured batch sizes.")
    slots = _table_field("slots", "The live slots, in order.")
    batch = _table_field("batch", "The number of live slots.")
    n_free = _table_field("n_free", "Slots an admission may claim: neither live nor prefilling.")
    _meta = _table_field("meta", "The per-slot numbers a step reads (5, slots) int32.")
    _pos = _table_field("pos_d", "The positions a step reads (slots,).")
    _last_tokens = _table_field("last_tokens", "Recompute: the last step's tokens.")
    _graphs = property(lambda self: self.runner.captured, doc="The captured CUDA graphs.")

    @property
    def position(self):
        """The position every live slot is at (lock-step use); an error if they differ."""
        at = {self.pos[s] for s in self.slots}
        if len(at) != 1:
            raise ValueError(f"position: the live slots are at positions {sorted(at)}")
        return at.pop()

    def room(self, slot):
        """The most tokens ``slot`` may take in its next step: max_verify, and under replay no
        more than its log ring holds after the step's fold (with log_capacity L: no more than
        are left before its next fold, so a step never crosses the fold grid)."""
        return self.policy.room(check_slot(self, slot))

    def nbytes_per_slot(self):
        """Bytes one slot holds in the pools (state, windows, logs or copies, KV)."""
        return sum(p.nbytes_per_slot() for p in (*self.ssm.values(), *self.kv.values()))

    # --- admission and retirement -------------------------------------------------------
    @torch.no_grad()
    def admit(self, prompt):
        """Prefill ``prompt`` (T0,) or (1, T0) into the lowest free slot; returns (slot, the
        last logits (vocab,)). Raises if every slot is in use or T0 >= max_len."""
        prompt = check_prompt(self, prompt)
        slot = self._claim()
        if self.batched_admission and prompt.numel() <= self.prefill_chunk:
            logits = prefill_many(self, [slot], [prompt.to(self.device)])[0]
        else:
            logits = self._prefill(slot, prompt.to(self.device))
        self._go_live(slot, prompt.numel())
        return slot, logits

    @torch.no_grad()
    def admit_many(self, prompts):
        """Prefill each of ``prompts`` (a list of (T0,) or (1, T0) ids) into the lowest free
        slots, in order; returns a list of (slot, the last logits (vocab,)); with
        ``batched_admission`` the short ones in one pass (``serving.batched_admission``)."""
        return admit_many(self, prompts)

    def begin_admit(self, prompt):
        """Claim the lowest free slot for ``prompt`` (T0,) or (1, T0) and return an
        ``Admission`` that prefills it a chunk at a time (``serving.admission``)."""
        from replaylab.serving.admission import Admission

        prompt = check_prompt(self, prompt)
        slot = self._claim()
        self.prefilling.add(slot)
        self.pos[slot] = self.max_len  # parked while it prefills (serving.admission)
        return Admission(self, slot, prompt.to(self.device))

    def free_slot(self):
        """The slot the next ``admit`` takes (the lowest free one); raises if none is free."""
        free = self.table.free()
        if not free:
            raise ValueError(
                f"admit: all max_batch={self.max_batch} slots are in use ({self.batch} live, "
                f"{len(self.prefilling)} prefilling); retire one first"
            )
        return free[0]

    def _claim(self):
        """The lowest free slot, its pools cleared and its host values at zero (not yet live)."""
        slot = self.free_slot()
        # so a new tenant starts from nothing of the last one: one multi-tensor call per dtype
        # (a list of mixed dtypes takes the one-launch-per-tensor path on a GPU)
        by_dtype = {}
        for pool in (*self.ssm.values(), *self.kv.values()):
            for t in pool.slot_views(slot):
                by_dtype.setdefault(t.dtype, []).append(t)
        for views in by_dtype.values():
            torch._foreach_zero_(views)
        self.table.reset(slot)
        return slot

    def _go_live(self, slot, T0):
        """``slot``, prefilled to T0 tokens, starts decoding."""
        self.table.go_live(slot, T0)
        self.stats.admitted += 1

    def retire(self, slot):
        """Free ``slot``; its memory is cleared when the next sequence is admitted there."""
        slot = as_int("slot", slot, 0, self.max_batch - 1)
        if not self.live[slot]:
            raise ValueError(f"slot: {slot} is not live (live slots: {self.slots})")
        self.table.retire(slot)
        self._limits.pop(slot, None)  # a provisional block gives it nothing back
        self.stats.retired += 1

    def _prefill(self, slot, prompt, start=0, carried=None, block=None, record=None):
        """``serving.prefill.prefill`` of ``prompt`` (T0,) into ``slot``: the last logits."""
        return run_prefill(self, slot, prompt, start, carried, block, record)

    # --- one step -----------------------------------------------------------------------
    @torch.no_grad()
    def step(self, tokens, counts=None, slots=None, check=True):
        """Logits (S, T, vocab) of ``tokens`` (S, T) for ``slots`` (default: every live slot,
        in order), advancing slot i by ``counts[i]`` tokens (1 <= counts[i] <= T, default T;
        the rest of its row is padding). A rollback afterwards applies to this step: slots left
        out of it can no longer roll back an earlier one. ``check=False`` skips the id range
        check, which reads the ids back from the device; shapes are always checked."""
        as_flag("check", check)
        tokens, counts, slots = check_step(self, tokens, counts, slots, check)
        return self._step(tokens, counts, slots)

    def _step(self, tokens, counts, slots):
        """``step`` after its checks: ``counts`` and ``slots`` lists, tokens (S, T)."""
        T = tokens.shape[1]
        bucket = self.table.bucket(slots)
        step_counts = dict(zip(slots, counts))
        tokens = tokens.to(self.device)  # before plan_folds moves the host's lengths
        folds = self.policy.plan_folds(slots)
        self.table.upload(step_counts, folds, rows=slots)  # the runner places row i at slots[i]
        try:
            logits = self._run(tokens, bucket, bool(folds), save=True)
        except BaseException:  # the saved and draft copies are overwritten: no rollback now
            self.table.forget_last()
            raise
        self.policy.after_step(self.runner.placed, bucket, T)
        self.table.commit(step_counts)
        self.stats.steps += 1
        self.stats.verify_steps += int(T > 1)
        return logits.index_select(0, self.table.index_d[: len(slots)])

    def _run(self, tokens, bucket, folds, save):
        return self.runner.run(tokens, bucket, folds, save)

    def rollback(self, keep, slots=None):
        """Keep the first ``keep[i]`` tokens of the last step of ``slots[i]`` (an int: the same
        for every slot; 1 <= keep <= that slot's tokens in the last step) and drop the rest."""
        slots = check_slots(self, slots)
        lasts = [self.last[s] for s in slots]
        for s, n in zip(slots, lasts):
            if n == 0:
                raise ValueError(f"keep: slot {s} took no tokens in the last step: nothing to keep")
        self._rollback(per_slot("keep", keep, slots, 1, lasts), slots)

    def _rollback(self, keep, slots):
        """``rollback`` after its checks: ``keep`` and ``slots`` lists."""
        dropped = [(s, k) for s, k in zip(slots, keep) if k < self.last[s]]
        if not dropped:
            return
        pair = torch.tensor([[s for s, _ in dropped], [k - 1 for _, k in dropped]])
        if self.graphs and self.policy.rollback_graphable:  # one launch for every pool
            self.runner.graph_rollback(pair, self.table.bucket(pair[0].tolist()))
        else:
            pair = pair.to(self.device)  # one copy to the device, not two
            self.policy.rollback(pair[0], pair[1])
        self.table.rollback(dropped)
        self.stats.rollbacks += len(dropped)
        self.policy.after_rollback(dropped)

    def provisional_room(self, slot):
        """Tokens ``slot`` may take inside ``provisional``: up to its next fold after the one
        its held log may need (replay), and up to max_len."""
        slot = check_slot(self, slot)
        return provisional_room(
            self.pos[slot], self.log_len[slot], self.L, self.max_len, self.capacity
        )

    def provisional(self, slots):
        """Steps of ``slots`` inside the block are given back when it ends (a context manager
        yielding each slot's room; replay only): ``serving.provisional``."""
        return provisional(self, slots)

    # --- lock-step workloads and speculation ---------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts):
        """Retire every slot and admit the rows of ``prompts`` (B, T0) into slots 0 .. B-1;
        returns their last logits (B, vocab)."""
        prompts, _ = check_prompts(self, prompts)
        for s in self.slots:
            self.retire(s)
        return torch.stack([self.admit(p)[1] for p in prompts])

    @torch.no_grad()
    def greedy(self, prompts, n_new):
        """Greedy decoding of ``n_new`` tokens after ``prompts`` (B, T0): (B, n_new)."""
        prompts, n_new = check_prompts(self, prompts, n_new)
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
        k = check_k(self, k)
        prompt = as_token_ids("prompt", prompt, self.cfg.vocab_size, (1, "T0"))
        prompt, n_new = check_prompts(self, prompt, n_new, name="prompt")
        check_drafters([drafter], 1)
        pending = self.prefill(prompt).argmax(-1, keepdim=True)
        return self.speculate(prompt, pending, n_new, drafter, k)

    @torch.no_grad()
    def speculate(self, prompt, pending, n_new, drafter, k=4):
        """The decode part of ``speculative``, after ``prefill(prompt)`` gave the first token
        ``pending`` (1, 1): (tokens (1, n_new), proposed, accepted)."""
        prompt = as_token_ids("prompt", prompt, self.cfg.vocab_size, (1, "T0"))
        tokens, proposed, accepted = self.speculate_batch([prompt[0]], pending, n_new, [drafter], k)
        return tokens[0][None], proposed[0], accepted[0]

    @torch.no_grad()
    def speculate_batch(self, prompts, pending, n_new, drafters, k=4, slots=None, on_device=False):
        """Speculative decoding of the live ``slots`` (default: all) together, each sequence
        accepting its own number of drafts per round (``serving.speculation``): ``prompts``
        (list of (T0,)), ``pending`` (S, 1) or (S,) their first tokens, ``drafters`` one per
        sequence (``propose``) or one batched drafter for all (``serving.drafters``). A
        round verifies fewer drafts before a fold (replay) and near max_len. Returns (list of
        (n_new,) tokens on the engine's device, proposed, accepted), the last two per sequence.
        Everything is checked before the first step; a drafter's proposal before the step of
        its round, so a bad one is refused with the rounds before it kept. ``on_device``:
        every part of a round on the engine's device, the host reading the progress a round
        late (``serving.device_rounds``; replay with its kernels, one drafter with
        ``propose_on_device``); there a draft's type and shape are checked before the first
        step, and an id outside the vocabulary is verified as id 0 and refused when its round
        is read, with the rounds run kept."""
        return speculate_batch(self, prompts, pending, n_new, drafters, k, slots, on_device)
