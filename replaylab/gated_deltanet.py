"""The Gated DeltaNet mixer of Qwen3-Next and Qwen3.5, its recurrent-layer spec, and the gated
attention those models interleave with it.

Glossary (code name -> paper symbol, shape):
    Hk, H          key heads, value heads (H a multiple of Hk: each key head serves H / Hk)
    K, V           key and value head widths; state S: (batch, H, K, V) fp32 (o = S^T q)
    conv_dim       channels through the causal conv: 2*Hk*K + H*V (q, k and v)
    qkv            conv input, the raw inputs a replay log keeps (batch, T, conv_dim)
    q, k           q_t, k_t (batch, T, Hk, K) after conv, SiLU and L2 norm; q scaled by K^-1/2
    v              v_t (batch, T, H, V) after conv and SiLU
    a, b           per-head projections (batch, T, H) -> g and β
    g              log α_t = -exp(A_log) * softplus(a + dt_bias)   (batch, T, H), <= 0
    beta           β_t = sigmoid(b) (batch, T, H)
    z              output gate (batch, T, H, V): out = RMSNorm(o) * silu(z) per head
    recurrence     S_t = α_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T;   o_t = S_t^T q_t

The mixer projects, hands ``qkv``, ``a`` and ``b`` to the cache (``cache.layer(l).advance``),
which runs the conv and the recurrence under its strategy through ``GatedDeltaNetSpec``, then
normalises, gates and projects out. Replay keeps (qkv, q, k, v, g, β) per token: new outputs
come from checkpoint + log by the backward query recursion (``scan.gdn_replay_outputs``, no
state written) and the fold is the chunked WY / UT form (``scan.gdn_chunked_scan``).
Parameter names equal transformers' Qwen3.5 (Qwen3-Next's fused projections are split on load).

``GatedAttention`` is the models' softmax attention: q and k RMS-normalised per head, partial
RoPE, and a sigmoid output gate projected together with q (``project``, then ``kv.attend``
over the KV rows, then ``finish``: the serving engine runs ``project`` and ``finish`` at each
slot's positions, with its own attention between them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from replaylab.kv import attend, causal_mask
from replaylab.recurrent import RecurrentSpec, ReplayKernels
from replaylab.replay_ops import ReferenceReplayOps
from replaylab.scan import gdn_chunked_scan, gdn_replay_outputs, gdn_scan

__all__ = [
    "GDNConfig",
    "GatedDeltaNetMixer",
    "GatedDeltaNetSpec",
    "GatedDeltaNetReplayKernels",
    "GDNParams",
    "GatedAttention",
    "l2_normalize",
]


@dataclass
class GDNConfig:
    """The shape of a Gated DeltaNet layer: ``k_heads`` (Hk), ``v_heads`` (H, a multiple of
    Hk), ``k_head_dim`` (K), ``v_head_dim`` (V), ``d_conv``."""

    k_heads: int = 2
    v_heads: int = 4
    k_head_dim: int = 16
    v_head_dim: int = 16
    d_conv: int = 4

    def __post_init__(self):
        for name in ("k_heads", "v_heads", "k_head_dim", "v_head_dim", "d_conv"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"gdn.{name}: expected an integer >= 1, got {value!r}")
        if self.v_heads % self.k_heads:
            raise ValueError(
                f"gdn.v_heads={self.v_heads} must be a multiple of gdn.k_heads={self.k_heads}"
            )

    @property
    def conv_dim(self):
        return 2 * self.k_heads * self.k_head_dim + self.v_heads * self.v_head_dim


class GDNParams(NamedTuple):
    """A Gated DeltaNet layer's processed parameters: A = -exp(A_log) (H,) fp32, dt_bias (H,)."""

    A: torch.Tensor
    dt_bias: torch.Tensor


def l2_normalize(t, eps=1e-6):
    """t / sqrt(sum t^2 + eps) over the last dim, in fp32 (as the models compute it)."""
    t32 = t.float()
    return t32 * torch.rsqrt((t32 * t32).sum(-1, keepdim=True) + eps)


class _RMSNorm(nn.Module):
    """RMS norm over the last dim in fp32, times ``weight`` (a zero-centred norm's 1 + w is
    stored as the weight on load)."""

    def __init__(self, size, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, h):
        h32 = h.float()
        h32 = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h32 * self.weight.float()).to(h.dtype)


