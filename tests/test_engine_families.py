"""The serving engine's reference path (CPU: fused=False, graphs=False) for every family beyond
NemotronH, against the independent teaching cache: Jamba (Mamba-1 "S", plain attention),
Qwen3-Next (Gated DeltaNet "G", gated attention with partial RoPE), Qwen3.5 (loaded from a tiny
transformers model), Bamba (Mamba-2 with RoPE attention and SwiGLU MLPs) and a mixed pattern;
under snapshot, recompute and replay: the same logits and greedy tokens over fold boundaries
and chunked prefill, speculative decoding equal to the engine's own greedy decoding bit for
bit, ragged programs of admit / step / rollback / retire, and the fused path refused with
what it lacks.

Tolerance: logits agree to ``TOL`` = 1e-5, absolute and relative. These models' logits are
0.1-0.5 in size, where an fp32 ulp is 1e-8 to 6e-8. The two paths compute the same fp32
arithmetic grouped differently: the engine runs a batch of slots, scans its prefill in chunks
of ``prefill_chunk`` tokens, folds its log on a fixed grid of L tokens by the spec's fold
(Mamba-1: the closed form, Gated DeltaNet: the chunked WY form) and computes replay outputs
by ``spec.outputs``, where the teaching cache folds when its log fills. The largest
difference measured here is 1.2e-7 (a few ulps); 1e-5 leaves a margin of about 100 and is
still 10^4 below the logits, so a wrong position, window, state or log entry fails it."""

import copy

import pytest
import torch
from family_models import tiny_family_model, tiny_qwen3_5
from test_engine import run_program

from replaylab.cache import CacheConfig
from replaylab.decoding import SyntheticDrafter, greedy
from replaylab.model import HybridConfig, HybridLM, load_transformers_hybrid
from replaylab.serving import (
    STRATEGIES,
    DecodeEngine,
    Request,
    Scheduler,
    default_strategy,
    fused_reason,
    unsupported_reason,
)
from replaylab.serving.layouts import fused_by_default
from replaylab.testing import DEVICE

TOL = 1e-5
FUSED_TOL = 2e-4  # the fused kernels against the teaching modules (as test_engine's programs)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models' operations are tiny: one thread runs them several times faster than
    two on a shared 2-core machine (the other spins). Both paths run under the same setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _bamba():
    cfg = HybridConfig(
        vocab_size=50,
        hidden_size=32,
        pattern="M-*-",
        ssm_heads=4,
        ssm_head_dim=8,
        d_state=8,
        n_groups=2,
        attn_heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate_size=48,
        mlp="swiglu",
        rotary_dim=8,
    )
    return HybridLM(cfg, seed=5).eval()


def _mixed():
    """Every recurrent family in one stack, with gated RoPE attention between them."""
    base = tiny_family_model("gdn").cfg
    cfg = HybridConfig(
        **{
            **base.__dict__,
            "pattern": "SM*G-",
            "mamba1": dict(d_inner=32, d_state=4, dt_rank=4),
            "ssm_heads": 2,
            "ssm_head_dim": 8,
            "d_state": 8,
            "n_groups": 1,
        }
    )
    return HybridLM(cfg, seed=7).eval()


