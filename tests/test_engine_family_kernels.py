"""The serving engine's replay through the Triton kernels on its reference path
(``use_kernels=True``: the default on a GPU; here through Triton's interpreter) for the layouts
the fused path does not serve: Gated DeltaNet ("G", ``kernels.gdn``: the log holds k, the
corrected update u and g), Mamba-1 ("S", ``kernels.mamba1``: x, dt, B) and Mamba-2 beside RoPE
attention and SwiGLU (Bamba, ``kernels.mamba2``). Against the independent teaching cache: the
same logits over folds and chunked prefill, and under ragged programs; a prefill leaves the
checkpoint and log a token-by-token decode leaves; speculative decoding gives the engine's own
greedy tokens bit for bit (k = 1 .. 4, per-sequence acceptance, across fold boundaries); one
kernel call per layer and step for the whole bucket, never the per-slot loop.

Tolerance: ``TOL`` of ``test_engine_families`` (1e-5, absolute and relative, on logits of
0.1-0.5). The kernels compute the same fp32 recurrences in another order (Gated DeltaNet: the
decayed sum over the logged updates u, where the teaching cache runs the backward query
recursion over k, v, g, β; a prefill's u by the token recurrence); the largest difference
measured here is 1.3e-7 (a few ulps), the same as the spec path's. The models' recurrent
projections are scaled up so that the kernels' outputs matter: 1% of random relative error in
them moves the logits by 8e-4 to 3e-3 (80-300 x TOL).

Sizes are tiny on purpose: the interpreter runs about 0.1 s per kernel program, and a step
launches (slots x heads) programs per layer and token. On a GPU machine the engine's models run
on the device (the kernels compiled) and the teaching cache on their CPU twins."""

import copy
import random
from types import SimpleNamespace

import pytest
import torch
from family_models import decode_after_admissions
from test_engine import outputs_past_the_grid, pools, run_program
from test_engine_families import TOL, one_thread  # noqa: F401 - the fixture applies here too

from replaylab.cache import CacheConfig
from replaylab.decoding import SyntheticDrafter
from replaylab.gated_deltanet import GDNConfig
from replaylab.mamba1 import Mamba1Config
from replaylab.model import HybridConfig, HybridLM
from replaylab.serving import DecodeEngine
from replaylab.serving.pools import recurrent_pool
from replaylab.serving.prefix import EnginePrefixCache
from replaylab.testing import DEVICE

COMMON = dict(
    vocab_size=50, hidden_size=32, attn_heads=2, kv_heads=1, head_dim=16, intermediate_size=64
)


def _model(kind, seed=11):
    if kind == "gdn":  # Qwen3.5-like: one key head for two value heads, gated RoPE attention
        cfg = HybridConfig(
            pattern="G*-",
            gdn=GDNConfig(k_heads=1, v_heads=2, k_head_dim=8, v_head_dim=6),
            attention="gated",
            rotary_dim=8,
            mlp="swiglu",
            **COMMON,
        )
    elif kind == "mamba1":  # Jamba-like: 40 channels, two blocks of 32 (the second masked)
        cfg = HybridConfig(
            pattern="S*-", mamba1=Mamba1Config(d_inner=40, d_state=4, dt_rank=4), **COMMON
        )
    else:  # Bamba-like: Mamba-2 with RoPE attention and SwiGLU
        cfg = HybridConfig(
            pattern="M*-",
            ssm_heads=2,
            ssm_head_dim=8,
            d_state=8,
            n_groups=1,
            rotary_dim=8,
            mlp="swiglu",
            **COMMON,
        )
    model = HybridLM(cfg, seed=seed).eval()
    with torch.no_grad():  # recurrent scalars off their initial values, so they matter
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if name.endswith(("dt_bias", "A_log", "D", "dt_proj.bias")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
            if name.endswith("dt_proj.bias"):  # Jamba's Δ from 1e-3-1e-1 to about 0.2-1
                p.add_(1.5)
            if name.endswith(("mixer.out_proj.weight", "mixer.in_proj.weight")):
                p.mul_(5.0)  # the recurrent outputs (and Jamba's gate) weigh in the logits
    return model


FAMILIES = ("gdn", "mamba1", "bamba")
MODELS = {kind: _model(kind) for kind in FAMILIES}  # the teaching cache's, on CPU
ENGINE_MODELS = {kind: copy.deepcopy(m).to(DEVICE) for kind, m in MODELS.items()}


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50, (n,), generator=gen) for n in lengths]


