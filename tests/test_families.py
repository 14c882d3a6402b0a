"""The family byte counts of notebook 11: the shapes agree with transformers' configs, the
counted log-entry bytes are what the specs actually log, and the decode-byte model behaves."""

import dataclasses

import pytest
import torch
from family_models import tiny_family_model

from replaylab import families


def test_published_gdn_and_jamba_shapes_match_transformers_config_defaults():
    from transformers import JambaConfig, Qwen3_5TextConfig, Qwen3NextConfig

    for name, config in [
        ("Qwen3-Next-80B-A3B", Qwen3NextConfig()),
        ("Qwen3.5 (text defaults)", Qwen3_5TextConfig()),
    ]:
        shape = families.FAMILY_SHAPES[name]
        assert (shape.Hk, shape.H, shape.K, shape.V, shape.d_conv) == (
            config.linear_num_key_heads,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
            config.linear_conv_kernel_dim,
        )
        assert shape.layers == config.layer_types.count("linear_attention")
    jamba, shape = JambaConfig(), families.FAMILY_SHAPES["Jamba 1.5 Mini"]
    assert (shape.D, shape.N, shape.R, shape.d_conv) == (
        jamba.mamba_expand * jamba.hidden_size,
        jamba.mamba_d_state,
        jamba.mamba_dt_rank,
        jamba.mamba_d_conv,
    )
    assert shape.layers == jamba.layers_block_type.count("mamba")


@pytest.mark.parametrize("family", ["mamba1", "gdn"])
def test_counted_entry_bytes_are_what_the_spec_logs(family):
    model = tiny_family_model(family).to(torch.bfloat16)
    layer = model.cfg.recurrent_layers[0]
    spec = model.model.layers[layer].mixer.state_spec
    bf16 = dict(dtype=torch.bfloat16)
    if family == "gdn":
        c = model.cfg.gdn
        inputs = dict(
            qkv=torch.randn(1, 1, c.conv_dim, **bf16),
            a=torch.randn(1, 1, c.v_heads, **bf16),
            b=torch.randn(1, 1, c.v_heads, **bf16),
        )
        shape = families.FamilyShape(
            "tiny", "gdn", 1, Hk=c.k_heads, H=c.v_heads, K=c.k_head_dim, V=c.v_head_dim
        )
    else:
        c = model.cfg.mamba1
        inputs = dict(x_in=torch.randn(1, 1, c.d_inner, **bf16))
        shape = families.FamilyShape("tiny", "mamba1", 1, D=c.d_inner, N=c.d_state, R=c.dt_rank)
    window = spec.zero_state(1, torch.bfloat16, "cpu").conv
    entries = spec.prepare(window, inputs)
    logged = {f: entries[f].numel() * entries[f].element_size() for f in spec.log_fields}
    assert logged == families.entry_bytes(shape)
    assert families.state_bytes(shape) == spec.zero_state(1, torch.bfloat16, "cpu").ssm.nbytes


def test_decode_byte_model():
    shape = families.FAMILY_SHAPES["Qwen3-Next-80B-A3B"]
    S = families.state_bytes(shape)
    assert families.decode_bytes(shape, 1)["current"] == 2 * S
    lo, hi = families.replay_pays(shape)
    assert 1 < lo < 16 < hi
    for L in (lo, hi):
        b = families.decode_bytes(shape, L)
        assert b["replay"] < b["current"]
    for L in (lo - 1, hi + 1):
        b = families.decode_bytes(shape, L)
        assert b["replay"] >= b["current"]
    # a wider Mamba-1 state (larger N) makes replay pay for longer logs
    jamba = families.FAMILY_SHAPES["Jamba 1.5 Mini"]
    wide = dataclasses.replace(jamba, N=64)
    assert families.replay_pays(wide)[1] > families.replay_pays(jamba)[1]
    with pytest.raises(ValueError, match=r"L: expected a log length >= 1, got 0"):
        families.decode_bytes(shape, 0)
