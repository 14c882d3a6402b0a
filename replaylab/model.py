"""A hybrid causal LM that mirrors transformers' NemotronH: a stack of pre-norm residual blocks,
each holding one mixer: Mamba-2 ("M"), attention ("*") or MLP ("-"); also Mamba-1 ("S", Jamba,
``replaylab.mamba1``) and Gated DeltaNet ("G", Qwen3-Next and Qwen3.5, ``replaylab.gated_deltanet``).

Glossary (code name -> meaning, shape):
    pattern        one character per block, e.g. "M-M*-M-" (NemotronH's hybrid_override_pattern;
                   a Bamba, Jamba or Qwen layer is a mixer block then an MLP block: "M-*-M-")
    mamba1, gdn    the shapes of the "S" and "G" layers (``Mamba1Config``, ``GDNConfig``)
    attention      "plain", or "gated" (Qwen: q / k RMS norms and a sigmoid output gate)
    mlp            "relu2" (NemotronH: down(relu(up x)^2)) or "swiglu" (Bamba: down(silu(gate x) up x))
    rotary_dim     attention dims rotated by RoPE (0: none, as NemotronH; Bamba: half the head)
    hidden         d_model; hidden states (batch, T, d_model)
    H, P, N, G     Mamba-2 heads, head width, state size, groups (state (batch, H, P, N))
    conv_dim       channels through the causal conv: H*P + 2*G*N (x, B and C)
    xBC            conv input, the "raw conv inputs" a replay log keeps (batch, T, conv_dim)
    scan inputs    x (batch, T, H, P), dt (batch, T, H) raw, B and C (batch, T, G, N), after conv

Parameter names equal NemotronH's, so its state dict loads as it is. Every mixer reads and
writes its memory only through the cache it is given (``replaylab.cache.HybridCache``); the
cache is built from ``HybridLM.cache_spec()``, which names each recurrent layer's
``RecurrentSpec`` (``replaylab.mamba2.Mamba2Spec``) and each attention layer's KV shape.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from replaylab.cache import CacheSpec
from replaylab.gated_deltanet import GatedAttention, GatedDeltaNetMixer, GDNConfig
from replaylab.kv import attend, causal_mask
from replaylab.mamba1 import Mamba1Config, Mamba1Mixer
from replaylab.mamba2 import Mamba2Mixer
from replaylab.validation import as_flag, as_int, as_real, check_token_ids

__all__ = [
    "HybridConfig",
    "HybridLM",
    "load_transformers_hybrid",
    "load_transformers_nemotron_h",
    "preset",
    "PRESETS",
    "to_transformers_nemotron_h",
]


@dataclass
class HybridConfig:
    vocab_size: int = 128
    hidden_size: int = 64
    pattern: str = "M-M*-M-"
    ssm_heads: int = 4
    ssm_head_dim: int = 16
    d_state: int = 16
    n_groups: int = 2
    d_conv: int = 4
    attn_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    eps: float = 1e-5
    time_step_min: float = 0.001  # the Mamba-2 layers' floor on Δ: Δ = max(softplus(..), this)
    use_conv_bias: bool = True
    tie_word_embeddings: bool = False
    mlp: str = "relu2"
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    # other recurrent families and attention variants (Jamba, Qwen3-Next, Qwen3.5); a dict
    # (as config.json stores them) becomes the dataclass
    mamba1: Mamba1Config | None = None  # the "S" layers' shape
    gdn: GDNConfig | None = None  # the "G" layers' shape
    attention: str = "plain"  # "gated": Qwen's q/k-normed attention with a sigmoid gate

    def __post_init__(self):
        if not isinstance(self.pattern, str):
            raise TypeError(f"pattern: expected a string such as 'M-M*-', got {self.pattern!r}")
        if self.d_conv < 1:
            raise ValueError(f"d_conv: expected a conv width >= 1, got {self.d_conv}")
        for name in ("vocab_size", "hidden_size", "ssm_heads", "ssm_head_dim", "d_state",
                     "n_groups", "d_conv", "attn_heads", "kv_heads", "head_dim",
                     "intermediate_size"):  # fmt: skip
            as_int(name, getattr(self, name), low=1)
        as_int("rotary_dim", self.rotary_dim, low=0)
        as_real("eps", self.eps, above=0)
        as_real("time_step_min", self.time_step_min, low=0)
        as_real("rope_theta", self.rope_theta, above=0)
        for name in ("use_conv_bias", "tie_word_embeddings"):
            as_flag(name, getattr(self, name))
        bad = set(self.pattern) - set(PATTERN_CHARACTERS)
        if bad:
            allowed = ", ".join(f"{c} ({what})" for c, what in PATTERN_CHARACTERS.items())
            raise ValueError(
                f"pattern: expected characters {allowed}, got {sorted(bad)} in {self.pattern!r}"
            )
        for name, kind in (("mamba1", Mamba1Config), ("gdn", GDNConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, kind(**value))
            elif value is not None and not isinstance(value, kind):
                raise TypeError(f"{name}: expected a {kind.__name__} or a dict, got {value!r}")
        if "S" in self.pattern and self.mamba1 is None:
            self.mamba1 = Mamba1Config()
        if "G" in self.pattern and self.gdn is None:
            self.gdn = GDNConfig()
        if self.attention not in ("plain", "gated"):
            raise ValueError(f"attention: expected 'plain' or 'gated', got {self.attention!r}")
        if self.mlp not in ("relu2", "swiglu"):
            raise ValueError(f"mlp: expected 'relu2' or 'swiglu', got {self.mlp!r}")
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"rotary_dim: expected an even number in [0, head_dim={self.head_dim}], "
                f"got {self.rotary_dim}"
            )
        if self.ssm_heads % self.n_groups or self.attn_heads % self.kv_heads:
            raise ValueError(
                f"n_groups={self.n_groups} must divide ssm_heads={self.ssm_heads} and "
                f"kv_heads={self.kv_heads} must divide attn_heads={self.attn_heads}"
            )

    @property
    def conv_dim(self):
        return self.ssm_heads * self.ssm_head_dim + 2 * self.n_groups * self.d_state

    @property
    def ssm_layers(self):
        return [i for i, c in enumerate(self.pattern) if c == "M"]

    @property
    def attn_layers(self):
        return [i for i, c in enumerate(self.pattern) if c == "*"]

    @property
    def mamba1_layers(self):
        return [i for i, c in enumerate(self.pattern) if c == "S"]

    @property
    def gdn_layers(self):
        return [i for i, c in enumerate(self.pattern) if c == "G"]

    @property
    def recurrent_layers(self):
        """Every layer with a recurrent state: Mamba-2 (M), Mamba-1 (S), Gated DeltaNet (G)."""
        return [i for i, c in enumerate(self.pattern) if c in "MSG"]


# pattern character -> the block's mixer
PATTERN_CHARACTERS = {
    "M": "Mamba-2",
    "S": "Mamba-1 / S6",
    "G": "Gated DeltaNet",
    "*": "attention",
    "-": "MLP",
}


def rope_frequencies(cfg, device):
    """RoPE's frequencies theta^(-2i / rotary_dim), i < rotary_dim / 2, fp32 (empty without
    RoPE): both attention modules' (``Attention``, ``GatedAttention``)."""
    steps = torch.arange(0, cfg.rotary_dim, 2, device=device).float()
    return 1.0 / cfg.rope_theta ** (steps / max(cfg.rotary_dim, 1))


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, h):
        h32 = h.float()
        h32 = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h32).to(h.dtype)