def _engine(family, *args, **kw):
    return DecodeEngine(ENGINE_MODELS[family], *args, use_kernels=True, **kw)


def _batched_only(engine, monkeypatch):
    """Count the pools' kernel calls (layer -> list of batch sizes) and fail on the per-slot
    reference loop."""
    calls = {}

    def counted(layer, pool):
        replay = pool.replay

        def wrapped(entries, rows, *meta, **kw):
            calls.setdefault(layer, []).append(rows.shape[0])
            return replay(entries, rows, *meta, **kw)

        return wrapped

    for layer, pool in engine.ssm.items():
        assert pool.kernels and set(pool.log) >= set(pool.kernel_fields)
        monkeypatch.setattr(pool, "replay", counted(layer, pool))

    def per_slot(*args):
        raise AssertionError("the per-slot reference loop ran under use_kernels=True")

    monkeypatch.setattr(engine.policy, "_replay_outputs", per_slot)
    return calls


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_replay_gives_the_teaching_logits_in_one_call_per_layer(family, monkeypatch):
    """Two sequences at their own positions, prompts prefilled in chunks of 3 past a fold of
    L = 4, then greedy steps past more folds: every logit is the teaching cache's, and each
    step makes one kernel call per recurrent layer for the whole bucket."""
    model = MODELS[family]
    engine = _engine(  # un-graphed: a graph's warm-ups and capture would add calls
        family, 2, 24, "replay", log_length=4, max_verify=3, prefill_chunk=3, graphs=False
    )
    calls = _batched_only(engine, monkeypatch)
    prompts = _prompts((7, 4))
    caches, want = [], []
    with torch.no_grad():
        for p in prompts:
            caches.append(CacheConfig("replay", log_length=4).build(model, 1))
            want.append(model(p[None], caches[-1])[0, -1])
    got, worst = torch.stack([engine.admit(p)[1] for p in prompts]).cpu(), 0.0
    n_steps = 5
    for i in range(n_steps + 1):
        torch.testing.assert_close(got, torch.stack(want), atol=TOL, rtol=TOL)
        worst = max(worst, float((got - torch.stack(want)).abs().max()))
        if i == n_steps:
            break
        tokens = torch.stack(want).argmax(-1)
        got = engine.step(tokens[:, None])[:, 0].cpu()
        with torch.no_grad():
            want = [model(t.view(1, 1), c)[0, -1] for t, c in zip(tokens, caches)]
    assert calls == {l: [2] * n_steps for l in engine.ssm}  # bucket 2: one call per step
    assert engine.stats.folds >= 3 and worst < TOL
    assert [engine.pos[s] - engine.log_len[s] for s in engine.slots] == [8, 8]  # 12, 9 held


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prefill_leaves_the_checkpoint_and_log_of_a_token_by_token_decode(family):
    """Prefilled in chunks (Gated DeltaNet: the corrected updates from the state before the
    prompt), a prompt leaves the checkpoint, the log ring, its length and head and the conv
    window that decoding it token by token through the kernels leaves."""
    prompt = _prompts((7,), seed=4)[0]
    filled = _engine(family, 1, 16, "replay", log_length=4, max_verify=2, prefill_chunk=3)
    stepped = _engine(family, 1, 16, "replay", log_length=4, max_verify=2)
    filled.admit(prompt)
    stepped.admit(prompt[:1])
    for t in prompt[1:]:
        stepped.step(t.view(1, 1))
    assert (filled.log_len, filled.head) == (stepped.log_len, stepped.head) == ([3], [0])
    pairs = []
    for layer, pool in filled.ssm.items():
        other = stepped.ssm[layer]
        pairs += [("state", pool.state, other.state), ("conv", pool.conv, other.conv)]
        pairs += [(f, buf[:, :3], other.log[f][:, :3]) for f, buf in pool.log.items()]  # live
    for name, got, want in pairs:  # to TOL of each tensor's own scale (Mamba-2's state: 1e-4)
        scale = float(want.abs().max())
        assert scale > 0, name  # the checkpoint at 4 and the entries hold something
        worst = float((got.float() - want.float()).abs().max())
        assert worst <= TOL * scale, (name, worst, scale)


