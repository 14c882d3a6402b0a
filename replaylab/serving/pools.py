"""Preallocated memory of the serving engine, one row per slot (a slot holds one sequence).

Per recurrent layer (``RecurrentPool``: Mamba-2, Mamba-1, Gated DeltaNet, any layer with a
``RecurrentSpec``), shapes from the layer's spec:
    state        (slots, *state_shape) fp32   snapshot / recompute: the current state;
                                              replay: the checkpoint S_c
    conv         (slots, K, C)                the current conv window (every strategy)
    draft_conv   (slots, T_max, K, C)         the window after each token of the last step
    log[field]   (slots, L, ...)              replay: the spec's log entries since the
                                              checkpoint, a ring (entry i of slot s at row
                                              (head[s] + i) % L); fields, shapes and dtypes
                                              from a one-token probe of the mixer
    draft_state  (slots, T_max, *state_shape) snapshot: the state after each token of the
                                              last step
    saved_state  (slots, *state_shape)        recompute: the state before the last verify
    saved_conv   (slots, K, C)                recompute: the window before it
Snapshot and recompute through the Triton kernels (the engine's ``step_kernels``, with
``use_kernels``): a family whose pool says ``serves_step_kernel`` (Mamba-1:
``kernels.mamba1.state_update``; Mamba-2: ``kernels.decode.state_update``, the fused path's;
Gated DeltaNet: ``kernels.gdn.state_update``) steps the state of the whole bucket in one launch
instead of the spec's token loop (``step``); by default those whose pools say
``step_kernel_default`` (all three, each timed in the engine against the token loop; each
launched alike at every batch, Mamba-2's under the engine's ``batch_invariant``).
Replay through the Triton kernels (``kernels=True``): each family's pool calls its kernels,
batched over the slots of a step (``replay``: outputs from checkpoint + log, the new entries
appended to the ring, no state written; ``fold``: L entries into the checkpoint), and its log
keeps what they read:
    Mamba-2 (``Mamba2Pool``, ``kernels.mamba2``)      the spec's fields (xBC, x, dt, B, C); on
                                                      the fused path x, dt, B, C only (the fused
                                                      conv keeps the window in ``conv``); also
                                                      the conv weights the fused path reads
    Mamba-1 (``Mamba1Pool``, ``kernels.mamba1``)      x, dt, B (bf16 / the activations' dtype)
    Gated DeltaNet (``GDNPool``, ``kernels.gdn``)     k, the corrected update u = β(v − α Sᵀk)
                                                      (fp32) and g = log α (fp32)
The Mamba kernels log some of the spec's fields, which the spec's fold reads; Gated
DeltaNet's u is no spec field. u depends on the state before each token, so a prefill computes
it (``logged_scan``: ``GatedDeltaNetSpec.scan_with_updates``, or with the engine's
``prefill_kernels`` ``kernels.gdn_scan.gdn_prompt_scan`` in the scan's own launch), and so does a
prefix cache's seat from the node's inputs and the state at the block's start
(``seats_from_log``).
Per attention layer (``KVPool``): k, v (slots, Hkv, max_len + T_max, Dh); rows past a slot's
position are padding that the next step overwrites before any token reads it.

Glossary: K = d_conv - 1, C conv channels, T_max = max_verify, L = log_length.
"""

from __future__ import annotations

import torch

__all__ = ["RecurrentPool", "Mamba2Pool", "Mamba1Pool", "GDNPool", "KVPool", "recurrent_pool"]


class _Probe:
    """A cache for one token of one mixer: records what the mixer hands its layer's
    ``advance`` and the log entries the spec derives from it (``entries``)."""

    def __init__(self, spec, dtype, device):
        self.spec, self.dtype, self.device, self.entries = spec, dtype, device, None

    def layer(self, index):
        return self

    def advance(self, **inputs):
        zero = self.spec.zero_state(1, self.dtype, self.device)
        self.inputs = inputs
        self.entries = self.spec.prepare(zero.conv, inputs)
        return self.spec.scan(zero.ssm, self.entries).y


