"""The cache at its edges: valid operations that used to crash (position 0, empty input,
d_conv=1, models without recurrent or without attention layers), and every bad input refused
with a typed error before anything changes (the cache compared before and after)."""

import pytest
import torch
from test_cache_contract import EDGE_MODELS

from replaylab.cache import CacheConfig, HybridCache
from replaylab.decoding import SyntheticDrafter, beam_search, greedy, speculative, tree_search
from replaylab.model import HybridConfig, HybridLM
from replaylab.strategies import STRATEGY_NAMES
from replaylab.testing import tiny_hybrid

MODEL = tiny_hybrid()


def held(cache):
    """Everything a cache holds that the next forward reads, plus its bookkeeping."""
    out = {
        "tokens": cache.tokens.clone(),
        "position": cache.position,
        "batch": cache.batch,
        "layout": cache.layout,
        "handles": dict(cache.live_handles),
        "bytes": cache.nbytes(),
    }
    for layer in cache.spec.recurrent:
        s = cache.state(layer)
        out[f"h{layer}"], out[f"w{layer}"] = s.ssm.clone(), s.conv.clone()
    for layer, kv in cache.kv.items():
        out[f"k{layer}"], out[f"v{layer}"] = (t.clone() for t in kv.keys_values())
    return out


def assert_same(got, want):
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


def advanced(strategy, n=7, batch=1, model=MODEL, **options):
    cache = HybridCache(model, batch, strategy, checkpoint_interval=3, log_length=3, **options)
    with torch.no_grad():
        model(torch.randint(0, model.cfg.vocab_size, (batch, n)), cache)
    return cache


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("how", ["restore", "truncate", "handle"])
def test_going_back_to_position_0_works_after_the_checkpoint_moved(strategy, how):
    cache = HybridCache(MODEL, 2, strategy, checkpoint_interval=2, log_length=2)
    handle = cache.snapshot() if how == "handle" else None
    with torch.no_grad():
        for _ in range(3):  # replay folds its log into the checkpoint at 2, 4, 6
            MODEL(torch.randint(0, 50, (2, 2)), cache)
        {
            "restore": lambda: cache.restore(0),
            "truncate": lambda: cache.truncate_to(0),
            "handle": lambda: cache.restore(handle),
        }[how]()
    assert cache.position == 0 and cache.stats.restores == 1
    assert cache.stats.recomputed_tokens == 0  # nothing to re-run from the empty state
    fresh = held(HybridCache(MODEL, 2, strategy))
    got = held(cache)
    assert_same(
        {k: got[k] for k in fresh if k not in ("layout", "handles", "bytes")},
        {k: fresh[k] for k in fresh if k not in ("layout", "handles", "bytes")},
    )
    with torch.no_grad():  # and decoding goes on as from a fresh cache
        ids = torch.randint(0, 50, (2, 3))
        fresh = HybridCache(MODEL, 2, strategy)
        assert torch.equal(MODEL(ids, cache), MODEL(ids, fresh))


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_zero_new_tokens_is_a_no_op(strategy):
    cache = advanced(strategy)
    before = held(cache)
    with torch.no_grad():
        logits = MODEL(torch.zeros(1, 0, dtype=torch.long), cache)
    assert logits.shape == (1, 0, 50)
    assert_same(held(cache), before)


@pytest.mark.parametrize("name", EDGE_MODELS)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_edge_configs_give_the_same_tokens_under_every_workload(name, strategy):
    model = HybridLM(EDGE_MODELS[name], seed=1).eval()
    prompt = torch.tensor([[3, 7, 1, 3, 7, 2]])
    ref = greedy(model, prompt, 12, "snapshot")
    config = CacheConfig(strategy, checkpoint_interval=3, log_length=3)
    assert torch.equal(greedy(model, prompt, 12, config).tokens, ref.tokens)
    full = torch.cat([prompt, ref.tokens], 1)
    run = speculative(model, prompt, 12, SyntheticDrafter(full, 0.5, seed=1), k=3, cache=config)
    assert torch.equal(run.tokens, ref.tokens) and run.restores > 0
    beams = beam_search(model, prompt, 5, 3, "snapshot").extra["beams"]
    assert torch.equal(beam_search(model, prompt, 5, 3, config).extra["beams"], beams)
    paths = tree_search(model, prompt, 6, 2, 2, 3, "snapshot").extra["paths"]
    assert torch.equal(tree_search(model, prompt, 6, 2, 2, 3, config).extra["paths"], paths)