class Attention(nn.Module):
    """Softmax attention, RoPE on the first ``rotary_dim`` dims (Bamba) or none (NemotronH).
    ``project`` and ``finish`` are the math before and after the product with the KV rows
    (``kv.attend``); ``forward`` runs them over a cache, the serving engine over its pools at
    each slot's own positions (with its own attention between them)."""

    def __init__(self, cfg: HybridConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.attn_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.attn_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def project(self, h, positions):
        """h (batch, T, hidden) at ``positions`` (an int start, (T,) or (batch, T)) -> q
        (batch, heads, T, Dh), k, v (batch, Hkv, T, Dh) with RoPE applied, and the output gate
        (None: no gate)."""
        c = self.cfg
        batch, T, _ = h.shape
        q = self.q_proj(h).view(batch, T, c.attn_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(batch, T, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(batch, T, c.kv_heads, c.head_dim).transpose(1, 2)
        if c.rotary_dim:
            q, k = self.rotate(q, positions), self.rotate(k, positions)
        return q, k, v, None

    def finish(self, out, gate):
        """The attention output (batch, T, heads * Dh) -> (batch, T, hidden)."""
        return self.o_proj(out)

    def forward(self, h, cache):
        positions = torch.arange(cache.position, cache.position + h.shape[1], device=h.device)
        q, k, v, gate = self.project(h, positions)
        keys, values = cache.layer(self.layer).append(k, v)
        out = attend(q, keys, values, causal_mask(h.shape[1], keys.shape[2], h.device))
        return self.finish(out, gate)

    def inv_freq(self, device):
        """RoPE's frequencies (``rope_frequencies``)."""
        return rope_frequencies(self.cfg, device)

    def rotate(self, t, positions):
        """RoPE on the first ``rotary_dim`` dims of t (batch, heads, T, Dh) at ``positions``:
        an int start (start, start + 1, ...) or a tensor (T,) or (batch, T)."""
        c = self.cfg
        if isinstance(positions, int):
            positions = torch.arange(positions, positions + t.shape[2], device=t.device)
        half = c.rotary_dim // 2
        pos = positions.float()
        angles = torch.cat([pos[..., None] * self.inv_freq(t.device)] * 2, dim=-1)
        if angles.dim() == 3:  # per row: (batch, 1, T, rotary_dim) against the heads
            angles = angles[:, None]
        cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
        rot, rest = t[..., : c.rotary_dim], t[..., c.rotary_dim :]
        rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
        return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


class MLP(nn.Module):
    def __init__(self, cfg: HybridConfig, layer: int):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        if self.swiglu:
            self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h, cache):
        if self.swiglu:
            return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return self.down_proj(F.relu(self.up_proj(h)).square())


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.eps)
        attention = GatedAttention if cfg.attention == "gated" else Attention
        mixers = {
            "M": Mamba2Mixer,
            "S": Mamba1Mixer,
            "G": GatedDeltaNetMixer,
            "*": attention,
            "-": MLP,
        }
        self.mixer = mixers[cfg.pattern[layer]](cfg, layer)

    def forward(self, h, cache):
        return h + self.mixer(self.norm(h), cache)


class _Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(len(cfg.pattern)))
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.eps)