@torch.no_grad()
def log_entry_shapes(mixer, dtype, device):
    """field -> (shape of one token's entry, dtype), for each field the spec logs and each of
    its ``input_fields``: one token of zeros through the mixer, with a cache that records the
    inputs and the entries."""
    spec = mixer.state_spec
    probe = _Probe(spec, dtype, device)
    mixer(torch.zeros(1, 1, mixer.cfg.hidden_size, dtype=dtype, device=device), probe)
    seen = {**probe.inputs, **probe.entries}
    return {
        f: (tuple(seen[f].shape[2:]), seen[f].dtype)
        for f in dict.fromkeys((*spec.log_fields, *(spec.input_fields or ())))
    }


class RecurrentPool:
    """The pools of one recurrent layer under ``strategy`` (a name or a class of
    ``serving.strategies``, which adds its own buffers; see the module docstring), built from
    its mixer's ``state_spec`` alone. ``fused``: the engine's fused path; ``kernels``:
    replay through the family's Triton kernels (a family without them, this base class,
    refuses ``kernels=True``)."""

    serves_kernels = False  # whether the family's pool runs replay through Triton kernels
    serves_prompt_kernel = False  # whether it scans prompt chunks in one Triton launch
    serves_step_kernel = False  # whether snapshot's and recompute's token loop has a kernel
    step_kernel_default = False  # whether the engine's default (with its kernels) uses it
    prompt_kernel_default = False  # whether the engine's default (on a GPU) uses it
    kernel_fields = ()  # the log fields the kernels append themselves

    def __init__(
        self, mixer, slots, strategy, log_capacity, max_verify, dtype, device, fused, kernels=False
    ):
        if isinstance(strategy, str):
            from replaylab.serving.strategies import strategy_class

            strategy = strategy_class(strategy)
        self.mixer, self.spec = mixer, mixer.state_spec
        self.dtype, self.device = dtype, device
        self.kernels = strategy.replays_with_kernels(kernels)
        # snapshot / recompute: the state read and written every token through the family's
        # Triton step (``step``) instead of the spec's token loop (the engine's step_kernels)
        self.step_kernel = False
        self.prompt_kernel = False  # prompt chunks through the family's Triton scan (the
        # engine's prefill_kernels)
        self.launch = {}  # kernel -> launch keywords (the engine's batch_invariant sets them)
        if self.kernels and not self.serves_kernels:
            raise ValueError(
                f"kernels: no Triton replay kernels for the {self.spec.family!r} family; "
                f"use use_kernels=False"
            )
        state_shape, conv_shape = tuple(self.spec.state_shape), tuple(self.spec.conv_shape)
        zeros = lambda *shape, dt=dtype: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        self.state = zeros(slots, *state_shape, dt=torch.float32)
        self.conv = zeros(slots, *conv_shape)
        self.draft_conv = zeros(slots, max_verify, *conv_shape)
        self.log = {}
        strategy.allocate(self, zeros, slots, log_capacity, max_verify, fused)

    def allocate_log(self, zeros, slots, capacity, fused):
        """The log ring (replay): ``log[field]`` (slots, capacity, ...) for each logged field."""
        entries = log_entry_shapes(self.mixer, self.dtype, self.device)
        for field in self.logged_fields(fused):
            shape, dt = self.entry_layout(entries, field)
            self.log[field] = zeros(slots, capacity, *shape, dt=dt)

    def logged_fields(self, fused):
        """The fields the log keeps: the kernels' under ``kernels``, else every field the spec
        logs."""
        return self.kernel_fields if self.kernels else self.spec.log_fields

    def _kernel_logs(self, batch):
        """The kernels' log buffers of slots 0 .. batch-1, in ``kernel_fields`` order."""
        return [self.log[k][:batch] for k in self.kernel_fields]

    def entry_layout(self, entries, field):
        """(shape, dtype) of one token's ``field``, from the probe's ``entries``."""
        return entries[field]

    def fold_chains(self, L):
        """Whether one kernel ``fold`` of G·L entries leaves the bits of G folds of L entries in
        turn (then a prefill folds all the grid points a chunk reaches in one launch)."""
        return False

    @property
    def seats_from_log(self):
        """Whether a prefix cache can seat a slot's log: its nodes keep the spec's
        ``input_fields`` (a seat derives every field from them, and a kernel's own values such
        as Gated DeltaNet's corrected updates u by the scan the prefill logs them with,
        ``logged_scan``), or the log's fields are the spec's (the Mamba kernels' x, dt, B(, C),
        which ``spec.fold`` reads)."""
        return bool(self.spec.input_fields) or set(self.log) <= set(self.spec.log_fields)

    @property
    def node_fields(self):
        """What a prefix node keeps of each prompt token: the spec's ``input_fields``, from which
        a seat off the grid derives the log's entries (``prepare`` from the window at the
        block's start) and the conv window; where the spec names none, the log's fields and
        the conv field."""
        if self.spec.input_fields:
            return self.spec.input_fields
        conv = self.spec.conv_field
        return tuple(self.log) + (() if conv in self.log else (conv,))

    def node_layout(self):
        """field -> (shape of one token's entry, dtype) for each of ``node_fields``, as the
        prefill records them: in the log's dtype where the log keeps the field."""
        shapes = log_entry_shapes(self.mixer, self.dtype, self.device)
        return {
            f: (shapes[f][0], self.log[f].dtype if f in self.log else shapes[f][1])
            for f in self.node_fields
        }

    def prepare(self, window, inputs):
        """A prefill chunk's entries derived from its layer ``inputs`` (field -> (batch, T,
        ...)) after the conv ``window`` (batch, K, C): the spec's ``prepare``, or the
        family's Triton conv (``prompt_kernel``)."""
        return self.spec.prepare(window, inputs)

    def scan_prompt(self, state, entries):
        """A prefill chunk scanned from ``state`` (batch, *state_shape) -> the spec's
        ScanResult: the spec's chunked form, or the family's Triton scan (``prompt_kernel``)."""
        return self.spec.scan_prompt(state, entries)

    def scan_prompt_into(self, state, entries):
        """``scan_prompt`` from ``state`` (a view of the pool's rows), leaving the final state
        in it -> y."""
        result = self.scan_prompt(state, entries)
        state.copy_(result.state)
        return result.y

    def logged_scan(self, state, entries):
        """``scan_prompt``, and what the log keeps of the chunk's tokens: field -> (batch, T,
        ...), by default the spec's ``entries``."""
        return self.scan_prompt(state, entries), entries

    def batch_invariant_launch(self):
        """kernel -> launch keywords that are the same at every batch, so a slot's bits do
        not depend on the batch its step runs in ({}: the family's kernels have none yet)."""
        return {}

    def replay(self, entries, rows, log_len, head, counts, state=None):
        """Outputs of the T new tokens of slots 0 .. batch-1 (``entries``: field -> (batch, T,
        ...)) from checkpoint ``state[rows]`` (default: the pool's ``state``) and the
        ``log_len`` entries of each ring (from row ``head``), no state written; appends each
        slot's first ``counts`` tokens of the ``kernel_fields`` to its ring (the rest are
        padding). All (batch,) int32 on the device; each verify row is computed as a single
        step at its position would be."""
        raise NotImplementedError

    def step(self, entries, bucket, drafts, counts):
        """The state of slots 0 .. bucket-1 stepped through the T new tokens of ``entries``
        (field -> (bucket, T, ...)) in one launch (``step_kernel``): y (bucket, T, ...); the
        state written is the one after ``counts[b]`` tokens, and with ``drafts`` (slots, T_max,
        *state_shape) the state after each token is kept."""
        raise NotImplementedError

    def fold(self, states, rows, log, fold_len, head, out=None):
        """out[rows[b]] <- the state after the first ``fold_len[b]`` entries of ``log`` (field
        -> (batch, capacity, ...), ring rows from ``head[b]``) from ``states[rows[b]]``,
        through the kernels' fold (default ``out``: ``states``, in place; a slot folding 0
        entries in place is not touched)."""
        raise NotImplementedError

    def slot_views(self, slot):
        """Every buffer's row of ``slot`` (what ``DecodeEngine`` zeroes for a new tenant)."""
        return [t[slot] for t in self._held()]

    def _held(self):
        held = [self.state, self.conv, self.draft_conv, *self.log.values()]
        return held + [
            getattr(self, n)
            for n in ("draft_state", "saved_state", "saved_conv", "grid_state")
            if hasattr(self, n)
        ]

    def nbytes_per_slot(self):
        return sum(t[0].numel() * t.element_size() for t in self._held())


