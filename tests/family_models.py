"""Tiny transformers models of the families beyond Mamba-2 (Jamba with dense MLPs, Qwen3-Next
with dense MLPs, Qwen3.5 text), built from configs with random weights on CPU, and replaylab
models of the same layouts: shared by the family tests."""

import importlib

import torch

from replaylab.gated_deltanet import GDNConfig
from replaylab.mamba1 import Mamba1Config
from replaylab.model import HybridConfig, HybridLM

VOCAB = 97

# transformers picks Jamba's scan implementation when its modeling module is first imported:
# mamba-ssm's if it imports (it does once a test has installed the stand-in that
# ``replaylab.testing.mamba_ssm_references`` arranges), else PyTorch. Importing it here, at
# collection, keeps it on the PyTorch path these tests compare against.
importlib.import_module("transformers.models.jamba.modeling_jamba")


def _perturb(model):
    """Move the recurrent scalars and norms off their initial values so they matter."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            scalar = name.endswith(("dt_bias", "A_log", "D", "conv1d.bias", "dt_proj.bias"))
            if scalar or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def tiny_jamba(seed=0, **overrides):
    from transformers import JambaConfig, JambaForCausalLM

    torch.manual_seed(seed)
    options = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        attn_layer_period=4,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
    )
    options.update(overrides)
    return _perturb(JambaForCausalLM(JambaConfig(**options)))


def _gdn_options(overrides):
    options = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
    )
    options.update(overrides)
    return options


def tiny_qwen3_next(seed=0, **overrides):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    options = _gdn_options(dict(mlp_only_layers=[0, 1, 2, 3]) | overrides)
    return _perturb(Qwen3NextForCausalLM(Qwen3NextConfig(**options)))


def tiny_qwen3_5(seed=0, **overrides):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    return _perturb(Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_gdn_options(overrides))))


TINY_HF = {"jamba": tiny_jamba, "qwen3_next": tiny_qwen3_next, "qwen3_5": tiny_qwen3_5}


def tiny_family_model(family, seed=3):
    """A replaylab model with fixed random weights: "mamba1" (pattern "S*S-", Jamba-like) or
    "gdn" (pattern "G*G-", Qwen-like with gated attention), vocabulary 50."""
    common = dict(
        vocab_size=50,
        hidden_size=32,
        attn_heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        mlp="swiglu",
    )
    if family == "mamba1":
        cfg = HybridConfig(
            pattern="S*S-", mamba1=Mamba1Config(d_inner=48, d_state=8, dt_rank=4), **common
        )
    elif family == "gdn":
        cfg = HybridConfig(
            pattern="G*G-",
            gdn=GDNConfig(k_heads=2, v_heads=4, k_head_dim=8, v_head_dim=8),
            attention="gated",
            rotary_dim=8,
            **common,
        )
    else:
        raise ValueError(f"family: expected 'mamba1' or 'gdn', got {family!r}")
    return HybridLM(cfg, seed=seed).eval()


def decode_after_admissions(engine, logits, n=6):
    """``logits``: the admissions' last logits, one per slot; n greedy steps of every slot
    together, appended to them. Returns the list (for a graphed engine against an ungraphed
    one, bit for bit)."""
    import torch

    logits = list(logits)
    tok = torch.stack(logits).argmax(-1, keepdim=True)
    for _ in range(n):
        out = engine.step(tok)
        logits.append(out)
        tok = out[:, -1].argmax(-1, keepdim=True)
    return logits
