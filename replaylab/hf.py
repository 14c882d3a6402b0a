"""replaylab's replay and recompute strategies as transformers cache layers.

transformers 5.25 verifies a draft on a hybrid model by *recording*: while
``activate_past_recording`` is on, each recurrent layer keeps its state after every draft token
(``recurrent_states_history``) and ``crop(-n)`` picks one of them (the snapshot strategy). The
caches here keep the same model's recurrent layers under replaylab's other two strategies and
plug into transformers' own ``generate`` (greedy, beam search, assisted generation):

    from replaylab.hf import ReplayCache
    out = model.generate(ids, assistant_model=draft, cache=ReplayCache(model))

(``past_key_values=`` works too; transformers 5.25 names it ``cache`` and warns on the old
name.) ``RecomputeCache(model)`` is the same call with the recompute strategy.

- **Replay** (``ReplayLayer``): one checkpoint state per layer plus a log of the layer's scan
  inputs since it (the raw conv inputs, and the scan's inputs after the conv: Mamba
  ``x, dt, B, C``, Gated DeltaNet ``q, k, v, g, beta``). Outputs of
  new tokens come from checkpoint + log (``ReplayKernels.step``: no state written); ``crop(-n)``
  moves the log's cursor back n entries; the log is folded into the checkpoint on a fixed grid
  of ``log_length`` entries, at the start of a forward and only over entries no ``crop`` can
  take back any more. The conv window is the last ``d_conv - 1`` logged conv inputs.
- **Recompute** (``RecomputeLayer``): the current state plus the state at the last commit (a
  ``crop``, or a forward outside recording); ``crop(-n)`` restores every layer to the commit,
  drops the attention keys and values since it, and re-runs the kept tokens through the model.

The math is replaylab's own: the families' specs (``Mamba2Spec``, ``Mamba1Spec``,
``GatedDeltaNetSpec``: reference scans, folds and outputs from checkpoint + log) through
``replaylab.replay_ops.ReferenceReplayOps``, and the families' Triton replay step and fold
(``Mamba2ReplayKernels``, ``Mamba1ReplayKernels``, ``GatedDeltaNetReplayKernels``) where
``use_kernels`` says, by default on CUDA. Under the Gated DeltaNet kernels the log keeps k, the
corrected updates u and g instead of q, k, v, g, beta (``GatedDeltaNetReplayKernels``).

Glossary (code name -> meaning, shape; Mamba-2: H, P, N, G heads, head width, state size,
groups; Mamba-1: D channels, N state size; Gated DeltaNet: H value heads, K, V head widths):
    ckpt        S_c, the checkpoint state, (batch, H, P, N), (batch, D, N) or (batch, H, K, V)
                fp32
    window0     the conv window at the checkpoint: the last d_conv - 1 conv inputs,
                (batch, d_conv - 1, conv_dim) in the model dtype
    log         field -> (batch, n, ...): conv_in (the raw conv inputs, conv_dim), and the
                scan fields (Mamba-2 x (H, P), dt (H), B, C (G, N); Mamba-1 x, dt (D), B, C
                (N); Gated DeltaNet q, k (Hk, K), v (H, V), g, beta (H))
    n           log entries since the checkpoint (the cursor); ``committed`` of them are final

Families: NemotronH and Bamba (Mamba-2), Jamba (Mamba-1: ``Mamba1Spec``, its closed-form fold
and outputs), Qwen3-Next and Qwen3.5 (Gated DeltaNet: ``GatedDeltaNetSpec``, the chunked WY
fold and the backward query recursion). Qwen3.5-MoE raises ``NotImplementedError``; other model types
``ValueError``.

transformers 5.25.0's own recording restores one token too far when a round rejects every
draft (its history lacks the state after the verified token); these caches do not share that
(``tests/test_hf_cache.py::test_rejecting_every_draft``).

Releases and hooks: transformers >= 5.25 (older releases refuse assisted generation for
hybrids, and are refused here with an error naming the version); written against 5.25.0. The
layers subclass the public ``LinearAttentionLayer`` and override its public methods
(``update_conv_state``, ``crop``, ``reorder_cache``, ``activate_past_recording``, ...). One
hook is not public API: building a cache replaces the module-level scan function
(``mamba2_scan_forward`` of ``modeling_nemotron_h`` / ``modeling_bamba``, ``mamba_scan_forward``
of ``modeling_jamba``: the functions transformers documents as replaceable "with a runtime
that manages the recurrent state itself") by a dispatcher that hands the call to a replaylab
layer when the cache passed in is one, and to the original otherwise. Gated DeltaNet mixers
run their recurrence inline through ``torch_chunk_gated_delta_rule`` /
``torch_recurrent_gated_delta_rule`` (``modeling_qwen3_next``, ``modeling_qwen3_5``), which get
no cache: the layer hands ``Cache.get_recurrent_state`` a sentinel tensor and the dispatchers
that replace those two functions route a call whose ``initial_state`` is a sentinel to its
layer. The layers keep ``record_past`` True (so every conv input reaches
``update_conv_state``) and ``recurrent_states_to_keep`` 0 (no intermediate states asked for).
``RecomputeCache`` also registers a forward pre-hook on the model, to learn the token ids it
re-runs (batch rows without padding; ``inputs_embeds`` is refused).
"""