class Mamba2Pool(RecurrentPool):
    """A Mamba-2 layer's pools, and its scan parameters processed once for the kernels
    (A = -exp(A_log), D, dt_bias in fp32; the engine serves frozen weights)."""

    serves_kernels = True
    serves_prompt_kernel = prompt_kernel_default = True
    # the step's launch is pinned under the engine's batch_invariant, as replay's are
    serves_step_kernel = step_kernel_default = True
    kernel_fields = ("x", "dt", "B", "C")
    # a verify's rows in one launch, each bit for bit a single step (the loop runs one compiled
    # body for every T); "exact": T launches of the one-token kernel
    verify_kernel = "per_token"

    def __init__(self, mixer, *args):
        super().__init__(mixer, *args)
        p = self.spec.params()
        self.A, self.D = p.A.detach().float(), p.D.detach().float()
        self.dt_bias, self.dt_limit = p.dt_bias.detach().float(), p.dt_limit
        self.conv_weight = mixer.conv1d.weight.detach().view(self.spec.conv_shape[1], -1)
        self.conv_bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias.detach()

    def prepare(self, window, inputs):
        if not self.prompt_kernel:
            return super().prepare(window, inputs)
        from replaylab.kernels.conv import conv_prompt

        xBC, (XP, GN, _) = inputs["xBC"], self.mixer.scan_input_widths()
        parts = conv_prompt(xBC, window, self.conv_weight, self.conv_bias, splits=(XP, GN))
        x, B, C = self.mixer.unflatten_scan_inputs(*parts)
        return dict(xBC=xBC, x=x, dt=inputs["dt"], B=B, C=C)

    def scan_prompt(self, state, entries):
        if not self.prompt_kernel:
            return super().scan_prompt(state, entries)
        return self._prompt_kernel_scan(state, entries)

    def scan_prompt_into(self, state, entries):
        if not self.prompt_kernel:
            return super().scan_prompt_into(state, entries)
        return self._prompt_kernel_scan(state, entries, out=state).y  # moved on in place

    def _prompt_kernel_scan(self, state, entries, out=None):
        """``kernels.ssd_chunked`` from ``state``; the final state written into ``out`` ((1,
        *state_shape) fp32, may be ``state``) where given."""
        from replaylab.kernels.ssd_chunked import ssd_chunked_scan

        x, dt, B, C = (entries[k] for k in ("x", "dt", "B", "C"))
        return ssd_chunked_scan(x, dt, self.A, B, C, self.D, self.dt_bias, True, self.dt_limit,
                                initial_state=state, out_state=out,
                                chunk_size=self.spec.CHUNK_SIZE)  # fmt: skip

    def step(self, entries, bucket, drafts, counts):
        from replaylab.kernels.decode import state_update

        x, dt, B, C = (entries[k].contiguous() for k in ("x", "dt", "B", "C"))
        return state_update(self.state, x, dt, B, C, self.A, self.D, self.dt_bias, self.dt_limit,
                            drafts=drafts, counts=counts,
                            **self.launch.get("state_update", {}))  # fmt: skip

    def logged_fields(self, fused):
        """x, dt, B, C for the fused kernels; the reference path keeps the conv inputs (xBC)
        too, as the teaching log does."""
        return self.kernel_fields if fused else self.spec.log_fields

    def replay(self, entries, rows, log_len, head, counts, state=None):
        from replaylab.kernels.mamba2 import replay_step

        return replay_step(
            self.state if state is None else state,
            rows,
            *self._kernel_logs(rows.shape[0]),
            log_len,
            *(entries[k] for k in self.kernel_fields),
            self.A,
            self.D,
            self.dt_bias,
            True,
            self.dt_limit,
            append=True,
            advance=False,
            check=False,
            kernel=self.verify_kernel,
            log_head=head,
            append_count=counts,  # a slot's padding and slots left out append nothing
            **self.launch.get("replay_step", {}),
        )

    def fold(self, states, rows, log, fold_len, head, out=None):
        from replaylab.kernels.mamba2 import fold

        logs = (log["x"], log["dt"], log["B"])
        fold(states, rows, states if out is None else out, rows, *logs, fold_len, self.A, self.dt_bias, True,
             self.dt_limit, check=False, log_head=head, **self.launch.get("fold", {}))  # fmt: skip

    def fold_chains(self, L):
        """The fold sums blocks of ``FOLD_BLOCK_L`` entries in turn, so block edges agree when L
        is a multiple of it."""
        from replaylab.kernels.mamba2 import FOLD_BLOCK_L

        return L % FOLD_BLOCK_L == 0

    def batch_invariant_launch(self):
        from replaylab.kernels.decode import BATCH_INVARIANT_STATE_UPDATE
        from replaylab.kernels.mamba2 import BATCH_INVARIANT

        launches = {**BATCH_INVARIANT, "state_update": BATCH_INVARIANT_STATE_UPDATE}
        return {k: dict(block_p=p, num_warps=w) for k, (p, w) in launches.items()}