@pytest.mark.parametrize(
    "family, L, chunk, launches", [("bamba", 16, 40, (2, 3)), ("mamba1", 4, 23, (3, 15)),
                                    ("mamba1", 6, 23, (3, 10))]
)  # fmt: skip
def test_a_prefill_folds_its_grid_in_one_launch_with_the_bits_of_fold_by_fold(
    family, L, chunk, launches, monkeypatch
):
    """Where the pool's fold chains, a prefill chunk folds every grid point it reaches in one
    kernel launch a layer, leaving the checkpoint and ring of folding L entries at a time bit
    for bit (61 tokens in chunks that straddle the grid and leave a partial ring)."""
    prompt = _prompts((61,), seed=8)[0]
    kw = dict(log_length=L, max_verify=2, prefill_chunk=chunk, graphs=False)
    chained, stepwise = (_engine(family, 1, 64, "replay", **kw) for _ in range(2))
    calls = {"chained": 0, "stepwise": 0}
    for name, engine in (("chained", chained), ("stepwise", stepwise)):
        for pool in engine.ssm.values():
            fold = pool.fold

            def counted(*args, fold=fold, name=name, **kw):
                calls[name] += 1
                return fold(*args, **kw)

            monkeypatch.setattr(pool, "fold", counted)
    for pool in stepwise.ssm.values():
        assert pool.fold_chains(L)
        monkeypatch.setattr(pool, "fold_chains", lambda L: False)
    got, want = chained.admit(prompt)[1], stepwise.admit(prompt)[1]
    assert torch.equal(got, want)
    assert chained.log_len == stepwise.log_len == [61 % L]
    assert chained.head == stepwise.head
    layers = len(chained.ssm)
    assert (calls["chained"], calls["stepwise"]) == tuple(n * layers for n in launches)
    live = (chained.head[0] + torch.arange(61 % L)) % chained.table.capacity
    for layer, pool in chained.ssm.items():
        other = stepwise.ssm[layer]
        assert torch.equal(pool.state, other.state) and torch.equal(pool.conv, other.conv)
        for field, buf in pool.log.items():
            assert torch.equal(
                buf[0, live.to(buf.device)], other.log[field][0, live.to(buf.device)]
            )


@pytest.mark.parametrize("family", FAMILIES)
def test_a_chunk_ending_on_the_fold_grid_takes_the_scans_state_as_its_checkpoint(
    family, monkeypatch
):
    """Chunks of 8 tokens at L = 4 end on the fold grid: the checkpoint is the scan's state at
    each chunk's end (no fold launch), and only the last chunk, which ends off the grid, folds
    (23 tokens: [16, 20) folded, 3 entries left in the ring). The checkpoint, ring and window
    are those a token-by-token decode leaves, to ``TOL`` of their scale."""
    prompt = _prompts((23,), seed=6)[0]
    filled = _engine(family, 1, 32, "replay", log_length=4, max_verify=2, prefill_chunk=8)
    stepped = _engine(family, 1, 32, "replay", log_length=4, max_verify=2)
    folds = []
    for pool in filled.ssm.values():
        fold = pool.fold

        def counted(*args, fold=fold, **kw):
            folds.append(1)
            return fold(*args, **kw)

        monkeypatch.setattr(pool, "fold", counted)
    filled.admit(prompt)
    assert len(folds) == len(filled.ssm)  # one fold a layer: the last chunk's
    stepped.admit(prompt[:1])
    for t in prompt[1:]:
        stepped.step(t.view(1, 1))
    assert (filled.log_len, filled.head) == (stepped.log_len, stepped.head) == ([3], [0])
    for layer, pool in filled.ssm.items():
        other = stepped.ssm[layer]
        pairs = [("state", pool.state, other.state), ("conv", pool.conv, other.conv)]
        pairs += [(f, buf[:, :3], other.log[f][:, :3]) for f, buf in pool.log.items()]
        for name, got, want in pairs:
            scale = float(want.abs().max())
            worst = float((got.float() - want.float()).abs().max())
            assert scale > 0 and worst <= TOL * scale, (layer, name, worst, scale)