MODELS = {
    "jamba": tiny_family_model("mamba1"),
    "qwen3_next": tiny_family_model("gdn"),
    "qwen3_5": load_transformers_hybrid(
        tiny_qwen3_5(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    ).eval(),
    "bamba": _bamba(),
    "mixed": _mixed(),
}
# the fused path's Triton kernels take the GPU's tensors where there is one
ON_DEVICE = {f: copy.deepcopy(m).to(DEVICE) for f, m in MODELS.items()}
BAMBA_ON_DEVICE = ON_DEVICE["bamba"]


def _prompts(model, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.cfg.vocab_size, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", MODELS)
def test_logits_and_greedy_tokens_equal_the_teaching_cache(family, strategy):
    """Two sequences at their own positions, prompts longer than ``prefill_chunk`` = 3, then
    greedy decoding past several folds of L = 4: every logit the engine returns is the
    teaching cache's, and so is every greedy token."""
    model, n_new = MODELS[family], 7
    prompts = _prompts(model, (7, 4))
    engine = DecodeEngine(model, 2, 24, strategy, log_length=4, max_verify=3, prefill_chunk=3)
    caches, want = [], []
    with torch.no_grad():
        for p in prompts:
            caches.append(CacheConfig(strategy, log_length=4).build(model, 1))
            want.append(model(p[None], caches[-1])[0, -1])
    got = torch.stack([engine.admit(p)[1] for p in prompts])
    for i in range(n_new):
        torch.testing.assert_close(got, torch.stack(want), atol=TOL, rtol=TOL)
        tokens = got.argmax(-1)
        assert torch.equal(tokens, torch.stack(want).argmax(-1)), i
        if i == n_new - 1:
            break
        got = engine.step(tokens[:, None])[:, 0]
        with torch.no_grad():
            want = [model(t.view(1, 1), c)[0, -1] for t, c in zip(tokens, caches)]
    if strategy == "replay":  # 7 + 6 and 4 + 6 tokens: folds on the grid of L = 4
        assert engine.stats.folds >= 4
        assert [engine.pos[s] - engine.log_len[s] for s in engine.slots] == [12, 8]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", MODELS)
def test_speculation_gives_the_engine_greedy_tokens(family, strategy):
    """Two sequences speculating together, each accepting its own drafts (drafters right with
    probability 0.8 and 0.4), give each sequence's greedy tokens bit for bit, across folds."""
    model, n = MODELS[family], 10
    engine = DecodeEngine(model, 2, 32, strategy, log_length=5, max_verify=4)
    prompts = _prompts(model, (6, 3), seed=1)
    refs = [engine.greedy(p[None], n)[0] for p in prompts]
    for s in engine.slots:
        engine.retire(s)
    pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]
    drafters = [
        SyntheticDrafter(torch.cat([p, r]), a, seed=s)
        for p, r, a, s in zip(prompts, refs, (0.8, 0.4), (1, 2))
    ]
    tokens, proposed, accepted = engine.speculate_batch(prompts, pending, n, drafters, k=3)
    for got, ref in zip(tokens, refs):
        assert torch.equal(got, ref)
    assert engine.stats.rollbacks > 0 and 0 < sum(accepted) < sum(proposed)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", MODELS)
def test_ragged_programs_give_the_teaching_logits(family, strategy):
    """Random programs of admit / step (per-slot T and counts) / rollback (per-slot keep, of
    the slots in the last step) / retire against one teaching cache per sequence
    (``test_engine.run_program``), comparing every logit the engine returns."""
    rollbacks = 0
    for seed in (0, 1):
        engine, worst = run_program(
            strategy,
            fused=False,
            seed=seed,
            n_ops=30,
            slots=2,
            max_verify=4,
            model=MODELS[family],
            tol=TOL,
            partial_rollbacks=True,
        )
        assert engine.stats.steps > 0 and worst < TOL
        rollbacks += engine.stats.rollbacks
    assert rollbacks > 0


@pytest.mark.parametrize("family", MODELS)
def test_continuous_batching_gives_each_request_its_teaching_greedy_tokens(family):
    """The scheduler (admit / step / rollback / retire only) over a family's engine: four
    speculating requests through two slots, each with its teaching greedy tokens."""
    model = MODELS[family]
    prompts, outs = _prompts(model, (5, 2, 8, 3), seed=2), (6, 4, 5, 7)
    alone = [greedy(model, p[None], n, "replay").tokens[0] for p, n in zip(prompts, outs)]
    engine = DecodeEngine(model, 2, 24, "replay", log_length=4, max_verify=4)
    sched = Scheduler(engine, budget_bytes=10**9, k=3)
    for i, (p, n) in enumerate(zip(prompts, outs)):
        drafter = SyntheticDrafter(torch.cat([p, alone[i]]), 0.6, seed=i)
        sched.add(Request(i, p, n, drafter=drafter))
    finished = sched.run()
    assert sorted(r.id for r in finished) == [0, 1, 2, 3]
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), alone[r.id]), r.id
    assert engine.stats.admitted == 4 and engine.stats.rollbacks > 0


