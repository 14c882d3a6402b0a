"""Mamba-1 (Jamba) layers: the closed-form fold and replay outputs against a float64
recurrence and mamba-ssm's reference scan; a tiny transformers Jamba loads with equal logits,
prefill and token by token under every strategy; bad configs are refused by field."""

import pytest
import torch
from family_models import VOCAB, tiny_jamba

from replaylab import assert_close
from replaylab.cache import HybridCache
from replaylab.model import HybridConfig, HybridLM, config_from_jamba, load_transformers_hybrid
from replaylab.scan import process_dt, s6_fold, s6_replay_outputs, s6_scan
from replaylab.strategies import STRATEGY_NAMES
from replaylab.testing import mamba_ssm_references


def s6_inputs(batch, T, D, N, generator):
    r = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    return dict(
        u=r(batch, T, D),
        dt=r(batch, T, D) - 1.0,
        A=-torch.exp(r(D, N) * 0.8),
        B=r(batch, T, N),
        C=r(batch, T, N),
        Dskip=r(D),
        dt_bias=torch.rand(D, generator=generator) - 0.5,
        state=r(batch, D, N),
    )


def float64_loop(p):
    """The S6 recurrence written out in float64, one token at a time (the oracle)."""
    delta = torch.nn.functional.softplus(p["dt"].double() + p["dt_bias"].double())
    h, ys, states = p["state"].double(), [], []
    for t in range(p["u"].shape[1]):
        decay = torch.exp(delta[:, t, :, None] * p["A"].double())
        h = (
            decay * h
            + (delta[:, t] * p["u"][:, t].double())[..., None] * p["B"][:, t, None].double()
        )
        ys.append((h * p["C"][:, t, None].double()).sum(-1) + p["Dskip"].double() * p["u"][:, t])
        states.append(h)
    return torch.stack(ys, 1), torch.stack(states, 1)


@pytest.mark.parametrize("batch,T,D,N,n", [(3, 23, 10, 6, 17), (1, 9, 7, 16, 0), (2, 5, 4, 3, 4)])
def test_closed_form_fold_and_outputs_equal_a_float64_recurrence(batch, T, D, N, n, generator):
    p = s6_inputs(batch, T, D, N, generator)
    ref_y, ref_states = float64_loop(p)
    log = dict(u=p["u"][:, :n], dt=p["dt"][:, :n], B=p["B"][:, :n])
    new = dict(u=p["u"][:, n:], dt=p["dt"][:, n:], B=p["B"][:, n:], C=p["C"][:, n:])
    folded = s6_fold(p["state"], log["u"], log["dt"], p["A"], log["B"], p["dt_bias"], True)
    want = ref_states[:, n - 1] if n else p["state"].double()
    assert_close(folded, want, atol=2e-5, rtol=1e-5, name="fold")
    y = s6_replay_outputs(p["state"], log, new, p["A"], p["Dskip"], p["dt_bias"], True)
    assert_close(y, ref_y[:, n:], atol=2e-5, rtol=1e-5, name="replay outputs")
    # in float64 the closed form agrees with the loop to rounding
    f64 = {k: v.double() for k, v in p.items()}
    y64 = s6_replay_outputs(
        f64["state"],
        {k: v.double() for k, v in log.items()},
        {k: v.double() for k, v in new.items()},
        f64["A"],
        f64["Dskip"],
        f64["dt_bias"],
        True,
        compute_dtype=torch.float64,
    )
    assert_close(y64, ref_y[:, n:], atol=1e-10, rtol=1e-10, name="float64 replay outputs")
    # the token scan agrees too (its own oracle, tests/test_scan.py; here: same state)
    scan = s6_scan(
        p["u"],
        p["dt"],
        p["A"],
        p["B"],
        p["C"],
        p["Dskip"],
        dt_bias=p["dt_bias"],
        dt_softplus=True,
        initial_state=p["state"],
    )
    assert_close(scan.y, ref_y, atol=2e-5, rtol=1e-5, name="scan")