def test_a_long_prefill_logs_the_chunked_corrected_updates(monkeypatch):
    """A 70-token prompt in one pass (over ``UPDATES_CHUNKED_MIN_TOKENS``: the Gated DeltaNet
    log's corrected updates come from the chunked scan that gives the outputs, one pass), then
    5 steps that read the 6 logged entries: every logit is the teaching cache's."""
    from replaylab import gated_deltanet

    passes = []
    chunked = gated_deltanet.gdn_chunked_scan

    def spy(*args, **kw):
        passes.append(kw.get("return_updates", False))
        return chunked(*args, **kw)

    monkeypatch.setattr(gated_deltanet, "gdn_chunked_scan", spy)
    model = MODELS["gdn"]
    engine = _engine("gdn", 1, 80, "replay", log_length=16, max_verify=2, graphs=False)
    prompt = _prompts((70,), seed=5)[0]
    cache = CacheConfig("replay", log_length=16).build(model, 1)
    with torch.no_grad():
        want = model(prompt[None], cache)[0, -1]
        got = engine.admit(prompt)[1].cpu()
        assert engine.log_len == [6]
        for _ in range(5):
            torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)
            token = want.argmax()
            got = engine.step(token.view(1, 1).to(DEVICE))[0, 0].cpu()
            want = model(token.view(1, 1), cache)[0, -1]
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)
    # the engine's prefill: one chunked pass per recurrent layer, with the updates
    assert passes.count(True) == len(engine.ssm)


@pytest.mark.parametrize(
    "family, strategy",
    [("gdn", "replay"), ("mamba1", "replay"), ("mamba1", "snapshot"), ("mamba1", "recompute"),
     ("bamba", "snapshot"), ("bamba", "recompute"), ("gdn", "snapshot"), ("gdn", "recompute")],
)  # fmt: skip
def test_kernel_speculation_gives_the_engine_greedy_tokens_bit_for_bit(family, strategy):
    """Two sequences speculating together (drafters right with probability 0.8 and 0.4, each
    sequence accepting its own drafts), k = 1 .. 4, across folds of L = 5 (replay): each gives
    its greedy tokens bit for bit. Under snapshot and recompute the state steps through the
    family's ``state_update`` kernel, a verify as its tokens' single steps."""
    n = 8
    engine = _engine(family, 2, 32, strategy, log_length=5, max_verify=5, step_kernels=True)
    assert all(p.step_kernel == (strategy != "replay") for p in engine.ssm.values())
    prompts = _prompts((6, 3), seed=1)
    refs = [engine.greedy(p[None], n)[0].cpu() for p in prompts]
    rollbacks = 0
    for k in (1, 2, 3, 4):
        for s in engine.slots:
            engine.retire(s)
        pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]
        drafters = [
            SyntheticDrafter(torch.cat([p, r]), a, seed=10 * k + i)
            for i, (p, r, a) in enumerate(zip(prompts, refs, (0.8, 0.4)))
        ]
        before = engine.stats.rollbacks
        tokens, proposed, accepted = engine.speculate_batch(prompts, pending, n, drafters, k=k)
        for got, ref in zip(tokens, refs):
            assert torch.equal(got.cpu(), ref), k
        assert 0 < sum(accepted) <= sum(proposed)
        rollbacks += engine.stats.rollbacks - before
    assert rollbacks > 0 and (engine.stats.folds > 0) == (strategy == "replay")


@pytest.mark.parametrize("strategy", ("snapshot", "recompute"))
@pytest.mark.parametrize(
    "family, pool_class", [("mamba1", "Mamba1Pool"), ("bamba", "Mamba2Pool"), ("gdn", "GDNPool")]
)
def test_snapshot_and_recompute_step_the_bucket_in_one_kernel_launch(
    family, pool_class, strategy, monkeypatch
):
    """Under ``use_kernels`` snapshot's and recompute's recurrent layers (Mamba-1, Mamba-2,
    Gated DeltaNet) step the whole bucket in one ``state_update`` launch a layer and step (the spec's token loop never
    runs): random admit / step / rollback / retire programs give the teaching caches' logits."""
    from replaylab.serving import pools
    from replaylab.serving.strategies.base import EngineStrategy
    from replaylab.serving.strategies.snapshot import EngineSnapshot

    launches = []
    cls = getattr(pools, pool_class)
    step = cls.step

    def counted(pool, entries, bucket, drafts, counts):
        launches.append((bucket, next(iter(entries.values())).shape[1], drafts is not None))
        return step(pool, entries, bucket, drafts, counts)

    def token_loop(*args):
        raise AssertionError("the spec's token loop ran under use_kernels=True")

    monkeypatch.setattr(cls, "step", counted)
    for strategy_class in (EngineStrategy, EngineSnapshot):  # snapshot has its own
        monkeypatch.setattr(strategy_class, "keep_states", token_loop)
    engine, worst = _ragged_program(family, strategy, step_kernels=True)
    assert engine.stats.steps > 0 and engine.stats.rollbacks > 0 and worst < TOL
    assert all(p.step_kernel and not p.kernels for p in engine.ssm.values())
    runs = engine.stats.steps + engine.stats.reruns  # recompute re-runs its kept tokens
    if engine.graphs:  # on a GPU: two warm-ups and the capture of each graph launch it
        assert engine.stats.graph_replays == runs
        assert len(launches) == 3 * len(engine._graphs) * len(engine.ssm)
    else:
        assert len(launches) == runs * len(engine.ssm)
    # snapshot keeps the state after each token of a verify, straight from the kernel
    assert {d for _, T, d in launches if T > 1} == {strategy == "snapshot"}


