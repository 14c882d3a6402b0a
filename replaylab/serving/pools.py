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
A Mamba-2 layer's pool (``Mamba2Pool``) also holds what the fused kernels read: its scan
parameters processed once and its conv weights; on the fused path its log keeps x, dt, B, C
only (the kernels keep the conv window in ``conv``, not in the log).
Per attention layer (``KVPool``): k, v (slots, Hkv, max_len + T_max, Dh); rows past a slot's
position are padding that the next step overwrites before any token reads it.

Glossary: K = d_conv - 1, C conv channels, T_max = max_verify, L = log_length.
"""

from __future__ import annotations

import torch

__all__ = ["RecurrentPool", "Mamba2Pool", "KVPool", "recurrent_pool"]


class _Probe:
    """A cache for one token of one mixer: records what the mixer hands its layer's
    ``advance`` and the log entries the spec derives from it (``entries``)."""

    def __init__(self, spec, dtype, device):
        self.spec, self.dtype, self.device, self.entries = spec, dtype, device, None

    def layer(self, index):
        return self

    def advance(self, **inputs):
        zero = self.spec.zero_state(1, self.dtype, self.device)
        self.entries = self.spec.prepare(zero.conv, inputs)
        return self.spec.scan(zero.ssm, self.entries).y


@torch.no_grad()
def log_entry_shapes(mixer, dtype, device):
    """field -> (shape of one token's entry, dtype), for each field the spec logs: one token
    of zeros through the mixer, with a cache that records the entries."""
    probe = _Probe(mixer.state_spec, dtype, device)
    mixer(torch.zeros(1, 1, mixer.cfg.hidden_size, dtype=dtype, device=device), probe)
    return {
        f: (tuple(probe.entries[f].shape[2:]), probe.entries[f].dtype)
        for f in mixer.state_spec.log_fields
    }


class RecurrentPool:
    """The pools of one recurrent layer under ``strategy`` (see the module docstring), built
    from its mixer's ``state_spec`` alone."""

    def __init__(self, mixer, slots, strategy, log_capacity, max_verify, dtype, device, fused):
        self.mixer, self.spec = mixer, mixer.state_spec
        state_shape, conv_shape = tuple(self.spec.state_shape), tuple(self.spec.conv_shape)
        zeros = lambda *shape, dt=dtype: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        self.state = zeros(slots, *state_shape, dt=torch.float32)
        self.conv = zeros(slots, *conv_shape)
        self.draft_conv = zeros(slots, max_verify, *conv_shape)
        self.log = {}
        if strategy == "replay":
            entries = log_entry_shapes(mixer, dtype, device)
            for field in self.logged_fields(fused):
                shape, dt = entries[field]
                self.log[field] = zeros(slots, log_capacity, *shape, dt=dt)
        elif strategy == "snapshot":
            self.draft_state = zeros(slots, max_verify, *state_shape, dt=torch.float32)
        else:  # recompute
            self.saved_state = zeros(slots, *state_shape, dt=torch.float32)
            self.saved_conv = zeros(slots, *conv_shape)

    def logged_fields(self, fused):
        """The fields the log keeps: every field the spec logs."""
        return self.spec.log_fields

    def clear(self, slot):
        """Zero what a slot holds, so a new tenant starts from nothing of the last one."""
        for t in self._held():
            t[slot].zero_()

    def _held(self):
        held = [self.state, self.conv, self.draft_conv, *self.log.values()]
        return held + [
            getattr(self, n)
            for n in ("draft_state", "saved_state", "saved_conv")
            if hasattr(self, n)
        ]

    def nbytes_per_slot(self):
        return sum(t[0].numel() * t.element_size() for t in self._held())


class Mamba2Pool(RecurrentPool):
    """A Mamba-2 layer's pools, and its scan parameters processed once for the fused kernels
    (A = -exp(A_log), D, dt_bias in fp32; the engine serves frozen weights)."""

    def __init__(self, mixer, slots, strategy, log_capacity, max_verify, dtype, device, fused):
        super().__init__(mixer, slots, strategy, log_capacity, max_verify, dtype, device, fused)
        p = self.spec.params()
        self.A, self.D = p.A.detach().float(), p.D.detach().float()
        self.dt_bias, self.dt_limit = p.dt_bias.detach().float(), p.dt_limit
        self.conv_weight = mixer.conv1d.weight.detach().view(self.spec.conv_shape[1], -1)
        self.conv_bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias.detach()

    def logged_fields(self, fused):
        """x, dt, B, C for the fused kernels; the reference path keeps the conv inputs (xBC)
        too, as the teaching log does."""
        return ("x", "dt", "B", "C") if fused else self.spec.log_fields


def recurrent_pool(mixer, *args):
    """The pool of ``mixer``'s layer: a ``Mamba2Pool`` for Mamba-2, else a ``RecurrentPool``."""
    kind = Mamba2Pool if mixer.state_spec.family == "mamba2" else RecurrentPool
    return kind(mixer, *args)


class KVPool:
    """A static KV buffer of one attention layer with ``rows`` positions per slot."""

    def __init__(self, cfg, slots, rows, dtype, device):
        shape = (slots, cfg.kv_heads, rows, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def clear(self, slot):
        self.k[slot].zero_()
        self.v[slot].zero_()

    def nbytes_per_slot(self):
        return 2 * self.k[0].numel() * self.k.element_size()
