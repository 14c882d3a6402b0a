"""The cache contract: after any sequence of advance / snapshot / restore / truncate / fork /
reorder, the SSM state, conv window and KV equal (a) what the cache held when it first reached
that position (bitwise for snapshot and replay: the same operations in the same order; within
1e-5 for recompute and for a replay restore before its checkpoint, which fall back to re-running
the model with tokens batched differently) and (b) a fresh prefill of the
same tokens (within 1e-5). Workloads give the same tokens under every strategy."""

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replaylab import assert_close
from replaylab.cache import CacheConfig, HybridCache
from replaylab.decoding import (
    ModelDrafter,
    PromptLookupDrafter,
    SyntheticDrafter,
    beam_search,
    best_of_n,
    greedy,
    speculative,
    tree_search,
)
from replaylab.model import HybridConfig, HybridLM
from replaylab.strategies import STRATEGY_NAMES as STRATEGIES
from replaylab.strategies import EvictionItem
from replaylab.testing import tiny_hybrid


def both(strategy, interval, **options):
    """A config whose checkpoint interval and log length are both ``interval``."""
    return CacheConfig(strategy, checkpoint_interval=interval, log_length=interval, **options)


MODEL = tiny_hybrid()


def held(cache):
    """Everything the cache would hand the model next: SSM (h, w) per layer and KV."""
    out = {}
    for layer in cache.spec.recurrent:
        h, w = cache.state(layer)
        out[f"h{layer}"], out[f"w{layer}"] = h.clone(), w.clone()
    for layer, kv in cache.kv.items():
        out[f"k{layer}"], out[f"v{layer}"] = (t.clone() for t in kv.keys_values())
    return out


def compare(got, want, exact):
    for name in want:
        if exact:
            assert torch.equal(got[name], want[name]), name
        else:
            assert_close(got[name], want[name], atol=1e-5, rtol=1e-5, name=name)


ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["advance", "advance", "snapshot", "restore", "truncate", "fork", "reorder", "evict"]
        ),
        st.integers(0, 1000),
    ),
    min_size=2,
    max_size=12,
)