def test_the_engine_serves_every_family_and_the_fused_path_says_what_it_lacks():
    for model in MODELS.values():
        assert unsupported_reason(model.cfg) is None
    nemotron = HybridLM(HybridConfig(), seed=None).cfg
    assert fused_reason(nemotron) is None and fused_by_default(nemotron)
    assert fused_reason(MODELS["bamba"].cfg) is None  # served, opt-in until timed
    assert not fused_by_default(MODELS["bamba"].cfg)
    for family in ("qwen3_next", "qwen3_5", "jamba", "mixed"):  # served, opt-in until timed
        assert fused_reason(MODELS[family].cfg) is None
        assert not fused_by_default(MODELS[family].cfg)
    cfg = HybridConfig()
    cfg.mlp = "gelu"  # past the config's own check
    assert unsupported_reason(cfg) == "mlp: 'gelu' (the engine serves 'relu2' and 'swiglu')"
    assert fused_reason(cfg) == "gelu MLPs (mlp='gelu')"
    from replaylab.serving.layouts import paths
    from replaylab.serving.strategies import strategy_class

    with pytest.raises(ValueError, match=r"lack gelu MLPs \(mlp='gelu'\); use fused=False"):
        paths(strategy_class("replay"), cfg, torch.device("cpu"), True, False, True, None)
    cfg = HybridConfig()
    cfg.pattern = "MX*-"
    assert fused_reason(cfg) == "layer kind 'X'" and "'X'" in unsupported_reason(cfg)
    engine = DecodeEngine(MODELS["qwen3_next"], 1, 8)  # CPU defaults: the reference path
    assert not engine.fused and not engine.graphs


def test_the_default_strategy_is_snapshot_for_mamba1_layouts_with_the_kernels():
    """Where every recurrent layer is Mamba-1 (Jamba) and the engine runs its kernels (the
    default on a GPU), the snapshot step is the faster decode (``default_strategy``); without
    the kernels, or with any other recurrent family, the engine replays. A strategy named is
    kept, and what only replay serves says why the engine chose snapshot."""
    for family, model in MODELS.items():
        want = "snapshot" if family == "jamba" else "replay"
        assert default_strategy(model.cfg) == want, family
        assert default_strategy(model.cfg, use_kernels=False) == "replay", family
        assert DecodeEngine(model, 1, 8, use_kernels=True).strategy == want, family
    jamba = MODELS["jamba"]
    assert DecodeEngine(jamba, 1, 8).strategy == "replay"  # a CPU model: no kernels by default
    assert DecodeEngine(jamba, 1, 8, "replay", use_kernels=True).strategy == "replay"
    assert default_strategy(HybridLM(HybridConfig(), seed=None).cfg) == "replay"
    hint = r"\(snapshot: the engine's default for Mamba-1 layouts with the kernels, when no " \
        r"strategy is named\)"  # fmt: skip
    with pytest.raises(ValueError, match=r"log_capacity: only replay keeps a log.*" + hint):
        DecodeEngine(jamba, 1, 8, use_kernels=True, log_length=4, log_capacity=6)
    engine = DecodeEngine(jamba, 1, 8, use_kernels=True)
    with pytest.raises(ValueError, match=r"provisional: .*use strategy='replay'.*" + hint):
        with engine.provisional([0]):
            pass
    named = DecodeEngine(jamba, 1, 8, "snapshot", use_kernels=True, log_length=4)
    with pytest.raises(ValueError, match=r"use strategy='replay' \(a cursor move\)$"):
        with named.provisional([0]):
            pass


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bamba_on_the_fused_path_follows_the_teaching_cache(strategy):
    """The fused path on a Bamba layout (RoPE on half of each head, SwiGLU MLPs: the fused
    kernels ``rope_`` and ``swiglu``): a ragged program of admit / step / rollback / retire
    gives the teaching cache's logits (to ``FUSED_TOL``: the kernels round once where the
    teaching modules round per operation), with every slot at its own position."""
    engine, worst = run_program(strategy, fused=True, seed=3, n_ops=14, slots=2, max_verify=3,
                                model=BAMBA_ON_DEVICE, teaching_model=MODELS["bamba"], tol=FUSED_TOL,
                                partial_rollbacks=True)  # fmt: skip
    assert engine.fused and engine.stats.steps > 0 and worst < FUSED_TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", ["jamba", "mixed"])
