"""Preallocated memory of the serving engine, one row per slot (a slot holds one sequence).

Per Mamba-2 layer (``MambaPool``):
    state        (slots, H, P, N) fp32    snapshot / recompute: the current state;
                                          replay: the checkpoint S_c
    conv         (slots, K, C)            the current conv window (every strategy)
    draft_conv   (slots, T_max, K, C)     the window after each token of the last step
    log_*        (slots, L + T_max, ...)  replay: x, dt, B, C since the checkpoint, a ring
                                          (entry i of slot s at row (head[s] + i) % capacity)
    draft_state  (slots, T_max, H, P, N)  snapshot: the state after each token of the last step
    saved_state  (slots, H, P, N)         recompute: the state before the last verify
    saved_conv   (slots, K, C)            recompute: the window before it
Per attention layer (``KVPool``): k, v (slots, Hkv, max_len + T_max, Dh); rows past a slot's
position are padding that the next step overwrites before any token reads it.

Glossary: K = d_conv - 1, C conv channels, T_max = max_verify, L = log_length.
"""

from __future__ import annotations

import torch

__all__ = ["MambaPool", "KVPool"]


class MambaPool:
    """The pools of one Mamba-2 layer, and its scan parameters processed once (A = -exp(A_log),
    D, dt_bias in fp32: the engine serves frozen weights)."""

    def __init__(self, mixer, slots, strategy, log_capacity, max_verify, dtype, device, fused):
        c = mixer.cfg
        self.mixer, self.spec = mixer, mixer.state_spec
        K, C = self.spec.conv_shape
        H, P, N, G = c.ssm_heads, c.ssm_head_dim, c.d_state, c.n_groups
        zeros = lambda *shape, dt=dtype: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        p = self.spec.params()
        self.A, self.D = p.A.detach().float(), p.D.detach().float()
        self.dt_bias, self.dt_limit = p.dt_bias.detach().float(), p.dt_limit
        self.conv_weight = mixer.conv1d.weight.detach().view(C, -1)
        self.conv_bias = None if mixer.conv1d.bias is None else mixer.conv1d.bias.detach()
        self.state = zeros(slots, H, P, N, dt=torch.float32)
        self.conv = zeros(slots, K, C)
        self.draft_conv = zeros(slots, max_verify, K, C)
        self.log = {}
        if strategy == "replay":
            Lc = log_capacity
            self.log = dict(
                x=zeros(slots, Lc, H, P),
                dt=zeros(slots, Lc, H),
                B=zeros(slots, Lc, G, N),
                C=zeros(slots, Lc, G, N),
            )
            if not fused:  # the reference path keeps the conv inputs as the teaching log does
                self.log["xBC"] = zeros(slots, Lc, C)
        elif strategy == "snapshot":
            self.draft_state = zeros(slots, max_verify, H, P, N, dt=torch.float32)
        else:  # recompute
            self.saved_state = zeros(slots, H, P, N, dt=torch.float32)
            self.saved_conv = zeros(slots, K, C)

    def clear(self, slot):
        """Zero what a slot holds, so a new tenant starts from nothing of the last one."""
        for t in (self.state, self.conv, self.draft_conv, *self.log.values()):
            t[slot].zero_()
        for name in ("draft_state", "saved_state", "saved_conv"):
            if hasattr(self, name):
                getattr(self, name)[slot].zero_()

    def nbytes_per_slot(self):
        held = [self.state, self.conv, self.draft_conv, *self.log.values()]
        held += [
            getattr(self, n)
            for n in ("draft_state", "saved_state", "saved_conv")
            if hasattr(self, n)
        ]
        return sum(t[0].numel() * t.element_size() for t in held)


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
