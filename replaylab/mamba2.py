"""The Mamba-2 mixer of NemotronH and Bamba, and its recurrent-layer spec.

Glossary (code name -> paper symbol, shape):
    H, P, N, G     heads, head width, state size, groups; state S: (batch, H, P, N) fp32
    conv_dim       channels through the causal conv: H*P + 2*G*N (x, B and C)
    gate           z_t (batch, T, H*P), the output gate
    xBC            conv input, the raw inputs a replay log keeps (batch, T, conv_dim)
    x, B, C        x_t (batch, T, H, P), B_t and C_t (batch, T, G, N), after conv and SiLU
    dt             Δ_t before processing (batch, T, H): Δ = max(softplus(dt + dt_bias), dt_min)
    A, D           -exp(A_log) (H,), one decay per head; D (H,) the skip

The mixer projects, hands ``xBC`` and ``dt`` to the cache (``cache.layer(l).advance``), which
runs the conv and the scan under its strategy through ``Mamba2Spec``, then gates, normalises
and projects out. Parameter names equal NemotronH's, so its state dict loads as it is.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from replaylab.recurrent import RecurrentSpec, ReplayKernels
from replaylab.scan import ssd_chunked_scan, ssd_scan

__all__ = ["Mamba2Mixer", "Mamba2Spec", "Mamba2Params", "GatedRMSNorm"]


class GatedRMSNorm(nn.Module):
    """y * silu(gate), then RMS-normalised within each of G groups (norm after gate)."""

    def __init__(self, size, groups, eps):
        super().__init__()
        self.weight, self.groups, self.eps = nn.Parameter(torch.ones(size)), groups, eps

    def forward(self, y, gate):
        y32 = (y.float() * F.silu(gate.float())).unflatten(-1, (self.groups, -1))
        y32 = y32 * torch.rsqrt(y32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y32.flatten(-2).to(y.dtype)


class Mamba2Params(NamedTuple):
    """A Mamba-2 layer's processed scan parameters: A (H,) fp32, D (H,), dt_bias (H,) and the
    (min, max) clamp of Δ."""

    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    dt_limit: tuple[float, float]


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        inner = cfg.ssm_heads * cfg.ssm_head_dim
        self.in_proj = nn.Linear(cfg.hidden_size, inner + cfg.conv_dim + cfg.ssm_heads, bias=False)
        self.conv1d = nn.Conv1d(
            cfg.conv_dim, cfg.conv_dim, cfg.d_conv, groups=cfg.conv_dim, bias=cfg.use_conv_bias
        )
        self.dt_bias = nn.Parameter(torch.ones(cfg.ssm_heads))
        self.A_log = nn.Parameter(
            torch.log(torch.arange(1, cfg.ssm_heads + 1, dtype=torch.float32))
        )
        self.D = nn.Parameter(torch.ones(cfg.ssm_heads))
        self.norm = GatedRMSNorm(inner, cfg.n_groups, cfg.eps)
        self.out_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.state_spec = Mamba2Spec(self)

    def params(self) -> Mamba2Params:
        """The processed scan parameters (differentiable: training goes through them)."""
        return Mamba2Params(
            -torch.exp(self.A_log.float()), self.D, self.dt_bias, (self.cfg.time_step_min, math.inf)
        )

    def conv(self, xBC, window):
        """SiLU(causal depthwise conv) over ``window`` (batch, d_conv-1, conv_dim) followed by
        xBC (batch, T, conv_dim): (batch, T, conv_dim)."""
        full = torch.cat([window.to(xBC.dtype), xBC], dim=1).transpose(1, 2)
        return F.silu(
            F.conv1d(full, self.conv1d.weight, self.conv1d.bias, groups=self.cfg.conv_dim)
        ).transpose(1, 2)

    def scan_input_widths(self):
        """The conv channels of x, B and C: (H·P, G·N, G·N)."""
        c = self.cfg
        return c.ssm_heads * c.ssm_head_dim, c.n_groups * c.d_state, c.n_groups * c.d_state

    def split_scan_inputs(self, conv_out):
        """(batch, T, conv_dim) after conv -> x (batch,T,H,P), B, C (batch,T,G,N)."""
        return self.unflatten_scan_inputs(*conv_out.split(self.scan_input_widths(), dim=-1))

    def unflatten_scan_inputs(self, x, B, C):
        """x (batch, T, H·P), B, C (batch, T, G·N) -> x (batch,T,H,P), B, C (batch,T,G,N)."""
        c = self.cfg
        return (
            x.unflatten(-1, (c.ssm_heads, c.ssm_head_dim)),
            B.unflatten(-1, (c.n_groups, c.d_state)),
            C.unflatten(-1, (c.n_groups, c.d_state)),
        )

    def forward(self, h, cache):
        c = self.cfg
        inner = c.ssm_heads * c.ssm_head_dim
        gate, xBC, dt = self.in_proj(h).split([inner, c.conv_dim, c.ssm_heads], dim=-1)
        y = cache.layer(self.layer).advance(xBC=xBC, dt=dt)
        return self.out_proj(self.norm(y.flatten(-2), gate))


class Mamba2Spec(RecurrentSpec):
    """The memory of one ``Mamba2Mixer``: state (H, P, N) fp32, conv window (d_conv-1, conv_dim),
    log entries xBC, x, dt, B, C; the scan is ``replaylab.scan.ssd_scan``.

    Inputs of ``CHUNKED_MIN_TOKENS`` tokens or more (a long prefill or recompute, training)
    go through the chunked form ``ssd_chunked_scan`` when no intermediate states are asked
    for: matrix products instead of a loop over tokens. It agrees with the token loop to
    rounding, not bitwise, so shorter advances (decode steps, verification of k drafts, the
    cache-contract tests) keep the token loop, whose T steps equal one T-token scan bitwise.
    The serving engine's prefill takes the chunked form at any length (``scan_prompt``).
    """

    family = "mamba2"
    log_fields = ("xBC", "x", "dt", "B", "C")
    conv_field = "xBC"
    input_fields = ("xBC", "dt")
    CHUNKED_MIN_TOKENS = 64  # tokens from which ``scan`` uses the chunked form
    CHUNK_SIZE = 64

    def __init__(self, mixer: Mamba2Mixer):
        c = mixer.cfg
        self.state_shape = (c.ssm_heads, c.ssm_head_dim, c.d_state)
        self.conv_shape = (c.d_conv - 1, c.conv_dim)
        self.kernels = Mamba2ReplayKernels(self)
        self.mixer = mixer  # the weights are read here and only here

    def params(self) -> Mamba2Params:
        return self.mixer.params()

    def prepare(self, window, inputs):
        xBC, dt = inputs["xBC"], inputs["dt"]
        x, B, C = self.mixer.split_scan_inputs(self.mixer.conv(xBC, window))
        return dict(xBC=xBC, x=x, dt=dt, B=B, C=C)

    def scan(self, state, entries, return_states=False):
        args, kw = self._scan_args(state, entries)
        if not return_states and entries["x"].shape[1] >= self.CHUNKED_MIN_TOKENS:
            return ssd_chunked_scan(*args, **kw, chunk_size=self.CHUNK_SIZE)
        return ssd_scan(*args, **kw, return_states=return_states)

    def scan_prompt(self, state, entries):
        args, kw = self._scan_args(state, entries)
        return ssd_chunked_scan(*args, **kw, chunk_size=self.CHUNK_SIZE)

    def _scan_args(self, state, entries):
        """(x, dt, A, B, C, D) and the keywords both scan forms take."""
        p = self.params()
        args = (entries["x"], entries["dt"], p.A, entries["B"], entries["C"], p.D)
        kw = dict(dt_bias=p.dt_bias, dt_softplus=True, dt_limit=p.dt_limit, initial_state=state)
        return args, kw


class Mamba2ReplayKernels(ReplayKernels):
    """``replaylab.kernels.mamba2``'s Triton kernels over a Mamba-2 replay log."""

    MAX_STEP_TOKENS = 16  # longer inputs (a prefill) go through fold + reference scan

    def __init__(self, spec: Mamba2Spec):
        self.spec = spec

    def _params(self):
        p = self.spec.params()
        return p.A.detach(), p.D.detach().float(), p.dt_bias.detach().float(), p.dt_limit

    def fold(self, checkpoint, rows, log, upto):
        from replaylab.kernels.mamba2 import fold

        A, _, bias, limit = self._params()
        out, src, dst, fold_len = self.fold_targets(checkpoint, rows, upto)
        return fold(checkpoint, src, out, dst, log["x"], log["dt"], log["B"], fold_len, A, bias,
                    True, limit)  # fmt: skip

    def step(self, checkpoint, rows, log, n, entries):
        if entries["x"].shape[1] > self.MAX_STEP_TOKENS:
            return None
        from replaylab.kernels.mamba2 import replay_step

        A, D, bias, limit = self._params()
        log_len = torch.full((rows.numel(),), n, dtype=torch.int32, device=checkpoint.device)
        return replay_step(
            checkpoint,
            rows.to(torch.int32),
            log["x"],
            log["dt"],
            log["B"],
            log["C"],
            log_len,
            entries["x"],
            entries["dt"],
            entries["B"],
            entries["C"],
            A,
            D,
            bias,
            True,
            limit,
            append=False,
            check=False,
        )