class _NoCache:
    """What the mixers meet when ``HybridLM.forward`` runs with ``cache=None`` (training): each
    recurrent layer scans the whole sequence from a zero state (``spec.scan``, chunked for long
    inputs), each attention layer attends within the sequence; nothing is kept."""

    position = 0

    def __init__(self, model):
        self.model = model

    def layer(self, index):
        return _NoCacheLayer(self.model.model.layers[index].mixer)


class _NoCacheLayer:
    def __init__(self, mixer):
        self.mixer = mixer

    def advance(self, **inputs):
        spec, first = self.mixer.state_spec, next(iter(inputs.values()))
        zero = spec.zero_state(first.shape[0], first.dtype, first.device)
        return spec.scan(zero.ssm, spec.prepare(zero.conv, inputs)).y

    def append(self, k, v):
        return k, v


class HybridLM(nn.Module):
    """The hybrid LM. ``forward(input_ids (batch, T), cache) -> logits (batch, T, vocab)``
    processes T new tokens after what the cache holds, and advances the cache by T."""

    def __init__(self, cfg: HybridConfig, seed: int | None = 0):
        super().__init__()
        self.cfg = cfg
        self.model = _Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if seed is not None:
            self.init_weights(seed)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embeddings.weight

    @torch.no_grad()
    def init_weights(self, seed):
        """Deterministic random weights (std 0.02 for matrices, the norms and SSM scalars as
        NemotronH initialises them)."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02 * (4 if "conv1d" in name else 1))
            elif "dt_bias" in name:
                p.copy_(torch.rand(p.shape, generator=g) - 0.5)
            elif "conv1d.bias" in name:
                p.zero_()

    def cache_spec(self, dtype=None) -> CacheSpec:
        """What a cache of this model holds: each recurrent layer's spec (Mamba-2, Mamba-1,
        Gated DeltaNet), each attention layer's (kv_heads, head_dim), and ``rerun`` (this
        model's forward) for restores that re-run."""
        c, param = self.cfg, next(self.parameters())
        return CacheSpec(
            recurrent={l: self.model.layers[l].mixer.state_spec for l in c.recurrent_layers},
            attention={l: (c.kv_heads, c.head_dim) for l in c.attn_layers},
            dtype=dtype or param.dtype,
            device=param.device,
            rerun=self._rerun,
        )

    def _rerun(self, tokens, cache):
        self(tokens, cache)

    def forward(self, input_ids, cache):
        """Logits (batch, T, vocab) of T new tokens ``input_ids`` (batch, T) after what
        ``cache`` holds; advances the cache by T. Checks the ids and that the cache was built
        for this model before anything changes; if a layer fails midway the cache is put back
        as it was. T = 0 is a no-op returning (batch, 0, vocab) logits.

        ``cache=None`` (training): the logits of whole sequences from an empty memory, with
        gradients; nothing is kept."""
        if cache is None:
            if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
                got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else input_ids
                kind = ValueError if isinstance(input_ids, torch.Tensor) else TypeError
                raise kind(f"input_ids: expected token ids of shape (batch, T), got {got!r}")
            check_token_ids(input_ids, input_ids.shape[0], self.cfg.vocab_size)
            if input_ids.shape[1] == 0:
                return self.lm_head.weight.new_zeros(input_ids.shape[0], 0, self.cfg.vocab_size)
            h = self.model.embeddings(input_ids.long())
            for block in self.model.layers:
                h = block(h, _NoCache(self))
            return self.lm_head(self.model.norm_f(h))
        if not hasattr(cache, "check_layout"):
            raise TypeError(
                f"cache: expected a HybridCache (replaylab.cache) or None, got "
                f"{type(cache).__name__} {cache!r}"
            )
        check_token_ids(input_ids, cache.batch, self.cfg.vocab_size)
        cache.check_layout(self.cache_spec())
        input_ids = input_ids.long()  # any integer dtype (the embedding takes int64)
        if input_ids.shape[1] == 0:
            return self.lm_head.weight.new_zeros(cache.batch, 0, self.cfg.vocab_size)
        cache.begin(input_ids)
        try:
            h = self.model.embeddings(input_ids)
            for block in self.model.layers:
                h = block(h, cache)
        except BaseException:
            cache.abort()
            raise
        cache.end()
        return self.lm_head(self.model.norm_f(h))

    def save(self, folder):
        """Write ``config.json`` and ``model.safetensors`` to ``folder``."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(asdict(self.cfg), indent=1))
        save_file(
            {k: v.contiguous() for k, v in self.state_dict().items()},
            str(folder / "model.safetensors"),
        )

    @classmethod
    def load(cls, folder):
        from safetensors.torch import load_file

        folder = Path(folder)
        model = cls(HybridConfig(**json.loads((folder / "config.json").read_text())), seed=None)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        return model


def _dt_floor(hf_config) -> float:
    """The floor on Δ that a NemotronH or Bamba config asks for: ``time_step_limit[0]``.

    transformers' Mamba-2 layers clamp Δ to ``time_step_limit`` (Mamba2, Bamba, and NemotronH
    from 5.25 on, as mamba-ssm's kernels take ``dt_limit``); ``time_step_min`` only sets the
    range ``dt_bias`` is initialised in. NemotronH up to 5.24 clamped at
    ``(time_step_min, inf)`` instead (tests/test_model.py states both); the folders replaylab
    writes set ``time_step_limit[0] == time_step_min``, so they compute one function in either.
    """
    low, high = (float(v) for v in hf_config.time_step_limit)
    if high != math.inf:
        raise ValueError(
            f"time_step_limit: replaylab supports no upper limit on Δ, got {hf_config.time_step_limit}"
        )
    return low


def config_from_nemotron_h(hf_config) -> HybridConfig:
    """A HybridConfig from a transformers NemotronHConfig (Mamba-2, attention, MLP blocks).
    The floor on Δ is ``time_step_limit[0]``, as transformers >= 5.25 reads it (``_dt_floor``)."""
    kinds = {"linear_attention": "M", "full_attention": "*", "mlp": "-"}
    unsupported = set(hf_config.layers_block_type) - set(kinds)
    if unsupported:
        raise ValueError(
            f"layers_block_type: replaylab supports {sorted(kinds)}, got {sorted(unsupported)}"
        )
    if hf_config.mlp_hidden_act != "relu2" or hf_config.mamba_hidden_act != "silu":
        raise ValueError(
            f"activations: expected relu2 MLP and silu Mamba, got "
            f"{hf_config.mlp_hidden_act!r} and {hf_config.mamba_hidden_act!r}"
        )
    return HybridConfig(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        pattern="".join(kinds[k] for k in hf_config.layers_block_type),
        ssm_heads=hf_config.mamba_num_heads,
        ssm_head_dim=hf_config.mamba_head_dim,
        d_state=hf_config.ssm_state_size,
        n_groups=hf_config.n_groups,
        d_conv=hf_config.conv_kernel,
        attn_heads=hf_config.num_attention_heads,
        kv_heads=hf_config.num_key_value_heads,
        head_dim=hf_config.head_dim,
        intermediate_size=hf_config.intermediate_size,
        eps=hf_config.layer_norm_epsilon,
        time_step_min=_dt_floor(hf_config),
        use_conv_bias=hf_config.use_conv_bias,
        tie_word_embeddings=hf_config.tie_word_embeddings,
    )


def config_from_bamba(hf_config) -> HybridConfig:
    """A HybridConfig from a transformers BambaConfig: each layer becomes a mixer block and a
    SwiGLU MLP block; attention uses partial RoPE."""
    if hf_config.hidden_act != "silu" or hf_config.mamba_proj_bias or hf_config.attention_bias:
        raise ValueError("Bamba config: replaylab supports silu MLPs without projection biases")
    rope = hf_config.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters: only the default RoPE is supported, got {rope}")
    head_dim = (
        getattr(hf_config, "head_dim", None)
        or hf_config.hidden_size // hf_config.num_attention_heads
    )
    kinds = {"linear_attention": "M", "full_attention": "*"}
    unsupported = set(hf_config.layers_block_type) - set(kinds)
    if unsupported:
        raise ValueError(
            f"layers_block_type: replaylab supports {sorted(kinds)}, got {sorted(unsupported)}"
        )
    return HybridConfig(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        pattern="".join(kinds[k] + "-" for k in hf_config.layers_block_type),
        ssm_heads=hf_config.mamba_n_heads,
        ssm_head_dim=hf_config.mamba_d_head,
        d_state=hf_config.mamba_d_state,
        n_groups=hf_config.mamba_n_groups,
        d_conv=hf_config.mamba_d_conv,
        attn_heads=hf_config.num_attention_heads,
        kv_heads=hf_config.num_key_value_heads,
        head_dim=head_dim,
        intermediate_size=hf_config.intermediate_size,
        eps=hf_config.rms_norm_eps,
        time_step_min=_dt_floor(hf_config),
        use_conv_bias=hf_config.mamba_conv_bias,
        tie_word_embeddings=hf_config.tie_word_embeddings,
        mlp="swiglu",
        rotary_dim=int(head_dim * rope.get("partial_rotary_factor", 1.0)),
        rope_theta=float(rope["rope_theta"]),
    )


def _bamba_key(key):
    """transformers Bamba parameter name -> replaylab's (layer i -> blocks 2i and 2i+1)."""
    key = key.replace("model.embed_tokens.", "model.embeddings.")
    key = key.replace("model.final_layernorm.", "model.norm_f.")
    parts = key.split(".")
    if parts[:2] != ["model", "layers"]:
        return key
    i, rest = int(parts[2]), parts[3:]
    if rest[0] == "input_layernorm":
        return f"model.layers.{2 * i}.norm.{rest[1]}"
    if rest[0] in ("mamba", "self_attn"):
        return ".".join(["model.layers", str(2 * i), "mixer", *rest[1:]])
    if rest[0] == "pre_ff_layernorm":
        return f"model.layers.{2 * i + 1}.norm.{rest[1]}"
    if rest[0] == "feed_forward":
        return ".".join(["model.layers", str(2 * i + 1), "mixer", *rest[1:]])
    return key