class Mamba1Pool(RecurrentPool):
    """A Mamba-1 (Jamba) layer's pools; with kernels its log keeps x, dt, B (the conv window
    lives in ``conv``; C of past tokens is never read again), and A = -exp(A_log) (D, N),
    D and dt_bias are processed once in fp32."""

    serves_kernels = True
    serves_prompt_kernel = True
    serves_step_kernel = step_kernel_default = True
    kernel_fields = ("x", "dt", "B")

    def __init__(self, mixer, *args):
        super().__init__(mixer, *args)
        p = self.spec.params()
        self.A = p.A.detach().float().contiguous()
        self.D, self.dt_bias = p.D.detach().float(), p.dt_bias.detach().float()

    def scan_prompt(self, state, entries):
        if not self.prompt_kernel:
            return super().scan_prompt(state, entries)
        from replaylab.kernels.s6_scan import s6_prompt_scan

        x, dt, B, C = (entries[k] for k in ("x", "dt", "B", "C"))
        return s6_prompt_scan(x, dt, self.A, B, C, self.D, self.dt_bias, initial_state=state)

    def replay(self, entries, rows, log_len, head, counts, state=None):
        from replaylab.kernels.mamba1 import replay_step

        return replay_step(
            self.state if state is None else state,
            rows,
            *self._kernel_logs(rows.shape[0]),
            log_len,
            *(entries[k] for k in ("x", "dt", "B", "C")),
            self.A,
            self.D,
            self.dt_bias,
            log_head=head,
            append_count=counts,
            check=False,
        )

    def step(self, entries, bucket, drafts, counts):
        from replaylab.kernels.mamba1 import state_update

        x, dt, B, C = (entries[k] for k in ("x", "dt", "B", "C"))
        return state_update(self.state, x, dt, B, C, self.A, self.D, self.dt_bias, drafts=drafts,
                            counts=counts, check=False)  # fmt: skip

    def fold(self, states, rows, log, fold_len, head, out=None):
        from replaylab.kernels.mamba1 import fold

        logs = (log["x"], log["dt"], log["B"])
        fold(states, rows, states if out is None else out, rows, *logs, fold_len, self.A, self.dt_bias, log_head=head,
             check=False)  # fmt: skip

    def fold_chains(self, L):
        """The fold updates the state one entry at a time, for any L."""
        return True