def test_snapshot_keeps_every_position_after_a_snapshot_without_recurrent_layers():
    model = HybridLM(EDGE_MODELS["attention only"], seed=1).eval()
    cache = advanced("snapshot", model=model)
    handle = cache.snapshot()
    with torch.no_grad():
        model(torch.randint(0, 40, (1, 5)), cache)
        for p in (11, 9, 8):  # positions promised since the snapshot
            cache.truncate_to(p)
            assert cache.position == p
        cache.restore(handle)
    assert cache.position == 7


def test_release_is_tied_to_its_cache():
    a, b = advanced("snapshot"), advanced("snapshot")
    mine, theirs = a.snapshot(), b.snapshot()
    assert mine.id == theirs.id  # ids alone would confuse the two
    before = held(a)
    with pytest.raises(ValueError, match=r"handle: taken from cache \d+, not this cache"):
        a.release(theirs)
    with pytest.raises(TypeError, match=r"handle: expected a Handle from snapshot\(\), got int 3"):
        a.release(3)
    assert_same(held(a), before)
    with torch.no_grad():
        MODEL(torch.randint(0, 50, (1, 2)), a)
        a.restore(mine)  # still live
    a.release(mine)
    a.release(mine)  # twice: nothing happens


def test_a_cache_refuses_a_model_it_was_not_built_for():
    other = HybridLM(
        HybridConfig(
            vocab_size=50,
            hidden_size=32,
            pattern="*M-M",
            ssm_heads=3,
            ssm_head_dim=8,
            d_state=8,
            n_groups=3,
            attn_heads=2,
            kv_heads=1,
            head_dim=16,
            intermediate_size=64,
        ),
        seed=0,
    ).eval()
    for strategy in STRATEGY_NAMES:
        cache = advanced(strategy)
        before = held(cache)
        with (
            torch.no_grad(),
            pytest.raises(
                ValueError,
                match=r"model: this cache was built "
                r"for other layers",
            ),
        ):
            other(torch.randint(0, 50, (1, 2)), cache)
        assert_same(held(cache), before)
        wide = HybridCache(MODEL, 1, strategy, dtype=torch.float64)
        with (
            torch.no_grad(),
            pytest.raises(
                ValueError,
                match=r"the cache holds torch.float64 "
                r"on cpu, the model computes in "
                r"torch.float32",
            ),
        ):
            MODEL(torch.randint(0, 50, (1, 2)), wide)
        assert (
            wide.position == 0
            and wide.total_bytes()
            == HybridCache(MODEL, 1, strategy, dtype=torch.float64).total_bytes()
        )


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("failing_block", [1, 2])  # after an SSM layer, after the attention layer
def test_a_forward_that_fails_midway_leaves_the_cache_as_it_was(
    strategy, failing_block, monkeypatch
):
    cache = advanced(strategy, batch=2)
    handle = cache.snapshot()
    with torch.no_grad():
        MODEL(torch.randint(0, 50, (2, 2)), cache)
    before = held(cache)
    block = MODEL.model.layers[failing_block]

    def explode(*args, **kwargs):
        raise Boom("injected failure")

    monkeypatch.setattr(block, "forward", explode)
    with torch.no_grad(), pytest.raises(Boom):
        MODEL(torch.randint(0, 50, (2, 3)), cache)
    monkeypatch.undo()
    assert_same(held(cache), before)
    with torch.no_grad():  # and the cache goes on exactly as an untouched one would
        ids = torch.randint(0, 50, (2, 3))
        twin = HybridCache(MODEL, 2, strategy, checkpoint_interval=3, log_length=3)
        MODEL(cache.tokens, twin)
        assert torch.allclose(MODEL(ids, cache), MODEL(ids, twin), atol=1e-5)
        cache.restore(handle)