def test_mamba1_on_the_fused_path_follows_the_teaching_cache(family, strategy):
    """The fused path on Jamba's layout (Mamba-1 through its mixer's own math over the pools,
    plain attention, SwiGLU MLPs) and the mixed one (Mamba-1, Mamba-2, attention and Gated
    DeltaNet in one model): a ragged program gives the teaching cache's logits."""
    engine, worst = run_program(strategy, fused=True, seed=5, n_ops=12, slots=2, max_verify=3,
                                model=ON_DEVICE[family], teaching_model=MODELS[family],
                                tol=FUSED_TOL, partial_rollbacks=True)  # fmt: skip
    assert engine.fused and engine.stats.steps > 0 and worst < FUSED_TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bamba_on_the_fused_path_is_lossless_bit_for_bit(strategy):
    """Within the fused path's arithmetic (the row-invariant product, as on a GPU), on a
    Bamba layout: a sequence's logits do not depend on its batch; a 3-token verify gives the
    logits of three single steps (each verify row rotated at its own position); batched
    speculation (ragged rollbacks) gives each sequence its own greedy tokens. The prefill runs
    the fused path's kernels (``prefill_kernels``)."""
    check_fused_lossless(BAMBA_ON_DEVICE, strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_gated_deltanet_on_the_fused_path_follows_the_teaching_cache(family, strategy):
    """The fused path on Qwen3-Next and Qwen3.5 layouts (Gated DeltaNet through the strategy's
    pools, gated attention with q / k norms and partial RoPE through ``rope_`` and the
    attention kernel, SwiGLU MLPs, the residual and norms in one kernel): a ragged program of
    admit / step / rollback / retire gives the teaching cache's logits (to ``FUSED_TOL``)."""
    engine, worst = run_program(strategy, fused=True, seed=3, n_ops=12, slots=2, max_verify=3,
                                model=ON_DEVICE[family], teaching_model=MODELS[family],
                                tol=FUSED_TOL, partial_rollbacks=True)  # fmt: skip
    assert engine.fused and engine.stats.steps > 0 and worst < FUSED_TOL


def test_the_fused_gated_deltanet_layer_takes_its_entries_from_the_one_launch(monkeypatch):
    """The fused path's Gated DeltaNet entries come from ``kernels.gdn_inputs.prepare`` and its
    norm then gate from ``gated_rmsnorm(norm_first=True)``, for decode steps and verifies
    alike, and a ragged program with rollbacks under replay still
    gives the teaching cache's logits."""
    import replaylab.kernels.decode as decode
    import replaylab.kernels.gdn_inputs as gdn_inputs

    calls, norms, prepare, norm = [], [], gdn_inputs.prepare, decode.gated_rmsnorm

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return prepare(*args, **kwargs)

    def counted_norm(*args, **kwargs):
        norms.append(kwargs.get("norm_first", False))
        return norm(*args, **kwargs)

    monkeypatch.setattr(gdn_inputs, "prepare", counted)
    monkeypatch.setattr(decode, "gated_rmsnorm", counted_norm)
    engine, worst = run_program("replay", fused=True, seed=4, n_ops=8, slots=2, max_verify=3,
                                model=ON_DEVICE["qwen3_5"], teaching_model=MODELS["qwen3_5"],
                                tol=FUSED_TOL, partial_rollbacks=True)  # fmt: skip
    assert worst < FUSED_TOL and engine.stats.steps > 0
    assert len(calls) >= engine.stats.steps and any(shape[1] > 1 for shape in calls)
    assert len(norms) == len(calls) and all(norms)  # the norm then gate in one kernel too


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5"])
def test_gated_deltanet_on_the_fused_path_is_lossless_bit_for_bit(family, strategy):
    """The Bamba test's three contracts on Qwen3-Next and Qwen3.5 layouts: batch-invariant
    logits, a verify equal to single steps, speculation equal to greedy. On CPU Qwen3.5's layout
    under replay only (CI time: each of the others takes 25-55 s through the interpreter there;
    all run on a GPU, and every one follows the teaching cache on CPU above)."""
    if (family, strategy) != ("qwen3_5", "replay") and not torch.cuda.is_available():
        pytest.skip("CI time: 25-55 s each through the interpreter on CPU; all run on a GPU")
    check_fused_lossless(ON_DEVICE[family], strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_jamba_on_the_fused_path_is_lossless_bit_for_bit(strategy):
    """The Bamba test's three contracts on Jamba's layout (Mamba-1's products row-invariant).
    On CPU under snapshot only, the engine's default for Mamba-1 layouts with the kernels
    (CI time: 14-17 s each through the interpreter); all three on a GPU."""
    if strategy != "snapshot" and not torch.cuda.is_available():
        pytest.skip("CI time: through the interpreter on CPU; runs on a GPU")
    check_fused_lossless(ON_DEVICE["jamba"], strategy)


def check_fused_lossless(model, strategy):
    """A fused engine's logits do not depend on the batch, a 3-token verify equals three single
    steps, batched speculation equals each sequence's greedy tokens, bit for bit."""
    prompts = [p.to(DEVICE) for p in _prompts(model, (7, 3), seed=4)]
    kw = dict(log_length=16, max_verify=4, use_kernels=True, fused=True, prefill_kernels=True,
              matmul="row_invariant")  # fmt: skip

    def steps(engine, first, n=3):  # greedy logits after the admission's: (batch, n + 1, vocab)
        out, tok = [first], first.argmax(-1)[:, None]
        for _ in range(n):
            out.append(engine.step(tok)[:, -1])
            tok = out[-1].argmax(-1)[:, None]
        return torch.stack(out, 1)

    alone = []
    for p in prompts:
        engine = DecodeEngine(model, 1, 32, strategy, **kw)
        alone.append(steps(engine, engine.admit(p)[1][None])[0])
    engine = DecodeEngine(model, 2, 32, strategy, **kw)
    batched = steps(engine, torch.stack([engine.admit(p)[1] for p in prompts]))
    for got, want in zip(batched, alone):
        assert torch.equal(got, want)
    drafts = torch.randint(
        0, model.cfg.vocab_size, (2, 3), generator=torch.Generator().manual_seed(5)
    ).to(DEVICE)
    verify = engine.step(drafts)
    engine.rollback(1)
    single = torch.cat([verify[:, :1]] + [engine.step(drafts[:, t : t + 1]) for t in (1, 2)], 1)
    assert torch.equal(verify, single)

    kw["log_length"] = 4  # speculation across folds
    refs = [DecodeEngine(model, 1, 32, strategy, **kw).greedy(p[None], 8)[0] for p in prompts]
    engine = DecodeEngine(model, 2, 32, strategy, **kw)
    pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]
    drafters = [SyntheticDrafter(torch.cat([p, r]), 0.6, seed=i)
                for i, (p, r) in enumerate(zip(prompts, refs))]  # fmt: skip
    tokens, proposed, accepted = engine.speculate_batch(prompts, pending, 8, drafters, k=3)
    for got, want in zip(tokens, refs):
        assert torch.equal(got, want)
    assert engine.stats.rollbacks > 0 and 0 < sum(accepted) < sum(proposed)


def test_bamba_fused_prefill_kernels_equal_the_default_prefill():
    """The fused path's prefill on a Bamba layout (SwiGLU and RoPE chunks, the Mamba-2 prompt
    kernel) against its default prefill: pool buffers and logits (``prefill_kernel_checks``)."""
    from prefill_kernel_checks import check_prefill_kernels

    model = BAMBA_ON_DEVICE
    prompt = _prompts(model, (40,), seed=6)[0].to(DEVICE)
    check_prefill_kernels(model, prompt, 30, 8, family="mamba2", fused=True)