def _check_swiglu_without_biases(hf_config, family, bias_fields):
    if hf_config.hidden_act != "silu":
        raise ValueError(f"hidden_act: {family} MLPs must use silu, got {hf_config.hidden_act!r}")
    for name in bias_fields:
        if getattr(hf_config, name, False):
            raise ValueError(f"{name}: replaylab supports {family} without this bias, got True")


def _layer_kinds(hf_config, field, kinds):
    types = list(getattr(hf_config, field))
    unsupported = sorted(set(types) - set(kinds))
    if unsupported:
        raise ValueError(f"{field}: replaylab supports {sorted(kinds)}, got {unsupported}")
    return "".join(kinds[t] + "-" for t in types)


def config_from_jamba(hf_config) -> HybridConfig:
    """A HybridConfig from a transformers JambaConfig with dense MLPs (``num_experts=1``): each
    layer becomes a mixer block (Mamba-1 "S" or attention "*", no RoPE) and a SwiGLU MLP block."""
    experts = list(hf_config.layers_num_experts or [hf_config.num_experts])
    if hf_config.num_experts != 1 or any(n != 1 for n in experts):
        raise ValueError(
            f"num_experts: replaylab supports dense Jamba models (num_experts=1), got "
            f"num_experts={hf_config.num_experts} (mixture-of-experts layers are not supported)"
        )
    _check_swiglu_without_biases(hf_config, "Jamba", ())
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if hf_config.hidden_size % heads or heads % kv_heads:
        raise ValueError(
            f"num_attention_heads={heads} must divide hidden_size={hf_config.hidden_size} "
            f"and be a multiple of num_key_value_heads={kv_heads}"
        )
    return HybridConfig(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        pattern=_layer_kinds(hf_config, "layers_block_type", {"mamba": "S", "attention": "*"}),
        attn_heads=heads,
        kv_heads=kv_heads,
        head_dim=hf_config.hidden_size // heads,
        intermediate_size=hf_config.intermediate_size,
        eps=hf_config.rms_norm_eps,
        tie_word_embeddings=hf_config.tie_word_embeddings,
        mlp="swiglu",
        mamba1=Mamba1Config(
            d_inner=hf_config.mamba_expand * hf_config.hidden_size,
            d_state=hf_config.mamba_d_state,
            d_conv=hf_config.mamba_d_conv,
            dt_rank=int(hf_config.mamba_dt_rank),
            conv_bias=bool(hf_config.mamba_conv_bias),
            proj_bias=bool(hf_config.mamba_proj_bias),
            dt_bc_norm=True,
        ),
    )