# (call, expected error, message): each is tried on a cache that has advanced, and the cache
# must be unchanged afterwards
BAD_CALLS = [
    (lambda c: c.restore(2.5), TypeError, r"position: expected an integer, got float 2.5"),
    (lambda c: c.restore("3"), TypeError, r"position: expected an integer, got str '3'"),
    (lambda c: c.restore(True), TypeError, r"position: expected an integer, got a boolean"),
    (lambda c: c.restore(8), ValueError, r"position: expected 0 <= position <= 7, got 8"),
    (lambda c: c.restore(-1), ValueError, r"position: expected 0 <= position <= 7, got -1"),
    (lambda c: c.truncate_to(3.0), TypeError, r"position: expected an integer, got float"),
    (lambda c: c.truncate_to(None), TypeError, r"position: expected an integer, got NoneType"),
    (lambda c: c.reorder([0.7, 1.2]), TypeError, r"indices\[0\]: expected an integer"),
    (lambda c: c.reorder(torch.tensor([True, False])), TypeError, r"boolean mask"),
    (lambda c: c.reorder(torch.tensor([0.0, 1.0])), TypeError, r"expected integers, got dtype"),
    (lambda c: c.reorder([0, 2]), ValueError, r"values in \[0, 2\), got \[0, 2\]"),
    (lambda c: c.reorder([]), ValueError, r"a non-empty 1-d list"),
    (lambda c: c.reorder("01"), TypeError, r"expected a list or tensor of branch numbers"),
    (lambda c: c.fork(1.5), TypeError, r"n: expected an integer, got float 1.5"),
    (lambda c: c.fork(0), ValueError, r"n: expected 1 <= n, got 0"),
    (lambda c: c.release(3), TypeError, r"handle: expected a Handle"),
    (
        lambda c: c.set_budget(-5),
        ValueError,
        r"budget_bytes: expected a number of bytes > 0, got -5",
    ),
    (lambda c: c.set_budget(float("nan")), ValueError, r"budget_bytes: expected .* > 0, got nan"),
    # a bool budget was 1 byte: every kept copy evicted without a word
    (
        lambda c: c.set_budget(True),
        TypeError,
        r"budget_bytes: expected a number of bytes, got bool True",
    ),
    (lambda c: c.set_budget("100"), TypeError, r"budget_bytes: .* got str '100'"),
    (
        lambda c: MODEL(torch.tensor([[1, 50]] * 2), c),
        ValueError,
        r"input_ids: expected ids in \[0, 50\), got values from 1 to 50",
    ),
    (lambda c: MODEL(torch.tensor([[-1, 3]] * 2), c), ValueError, r"from -1 to 3"),
    (
        lambda c: MODEL(torch.tensor([[1.0, 2.0]] * 2), c),
        TypeError,
        r"input_ids: expected an integer tensor, got dtype torch.float32",
    ),
    (lambda c: MODEL(torch.tensor([[float("nan")]] * 2), c), TypeError, r"got dtype"),
    (lambda c: MODEL(torch.tensor([[True]] * 2), c), TypeError, r"got dtype torch.bool"),
    (
        lambda c: MODEL([[1, 2], [3, 4]], c),
        TypeError,
        r"input_ids: expected a torch.Tensor of token ids \(batch, T\), got list",
    ),
    (
        lambda c: MODEL(torch.tensor([[1, 2]]), c),
        ValueError,
        r"input_ids: expected shape \(batch=2, T\), got \(1, 2\)",
    ),
    (lambda c: MODEL(torch.tensor([1, 2]), c), ValueError, r"got \(2,\)"),
]


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_every_bad_input_is_refused_before_anything_changes(strategy):
    cache = advanced(strategy, batch=2)
    cache.snapshot()
    before = held(cache)
    for call, error, message in BAD_CALLS:
        with torch.no_grad(), pytest.raises(error, match=message):
            call(cache)
        assert_same(held(cache), before)