def run_program(model, strategy, program, batch=1, bitwise=("snapshot", "replay"), **options):
    """Run ``program`` [(op, arg)] on a cache and check the contract after every step: the
    state on returning to a position equals what was held on first reaching it (bitwise under
    the ``bitwise`` strategies unless a restore re-ran the model, else within 1e-5), and at the
    end equals a fresh prefill of the same tokens. ``options`` go to the cache."""
    torch.manual_seed(0)
    vocab = model.cfg.vocab_size
    cache = HybridCache(model, batch, strategy, checkpoint_interval=3, log_length=3, **options)
    handles = []  # every handle ever taken: stale ones must be refused, changing nothing
    with torch.no_grad():
        model(torch.randint(0, vocab, (batch, 4)), cache)
        history = {cache.position: held(cache)}  # position -> what was held on first reaching it
        floor = cache.position  # positions below were never recorded
        for op, arg in program:
            if op == "advance":
                for _ in range(arg % 3 + 1):
                    model(torch.randint(0, vocab, (cache.batch, 1 + arg % 2)), cache)
                    history[cache.position] = held(cache)
            elif op == "snapshot":
                handles.append(cache.snapshot())
            elif op == "restore" and handles:
                h = handles[arg % len(handles)]
                if h.id in cache.live_handles and h.layout == cache.layout:
                    cache.restore(h)
                else:  # released, rolled back past, or taken before a fork / reorder
                    before = held(cache)
                    with pytest.raises(ValueError, match=r"handle: position \d+ was released"):
                        cache.restore(h)
                    compare(held(cache), before, exact=True)
            elif op == "evict":  # squeeze the budget: kept copies go, restores fall back
                cache.set_budget(max(1, cache.total_bytes() - 1 - arg * 64))
                cache.set_budget(None)
            elif op == "truncate":
                p = floor + arg % (cache.position - floor + 1)
                if strategy != "snapshot" or p == cache.position or cache.ssm.can_restore(p):
                    cache.truncate_to(p)
            elif op == "fork" and cache.batch <= 2:
                cache.fork(2)
                idx = torch.arange(cache.batch // 2).repeat_interleave(2)
                history = {p: {n: t[idx] for n, t in s.items()} for p, s in history.items()}
            elif op == "reorder":  # with repeats: some branches continue twice, some end
                idx = torch.randint(0, cache.batch, (cache.batch,))
                cache.reorder(idx)
                history = {p: {n: t[idx] for n, t in s.items()} for p, s in history.items()}
            history = {p: s for p, s in history.items() if p <= cache.position}
            if cache.position in history:
                # bitwise unless some restore re-ran the model (recompute, or replay falling
                # back to it for a position before its checkpoint)
                exact = strategy in bitwise and cache.stats.recomputed_tokens == 0
                compare(held(cache), history[cache.position], exact=exact)
        fresh = HybridCache(model, cache.batch, strategy)
        model(cache.tokens, fresh)
        compare(held(cache), held(fresh), exact=False)


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
# snapshot once restored an evicted per-token copy as an empty one (the state left as it was)
@example(program=[("snapshot", 0), ("advance", 0), ("evict", 51), ("advance", 0), ("truncate", 1)])
def test_any_operation_sequence_gives_the_state_of_a_fresh_prefill(strategy, program):
    run_program(MODEL, strategy, program)


EDGE_MODELS = {
    "d_conv=1": HybridConfig(
        vocab_size=40,
        hidden_size=32,
        pattern="M*M-",
        ssm_heads=2,
        ssm_head_dim=8,
        d_state=8,
        n_groups=1,
        d_conv=1,
        attn_heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate_size=32,
    ),
    "attention only": HybridConfig(
        vocab_size=40,
        hidden_size=32,
        pattern="*-*",
        attn_heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate_size=32,
    ),
    "Mamba only, d_conv=2": HybridConfig(
        vocab_size=40,
        hidden_size=32,
        pattern="M-M",
        ssm_heads=2,
        ssm_head_dim=8,
        d_state=8,
        n_groups=2,
        d_conv=2,
        intermediate_size=32,
    ),
}


@pytest.mark.parametrize("name", EDGE_MODELS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
def test_the_contract_holds_for_edge_configs_at_batch_2(name, strategy, program):
    run_program(HybridLM(EDGE_MODELS[name], seed=1).eval(), strategy, program, batch=2)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_restores_raise_and_leave_the_cache_unchanged(strategy):
    cache = HybridCache(MODEL, 1, strategy, checkpoint_interval=4, log_length=4)
    other = HybridCache(MODEL, 1, strategy)
    with torch.no_grad():
        MODEL(torch.randint(0, 50, (1, 6)), cache)
        handle = cache.snapshot()
        MODEL(torch.randint(0, 50, (1, 3)), cache)
    before, tokens = held(cache), cache.tokens.clone()
    bad = [
        (9 + 1, r"expected 0 <= position <= 9, got 10"),
        (-1, r"got -1"),
        (other.snapshot(), r"taken from cache \d+, not this cache"),
    ]
    for target, message in bad:
        with pytest.raises(ValueError, match=message):
            cache.restore(target)
        compare(held(cache), before, exact=True)
        assert torch.equal(cache.tokens, tokens)
    cache.release(handle)
    with pytest.raises(ValueError, match=r"position 6 was released"):
        cache.restore(handle)
    if strategy == "snapshot":  # only snapshotted positions can be restored
        with pytest.raises(
            ValueError, match=r"position 2: no state kept for it under the snapshot"
        ):
            cache.truncate_to(2)
    compare(held(cache), before, exact=True)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_workloads_give_identical_tokens_under_every_strategy(strategy):
    prompt = torch.tensor([[3, 7, 1, 3, 7, 2, 9, 3, 7]])
    ref = greedy(MODEL, prompt, 20, "snapshot")
    assert torch.equal(greedy(MODEL, prompt, 20, both(strategy, 5)).tokens, ref.tokens)
    full = torch.cat([prompt, ref.tokens], 1)
    for drafter in [
        SyntheticDrafter(full, 0.5, seed=1),
        SyntheticDrafter(full, 0.9, seed=1),
        PromptLookupDrafter(),
        ModelDrafter(HybridLM(HybridConfig(vocab_size=50, pattern="M-"), seed=5).eval()),
    ]:
        run = speculative(MODEL, prompt, 20, drafter, k=4, cache=both(strategy, 5))
        assert torch.equal(run.tokens, ref.tokens), type(drafter).__name__
    beams = {s: beam_search(MODEL, prompt, 8, 3, s).extra["beams"] for s in STRATEGIES}
    assert all(torch.equal(beams[strategy], b) for b in beams.values())
    samples = {
        s: best_of_n(MODEL, prompt, 8, 4, seed=3, cache=s).extra["samples"] for s in STRATEGIES
    }
    assert all(torch.equal(samples[strategy], b) for b in samples.values())
    trees = {
        s: tree_search(MODEL, prompt, 11, branch=3, keep=2, depth=3, cache=both(s, 4)).extra[
            "paths"
        ]
        for s in STRATEGIES
    }
    assert all(torch.equal(trees[strategy], t) for t in trees.values())
    assert trees[strategy].shape == (2, 11)


def test_tree_search_scores_its_paths_by_the_model():
    prompt = torch.tensor([[1, 2, 3]])
    run = tree_search(MODEL, prompt, 6, branch=2, keep=2, depth=3, cache="replay")
    for path, score in zip(run.extra["paths"], run.extra["scores"]):
        seq = torch.cat([prompt[0], path])[None]
        with torch.no_grad():
            logp = torch.log_softmax(MODEL(seq, HybridCache(MODEL, 1))[0, 2:-1].float(), -1)
        assert_close(logp.gather(1, path[:, None]).sum(), score, atol=1e-4, name="path score")


def test_draft_model_with_another_vocabulary_is_refused():
    drafter = ModelDrafter(HybridLM(HybridConfig(vocab_size=60, pattern="M-")))
    with pytest.raises(ValueError, match=r"vocabulary of 60 tokens, expected the target's 50"):
        speculative(MODEL, torch.tensor([[1, 2, 3]]), 5, drafter)


def test_replay_holds_less_than_snapshot_when_speculating_on_a_wide_state():
    wide = HybridLM(
        HybridConfig(pattern="M*M-", ssm_heads=8, ssm_head_dim=16, d_state=64, n_groups=1), seed=0
    ).eval()
    prompt = torch.randint(0, 128, (1, 8))
    ref = torch.cat([prompt, greedy(wide, prompt, 12).tokens], 1)
    peak = {
        s: speculative(
            wide, prompt, 12, SyntheticDrafter(ref, 0.5), k=4, cache=both(s, 8)
        ).peak_bytes
        for s in STRATEGIES
    }
    assert peak["replay"] < peak["snapshot"]


def test_replay_with_the_triton_fold_gives_the_same_tokens_and_states():
    if torch.cuda.is_available():  # the kernels on CPU tensors need the interpreter
        pytest.skip("CPU tensors through Triton's interpreter (off on a GPU machine)")
    prompt = torch.tensor([[3, 7, 1, 3, 7, 2, 9]])
    ref = greedy(MODEL, prompt, 10, both("replay", 4))
    full = torch.cat([prompt, ref.tokens], 1)
    cache_ref = HybridCache(MODEL, 1, "replay", checkpoint_interval=4, log_length=4)
    cache_tri = HybridCache(MODEL, 1, "replay", log_length=4, use_kernels=True)
    with torch.no_grad():
        for c in (cache_ref, cache_tri):
            MODEL(full[:, :9], c)
            c.truncate_to(7)
    compare(held(cache_tri), held(cache_ref), exact=False)
    run = speculative(
        MODEL,
        prompt,
        10,
        SyntheticDrafter(full, 0.5),
        k=3,
        cache=both("replay", 4, use_kernels=True),
    )
    assert torch.equal(run.tokens, ref.tokens)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_handle_rolled_back_past_is_refused(strategy):
    cache = HybridCache(MODEL, 1, strategy, checkpoint_interval=3, log_length=3)
    with torch.no_grad():
        MODEL(torch.randint(0, 50, (1, 5)), cache)
        early = cache.snapshot()
        MODEL(torch.randint(0, 50, (1, 5)), cache)
        late = cache.snapshot()
        MODEL(torch.randint(0, 50, (1, 3)), cache)
        cache.restore(early)
        MODEL(torch.randint(0, 50, (1, 7)), cache)  # positions 5-11 now hold other tokens
    with pytest.raises(ValueError, match="rolled back past"):
        cache.restore(late)


@pytest.mark.parametrize("strategy", ["snapshot", "recompute"])
@pytest.mark.parametrize("policy", ["lru", "cost"])
def test_a_tight_budget_evicts_but_never_changes_the_tokens(strategy, policy):
    prompt = torch.tensor([[3, 7, 1, 3, 7, 2, 9, 3, 7]])
    ref = greedy(MODEL, prompt, 24, "replay")
    full = torch.cat([prompt, ref.tokens], 1)
    free = speculative(
        MODEL, prompt, 24, SyntheticDrafter(full, 0.5, seed=2), k=4, cache=both(strategy, 2)
    )
    budget = int(free.peak_bytes * 0.7)
    run = speculative(
        MODEL,
        prompt,
        24,
        SyntheticDrafter(full, 0.5, seed=2),
        k=4,
        cache=both(strategy, 2, budget_bytes=budget, eviction=policy),
    )
    assert torch.equal(run.tokens, ref.tokens)
    assert run.stats.evictions > 0


def test_restoring_an_evicted_snapshot_rebuilds_it():
    cache = HybridCache(MODEL, 1, "snapshot")
    with torch.no_grad():
        MODEL(torch.randint(0, 50, (1, 6)), cache)
        first = cache.snapshot()
        MODEL(torch.randint(0, 50, (1, 3)), cache)
        second = cache.snapshot()
        MODEL(torch.randint(0, 50, (1, 2)), cache)
        cache.set_budget(cache.total_bytes() - 1)  # one copy must go: the older (LRU)
        cache.set_budget(None)
        assert cache.stats.evictions == 1 and first.id in cache.ssm.evicted
        cache.restore(first)
        fresh = HybridCache(MODEL, 1, "snapshot")
        MODEL(cache.tokens, fresh)
    compare(held(cache), held(fresh), exact=False)
    assert cache.stats.fallback_restores == 1 and cache.stats.recomputed_tokens == 6
    assert second.id not in cache.live_handles  # rolled back past it


def test_eviction_policies():
    from replaylab.cache import choose_victim

    items = [
        EvictionItem("a", 4, 100, 3),
        EvictionItem("b", 8, 100, 1),
        EvictionItem("c", 9, 100, 2),
    ]
    assert choose_victim(items, "lru") == "b"
    assert choose_victim(items, "cost") == "c"  # rebuilt from b in 1 token
    with pytest.raises(ValueError, match=r"eviction: expected one of \('lru', 'cost'\)"):
        HybridCache(MODEL, 1, "snapshot", eviction="fifo")


def test_drafters_name_a_bad_draft_count_or_an_empty_context():
    """Both drafters propose nothing at k = 0 (the engine allows it) and name a negative k;
    prompt lookup names an empty context."""
    lookup = PromptLookupDrafter()
    assert lookup.propose(torch.tensor([3, 4, 3]), 0, 10).numel() == 0
    assert lookup.propose(torch.tensor([3, 4, 3]), 2, 10).tolist() == [4, 3]
    with pytest.raises(ValueError, match=r"k: expected k >= 0 drafts, got -1"):
        lookup.propose(torch.tensor([3, 4]), -1, 10)
    with pytest.raises(ValueError, match=r"context: expected at least one token"):
        lookup.propose(torch.tensor([], dtype=torch.long), 2, 10)
    drafter = ModelDrafter(HybridLM(HybridConfig(vocab_size=50, pattern="M-"), seed=5).eval())
    assert drafter.propose(torch.tensor([1, 2]), 0, 50).numel() == 0
    with pytest.raises(ValueError, match=r"k: expected k >= 0 drafts, got -2"):
        drafter.propose(torch.tensor([1, 2]), -2, 50)