class _NormThenGate(nn.Module):
    """Per head: RMSNorm(o) * weight, then * silu(z) (norm before gate, unlike Mamba-2's)."""

    def __init__(self, size, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, o, z):
        o32 = o.float()
        o32 = o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * o32.to(o.dtype) * F.silu(z.float())).to(o.dtype)


class GatedDeltaNetMixer(nn.Module):
    """``forward(h (batch, T, hidden), cache) -> (batch, T, hidden)``."""

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        s = self.settings = cfg.gdn
        value_dim = s.v_heads * s.v_head_dim
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, s.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, s.v_heads, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, s.v_heads, bias=False)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.d_conv, groups=s.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(s.v_heads))
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 8.0, s.v_heads)))
        self.norm = _NormThenGate(s.v_head_dim, cfg.eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)
        self.state_spec = GatedDeltaNetSpec(self)

    def params(self) -> GDNParams:
        return GDNParams(-torch.exp(self.A_log.float()), self.dt_bias)

    def conv(self, qkv, window):
        """SiLU(causal depthwise conv) over ``window`` (batch, d_conv-1, conv_dim) then qkv
        (batch, T, conv_dim): (batch, T, conv_dim)."""
        full = torch.cat([window.to(qkv.dtype), qkv], dim=1).transpose(1, 2)
        out = F.conv1d(full, self.conv1d.weight, None, groups=self.settings.conv_dim)
        return F.silu(out).transpose(1, 2)

    def recurrence_inputs(self, conv_out, a, b):
        """conv output (batch, T, conv_dim), a, b (batch, T, H) -> q, k (batch, T, Hk, K)
        (normalised in fp32, q scaled), v (batch, T, H, V), g fp32 and beta (batch, T, H)."""
        s = self.settings
        key_dim = s.k_heads * s.k_head_dim
        q, k, v = conv_out.split([key_dim, key_dim, s.v_heads * s.v_head_dim], dim=-1)
        dtype = conv_out.dtype  # the log keeps q and k in the activations' dtype
        q = (l2_normalize(q.unflatten(-1, (s.k_heads, s.k_head_dim))) * s.k_head_dim**-0.5).to(
            dtype
        )
        k = l2_normalize(k.unflatten(-1, (s.k_heads, s.k_head_dim))).to(dtype)
        p = self.params()
        g = p.A * F.softplus(a.float() + p.dt_bias)
        return q, k, v.unflatten(-1, (s.v_heads, s.v_head_dim)), g, b.sigmoid()

    def forward(self, h, cache):
        s = self.settings
        z = self.in_proj_z(h).unflatten(-1, (s.v_heads, s.v_head_dim))
        o = cache.layer(self.layer).advance(
            qkv=self.in_proj_qkv(h), a=self.in_proj_a(h), b=self.in_proj_b(h)
        )
        return self.out_proj(self.norm(o.to(h.dtype), z).flatten(-2))