def config_from_qwen3_gdn(hf_config) -> HybridConfig:
    """A HybridConfig from a transformers Qwen3NextConfig (dense MLPs only: ``mlp_only_layers``
    must cover every layer, or ``num_experts=0``) or Qwen3_5TextConfig: each layer becomes a
    mixer block (Gated DeltaNet "G" or gated attention "*" with partial RoPE) and a SwiGLU MLP
    block."""
    n = hf_config.num_hidden_layers
    experts = getattr(hf_config, "num_experts", 0) or 0
    if experts > 0:
        step = getattr(hf_config, "decoder_sparse_step", 1)
        dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
        moe = [i for i in range(n) if i not in dense and (i + 1) % step == 0]
        if moe:
            raise ValueError(
                f"mlp_only_layers: replaylab supports dense Qwen3-Next models (mlp_only_layers "
                f"covering all {n} layers, or num_experts=0); layers {moe} would be "
                f"mixture-of-experts (num_experts={experts})"
            )
    _check_swiglu_without_biases(hf_config, "Qwen3-Next / Qwen3.5", ("attention_bias",))
    rope = hf_config.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope_parameters: only the default RoPE is supported, got {rope}")
    k_heads, v_heads = hf_config.linear_num_key_heads, hf_config.linear_num_value_heads
    if v_heads % k_heads:
        raise ValueError(
            f"linear_num_value_heads={v_heads} must be a multiple of linear_num_key_heads={k_heads}"
        )
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if heads % kv_heads:
        raise ValueError(
            f"num_attention_heads={heads} must be a multiple of num_key_value_heads={kv_heads}"
        )
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    kinds = {"linear_attention": "G", "full_attention": "*"}
    return HybridConfig(
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        pattern=_layer_kinds(hf_config, "layer_types", kinds),
        attn_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=hf_config.intermediate_size,
        eps=hf_config.rms_norm_eps,
        tie_word_embeddings=hf_config.tie_word_embeddings,
        mlp="swiglu",
        rotary_dim=int(head_dim * rope.get("partial_rotary_factor", 1.0)),
        rope_theta=float(rope["rope_theta"]),
        attention="gated",
        gdn=GDNConfig(
            k_heads=k_heads,
            v_heads=v_heads,
            k_head_dim=hf_config.linear_key_head_dim,
            v_head_dim=hf_config.linear_value_head_dim,
            d_conv=hf_config.linear_conv_kernel_dim,
        ),
    )