def test_handles_taken_before_a_fork_are_refused_and_change_nothing():
    for strategy in STRATEGY_NAMES:
        cache = advanced(strategy)
        handle = cache.snapshot()
        cache.fork(2)
        before = held(cache)
        with pytest.raises(ValueError, match=r"forked/reordered since \(layout 0, now 1\)"):
            cache.restore(handle)
        cache.release(handle)  # no longer live: a no-op
        assert_same(held(cache), before)


@pytest.mark.parametrize("batch", [-1, 0, 2.5, True, "2"])
def test_bad_batch_sizes_are_refused_at_construction(batch):
    with pytest.raises(
        TypeError if not isinstance(batch, int) or batch is True else ValueError,
        match=r"batch: expected",
    ):
        HybridCache(MODEL, batch)


def test_a_config_without_a_conv_width_is_refused():
    with pytest.raises(ValueError, match=r"d_conv: expected a conv width >= 1, got 0"):
        HybridConfig(d_conv=0)


def test_decoding_workloads_refuse_bad_counts_by_name():
    """n_new, widths and sampling settings: best_first_search(n_new=2.5) never returned,
    beam_search(n_new=0) returned a token, greedy(n_new=0) raised inside torch.cat,
    best_of_n(temperature=-1) sampled the inverted distribution, and a width past the
    vocabulary raised inside topk."""
    from replaylab.decoding import best_first_search, best_of_n

    prompt = torch.tensor([[1, 2, 3]])
    vocab = MODEL.cfg.vocab_size
    bad = [
        (lambda: best_first_search(MODEL, prompt, 2.5), TypeError, r"n_new: expected an integer, got float 2.5"),
        (lambda: beam_search(MODEL, prompt, 0), ValueError, r"n_new: expected 1 <= n_new, got 0"),
        (lambda: greedy(MODEL, prompt, 0), ValueError, r"n_new: expected 1 <= n_new, got 0"),
        (lambda: greedy(MODEL, prompt, True), TypeError, r"n_new: expected an integer, got a boolean"),
        (lambda: beam_search(MODEL, prompt, 3, width=0), ValueError, r"width: expected 1 <= width"),
        (lambda: beam_search(MODEL, prompt, 3, width=vocab + 1), ValueError, rf"width: expected 1 <= width <= {vocab}"),
        (lambda: tree_search(MODEL, prompt, 3, branch=vocab + 1), ValueError, rf"branch: expected 1 <= branch <= {vocab}"),
        (lambda: best_of_n(MODEL, prompt, 3, temperature=-1.0), ValueError, r"temperature: expected a finite number > 0, got -1"),
        (lambda: best_of_n(MODEL, prompt, 3, temperature=float("inf")), ValueError, r"temperature: expected a finite number"),
        (lambda: best_of_n(MODEL, prompt, 3, seed=1.5), TypeError, r"seed: expected an integer, got float 1.5"),
        (lambda: speculative(MODEL, prompt, 3, SyntheticDrafter(prompt, 0.5), k=2.5), TypeError, r"k: expected an integer, got float 2.5"),
    ]  # fmt: skip
    for call, error, match in bad:
        with pytest.raises(error, match=match):
            call()


def test_a_config_with_sizes_or_settings_out_of_range_is_refused_by_name():
    """Each built a model that gave NaN logits (eps <= 0 or NaN), a degenerate model (zero
    sizes) or raised deep inside (n_groups=0 divided by zero)."""
    bad = [
        (dict(eps=-1.0), ValueError, r"eps: expected a finite number > 0, got -1"),
        (dict(eps=float("nan")), ValueError, r"eps: expected a finite number > 0, got nan"),
        (dict(time_step_min=float("nan")), ValueError, r"time_step_min: expected a finite number"),
        (dict(hidden_size=0), ValueError, r"hidden_size: expected 1 <= hidden_size, got 0"),
        (dict(ssm_heads=0), ValueError, r"ssm_heads: expected 1 <= ssm_heads, got 0"),
        (dict(n_groups=0), ValueError, r"n_groups: expected 1 <= n_groups, got 0"),
        (dict(kv_heads=0), ValueError, r"kv_heads: expected 1 <= kv_heads, got 0"),
        (dict(head_dim=-4), ValueError, r"head_dim: expected 1 <= head_dim, got -4"),
        (dict(vocab_size=0), ValueError, r"vocab_size: expected 1 <= vocab_size, got 0"),
        (dict(d_state=2.5), TypeError, r"d_state: expected an integer, got float 2.5"),
        (dict(d_conv=True), TypeError, r"d_conv: expected an integer, got a boolean"),
        (dict(rope_theta=0.0), ValueError, r"rope_theta: expected a finite number > 0, got 0"),
        (dict(use_conv_bias="yes"), TypeError, r"use_conv_bias: expected True or False"),
        (dict(pattern=["M", "-"]), TypeError, r"pattern: expected a string"),
    ]
    for fields, error, match in bad:
        with pytest.raises(error, match=match):
            HybridConfig(**fields)


