"""The hybrid model mirrors transformers' NemotronH: same weights, same logits; decoding token
by token through the cache equals one forward; save/load round-trips."""

import inspect
import math
from dataclasses import replace

import pytest
import torch

from replaylab import assert_close
from replaylab.cache import HybridCache
from replaylab.model import (
    HybridConfig,
    HybridLM,
    load_transformers_hybrid,
    load_transformers_nemotron_h,
)


def tiny_nemotron_h(pattern="M-M*-M", seed=0, **config):
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(seed)
    cfg = NemotronHConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=len(pattern),
        hybrid_override_pattern=pattern,
        mamba_num_heads=6,
        mamba_head_dim=8,
        ssm_state_size=16,
        n_groups=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        chunk_size=16,
        **config,
    )
    model = NemotronHForCausalLM(cfg).eval()
    with torch.no_grad():  # move the SSM scalars off their initial values so they matter
        for name, p in model.named_parameters():
            if name.endswith(("dt_bias", "A_log", "D", "conv1d.bias")) or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("pattern", ["M-M*-M", "*M-MM-*"])
def test_logits_equal_transformers_nemotron_h(pattern):
    hf = tiny_nemotron_h(pattern)
    ours = load_transformers_nemotron_h(hf).eval()
    ids = torch.randint(0, 97, (3, 37))
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        got = ours(ids, HybridCache(ours, 3))
    err = assert_close(got, ref, atol=1e-4, rtol=1e-4, name="logits")
    assert err < 1e-4


def test_nemotron_h_floor_on_dt_per_transformers_release():
    """NemotronH's floor on Δ. transformers >= 5.25 clamps Δ to ``time_step_limit`` (as its
    Mamba2 and Bamba do); up to 5.24 its NemotronH clamped at ``(time_step_min, inf)`` in the
    chunked form (prefill) and not at all in decode. Where the two fields disagree (a default
    config: time_step_limit (0, inf), time_step_min 0.001) the releases compute different
    functions once a Δ falls under time_step_min. replaylab reads ``time_step_limit[0]``: it
    mirrors >= 5.25 for every config, and <= 5.24 where the fields agree (the folders replaylab
    writes: tests/test_train.py). time_step_min is 0.1 here, so the difference stands well
    above rounding."""
    import transformers
    from packaging.version import Version

    hf = tiny_nemotron_h(time_step_min=0.1)
    assert tuple(hf.config.time_step_limit) == (0.0, math.inf)  # the default
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("dt_bias"):
                p.fill_(-9.0)  # Δ = softplus(dt - 9) ~ 1e-4, under time_step_min
    ours = load_transformers_nemotron_h(hf).eval()
    assert ours.cfg.time_step_min == 0.0
    floored = HybridLM(replace(ours.cfg, time_step_min=hf.config.time_step_min), seed=None)
    floored.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 97, (2, 37))
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        got = {m: m(ids, HybridCache(m, 2)) for m in (ours, floored.eval())}
    newer = Version(transformers.__version__) >= Version("5.25")
    mirrored, other = (ours, floored) if newer else (floored, ours)
    assert_close(got[mirrored], ref, atol=1e-4, rtol=1e-4, name="logits")
    assert float((got[other] - ref).abs().max()) > 1e-3  # 10x the agreement above


def test_an_upper_limit_on_dt_is_refused():
    with pytest.raises(ValueError, match=r"time_step_limit: replaylab supports no upper limit"):
        load_transformers_nemotron_h(tiny_nemotron_h(time_step_limit=(0.0, 10.0)))


def test_checkpoint_folder_round_trip(tmp_path):
    hf = tiny_nemotron_h()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_transformers_nemotron_h(tmp_path / "hf").eval()
    ours.save(tmp_path / "ours")
    again = HybridLM.load(tmp_path / "ours").eval()
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        assert torch.equal(ours(ids, HybridCache(ours)), again(ids, HybridCache(again)))
        assert_close(ours(ids, HybridCache(ours)), hf(ids, use_cache=False).logits, atol=1e-4)


