"""The Mamba-1 mixer of Jamba, and its recurrent-layer spec.

Glossary (code name -> paper symbol, shape):
    D, N           d_inner channels, state size; state S: (batch, D, N) fp32
    R              dt_rank: Δ is projected from R dims up to D
    x_in           the conv input, the raw inputs a replay log keeps (batch, T, D)
    gate           z_t (batch, T, D), the output gate: y <- y * silu(z)
    x              x_t (batch, T, D) after conv and SiLU: the scan input
    dt             Δ_t before bias and softplus (batch, T, D): Δ = softplus(dt + dt_bias)
    B, C           B_t, C_t (batch, T, N), one per token, shared by all D channels
    A, Dskip       -exp(A_log) (D, N): one decay per channel *and* state index; D (D,)
    recurrence     S_t = exp(Δ_t ⊙ A) ⊙ S_{t-1} + Δ_t x_t B_t^T;   y_t = S_t C_t + D x_t

Unlike Mamba-2 (one decay per head), the decay is elementwise over (D, N); the closed form
still holds elementwise, so the state after j logged tokens (``replaylab.scan.s6_fold``) and
new outputs (``replaylab.scan.s6_replay_outputs``) need one read of the checkpoint plus the
log (x, Δ, B, C). Parameter names equal transformers' Jamba, so its state dict loads as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from replaylab.recurrent import RecurrentSpec, ReplayKernels
from replaylab.replay_ops import ReferenceReplayOps
from replaylab.scan import s6_fold, s6_replay_outputs, s6_scan

__all__ = ["Mamba1Config", "Mamba1Mixer", "Mamba1Spec", "Mamba1Params", "Mamba1ReplayKernels"]


@dataclass
class Mamba1Config:
    """The shape of a Mamba-1 layer: d_inner D (expand x hidden), d_state N, d_conv, dt_rank R;
    ``conv_bias`` and ``proj_bias`` (in/out projections); ``dt_bc_norm``: RMS norms on the
    projected Δ, B and C (Jamba's addition to Mamba-1)."""

    d_inner: int = 128
    d_state: int = 16
    d_conv: int = 4
    dt_rank: int = 8
    conv_bias: bool = True
    proj_bias: bool = False
    dt_bc_norm: bool = True

    def __post_init__(self):
        for name in ("d_inner", "d_state", "d_conv", "dt_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"mamba1.{name}: expected an integer >= 1, got {value!r}")


class Mamba1Params(NamedTuple):
    """A Mamba-1 layer's processed scan parameters: A (D, N) fp32, D (D,), dt_bias (D,)."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor


class _RMSNorm(nn.Module):
    """RMS norm over the last dim, computed in fp32 (Jamba's dt / B / C norms)."""

    def __init__(self, size, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, h):
        h32 = h.float()
        h32 = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h32.to(h.dtype)


class Mamba1Mixer(nn.Module):
    """in_proj -> (x_in, gate); the cache runs conv, x_proj and the S6 scan through
    ``Mamba1Spec``; y * silu(gate) -> out_proj. ``forward(h (batch, T, hidden), cache)``."""

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        s = self.settings = cfg.mamba1
        self.in_proj = nn.Linear(cfg.hidden_size, 2 * s.d_inner, bias=s.proj_bias)
        self.conv1d = nn.Conv1d(s.d_inner, s.d_inner, s.d_conv, groups=s.d_inner, bias=s.conv_bias)
        self.x_proj = nn.Linear(s.d_inner, s.dt_rank + 2 * s.d_state, bias=False)
        self.dt_proj = nn.Linear(s.dt_rank, s.d_inner, bias=True)
        A = torch.arange(1, s.d_state + 1, dtype=torch.float32).expand(s.d_inner, -1)
        self.A_log = nn.Parameter(torch.log(A).contiguous())
        self.D = nn.Parameter(torch.ones(s.d_inner))
        with torch.no_grad():  # Δ = softplus(bias) log-spaced in [1e-3, 1e-1], no RNG drawn
            dt = torch.exp(torch.linspace(-6.9078, -2.3026, s.d_inner))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.out_proj = nn.Linear(s.d_inner, cfg.hidden_size, bias=s.proj_bias)
        if s.dt_bc_norm:
            self.dt_layernorm = _RMSNorm(s.dt_rank, cfg.eps)
            self.b_layernorm = _RMSNorm(s.d_state, cfg.eps)
            self.c_layernorm = _RMSNorm(s.d_state, cfg.eps)
        self.state_spec = Mamba1Spec(self)

    def params(self) -> Mamba1Params:
        return Mamba1Params(-torch.exp(self.A_log.float()), self.D, self.dt_proj.bias)

    def conv(self, x_in, window):
        """SiLU(causal depthwise conv) over ``window`` (batch, d_conv-1, D) then x_in
        (batch, T, D): (batch, T, D)."""
        full = torch.cat([window.to(x_in.dtype), x_in], dim=1).transpose(1, 2)
        out = F.conv1d(full, self.conv1d.weight, self.conv1d.bias, groups=self.settings.d_inner)
        return F.silu(out).transpose(1, 2)

    def scan_inputs(self, x):
        """x (batch, T, D) after conv -> dt (batch, T, D) before bias, B, C (batch, T, N)."""
        s = self.settings
        dt, B, C = self.x_proj(x).split([s.dt_rank, s.d_state, s.d_state], dim=-1)
        if s.dt_bc_norm:
            dt, B, C = self.dt_layernorm(dt), self.b_layernorm(B), self.c_layernorm(C)
        return F.linear(dt, self.dt_proj.weight), B, C

    def forward(self, h, cache):
        x_in, gate = self.in_proj(h).chunk(2, dim=-1)
        y = cache.layer(self.layer).advance(x_in=x_in)
        return self.out_proj((y * F.silu(gate)).to(h.dtype))


class Mamba1Spec(RecurrentSpec):
    """The memory of one ``Mamba1Mixer``: state (D, N) fp32, conv window (d_conv-1, D), log
    entries x_in, x, dt, B, C. ``scan`` is ``s6_scan``; ``fold`` and ``outputs`` use the
    per-channel closed form (one read of the checkpoint, no state written for outputs)."""

    family = "mamba1"
    log_fields = ("x_in", "x", "dt", "B", "C")
    conv_field = "x_in"
    input_fields = ("x_in",)

    def __init__(self, mixer: Mamba1Mixer):
        s = mixer.settings
        self.state_shape = (s.d_inner, s.d_state)
        self.conv_shape = (s.d_conv - 1, s.d_inner)
        self.kernels = ReferenceReplayOps(self)
        self.mixer = mixer  # the weights are read here and only here

    def params(self) -> Mamba1Params:
        return self.mixer.params()

    def prepare(self, window, inputs):
        x_in = inputs["x_in"]
        x = self.mixer.conv(x_in, window)
        dt, B, C = self.mixer.scan_inputs(x)
        return dict(x_in=x_in, x=x, dt=dt, B=B, C=C)

    def scan(self, state, entries, return_states=False):
        p = self.params()
        return s6_scan(
            entries["x"],
            entries["dt"],
            p.A,
            entries["B"],
            entries["C"],
            p.D,
            dt_bias=p.dt_bias,
            dt_softplus=True,
            initial_state=state,
            return_states=return_states,
        )

    def fold(self, state, log):
        p = self.params()
        return s6_fold(state, log["x"], log["dt"], p.A, log["B"], p.dt_bias, dt_softplus=True)

    def outputs(self, state, log, entries):
        p = self.params()
        return s6_replay_outputs(
            state,
            dict(u=log["x"], dt=log["dt"], B=log["B"]),
            dict(u=entries["x"], dt=entries["dt"], B=entries["B"], C=entries["C"]),
            p.A,
            p.D,
            p.dt_bias,
            dt_softplus=True,
        )


class Mamba1ReplayKernels(ReplayKernels):
    """``replaylab.kernels.mamba1``'s Triton kernels over a Mamba-1 replay log (x, dt, B; the
    kernels read no C of past tokens). ``spec.params()`` gives A (D, N), D and dt_bias."""

    MAX_STEP_TOKENS = 16  # longer inputs (a prefill) go through fold + reference scan

    def __init__(self, spec: Mamba1Spec):
        self.spec = spec

    def _params(self):
        p = self.spec.params()
        return (
            p.A.detach().float().contiguous(),
            p.D.detach().float().contiguous(),
            p.dt_bias.detach().float().contiguous(),
        )

    def fold(self, checkpoint, rows, log, upto):
        from replaylab.kernels.mamba1 import fold

        A, _, bias = self._params()
        out, src, dst, fold_len = self.fold_targets(checkpoint, rows, upto)
        return fold(checkpoint, src, out, dst, log["x"], log["dt"], log["B"], fold_len, A, bias,
                    check=False)  # fmt: skip

    def step(self, checkpoint, rows, log, n, entries):
        if entries["x"].shape[1] > self.MAX_STEP_TOKENS:
            return None
        from replaylab.kernels.mamba1 import replay_step

        A, D, bias = self._params()
        log_len = torch.full((rows.numel(),), n, dtype=torch.int32, device=checkpoint.device)
        return replay_step(
            checkpoint,
            rows.to(torch.int32),
            log["x"],
            log["dt"],
            log["B"],
            log_len,
            entries["x"],
            entries["dt"],
            entries["B"],
            entries["C"],
            A,
            D,
            bias,
            append=False,
            check=False,  # the inputs are the layer's own; checks would sync the device
        )
