"""Published hybrid model shapes and what their decoding memory costs per sequence.

Glossary (code name -> meaning):
    n_attn, n_ssm      number of attention layers and of state-space layers
    kv_heads, head_dim attention: grouped KV heads and their width (KV grows per token)
    ssm_heads (H), ssm_head_dim (P), d_state (N), n_groups (G)
                       Mamba-2 state (H, P, N) per layer; B and C shared by G groups
    d_inner (D)        Mamba-1 state (D, N) per layer
    d_conv             causal conv width: the conv state keeps the last d_conv - 1 inputs

Dimensions are written from the models' published configurations (no downloads); the source
of each is named in ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HybridShape", "PUBLISHED_SHAPES", "memory_per_sequence", "snapshot_in_kv_tokens"]


@dataclass(frozen=True)
class HybridShape:
    name: str
    n_attn: int
    n_ssm: int
    kv_heads: int
    head_dim: int
    ssm_form: str  # "mamba2" or "mamba1"
    d_state: int  # N
    d_conv: int = 4
    ssm_heads: int = 0  # H (mamba2)
    ssm_head_dim: int = 0  # P (mamba2)
    n_groups: int = 1  # G (mamba2)
    d_inner: int = 0  # D (mamba1)
    source: str = ""

    @property
    def ssm_state_elems(self) -> int:
        """Elements of one layer's recurrent state: H*P*N (Mamba-2) or D*N (Mamba-1)."""
        if self.ssm_form == "mamba2":
            return self.ssm_heads * self.ssm_head_dim * self.d_state
        return self.d_inner * self.d_state

    @property
    def conv_channels(self) -> int:
        """Channels through the causal conv: H*P + 2*G*N (Mamba-2: x, B, C) or D (Mamba-1)."""
        if self.ssm_form == "mamba2":
            return self.ssm_heads * self.ssm_head_dim + 2 * self.n_groups * self.d_state
        return self.d_inner

    @property
    def kv_elems_per_token(self) -> int:
        """Elements appended to the KV cache per token, over all attention layers."""
        return self.n_attn * 2 * self.kv_heads * self.head_dim


PUBLISHED_SHAPES = {
    s.name: s
    for s in [
        HybridShape(
            "Nemotron-H 8B",
            n_attn=4,
            n_ssm=24,
            kv_heads=8,
            head_dim=128,
            ssm_form="mamba2",
            ssm_heads=128,
            ssm_head_dim=64,
            d_state=128,
            n_groups=8,
            source="nvidia/Nemotron-H-8B-Base-8K config: 52 blocks, pattern of 24 M, "
            "24 MLP, 4 attention",
        ),
        HybridShape(
            "Bamba 9B",
            n_attn=3,
            n_ssm=29,
            kv_heads=8,
            head_dim=128,
            ssm_form="mamba2",
            ssm_heads=128,
            ssm_head_dim=64,
            d_state=128,
            n_groups=1,
            source="ibm-ai-platform/Bamba-9B config: 32 layers, attention at 9, 18, 27",
        ),
        HybridShape(
            "Falcon-H1 7B",
            n_attn=44,
            n_ssm=44,
            kv_heads=2,
            head_dim=128,
            ssm_form="mamba2",
            ssm_heads=24,
            ssm_head_dim=128,
            d_state=256,
            n_groups=1,
            source="tiiuae/Falcon-H1-7B (transformers FalconH1 docs): 44 layers, each "
            "with attention and Mamba-2 side by side",
        ),
        HybridShape(
            "Jamba v0.1",
            n_attn=4,
            n_ssm=28,
            kv_heads=8,
            head_dim=128,
            ssm_form="mamba1",
            d_inner=8192,
            d_state=16,
            source="ai21labs/Jamba-v0.1 config: 32 layers, attention every 8th (offset "
            "4), Mamba-1 expand 2 of hidden 4096",
        ),
    ]
}


def memory_per_sequence(
    shape: HybridShape, context_len: int, *, kv_bytes=2, state_bytes=4, conv_bytes=2
) -> dict:
    """Bytes one sequence holds at ``context_len`` tokens, by component.

    KV grows with the context; the SSM state and conv state do not. Defaults: bf16 KV and
    conv state, fp32 recurrent state (what serving engines keep for accuracy).
    """
    return {
        "kv": shape.kv_elems_per_token * context_len * kv_bytes,
        "ssm_state": shape.n_ssm * shape.ssm_state_elems * state_bytes,
        "conv_state": shape.n_ssm * shape.conv_channels * (shape.d_conv - 1) * conv_bytes,
    }


def snapshot_in_kv_tokens(shape: HybridShape, *, kv_bytes=2, state_bytes=4, conv_bytes=2) -> float:
    """How many tokens of KV cache one snapshot of a sequence's recurrent state costs."""
    mem = memory_per_sequence(
        shape, 1, kv_bytes=kv_bytes, state_bytes=state_bytes, conv_bytes=conv_bytes
    )
    return (mem["ssm_state"] + mem["conv_state"]) / mem["kv"]