class GatedDeltaNetSpec(RecurrentSpec):
    """The memory of one ``GatedDeltaNetMixer``: state (H, K, V) fp32, conv window
    (d_conv-1, conv_dim), log entries qkv, q, k, v, g, beta.

    ``scan``: the token loop ``gdn_scan`` (its T steps equal one T-token scan bitwise), or the
    chunked form for inputs of ``CHUNKED_MIN_TOKENS`` or more without intermediate states;
    ``fold``: the chunked WY / UT form; ``outputs``: the backward query recursion from the
    checkpoint, no state written.
    """

    family = "gated_deltanet"
    log_fields = ("qkv", "q", "k", "v", "g", "beta")
    conv_field = "qkv"
    input_fields = ("qkv", "a", "b")
    CHUNKED_MIN_TOKENS = 64
    UPDATES_CHUNKED_MIN_TOKENS = 64
    CHUNK_SIZE = 16

    def __init__(self, mixer: GatedDeltaNetMixer):
        s = mixer.settings
        self.state_shape = (s.v_heads, s.k_head_dim, s.v_head_dim)
        self.conv_shape = (s.d_conv - 1, s.conv_dim)
        self.kernels = ReferenceReplayOps(self)
        self.mixer = mixer  # the weights are read here and only here

    def params(self) -> GDNParams:
        return self.mixer.params()

    def prepare(self, window, inputs):
        qkv = inputs["qkv"]
        q, k, v, g, beta = self.mixer.recurrence_inputs(
            self.mixer.conv(qkv, window), inputs["a"], inputs["b"]
        )
        return dict(qkv=qkv, q=q, k=k, v=v, g=g, beta=beta)

    @staticmethod
    def _args(entries):
        return (entries[f] for f in ("q", "k", "v", "g", "beta"))

    def scan(self, state, entries, return_states=False):
        if not return_states and entries["v"].shape[1] >= self.CHUNKED_MIN_TOKENS:
            return self._chunked(state, entries)
        return gdn_scan(*self._args(entries), initial_state=state, return_states=return_states)

    def scan_prompt(self, state, entries):
        return self._chunked(state, entries)

    def _chunked(self, state, entries):
        return gdn_chunked_scan(
            *self._args(entries), initial_state=state, chunk_size=self.CHUNK_SIZE
        )

    def fold(self, state, log):
        _, k, v, g, beta = self._args(log)
        return gdn_chunked_scan(
            None, k, v, g, beta, initial_state=state, chunk_size=self.CHUNK_SIZE
        ).state

    def outputs(self, state, log, entries):
        return gdn_replay_outputs(state, log, entries)

    def scan_with_updates(self, state, entries, prompt=False):
        """``scan`` (``prompt``: ``scan_prompt``) from ``state`` and the tokens' corrected
        updates u (batch, T, H, V) fp32: for a prompt, or from ``UPDATES_CHUNKED_MIN_TOKENS``
        and ``CHUNKED_MIN_TOKENS`` tokens on, one chunked pass gives both (its outputs are
        ``scan``'s bit for bit); otherwise ``scan`` and then ``corrected_updates``. Returns
        (ScanResult, u)."""
        T = entries["v"].shape[1]
        if prompt or T >= max(self.CHUNKED_MIN_TOKENS, self.UPDATES_CHUNKED_MIN_TOKENS):
            result = gdn_chunked_scan(*self._args(entries), initial_state=state,
                                      chunk_size=self.CHUNK_SIZE, return_updates=True)  # fmt: skip
            return result, result.updates
        return self.scan(state, entries), self.corrected_updates(state, entries)

    def corrected_updates(self, state, entries):
        """u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t) (batch, T, H, V) fp32 of ``entries``' tokens from
        ``state`` (batch, H, K, V): what the kernels' replay log keeps. From
        ``UPDATES_CHUNKED_MIN_TOKENS`` tokens on (a long prefill) the chunked form solves for them
        (``gdn_chunked_scan``), otherwise the token recurrence does
        (``kernels.gdn.corrected_updates``); the two agree to rounding."""
        fields = [entries[f] for f in ("k", "v", "g", "beta")]
        if fields[1].shape[1] >= self.UPDATES_CHUNKED_MIN_TOKENS:
            return gdn_chunked_scan(
                None,
                *fields,
                initial_state=state,
                chunk_size=self.CHUNK_SIZE,
                return_updates=True,
            ).updates
        from replaylab.kernels.gdn import corrected_updates

        return corrected_updates(state, *fields)[0]