from __future__ import annotations

import importlib
import weakref

import torch
import torch.nn.functional as F

from replaylab.gated_deltanet import (
    GatedDeltaNetReplayKernels,
    GatedDeltaNetSpec,
    GDNParams,
    l2_normalize,
)
from replaylab.mamba1 import Mamba1Params, Mamba1ReplayKernels, Mamba1Spec
from replaylab.mamba2 import Mamba2Params, Mamba2ReplayKernels, Mamba2Spec
from replaylab.replay_ops import ReferenceReplayOps
from replaylab.validation import as_flag, as_int

__all__ = [
    "MIN_TRANSFORMERS",
    "FAMILIES",
    "ReplayCache",
    "RecomputeCache",
    "state_bytes",
]

MIN_TRANSFORMERS = "5.25"
DEFAULT_LOG_LENGTH = 16  # as replaylab.serving.engine.AUTO_LOG_LENGTH
MAX_STEP_TOKENS = 16  # longer forwards (a prefill) fold the log and scan instead

# model_type -> the modeling module whose ``mamba2_scan_forward`` the caches dispatch
FAMILIES = {
    "nemotron_h": "transformers.models.nemotron_h.modeling_nemotron_h",
    "bamba": "transformers.models.bamba.modeling_bamba",
    "jamba": "transformers.models.jamba.modeling_jamba",
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "qwen3_5": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_text": "transformers.models.qwen3_5.modeling_qwen3_5",
}
NOT_YET = {
    "qwen3_5_moe": "Qwen3.5-MoE (Gated DeltaNet with experts)",
    "qwen3_5_moe_text": "Qwen3.5-MoE (Gated DeltaNet with experts)",
}


def _check_release():
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise RuntimeError(
            f"replaylab.hf needs transformers >= {MIN_TRANSFORMERS} (its linear-attention cache "
            f"layers with crop and past recording); this is transformers {transformers.__version__}"
        )


def _install_gdn_hooks(module_name, family):
    """Route ``torch_chunk_gated_delta_rule`` and ``torch_recurrent_gated_delta_rule`` of
    ``module_name`` to the replaylab layer whose sentinel arrives as ``initial_state`` (what
    ``Cache.get_recurrent_state`` returned for it); other calls go to the originals."""
    mod = importlib.import_module(module_name)
    for name in family.hooks:
        original = getattr(mod, name)
        if getattr(original, "_replaylab_original", None) is not None:
            continue

        def dispatch(query, key, value, g, beta, *args, _original=original, **kwargs):
            state = kwargs.get("initial_state")
            owner = getattr(state, "_replaylab_layer", None)
            layer = owner() if owner is not None else None
            if layer is None:
                return _original(query, key, value, g, beta, *args, **kwargs)
            return layer.scan(layer.module, query, key, value, g, beta), state

        dispatch._replaylab_original = original
        setattr(mod, name, dispatch)


def _install_scan_hook(module_name, family):
    """Route ``family.hook`` (the scan function) of ``module_name`` to replaylab layers when the
    cache passed in (its last positional argument) is a replaylab cache (idempotent)."""
    mod = importlib.import_module(module_name)
    original = getattr(mod, family.hook)
    if getattr(original, "_replaylab_original", None) is not None:
        return

    def scan_forward(module, *args, **kwargs):
        cache = kwargs["cache"] if "cache" in kwargs else args[-1]
        layers = getattr(cache, "layers", None)
        layer = layers[module.layer_idx] if layers is not None else None
        if isinstance(layer, _RecurrentLayer):
            return layer.scan(module, *(args if "cache" in kwargs else args[:-1]))
        return original(module, *args, **kwargs)

    scan_forward._replaylab_original = original
    setattr(mod, family.hook, scan_forward)


class HFMamba2Spec(Mamba2Spec):
    """``Mamba2Spec`` over a transformers Mamba-2 mixer (NemotronH, Bamba): the same scan, fold
    and replay kernels, with the parameters read from ``module`` (``A_log``, ``D``,
    ``dt_bias``, ``time_step_limit``). transformers runs the conv itself, so ``prepare`` is
    not used."""

    def __init__(self, module):
        self.module = module
        self.state_shape = (module.num_heads, module.head_dim, module.ssm_state_size)
        self.conv_shape = (module.conv_kernel_size - 1, module.conv_dim)
        self.kernels = Mamba2ReplayKernels(self)

    def params(self) -> Mamba2Params:
        m = self.module
        low, high = (float(v) for v in m.time_step_limit)
        return Mamba2Params(-torch.exp(m.A_log.float()), m.D, m.dt_bias, (low, high))

    def prepare(self, window, inputs):
        raise NotImplementedError("transformers runs the conv: entries come from its mixer")