def _qwen_key(key):
    """transformers Qwen3-Next / Qwen3.5 parameter name -> replaylab's (layer i -> blocks 2i
    and 2i+1)."""
    if key.startswith("model.embed_tokens."):
        return key.replace("model.embed_tokens.", "model.embeddings.")
    if key.startswith("model.norm."):
        return key.replace("model.norm.", "model.norm_f.")
    parts = key.split(".")
    if parts[:2] != ["model", "layers"]:
        return key
    i, rest = int(parts[2]), parts[3:]
    block = {"input_layernorm": (0, "norm"), "linear_attn": (0, "mixer"), "self_attn": (0, "mixer")}
    block |= {"post_attention_layernorm": (1, "norm"), "mlp": (1, "mixer")}
    if rest[0] not in block:
        return key
    offset, name = block[rest[0]]
    return ".".join(["model.layers", str(2 * i + offset), name, *rest[1:]])


def _qwen_state(state, cfg: HybridConfig):
    """Qwen's zero-centred RMS norms scale by 1 + w: store 1 + w as the weight (block norms,
    the final norm, attention q / k norms; not the Gated DeltaNet output norm, which scales by
    w). Qwen3-Next's fused ``in_proj_qkvz`` / ``in_proj_ba`` (grouped by key head) are split
    into Qwen3.5's ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``."""
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        block_norm = parts[:2] == ["model", "layers"] and parts[3:] == ["norm", "weight"]
        zero_centred = block_norm or key == "model.norm_f.weight"
        zero_centred |= parts[-2:] in (["q_norm", "weight"], ["k_norm", "weight"])
        out[key] = value.float() + 1.0 if zero_centred else value
    g = cfg.gdn
    for layer in cfg.gdn_layers if g is not None else []:
        prefix = f"model.layers.{layer}.mixer."
        if prefix + "in_proj_qkv.weight" in out:  # Qwen3.5: already split
            continue
        for name in ("in_proj_qkvz.weight", "in_proj_ba.weight"):
            if prefix + name not in out:
                raise ValueError(f"weights: missing {prefix + name} (Gated DeltaNet layer {layer})")
        r = g.v_heads // g.k_heads
        qkvz = out.pop(prefix + "in_proj_qkvz.weight").unflatten(0, (g.k_heads, -1))
        q, k, v, z = qkvz.split([g.k_head_dim, g.k_head_dim, r * g.v_head_dim, r * g.v_head_dim], 1)
        out[prefix + "in_proj_qkv.weight"] = torch.cat([t.flatten(0, 1) for t in (q, k, v)])
        out[prefix + "in_proj_z.weight"] = z.flatten(0, 1)
        b, a = out.pop(prefix + "in_proj_ba.weight").unflatten(0, (g.k_heads, -1)).split([r, r], 1)
        out[prefix + "in_proj_b.weight"], out[prefix + "in_proj_a.weight"] = (
            b.flatten(0, 1),
            a.flatten(0, 1),
        )
    return out