class GatedDeltaNetReplayKernels(ReplayKernels):
    """``replaylab.kernels.gdn``'s Triton kernels over a log of keys k (batch, n, Hk, K), fp32
    corrected updates u_s = β_s (v_s - α_s S_{s-1}ᵀ k_s) (batch, n, H, V) and log-decays g
    (batch, n, H): S after j entries is then a decayed sum over the log, read in parallel.

    u depends on the state before its token, so it is made, not copied: ``step`` adds the
    new tokens' u to ``entries`` (the kernel computes it), and ``prefill`` gets it from the
    same chunked pass as the outputs (``GatedDeltaNetSpec.scan_with_updates``). Entries: q (scaled by K^-1/2) and k
    (batch, T, Hk, K), v (batch, T, H, V), g fp32 and beta (batch, T, H)."""

    MAX_STEP_TOKENS = 16  # longer inputs (a prefill) go through fold + reference scan
    LOG_FIELDS = ("k", "u", "g")

    def __init__(self, spec):
        self.spec = spec

    def fold(self, checkpoint, rows, log, upto):
        from replaylab.kernels.gdn import fold

        out, src, dst, fold_len = self.fold_targets(checkpoint, rows, upto)
        k, u, g = (log[f].contiguous() for f in self.LOG_FIELDS)
        return fold(checkpoint, src, out, dst, k, u, g, fold_len, check=False)

    def step(self, checkpoint, rows, log, n, entries):
        from replaylab.kernels.gdn import replay_step

        q, k, v, g, beta = (entries[f] for f in ("q", "k", "v", "g", "beta"))
        batch, T = v.shape[:2]
        if T > self.MAX_STEP_TOKENS:
            return None
        # room for the T new entries after the n logged ones: the kernel appends each token's
        # k, u and g before the next token reads the log
        room = {}
        for f in self.LOG_FIELDS:
            old = log[f][:, :n]
            room[f] = old.new_empty((batch, n + T, *old.shape[2:]))
            room[f][:, :n] = old
        log_len = torch.full((batch,), n, dtype=torch.int32, device=checkpoint.device)
        o = replay_step(checkpoint, rows.to(torch.int32), room["k"], room["u"], room["g"],
                        log_len, q, k.to(room["k"].dtype), v, g, beta, advance=False,
                        check=False)  # fmt: skip
        entries["u"] = room["u"][:, n:]
        return o

    def prefill(self, start, entries):
        result, u = self.spec.scan_with_updates(start, entries)
        return result.y, {"k": entries["k"], "u": u, "g": entries["g"]}

    def logged(self, entries):
        if "u" not in entries:
            raise ValueError(
                "logged: entries carry no corrected updates u; they come from step (decode) or "
                "prefill (a forward the step does not take)"
            )
        return {f: entries[f] for f in self.LOG_FIELDS}


class GatedAttention(nn.Module):
    """Softmax attention with per-head q / k RMS norms, partial RoPE (``cfg.rotary_dim``) and
    a sigmoid output gate: q_proj yields (q, gate) per head. ``forward(h, cache)``."""

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.attn_heads * hd * 2, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.attn_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = _RMSNorm(hd, cfg.eps)
        self.k_norm = _RMSNorm(hd, cfg.eps)

    def rotate(self, t, positions):
        """RoPE (halves rotated) on the first ``rotary_dim`` dims of t (batch, heads, T, hd)
        at ``positions``: an int start (start, start + 1, ...) or a tensor (T,) or (batch, T)."""
        c = self.cfg
        if not c.rotary_dim:
            return t
        if isinstance(positions, int):
            positions = torch.arange(positions, positions + t.shape[2], device=t.device)
        freq = 1.0 / c.rope_theta ** (
            torch.arange(0, c.rotary_dim, 2, device=t.device).float() / c.rotary_dim
        )
        angle = positions.float()[..., None] * freq
        angle = torch.cat([angle, angle], -1)
        if angle.dim() == 3:  # per row: (batch, 1, T, rotary_dim) against the heads
            angle = angle[:, None]
        cos, sin = angle.cos().to(t.dtype), angle.sin().to(t.dtype)
        rot, rest = t[..., : c.rotary_dim], t[..., c.rotary_dim :]
        first, second = rot.chunk(2, dim=-1)
        return torch.cat([rot * cos + torch.cat([-second, first], -1) * sin, rest], -1)

    def project(self, h, positions):
        """h (batch, T, hidden) at ``positions`` (an int start, (T,) or (batch, T)) -> q
        (batch, heads, T, hd), k, v (batch, Hkv, T, hd), normalised and rotated, and the
        output gate (batch, T, heads * hd)."""
        c = self.cfg
        batch, T, _ = h.shape
        q, gate = self.q_proj(h).view(batch, T, c.attn_heads, 2 * c.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(batch, T, c.kv_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(batch, T, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        return q, k, v, gate.reshape(batch, T, -1)

    def finish(self, out, gate):
        """The attention output (batch, T, heads * hd) -> gated by sigmoid(gate), projected
        out (batch, T, hidden)."""
        return self.o_proj(out * torch.sigmoid(gate))

    def forward(self, h, cache):
        positions = torch.arange(cache.position, cache.position + h.shape[1], device=h.device)
        q, k, v, gate = self.project(h, positions)
        keys, values = cache.layer(self.layer).append(k, v)
        out = attend(q, keys, values, causal_mask(h.shape[1], keys.shape[2], h.device))
        return self.finish(out, gate)