class HFMamba1Spec(Mamba1Spec):
    """``Mamba1Spec`` over transformers' Jamba mixer: ``s6_scan``, the closed-form fold and
    outputs, with A (D, N), D and dt_bias (``dt_proj.bias``) read from ``module``."""

    def __init__(self, module):
        self.module = module
        self.state_shape = (module.intermediate_size, module.ssm_state_size)
        self.conv_shape = (module.conv_kernel_size - 1, module.intermediate_size)
        self.kernels = Mamba1ReplayKernels(self)

    def params(self) -> Mamba1Params:
        m = self.module
        return Mamba1Params(-torch.exp(m.A_log.float()), m.D, m.dt_proj.bias)

    def prepare(self, window, inputs):
        raise NotImplementedError("transformers runs the conv: entries come from its mixer")


class HFGatedDeltaNetSpec(GatedDeltaNetSpec):
    """``GatedDeltaNetSpec`` over transformers' Qwen3-Next / Qwen3.5 Gated DeltaNet: the token
    loop ``gdn_scan``, the chunked WY fold and the backward query recursion for outputs; state
    (H, K, V) fp32. transformers computes g and beta itself, so no parameter is read here."""

    def __init__(self, module):
        self.module = module
        self.state_shape = (module.num_v_heads, module.head_k_dim, module.head_v_dim)
        self.conv_shape = (module.conv_kernel_size - 1, module.conv_dim)
        self.kernels = GatedDeltaNetReplayKernels(self)

    def params(self) -> GDNParams:
        m = self.module
        return GDNParams(-torch.exp(m.A_log.float()), m.dt_bias)

    def prepare(self, window, inputs):
        raise NotImplementedError("transformers runs the conv: entries come from its mixer")


class _GatedDeltaNetFamily:
    """Qwen3-Next, Qwen3.5: the recurrence runs inline in the mixer, through
    ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule(query, key, value,
    g, beta, initial_state=...)``, which get no cache: the layer's sentinel state says whose
    call it is."""

    hooks = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
    spec = HFGatedDeltaNetSpec
    log_length = DEFAULT_LOG_LENGTH
    install = staticmethod(_install_gdn_hooks)

    @staticmethod
    def entries(module, query, key, value, g, beta):
        """Scan entries q, k (batch, T, Hk, K), L2-normalised in fp32 and q scaled by K^-1/2
        (transformers' ``use_qk_l2norm_in_kernel``), v (batch, T, H, V), g (fp32) and beta
        (batch, T, H); outputs (batch, T, H, V) go back in the input dtype."""
        dtype, K = query.dtype, query.shape[-1]
        q = (l2_normalize(query) * K**-0.5).to(dtype)
        fields = dict(q=q, k=l2_normalize(key).to(dtype), v=value, g=g.float(), beta=beta)
        return fields, lambda y: y.to(dtype)


class _Mamba2Family:
    """NemotronH, Bamba: ``mamba2_scan_forward(module, hidden_states, B, C, dt, cache)``."""

    hook = "mamba2_scan_forward"
    spec = HFMamba2Spec
    log_length = DEFAULT_LOG_LENGTH
    install = staticmethod(lambda module_name, family: _install_scan_hook(module_name, family))

    @staticmethod
    def entries(module, hidden_states, B, C, dt):
        """Scan entries x (batch, T, H, P), dt (batch, T, H), B and C (batch, T, G, N), and
        the function from outputs y (batch, T, H, P) to what the hook returns, (batch, T, H*P)."""
        b, T, _ = hidden_states.shape
        G, N = module.n_groups, module.ssm_state_size
        fields = dict(
            x=hidden_states.reshape(b, T, module.num_heads, module.head_dim),
            dt=dt,
            B=B.reshape(b, T, G, N),
            C=C.reshape(b, T, G, N),
        )
        return fields, lambda y: y.reshape(b, T, -1).to(hidden_states.dtype)