def _ragged_program(family, strategy, **kw):
    """A random admit / step (per-slot T and counts) / rollback (per-slot keep) / retire
    program (``test_engine.run_program``) with the kernels, against the teaching caches."""
    return run_program(
        strategy,
        fused=False,
        use_kernels=True,
        seed=3,
        n_ops=14,
        slots=2,
        max_verify=3,
        model=ENGINE_MODELS[family],
        teaching_model=MODELS[family],
        tol=TOL,
        partial_rollbacks=True,
        **kw,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_ragged_programs_give_the_teaching_logits(family):
    """``_ragged_program`` under replay: every logit the teaching caches'."""
    engine, worst = _ragged_program(family, "replay")
    assert engine.stats.steps > 0 and engine.stats.folds > 0 and worst < TOL
    assert all(p.kernels for p in engine.ssm.values())


def test_bad_input_with_kernel_logs_is_refused_and_leaves_the_pools(monkeypatch):
    """A prefix cache over a kernel log of values the spec neither logs nor can derive (a spec
    that names no input fields) is refused naming the fix; a step across the fold grid is
    refused before any kernel runs; kernels for a family that has none are refused naming
    it."""
    engine = _engine("gdn", 2, 16, "replay", log_length=4)
    assert tuple(engine.ssm[0].log) == ("k", "u", "g")
    with monkeypatch.context() as m:
        m.setattr(type(engine.ssm[0].spec), "input_fields", None)
        with pytest.raises(
            ValueError,
            match=r"layer 0's spec names no input fields and its Triton replay log \(gated_deltanet\) "
            r"keeps \('k', 'u', 'g'\)",
        ):
            EnginePrefixCache(engine).admit(torch.tensor([1, 2, 3]))
    assert engine.slots == []
    slot, _ = engine.admit(torch.tensor([1, 2, 3]))
    before = pools(engine)
    with pytest.raises(ValueError, match=r"counts: slot 0 may take at most room=1 tokens"):
        engine.step(torch.tensor([[1, 2]]))
    after = pools(engine)
    for k, v in before.items():
        assert torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v, k
    mamba2 = _engine("bamba", 1, 16, "replay", log_length=4)
    assert tuple(mamba2.ssm[0].log) == mamba2.ssm[0].spec.log_fields  # served by a prefix cache
    stub = SimpleNamespace(state_spec=SimpleNamespace(family="decay"))  # no kernels of its own
    with pytest.raises(ValueError, match=r"kernels: no Triton replay kernels for the 'decay'"):
        recurrent_pool(stub, 1, "replay", 4, 2, torch.float32, "cpu", False, True)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("strategy", ("snapshot", "recompute", "replay"))
def test_graphed_steps_equal_the_ungraphed_engine_bit_for_bit(family, strategy):
    """The same ragged program of verifies (per-slot counts) and rollbacks (per-slot keeps),
    across folds of L = 5, on an engine whose steps are CUDA graph replays (the default on a
    GPU) and on one without graphs: the same arithmetic, so the same logits bit for bit."""
    plain, graphed = (
        _engine(family, 3, 48, strategy, log_length=5, max_verify=4, graphs=g)
        for g in (False, True)
    )
    assert graphed.graphs and not plain.graphs
    assert DecodeEngine(ENGINE_MODELS[family], 1, 8, strategy, use_kernels=True).graphs
    for p in _prompts((6, 3, 9), seed=2):
        for engine in (plain, graphed):
            engine.admit(p.to(DEVICE))
    gen, rng = torch.Generator().manual_seed(3), random.Random(4)
    for _ in range(12):
        slots = plain.slots
        counts = [rng.randint(1, plain.room(s)) for s in slots]
        tokens = torch.randint(0, 50, (len(slots), max(counts)), generator=gen).to(DEVICE)
        assert torch.equal(plain.step(tokens, counts), graphed.step(tokens, counts))
        keep = [rng.randint(1, c) for c in counts]
        for engine in (plain, graphed):
            engine.rollback(keep)
    assert (
        graphed.stats.graph_replays == 12 + graphed.stats.reruns and not plain.stats.graph_replays
    )
    assert strategy != "replay" or graphed.stats.folds > 0
    with pytest.raises(ValueError, match=r"graphs: replay without kernels reads each slot's"):
        DecodeEngine(ENGINE_MODELS[family], 1, 8, "replay", use_kernels=False, graphs=True)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_a_prefix_cache_seats_a_graphed_engine_as_an_ungraphed_one():
    """A prefix cache over a Bamba-like replay engine (its kernel log keeps the spec's fields)
    with CUDA graphs and without: a miss, then two hits off the grid, then decode steps:
    the same logits bit for bit (seating writes the pools in place, where the graphs read)."""
    rng = random.Random(5)
    system = [rng.randrange(50) for _ in range(13)]
    prompts = [system + [rng.randrange(50) for _ in range(n)] for n in (3, 6, 1)]
    seen = []
    for graphs in (False, True):
        engine = _engine("bamba", 3, 48, "replay", log_length=4, max_verify=3, graphs=graphs)
        prefix, logits = EnginePrefixCache(engine, block_size=4), []
        for p in prompts:
            logits.append(prefix.admit(p)[1])
        seen.append(decode_after_admissions(engine, logits, 6))
        assert engine.stats.graph_replays == (6 if graphs else 0)
    for a, b in zip(*seen):
        assert torch.equal(a, b)


def test_a_prefix_hit_folds_its_block_in_one_launch_with_the_bits_of_fold_by_fold(monkeypatch):
    """A hit seated off the grid on a Bamba-like replay engine (L = 16, blocks of 64): the
    block's entries up to the seat fold in one launch where the pool's fold chains, with the
    logits of folding 16 at a time bit for bit, and then the same decode."""
    rng = random.Random(9)
    system = [rng.randrange(50) for _ in range(110)]
    prompts = [system + [rng.randrange(50) for _ in range(n)] for n in (5, 9)]
    assert prompts[0][110] != prompts[1][110]
    seen = []
    for chained in (True, False):
        engine = _engine("bamba", 2, 128, "replay", log_length=16, max_verify=2, graphs=False)
        if not chained:
            for pool in engine.ssm.values():
                monkeypatch.setattr(pool, "fold_chains", lambda L: False)
        sizes, fold_entries = [], engine.policy.fold_entries

        def spy(pool, state, entries, fold_entries=fold_entries, sizes=sizes):
            sizes.append(next(iter(entries.values())).shape[1])
            return fold_entries(pool, state, entries)

        monkeypatch.setattr(engine.policy, "fold_entries", spy)
        prefix, logits = EnginePrefixCache(engine, block_size=64), []
        slot, out, _ = prefix.admit(prompts[0])
        del sizes[:]
        logits.append(out)
        slot, out, hit = prefix.admit(prompts[1])  # seated at 110: 64 + 32 folded + 14 in the ring
        logits.append(out)
        assert (hit.matched, hit.resumed_from, hit.folded) == (110, 110, 46)
        assert sizes[: len(engine.ssm)] == [32 if chained else 16] * len(engine.ssm)
        tok = torch.stack(logits).argmax(-1, keepdim=True)
        for _ in range(3):
            out = engine.step(tok)
            logits.append(out)
            tok = out[:, -1].argmax(-1, keepdim=True)
        seen.append(logits)
    for a, b in zip(*seen):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_verify_past_the_fold_grid_rounds_as_decode_steps_bit_for_bit(family):
    """log_capacity > L lets a verify pass the fold grid. Each row past it must give the
    recurrent layer's outputs a decode step there gives (from the folded checkpoint), bit for
    bit, and so must the steps after it, which fold the entries that verify appended (Gated
    DeltaNet's u among them). The products are row-invariant, so each layer's inputs agree
    too; the logits could not show this (a few ulps of y wash out in them)."""
    make = lambda **kw: _engine(family, 1, 32, "replay", matmul="row_invariant", graphs=False, **kw)  # noqa: E731
    prompt = _prompts((4 + 3,), seed=4)[0].to(DEVICE)  # no graphs: their replays skip the hook
    decoded, verified = outputs_past_the_grid(make, prompt, "advance", after=3)
    for t, (got, want) in enumerate(zip(verified[0], decoded[0])):
        assert torch.equal(got, want), (t, (got - want).abs().max().item())


def test_the_step_kernels_by_default_are_the_ones_timed_in_the_engine():
    """``step_kernels=None``: under snapshot and recompute with ``use_kernels`` the families
    whose pools say ``step_kernel_default`` (all three) step through their kernel;
    True: every family's; False: none; replay: none (it replays instead), and without
    ``use_kernels`` none. A family without the default keeps the token loop unless asked."""
    for family in FAMILIES:
        for strategy in ("snapshot", "recompute"):
            default = _engine(family, 1, 8, strategy).ssm.values()
            assert all(p.step_kernel for p in default), family
            every = _engine(family, 1, 8, strategy, step_kernels=True).ssm.values()
            assert all(p.step_kernel for p in every), family
            none = _engine(family, 1, 8, strategy, step_kernels=False).ssm.values()
            assert not any(p.step_kernel for p in none), family
        replay = _engine(family, 1, 8, "replay", step_kernels=True).ssm.values()
        assert not any(p.step_kernel for p in replay), family
        plain = DecodeEngine(MODELS[family], 1, 8, "snapshot", use_kernels=False, step_kernels=True)
        assert not any(p.step_kernel for p in plain.ssm.values()), family
    from replaylab.serving.pools import GDNPool

    with pytest.MonkeyPatch.context() as patch:  # a family whose kernel is not the default
        patch.setattr(GDNPool, "step_kernel_default", False)
        assert not any(p.step_kernel for p in _engine("gdn", 1, 8, "snapshot").ssm.values())
        asked = _engine("gdn", 1, 8, "snapshot", step_kernels=True).ssm.values()
        assert all(p.step_kernel for p in asked)
    assert DecodeEngine(MODELS["mamba1"], 1, 8, use_kernels=True).strategy == "snapshot"
    no_step = DecodeEngine(MODELS["mamba1"], 1, 8, use_kernels=True, step_kernels=False)
    assert no_step.strategy == "replay"  # snapshot's speed needs the kernel
    with pytest.raises(ValueError, match=r"step_kernels: expected None, True or False, got 'yes'"):
        DecodeEngine(MODELS["mamba1"], 1, 8, step_kernels="yes")


@pytest.mark.parametrize("fused", [False, True])
def test_the_mamba2_step_launches_alike_at_every_batch_under_batch_invariant(fused, monkeypatch):
    """Snapshot's Mamba-2 step (the reference path's ``step_kernels`` and the fused path) takes
    ``kernels.decode.BATCH_INVARIANT_STATE_UPDATE`` under the engine's ``batch_invariant``
    (default), whatever the bucket; without it the launch tuned per batch
    (``LAUNCH_STATE_UPDATE``, which changes past batch 32)."""
    import replaylab.kernels.decode as decode

    launches, update = [], decode.state_update

    def spy(*args, **kw):
        launches.append((kw.get("block_p"), kw.get("num_warps")))
        return update(*args, **kw)

    monkeypatch.setattr(decode, "state_update", spy)
    for invariant, want in ((True, decode.BATCH_INVARIANT_STATE_UPDATE), (False, (None, None))):
        launches.clear()
        engine = _engine("bamba", 3, 16, "snapshot", fused=fused, batch_invariant=invariant)
        for p in _prompts((4, 6, 5)):
            engine.admit(p.to(DEVICE))
        engine.step(torch.ones(3, 2, dtype=torch.long, device=DEVICE))
        assert launches and set(launches) == {want}, (invariant, set(launches))