# model_type -> (HybridConfig from its config, parameter renaming[, state conversion])
SUPPORTED = {
    "nemotron_h": (lambda c: config_from_nemotron_h(c), lambda k: k),
    "bamba": (lambda c: config_from_bamba(c), _bamba_key),
    "jamba": (config_from_jamba, _bamba_key),  # Jamba's names follow Bamba's
    "qwen3_next": (config_from_qwen3_gdn, _qwen_key, _qwen_state),
    "qwen3_5_text": (config_from_qwen3_gdn, _qwen_key, _qwen_state),
}
MAMBA2_FAMILIES = ("nemotron_h", "bamba")


def _unsupported(where, model_type):
    others = ", ".join(t for t in SUPPORTED if t not in MAMBA2_FAMILIES)
    return ValueError(
        f"{where}: expected a supported hybrid ({', '.join(MAMBA2_FAMILIES)}), got model_type "
        f"{model_type!r} (also supported: {others}; MoE variants are not)"
    )


def load_transformers_hybrid(source) -> HybridLM:
    """A HybridLM with the weights of a transformers NemotronH, Bamba, Jamba (dense), Qwen3-Next
    (dense) or Qwen3.5 text model: an instance, or a folder as ``save_pretrained`` writes it."""
    if isinstance(source, (str, Path)):
        from transformers import AutoConfig, AutoModelForCausalLM

        folder = Path(source)
        if not (folder / "config.json").exists():
            raise ValueError(
                f"{folder}: no config.json; expected a folder written by save_pretrained"
            )
        hf_config = AutoConfig.from_pretrained(folder)
        if hf_config.model_type not in SUPPORTED:
            raise _unsupported(folder, hf_config.model_type)
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
            raise ValueError(f"{folder}: no weights (*.safetensors or *.bin) next to config.json")
        source, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
        if info["missing_keys"]:  # transformers would fill them with random values
            raise ValueError(
                f"{folder}: weights missing for {sorted(info['missing_keys'])} (the folder's "
                f"weights do not cover every layer its config.json describes)"
            )
    if isinstance(source, HybridLM):
        raise TypeError("source: this is already a replaylab HybridLM; use it as it is")
    if not hasattr(getattr(source, "config", None), "model_type"):
        raise TypeError(
            f"source: expected a transformers model or a folder written by save_pretrained, got "
            f"{type(source).__name__}"
        )
    model_type = source.config.model_type
    if model_type not in SUPPORTED:
        raise _unsupported("model", model_type)
    make_config, rename, *convert = SUPPORTED[model_type]
    cfg = make_config(source.config)
    model = HybridLM(cfg, seed=None)
    state = {
        rename(k): v
        for k, v in source.state_dict().items()
        if not k.endswith("rotary_emb.inv_freq")
    }
    for conversion in convert:
        state = conversion(state, cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights: missing {missing}, unexpected {unexpected}")
    return model.to(next(source.parameters()).dtype)


def load_transformers_nemotron_h(source) -> HybridLM:
    """``load_transformers_hybrid`` for NemotronH (kept for its name)."""
    model = load_transformers_hybrid(source)
    if model.cfg.mlp != "relu2":
        raise ValueError("expected a NemotronH checkpoint, got a Bamba one")
    return model


PRESETS = {
    # the notebooks' and CI's model: runs anywhere in seconds
    "tiny": dict(
        vocab_size=128,
        hidden_size=64,
        pattern="M-M*-M-",
        ssm_heads=8,
        ssm_head_dim=16,
        d_state=64,
        n_groups=1,
        attn_heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate_size=128,
    ),
    # about 1B parameters, Nemotron-H's block layout
    "1b": dict(
        vocab_size=32000,
        hidden_size=2048,
        pattern="M-M-M*-M-M-M*-M-M-M*-M-M-M-",
        ssm_heads=64,
        ssm_head_dim=64,
        d_state=128,
        n_groups=8,
        attn_heads=16,
        kv_heads=4,
        head_dim=128,
        intermediate_size=8192,
    ),
    # Nemotron-H 8B's layer shapes (H=128, P=64, N=128, G=8), fewer blocks
    "8b-layers": dict(
        vocab_size=32000,
        hidden_size=4096,
        pattern="M-M*-M-",
        ssm_heads=128,
        ssm_head_dim=64,
        d_state=128,
        n_groups=8,
        attn_heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate_size=21504,
    ),
}


def preset(name: str) -> HybridConfig:
    """A named model size: "tiny" (CPU), "1b", or "8b-layers" (Nemotron-H 8B shapes)."""
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return HybridConfig(**PRESETS[name])


def to_transformers_nemotron_h(model: HybridLM):
    """The same model as a transformers NemotronHForCausalLM (same weights): the baseline."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    c = model.cfg
    if c.mlp != "relu2" or c.rotary_dim:
        raise ValueError(
            "to_transformers_nemotron_h: only NemotronH-style models (relu2 MLP, "
            "no RoPE) have a NemotronH twin"
        )
    hf_cfg = NemotronHConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=len(c.pattern),
        hybrid_override_pattern=c.pattern,
        mamba_num_heads=c.ssm_heads,
        mamba_head_dim=c.ssm_head_dim,
        ssm_state_size=c.d_state,
        n_groups=c.n_groups,
        conv_kernel=c.d_conv,
        num_attention_heads=c.attn_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        layer_norm_epsilon=c.eps,
        # the floor on Δ in both fields: NemotronH reads time_step_min up to transformers 5.24
        # and time_step_limit from 5.25
        time_step_min=c.time_step_min,
        time_step_limit=(c.time_step_min, math.inf),
        use_conv_bias=c.use_conv_bias,
        tie_word_embeddings=c.tie_word_embeddings,
    )
    param = next(model.parameters())
    with torch.device(param.device):
        hf = NemotronHForCausalLM(hf_cfg).to(param.dtype)
    hf.load_state_dict(model.state_dict())
    return hf.eval()