class _Mamba1Family:
    """Jamba: ``mamba_scan_forward(module, hidden_states, time_step, B, C, gate, cache)``,
    channels first, the gate applied inside."""

    hook = "mamba_scan_forward"
    spec = HFMamba1Spec
    # a state is only ~5 log entries at d_state 16 (data/bench_hf_cache_cpu.json): at L = 16 a
    # round's log holds 0.90 of recording's bytes at 4 drafts, at L = 4 0.49
    log_length = 4
    install = staticmethod(lambda module_name, family: _install_scan_hook(module_name, family))

    @staticmethod
    def entries(module, hidden_states, time_step, B, C, gate):
        """Scan entries x and dt (batch, T, D), B and C (batch, T, N), and the function from
        outputs y (batch, T, D) to the gated (batch, D, T) the hook returns."""
        fields = dict(x=hidden_states.transpose(1, 2), dt=time_step.transpose(1, 2), B=B, C=C)

        def finish(y):
            gated = y.float() * F.silu(gate.transpose(1, 2).float())
            return gated.transpose(1, 2).to(hidden_states.dtype)

        return fields, finish


_FAMILY_OF = {
    "nemotron_h": _Mamba2Family,
    "bamba": _Mamba2Family,
    "jamba": _Mamba1Family,
    "qwen3_next": _GatedDeltaNetFamily,
    "qwen3_5": _GatedDeltaNetFamily,
    "qwen3_5_text": _GatedDeltaNetFamily,
}


def _take(tensors: dict, fn):
    """``fn`` of every field, made contiguous: the Triton replay kernels index a log buffer
    (batch, n, ...) by its shape alone."""
    return {k: fn(v).contiguous() for k, v in tensors.items()}


class _RecurrentLayer:
    """What replay and recompute share: the conv window, the token count, the dispatch from the
    mixer's scan. Mixed into ``LinearAttentionLayer`` by the two layers below."""

    def _setup(self, module, family, use_kernels):
        from transformers.cache_utils import LinearAttentionLayer

        LinearAttentionLayer.__init__(self, number_of_states=1)
        self.family, self.module = family, module
        self.spec = self.family.spec(module)
        self.use_kernels = use_kernels
        self.recording = False  # transformers' generate sets ``record_past``; we keep our own
        self.keep = None  # the rollback depth transformers asked for (informative)
        # transformers asks for intermediate states when recording; none are needed here
        self.recurrent_states_to_keep = 0
        self._pending = None  # raw conv inputs of the forward in flight, (batch, T, conv_dim)
        # What ``Cache.get_recurrent_state`` / ``get_conv_state`` return for this layer: a
        # token, not a state, that the Gated DeltaNet dispatch recognises as this layer's
        self.sentinel = torch.empty(0)
        self.sentinel._replaylab_layer = weakref.ref(self)
        self.recurrent_states[0] = self.conv_states[0] = self.sentinel
        self.has_previous_state[0] = True

    # -- transformers' public layer API --------------------------------------------------
    is_compileable = False

    @property
    def record_past(self):
        """Always True: the mixers then hand every conv input to ``update_conv_state``."""
        return True

    @record_past.setter
    def record_past(self, value):
        pass  # generate switches recording off when it returns the cache; nothing to undo here

    def activate_past_recording(self, recurrent_states_to_keep=None):
        """From now on ``crop(-n)`` may take back tokens of later forwards: nothing past the
        current position is folded (replay) or committed (recompute) until the next crop."""
        self.recording = True
        self.keep = recurrent_states_to_keep
        self.commit()

    def get_seq_length(self) -> int:
        return self.cumulative_length_linear

    def update_conv_state(self, conv_states, state_idx=0, conv_kernel_size=None, **kwargs):
        """Raw conv inputs ``conv_states (batch, conv_dim, T)`` in; the window before them
        followed by them, ``(batch, conv_dim, d_conv - 1 + T)``, out (transformers' causal conv
        keeps its last T outputs). The inputs are logged by the scan that follows."""
        if state_idx != 0:
            raise ValueError(f"state_idx must be 0 for a Mamba-2 layer, got {state_idx}")
        if self.device is None:
            self.device, self.dtype = conv_states.device, conv_states.dtype
            self.cumulative_length_linear = self.cumulative_length_linear.to(self.device)
        xBC = conv_states.transpose(1, 2)
        window = self.window()
        if window is None:
            window = xBC.new_zeros(xBC.shape[0], self.spec.conv_shape[0], xBC.shape[2])
        self.cumulative_length_linear.add_(xBC.shape[1])
        self._pending = xBC
        return torch.cat([window.transpose(1, 2).to(conv_states.dtype), conv_states], dim=-1)

    def update_recurrent_state(self, recurrent_states, state_idx=0, **kwargs):
        if recurrent_states is self.sentinel:  # Gated DeltaNet hands back what it was given
            return self.sentinel
        raise RuntimeError(
            f"{type(self).__name__} keeps its own state: the mixer's scan must come through "
            "replaylab.hf (was the cache built with the model it runs?)"
        )

    # -- shared helpers ------------------------------------------------------------------
    def _entries(self, module, *args):
        """The forward's log entries (``conv_in``, the raw conv inputs (batch, T, channels), and
        the family's scan fields, each (batch, T, ...)), and the family's ``finish``."""
        fields, finish = self.family.entries(module, *args)
        T = next(iter(fields.values())).shape[1]
        if self._pending is None or self._pending.shape[1] < T:
            raise RuntimeError("a scan without its conv inputs: update_conv_state was not called")
        entries = dict(conv_in=self._pending[:, :T], **fields)
        self._pending = self._pending[:, T:] if self._pending.shape[1] > T else None
        return entries, finish

    def _zero_state(self, batch, device):
        return torch.zeros((batch, *self.spec.state_shape), dtype=torch.float32, device=device)