def test_a_folder_that_is_not_nemotron_h_is_refused(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
    ).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"expected a supported hybrid \(nemotron_h, bamba\), got "
        r"model_type 'llama'",
    ):
        load_transformers_nemotron_h(tmp_path)
    hf = tiny_nemotron_h()
    hf.config.save_pretrained(tmp_path / "no_weights")
    with pytest.raises(ValueError, match=r"no weights \(\*.safetensors or \*.bin\)"):
        load_transformers_hybrid(tmp_path / "no_weights")
    with pytest.raises(ValueError, match=r"no config.json"):
        load_transformers_hybrid(tmp_path / "nothing_here")


def _bamba_gated_norm_is_grouped() -> bool:
    """Whether the installed transformers normalises Bamba's gated RMSNorm per group of
    intermediate / n_groups channels, as mamba-ssm's ``RMSNormGated`` (and this library) do.
    Older releases (5.17, the GPU machine's) normalise over all channels at once."""
    from transformers.models.bamba import modeling_bamba

    return "group_size" in inspect.signature(modeling_bamba.BambaRMSNormGated).parameters


needs_grouped_bamba_norm = pytest.mark.skipif(
    not _bamba_gated_norm_is_grouped(),
    reason="this transformers' Bamba gated RMSNorm is not grouped (a different function from "
    "mamba-ssm's, which the library follows); fixed in later releases (5.24 has it)",
)


def tiny_bamba(attn=(1, 3), layers=5, seed=0):
    from transformers import BambaConfig, BambaForCausalLM

    torch.manual_seed(seed)
    cfg = BambaConfig(
        vocab_size=97,
        hidden_size=48,
        num_hidden_layers=layers,
        attn_layer_indices=list(attn),
        mamba_n_heads=6,
        mamba_d_head=8,
        mamba_d_state=16,
        mamba_n_groups=3,
        mamba_expand=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        mamba_chunk_size=16,
    )
    model = BambaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("dt_bias", "A_log", "D", "conv1d.bias")) or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


@needs_grouped_bamba_norm
def test_logits_equal_transformers_bamba_and_decode_through_the_cache(tmp_path):
    hf = tiny_bamba()
    hf.save_pretrained(tmp_path)
    ours = load_transformers_hybrid(tmp_path).eval()
    assert ours.cfg.pattern == "M-*-M-*-M-" and ours.cfg.rotary_dim == 6
    ids = torch.randint(0, 97, (2, 29))
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        assert_close(ours(ids, HybridCache(ours, 2)), ref, atol=1e-4, name="logits")
        cache = HybridCache(
            ours, 2, "replay", checkpoint_interval=4, log_length=4
        )  # RoPE positions follow the cache
        steps = [ours(ids[:, :10], cache)] + [ours(ids[:, t : t + 1], cache) for t in range(10, 29)]
    assert_close(torch.cat(steps, 1), ref, atol=1e-4, name="decoded logits")


@pytest.mark.parametrize("strategy", ["snapshot", "recompute", "replay"])
def test_decoding_token_by_token_equals_one_forward(strategy):
    model = HybridLM(HybridConfig(pattern="M*M-M", ssm_heads=3, n_groups=3), seed=1).eval()
    ids = torch.randint(0, 128, (3, 23))
    with torch.no_grad():
        ref = model(ids, HybridCache(model, 3, strategy))
        cache = HybridCache(model, 3, strategy, checkpoint_interval=5, log_length=5)
        outs = [model(ids[:, :9], cache)] + [model(ids[:, t : t + 1], cache) for t in range(9, 23)]
    assert_close(torch.cat(outs, 1), ref, atol=1e-5, name="logits")


def test_bad_config_and_input():
    with pytest.raises(ValueError, match=r"pattern: expected characters .* got \['x'\]"):
        HybridConfig(pattern="M-x")
    model = HybridLM(HybridConfig())
    with pytest.raises(ValueError, match=r"input_ids: expected shape \(batch=2, T\), got \(3, 4\)"):
        model(torch.zeros(3, 4, dtype=torch.long), HybridCache(model, 2))
    with pytest.raises(ValueError, match=r"strategy: expected one of"):
        HybridCache(model, 1, "magic")