class GDNPool(RecurrentPool):
    """A Gated DeltaNet (Qwen3-Next, Qwen3.5) layer's pools; with kernels its log keeps k, the
    corrected update u (H, V) fp32 and g (H,) fp32 (``kernels.gdn``)."""

    serves_kernels = True
    serves_prompt_kernel = True
    serves_step_kernel = step_kernel_default = True
    kernel_fields = ("k", "u", "g")

    def entry_layout(self, entries, field):
        if field == "u":  # not a spec field: one value row per head, fp32
            return tuple(self.spec.state_shape[::2]), torch.float32
        return entries[field]

    def _prompt_kernel_scan(self, state, entries, updates):
        from replaylab.kernels.gdn_scan import gdn_prompt_scan

        fields = (entries[f] for f in ("q", "k", "v", "g", "beta"))
        return gdn_prompt_scan(*fields, initial_state=state, return_updates=updates)

    def scan_prompt(self, state, entries):
        if not self.prompt_kernel:
            return super().scan_prompt(state, entries)
        return self._prompt_kernel_scan(state, entries, updates=False)

    def logged_scan(self, state, entries):
        if not self.kernels:
            return super().logged_scan(state, entries)
        if self.prompt_kernel:  # the outputs and u in one launch
            result = self._prompt_kernel_scan(state, entries, updates=True)
            return result, dict(entries, u=result.updates)
        result, u = self.spec.scan_with_updates(state, entries, prompt=True)  # one pass for both
        return result, dict(entries, u=u)

    def step(self, entries, bucket, drafts, counts):
        from replaylab.kernels.gdn import state_update

        q, k, v, g, beta = (entries[f] for f in ("q", "k", "v", "g", "beta"))
        return state_update(self.state, q, k, v, g, beta, drafts=drafts, counts=counts,
                            check=False)  # fmt: skip

    def replay(self, entries, rows, log_len, head, counts, state=None):
        from replaylab.kernels.gdn import replay_step

        return replay_step(
            self.state if state is None else state,
            rows,
            *self._kernel_logs(rows.shape[0]),
            log_len,
            *(entries[k] for k in ("q", "k", "v", "g", "beta")),
            log_head=head,
            append_count=counts,
            advance=False,
            check=False,
        )

    def fold(self, states, rows, log, fold_len, head, out=None):
        from replaylab.kernels.gdn import fold

        logs = (log["k"], log["u"], log["g"])
        fold(
            states,
            rows,
            states if out is None else out,
            rows,
            *logs,
            fold_len,
            log_head=head,
            check=False,
        )


_POOLS = {"mamba2": Mamba2Pool, "mamba1": Mamba1Pool, "gated_deltanet": GDNPool}


def recurrent_pool(mixer, *args):
    """The pool of ``mixer``'s layer: ``Mamba2Pool``, ``Mamba1Pool`` or ``GDNPool`` by its
    spec's family, else a ``RecurrentPool``."""
    return _POOLS.get(mixer.state_spec.family, RecurrentPool)(mixer, *args)


class KVPool:
    """A static KV buffer of one attention layer with ``rows`` positions per slot."""

    def __init__(self, cfg, slots, rows, dtype, device):
        shape = (slots, cfg.kv_heads, rows, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def slot_views(self, slot):
        return [self.k[slot], self.v[slot]]

    def nbytes_per_slot(self):
        return 2 * self.k[0].numel() * self.k.element_size()