def _last_window(window, xBC):
    """The last ``K = window.shape[1]`` rows of ``window`` followed by ``xBC``."""
    K = window.shape[1]
    return torch.cat([window, xBC.to(window.dtype)], dim=1)[:, xBC.shape[1] :][:, -K:]


def _ops(layer, device):
    use = layer.use_kernels if layer.use_kernels is not None else device.type == "cuda"
    return layer.spec.kernels if use else ReferenceReplayOps(layer.spec, MAX_STEP_TOKENS)


def _make_layer_class(strategy_cls):
    from transformers.cache_utils import LinearAttentionLayer

    return type(strategy_cls.__name__, (strategy_cls, LinearAttentionLayer), {})


class _ReplayLayer(_RecurrentLayer):
    """Replay: ``ckpt`` + ``log`` (n entries, ``committed`` of them final), no current state.

    ``log_length`` L: the log is folded on the grid ``ckpt`` at multiples of L entries;
    ``use_kernels``: the Triton replay step and fold (None: on CUDA)."""

    def __init__(self, module, family, log_length=DEFAULT_LOG_LENGTH, use_kernels=None):
        if not isinstance(log_length, int) or log_length < 1:
            raise ValueError(f"log_length must be an int >= 1, got {log_length!r}")
        self._setup(module, family, use_kernels)
        self.log_length = log_length
        self.ckpt = self.window0 = None
        self.log: dict = {}
        self.n = self.committed = 0

    def window(self):
        if self.window0 is None:
            return None
        if not self.n:
            return self.window0
        return _last_window(self.window0, self.log["conv_in"])

    def commit(self):
        self.committed = self.n

    def _fold(self, upto):
        """Fold the first ``upto`` log entries into the checkpoint."""
        if not upto:
            return
        rows = torch.arange(self.ckpt.shape[0], device=self.ckpt.device)
        self.ckpt = _ops(self, self.ckpt.device).fold(self.ckpt, rows, self.log, upto)
        self.window0 = _last_window(self.window0, self.log["conv_in"][:, :upto])
        self.log = _take(self.log, lambda v: v[:, upto:])
        self.n -= upto
        self.committed -= upto

    def scan(self, module, *args):
        """Outputs of T new tokens from checkpoint + log, in the layout the family's hook returns;
        the tokens' entries join the log."""
        entries, finish = self._entries(module, *args)
        batch, T = entries["conv_in"].shape[:2]
        device = entries["conv_in"].device
        if self.ckpt is None:
            self.ckpt = self._zero_state(batch, device)
            self.window0 = entries["conv_in"].new_zeros(batch, *self.spec.conv_shape)
        if not self.recording:
            self.commit()
        L = self.log_length
        self._fold(self.committed // L * L)  # the grid: only entries no crop can take back
        rows = torch.arange(batch, device=device)
        ops = _ops(self, device)
        scan_fields = {k: v for k, v in entries.items() if k != "conv_in"}
        y = None
        if self.n and T <= MAX_STEP_TOKENS:
            y = ops.step(self.ckpt, rows, self.log, self.n, scan_fields)
        if y is None:  # a long forward (prefill), or an empty log: fold in a copy, then scan
            start = ops.fold(self.ckpt, rows, self.log, self.n) if self.n else self.ckpt
            y, kept = ops.prefill(start, scan_fields)
        else:
            kept = ops.logged(scan_fields)
        entries = dict(conv_in=entries["conv_in"], **kept)
        if self.n and set(entries) != set(self.log):
            raise RuntimeError(
                f"this replay layer's log holds {sorted(self.log)} but the forward logs "
                f"{sorted(entries)}: the log's layout follows use_kernels and the device, which "
                "must not change while the cache holds tokens (reset it first)"
            )
        self.log = (
            _take(entries, lambda v: v)
            if not self.n
            else {k: torch.cat([self.log[k], entries[k].to(self.log[k].dtype)], 1) for k in entries}
        )
        self.n += T
        return finish(y)

    def crop(self, tokens_to_remove: int) -> None:
        """``crop(-k)``: the last k tokens go (a cursor move); ``crop(0)`` commits."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes -k (k tokens to remove), got {tokens_to_remove}")
        k = -tokens_to_remove
        if k > self.n - self.committed:
            raise ValueError(
                f"crop(-{k}): this replay layer can take back at most {self.n - self.committed} "
                "tokens (those since its last commit)"
            )
        if k:
            self.log = _take(self.log, lambda v: v[:, : self.n - k])
            self.n -= k
            self.cumulative_length_linear.sub_(k)
        self.commit()

    def reorder_cache(self, beam_idx):
        if self.ckpt is None:
            return
        idx = beam_idx.to(self.ckpt.device)
        self.ckpt, self.window0 = self.ckpt.index_select(0, idx), self.window0.index_select(0, idx)
        self.log = _take(self.log, lambda v: v.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int):
        if self.ckpt is not None:
            rep = lambda v: v.repeat_interleave(repeats, dim=0)  # noqa: E731
            self.ckpt, self.window0, self.log = (
                rep(self.ckpt),
                rep(self.window0),
                _take(self.log, rep),
            )

    def batch_select_indices(self, indices):
        if self.ckpt is not None:
            sel = lambda v: v[indices]  # noqa: E731
            self.ckpt, self.window0, self.log = (
                sel(self.ckpt),
                sel(self.window0),
                _take(self.log, sel),
            )

    def reset(self):
        self.cumulative_length_linear.zero_()
        self.ckpt = self.window0 = None
        self.log, self.n, self.committed = {}, 0, 0

    def tensors(self):
        """Every tensor this layer holds (for byte counts)."""
        held = [t for t in (self.ckpt, self.window0) if t is not None]
        return held + list(self.log.values())


class _RecomputeLayer(_RecurrentLayer):
    """Recompute: the current ``state`` and ``window``, and their values at the last commit
    (``ckpt``, ``ckpt_window``); the cache re-runs the model to roll back."""

    def __init__(self, module, family, use_kernels=None):
        self._setup(module, family, use_kernels)
        self.state = self.win = self.ckpt = self.ckpt_window = None
        self.since_commit = 0

    def window(self):
        return self.win

    def commit(self):
        self.ckpt, self.ckpt_window, self.since_commit = self.state, self.win, 0

    def scan(self, module, *args):
        """Outputs (the family's layout): the reference scan from the current state."""
        entries, finish = self._entries(module, *args)
        batch, T = entries["conv_in"].shape[:2]
        device = entries["conv_in"].device
        if self.state is None:
            self.state = self._zero_state(batch, device)
            self.win = entries["conv_in"].new_zeros(batch, *self.spec.conv_shape)
            self.commit()
        if not self.recording:
            self.commit()
        result = self.spec.scan(self.state, {k: v for k, v in entries.items() if k != "conv_in"})
        self.state, self.win = result.state, _last_window(self.win, entries["conv_in"])
        self.since_commit += T
        return finish(result.y)

    def restore(self):
        """Back to the last commit; returns the tokens it took back."""
        back = self.since_commit
        self.state, self.win = self.ckpt, self.ckpt_window
        self.cumulative_length_linear.sub_(back)
        self.since_commit = 0
        return back

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError(
            "a RecomputeLayer is cropped by its RecomputeCache, which re-runs the model"
        )

    def reorder_cache(self, beam_idx):
        if self.state is None:
            return
        idx = beam_idx.to(self.state.device)
        for name in ("state", "win", "ckpt", "ckpt_window"):
            setattr(self, name, getattr(self, name).index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int):
        if self.state is not None:
            for name in ("state", "win", "ckpt", "ckpt_window"):
                setattr(self, name, getattr(self, name).repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices):
        if self.state is not None:
            for name in ("state", "win", "ckpt", "ckpt_window"):
                setattr(self, name, getattr(self, name)[indices])

    def reset(self):
        self.cumulative_length_linear.zero_()
        self.state = self.win = self.ckpt = self.ckpt_window = None
        self.since_commit = 0

    def tensors(self):
        return [t for t in (self.state, self.win, self.ckpt, self.ckpt_window) if t is not None]


def _unique_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.numel() and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def state_bytes(cache) -> int:
    """Bytes of recurrent memory ``cache`` holds now, over all its recurrent layers and the
    whole batch (attention keys and values left out): for a replaylab cache its layers'
    checkpoints, logs, states and windows; for transformers' own cache its conv states,
    recurrent states and the recorded history of states. Tensors held twice count once."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    held = []
    for layer in cache.layers:
        if isinstance(layer, _RecurrentLayer):
            held += layer.tensors()
        elif isinstance(layer, LinearAttentionCacheLayerMixin):
            for i in range(layer.number_of_states):
                for t in (layer.conv_states[i], layer.recurrent_states[i]):
                    if t is not None:
                        held.append(t)
                history = getattr(layer, "recurrent_states_history", None) or {}
                held += list(history.get(i, []))
    return _unique_bytes(held)


def _mixers(model):
    """layer index -> the model's Mamba-2 mixer module."""
    found = {}
    for module in model.modules():
        if hasattr(module, "A_log") and hasattr(module, "conv1d") and hasattr(module, "layer_idx"):
            found[module.layer_idx] = module
    return found


def _family(model):
    _check_release()
    model_type = getattr(model.config.get_text_config(decoder=True), "model_type", None)
    if model_type in NOT_YET:
        raise NotImplementedError(
            f"replaylab.hf does not cover {NOT_YET[model_type]} yet; it covers "
            f"{', '.join(sorted(FAMILIES))}"
        )
    if model_type not in FAMILIES:
        raise ValueError(f"replaylab.hf covers model types {sorted(FAMILIES)}, not {model_type!r}")
    family = _FAMILY_OF[model_type]
    family.install(FAMILIES[model_type], family)
    return model_type


def _hybrid_cache(model, make_layer):
    """A ``DynamicCache`` for ``model`` whose linear-attention layers are ``make_layer(mixer)``."""
    from transformers.cache_utils import LinearAttentionLayer

    mixers = _mixers(model)
    layers = []
    from transformers import DynamicCache

    template = DynamicCache(config=model.config)
    for i, layer in enumerate(template.layers):
        if type(layer) is LinearAttentionLayer:
            if i not in mixers:
                raise ValueError(f"layer {i} is a linear-attention layer without a Mamba mixer")
            layer = make_layer(mixers[i])
        elif isinstance(layer, LinearAttentionLayer):
            raise NotImplementedError(
                f"layer {i}: {type(layer).__name__} (attention and a recurrent state in one "
                "layer) is not covered by replaylab.hf"
            )
        layers.append(layer)
    return layers


_LAYERS: list = []


def _layer_classes():
    """(ReplayLayer, RecomputeLayer): built on first use, so that importing this module works
    on any transformers release and only building a cache needs >= 5.25."""
    if not _LAYERS:
        _check_release()
        _LAYERS.extend([_make_layer_class(_ReplayLayer), _make_layer_class(_RecomputeLayer)])
    return tuple(_LAYERS)


def __getattr__(name):
    if name in ("ReplayLayer", "RecomputeLayer"):
        return _layer_classes()[name == "RecomputeLayer"]
    raise AttributeError(f"module 'replaylab.hf' has no attribute {name!r}")


def _cache_base():
    from transformers import DynamicCache

    return DynamicCache


class _ReplaylabCacheMixin:
    """Helpers both caches share."""

    def recurrent_layers(self):
        return [layer for layer in self.layers if isinstance(layer, _RecurrentLayer)]

    def state_bytes(self) -> int:
        """Recurrent bytes held now, whole batch (see ``state_bytes``)."""
        return state_bytes(self)

    def _batch(self):
        """The batch the recurrent layers hold (None before the first forward)."""
        held = [t for layer in self.recurrent_layers() for t in layer.tensors()]
        return held[0].shape[0] if held else None

    def batch_repeat_interleave(self, repeats: int):
        """Every row ``repeats`` >= 1 times (transformers' beam search and sampling expand
        the batch so); checked before any layer changes."""
        as_int("repeats", repeats, low=1)
        super().batch_repeat_interleave(repeats)

    def reorder_cache(self, beam_idx):
        """Row i becomes row ``beam_idx[i]`` in every layer; the indices are checked against
        the batch before any layer changes."""
        if not isinstance(beam_idx, torch.Tensor) or beam_idx.dim() != 1:
            raise TypeError(f"beam_idx: expected a 1-d tensor of row indices, got {beam_idx!r}")
        if beam_idx.dtype == torch.bool or beam_idx.is_floating_point():
            raise TypeError(f"beam_idx: expected integer row indices, got dtype {beam_idx.dtype}")
        batch = self._batch()
        if beam_idx.numel() and batch is not None:
            low, high = beam_idx.aminmax()  # one read back a step, not two
            low, high = int(low), int(high)
            if low < 0 or high >= batch:
                raise ValueError(
                    f"beam_idx: expected rows in [0, {batch}), got {beam_idx.tolist()}"
                )
        super().reorder_cache(beam_idx)


def ReplayCache(model, log_length: int | None = None, use_kernels: bool | None = None):
    """A transformers cache for ``model`` (NemotronH, Bamba, Jamba, Qwen3-Next or Qwen3.5)
    whose recurrent layers keep a checkpoint and a log of their scan inputs (replay);
    attention layers stay transformers' ``DynamicLayer``. ``log_length`` L >= 1: entries
    between folds (the grid; None: the family's, 16, or 4 for Jamba's Mamba-1);
    ``use_kernels``: the family's Triton replay step and fold (None: when on CUDA).

    Pass it as ``past_key_values=`` (or ``cache=``) to ``model.generate`` or ``model(...)``.
    Returns an instance of ``replaylab.hf.ReplayDynamicCache``, a ``DynamicCache``."""
    family = _FAMILY_OF[_family(model)]
    as_flag("use_kernels", use_kernels, none_ok=True)
    replay, _ = _layer_classes()
    log_length = family.log_length if log_length is None else log_length
    if not isinstance(log_length, int) or isinstance(log_length, bool) or log_length < 1:
        raise ValueError(f"log_length must be an int >= 1, got {log_length!r}")
    layers = _hybrid_cache(
        model, lambda m: replay(m, family, log_length=log_length, use_kernels=use_kernels)
    )
    return _cache_class("ReplayDynamicCache")(layers, model)


def RecomputeCache(model, use_kernels: bool | None = None):
    """A transformers cache for ``model`` (NemotronH or Bamba) whose Mamba-2 layers keep the
    state at the last commit; ``crop(-k)`` restores it and re-runs the kept tokens through
    ``model`` (one forward). Returns a ``replaylab.hf.RecomputeDynamicCache``."""
    family = _FAMILY_OF[_family(model)]
    as_flag("use_kernels", use_kernels, none_ok=True)
    _, recompute = _layer_classes()
    layers = _hybrid_cache(model, lambda m: recompute(m, family, use_kernels=use_kernels))
    return _cache_class("RecomputeDynamicCache")(layers, model)


_CLASSES: dict = {}


def _cache_class(name):
    if name in _CLASSES:
        return _CLASSES[name]
    base = _cache_base()
    from transformers.cache_utils import Cache

    if name == "ReplayDynamicCache":

        class ReplayDynamicCache(_ReplaylabCacheMixin, base):
            """transformers' ``DynamicCache`` with replaylab's replay layers (see module doc)."""

            def __init__(self, layers, model):
                Cache.__init__(self, layers=layers)

        cls = ReplayDynamicCache
    else:

        class RecomputeDynamicCache(_ReplaylabCacheMixin, base):
            """transformers' ``DynamicCache`` with replaylab's recompute layers: ``crop(-k)``
            restores each recurrent layer to its last commit and re-runs the kept tokens."""

            def __init__(self, layers, model):
                Cache.__init__(self, layers=layers)
                self._model = weakref.ref(model)
                self._ids = None  # token ids since the last commit, (batch, t)
                ref = weakref.ref(self)
                self._hook = model.register_forward_pre_hook(
                    lambda module, args, kwargs: _record_ids(ref, args, kwargs), with_kwargs=True
                )
                weakref.finalize(self, self._hook.remove)  # the model outlives its caches

            def activate_past_recording(self, **kwargs):
                super().activate_past_recording(**kwargs)
                self._ids = None

            def _commit(self):
                for layer in self.recurrent_layers():
                    layer.commit()
                self._ids = None

            def crop(self, tokens_to_remove: int) -> None:
                """``crop(-k)``: restore every recurrent layer to the last commit, drop the
                attention keys and values since it, re-run the kept tokens; ``crop(0)``
                commits."""
                if tokens_to_remove > 0:
                    raise ValueError(f"crop takes -k (k tokens to remove), got {tokens_to_remove}")
                k = -tokens_to_remove
                since = 0 if self._ids is None else self._ids.shape[1]
                if k > since:
                    raise ValueError(
                        f"crop(-{k}): this recompute cache can take back at most {since} tokens "
                        "(those since its last commit)"
                    )
                if not k:
                    self._commit()
                    return
                kept = self._ids[:, : since - k]
                for layer in self.layers:
                    if isinstance(layer, _RecurrentLayer):
                        layer.restore()
                    else:
                        layer.crop(-since)
                self._ids = None
                if kept.shape[1]:
                    model = self._model()
                    if model is None:
                        raise RuntimeError("the model of this RecomputeCache is gone")
                    with torch.no_grad():
                        model(input_ids=kept, cache=self, use_cache=True, logits_to_keep=1)
                self._commit()

        cls = RecomputeDynamicCache
    _CLASSES[name] = cls
    return cls


def _record_ids(ref, args, kwargs):
    """Forward pre-hook of a RecomputeCache's model: keep the ids of forwards through it."""
    cache = ref()
    if cache is None:
        return None
    if (kwargs.get("past_key_values") or kwargs.get("cache")) is not cache:
        return None
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        raise ValueError("RecomputeCache re-runs token ids: inputs_embeds is not supported")
    recording = any(layer.recording for layer in cache.recurrent_layers())
    if not recording:
        cache._ids = None
    cache._ids = ids if cache._ids is None else torch.cat([cache._ids, ids], dim=1)
    return None