def test_the_forward_takes_any_integer_ids_and_names_other_input():
    """uint8 / int16 ids passed the id check, then failed in the embedding; a list or a cache
    given by name failed with AttributeErrors; an empty prompt without a cache in the conv."""
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        want = MODEL(ids, None)
        for dtype in (torch.uint8, torch.int16, torch.int32):
            assert torch.equal(MODEL(ids.to(dtype), None), want)
            cache, ref = (
                HybridCache(MODEL, 1, "replay"),
                HybridCache(MODEL, 1, "replay"),
            )
            assert torch.equal(MODEL(ids.to(dtype), cache), MODEL(ids, ref))
        assert MODEL(torch.zeros(1, 0, dtype=torch.long), None).shape == (
            1,
            0,
            MODEL.cfg.vocab_size,
        )
        with pytest.raises(
            TypeError,
            match=r"input_ids: expected token ids of shape \(batch, T\), got \[\[1, 2\]\]",
        ):
            MODEL([[1, 2]], None)
        with pytest.raises(
            TypeError,
            match=r"cache: expected a HybridCache \(replaylab.cache\) or None, got str 'replay'",
        ):
            MODEL(ids, "replay")


def test_drafters_check_their_settings_and_speculation_the_drafts():
    """max_ngram=0 repeated the last token; a text acceptance raised a bare TypeError; a
    drafter returning k + 1 ids failed in a reshape."""
    from replaylab.decoding import PromptLookupDrafter

    with pytest.raises(ValueError, match=r"max_ngram: expected 1 <= max_ngram, got 0"):
        PromptLookupDrafter(max_ngram=0)
    ref = torch.tensor([1, 2, 3, 4])
    with pytest.raises(TypeError, match=r"acceptance: expected a number, got str 'x'"):
        SyntheticDrafter(ref, "x")
    with pytest.raises(
        ValueError, match=r"acceptance: expected a finite number >= 0 and <= 1, got 1.5"
    ):
        SyntheticDrafter(ref, 1.5)
    with pytest.raises(TypeError, match=r"reference: expected an integer tensor of token ids"):
        SyntheticDrafter([1, 2, 3], 0.5)

    class TooMany:
        def propose(self, context, k, vocab):
            return torch.zeros(k + 1, dtype=torch.long)

    with pytest.raises(
        ValueError,
        match=r"drafter: propose\(context, k=2, vocab\) must return k token ids, got \(3,\)",
    ):
        speculative(MODEL, torch.tensor([[1, 2, 3]]), 4, TooMany(), k=2)


def test_a_cache_needs_a_model_and_a_position_is_one_integer():
    from replaylab.prefix import PrefixCache

    with pytest.raises(
        TypeError,
        match=r"model: expected a replaylab HybridLM \(or a model with a cache_spec, or a CacheSpec\), got NoneType",
    ):
        HybridCache(None)  # an AttributeError before
    with pytest.raises(
        TypeError, match=r"model: expected a replaylab HybridLM \(.*\), got NoneType"
    ):
        PrefixCache(None)
    cache = advanced("replay")
    before = held(cache)
    with pytest.raises(
        TypeError, match=r"position: expected an integer, got a tensor of shape \(1,\)"
    ):
        cache.truncate_to(torch.tensor([3]))  # taken as 3 before
    assert_same(held(cache), before)
    cache.truncate_to(torch.tensor(3))  # a 0-d tensor is one integer
    assert cache.position == 3