@pytest.mark.mamba_ssm
def test_closed_form_outputs_equal_mamba_ssm_selective_scan_ref(generator):
    ref = mamba_ssm_references()
    p = s6_inputs(2, 19, 8, 5, generator)
    to_bdt = lambda t: t.transpose(1, 2)  # noqa: E731
    ref_y, ref_state = ref.selective_scan_ref(
        to_bdt(p["u"]), to_bdt(p["dt"]), p["A"], to_bdt(p["B"]), to_bdt(p["C"]), D=p["Dskip"],
        delta_bias=p["dt_bias"], delta_softplus=True, return_last_state=True,
    )  # fmt: skip
    zero = torch.zeros_like(p["state"])
    empty = dict(u=p["u"][:, :0], dt=p["dt"][:, :0], B=p["B"][:, :0])
    new = dict(u=p["u"], dt=p["dt"], B=p["B"], C=p["C"])
    y = s6_replay_outputs(zero, empty, new, p["A"], p["Dskip"], p["dt_bias"], True)
    assert_close(y, to_bdt(ref_y), atol=1e-4, name="outputs vs selective_scan_ref")
    folded = s6_fold(zero, p["u"], p["dt"], p["A"], p["B"], p["dt_bias"], True)
    assert_close(folded, ref_state, atol=1e-4, name="fold vs selective_scan_ref")


def test_process_dt_is_what_the_fold_uses(generator):
    """A sanity link: one token's fold is exp(Δ A) S + Δ u B with Δ = softplus(dt + bias)."""
    p = s6_inputs(2, 1, 5, 4, generator)
    delta = process_dt(p["dt"][:, 0], p["dt_bias"], True)
    want = (
        torch.exp(delta[..., None] * p["A"]) * p["state"]
        + (delta * p["u"][:, 0])[..., None] * p["B"][:, 0, None]
    )
    got = s6_fold(p["state"], p["u"], p["dt"], p["A"], p["B"], p["dt_bias"], True)
    assert_close(got, want, atol=1e-6, name="one-token fold")


def decode(model, ids, strategy, prefill=10, **options):
    cache = HybridCache(model, ids.shape[0], strategy, **options)
    steps = [model(ids[:, :prefill], cache)]
    steps += [model(ids[:, t : t + 1], cache) for t in range(prefill, ids.shape[1])]
    return torch.cat(steps, 1)


def test_jamba_logits_equal_transformers_prefill_and_token_by_token(tmp_path):
    hf = tiny_jamba()
    hf.save_pretrained(tmp_path)
    from_folder, from_instance = load_transformers_hybrid(tmp_path), load_transformers_hybrid(hf)
    assert from_folder.cfg.pattern == "S-*-S-S-" and from_folder.cfg.mamba1.d_inner == 64
    ids = torch.randint(0, VOCAB, (2, 27))
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        assert ref.abs().max() > 0.1  # the comparison below is not vacuous
        for ours in (from_folder.eval(), from_instance.eval()):
            assert_close(ours(ids, HybridCache(ours, 2)), ref, atol=1e-5, name="prefill logits")
        ours = from_folder.eval()
        for strategy in STRATEGY_NAMES:
            for use_kernels in (False, True):  # True: outputs by the closed form, no state write
                got = decode(
                    ours,
                    ids,
                    strategy,
                    checkpoint_interval=4,
                    log_length=4,
                    use_kernels=use_kernels,
                )
                assert_close(got, ref, atol=1e-5, name=f"{strategy} decode logits")
    again = HybridLM.load(_save(from_folder, tmp_path / "ours"))
    with torch.no_grad():
        assert torch.equal(
            again(ids, HybridCache(again, 2)), from_folder(ids, HybridCache(from_folder, 2))
        )


def _save(model, folder):
    model.save(folder)
    return folder


def test_moe_jamba_and_bad_configs_are_refused_by_field(tmp_path):
    with pytest.raises(ValueError, match=r"num_experts: replaylab supports dense Jamba .* got "
                       r"num_experts=4"):  # fmt: skip
        load_transformers_hybrid(tiny_jamba(num_experts=4, num_experts_per_tok=2))
    hf = tiny_jamba()
    hf.config.num_key_value_heads = 3
    with pytest.raises(ValueError, match=r"num_key_value_heads=3"):
        config_from_jamba(hf.config)
    hf = tiny_jamba()
    state = hf.state_dict()
    del state["model.layers.2.mamba.x_proj.weight"]
    hf.save_pretrained(tmp_path, state_dict=state)
    with pytest.raises(
        ValueError, match=r"weights missing for \['model.layers.2.mamba.x_proj.weight'\]"
    ):
        load_transformers_hybrid(tmp_path)
    with pytest.raises(ValueError, match=r"mamba1.d_state: expected an integer >= 1, got 0"):
        HybridConfig(pattern="S-", mamba1=dict(d_state=0))
    with pytest.raises(ValueError, match=r"pattern: expected characters .*S \(Mamba-1"):
        HybridConfig(pattern="S-x")
