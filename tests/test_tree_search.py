"""Best-first tree search (``decoding.best_first_search``): the same tokens as a brute-force
search that re-runs every node from scratch, the same under every strategy, and each
strategy's restores cost what its store says they should."""

import heapq

import pytest
import torch

from replaylab.cache import CacheConfig, HybridCache
from replaylab.decoding import best_first_search
from replaylab.strategies import STRATEGY_NAMES
from replaylab.testing import tiny_hybrid

MODEL = tiny_hybrid()


def prompt_of(length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, MODEL.cfg.vocab_size, (1, length), generator=g)


@torch.no_grad()
def brute_force(model, prompt, n_new, branch, frontier):
    """The oracle: the same search rules, every node's next-token distribution from a fresh
    cache fed the prompt and the node's tokens in one forward (no snapshot, no restore)."""
    heap, pushed, node, score, expanded = [], 0, (), 0.0, []
    while True:
        tokens = torch.cat([prompt, torch.tensor([node], dtype=torch.long)], 1)
        logits = model(tokens, HybridCache(model, 1, "snapshot"))[0, -1]
        logp = torch.log_softmax(logits.float(), -1)
        lps, toks = logp.topk(branch)
        for lp, tok in zip(lps.tolist(), toks.tolist()):
            heapq.heappush(heap, (-(score + lp), pushed, node + (tok,)))
            pushed += 1
        heap = heapq.nsmallest(frontier, heap)
        heapq.heapify(heap)
        neg, _, node = heapq.heappop(heap)
        score = -neg
        if len(node) == n_new:
            return list(node), score, expanded
        expanded.append(node)


@pytest.mark.parametrize(
    "seed, n_new, branch, frontier", [(0, 5, 3, 6), (1, 6, 2, 4), (2, 4, 4, 8)]
)
def test_same_tokens_as_a_search_rerun_from_scratch(seed, n_new, branch, frontier):
    prompt = prompt_of(7, seed)
    tokens, score, expanded = brute_force(MODEL, prompt, n_new, branch, frontier)
    assert len(expanded) > n_new  # it explored side branches, not one greedy path
    for strategy in STRATEGY_NAMES:
        run = best_first_search(MODEL, prompt, n_new, branch, frontier, cache=strategy)
        assert run.tokens.tolist() == [tokens], strategy
        assert run.extra["score"] == pytest.approx(score, abs=1e-4), strategy
        assert [t["node"] for t in run.extra["trace"]] == expanded, strategy


def test_restores_go_backwards_and_cost_what_each_store_keeps():
    # prompt 16 = the recompute checkpoint and the replay fold point (interval = L = 16), and
    # every node lies within 16 tokens of it: recompute re-runs p - 16 per restore to p,
    # replay never re-runs, snapshot never re-runs and holds a copy per live handle
    prompt, n_new = prompt_of(16, 3), 6
    config = CacheConfig(checkpoint_interval=16, log_length=16)
    runs = {
        s: best_first_search(MODEL, prompt, n_new, 3, 6, cache=config.replace(strategy=s))
        for s in STRATEGY_NAMES
    }
    trace = runs["replay"].extra["trace"]
    for s, run in runs.items():
        assert run.extra["trace"] == trace, s
        assert run.tokens.tolist() == runs["replay"].tokens.tolist()
    restored = [t["restored_to"] for t in trace if t["restored_to"] is not None]
    backwards = [
        t for t in trace if t["restored_to"] is not None and t["restored_to"] < t["before"]
    ]
    assert len(backwards) >= 3 and len(backwards) == runs["replay"].extra["backward_restores"]
    # the cache counts one restore per restore the search asked for, under every strategy
    assert all(run.restores == len(restored) for run in runs.values())
    # tokens fed: from each restored handle (or the current node) to the expanded node
    for t in trace:
        start = t["restored_to"] if t["restored_to"] is not None else t["before"]
        assert t["fed"] == 16 + len(t["node"]) - start
    assert runs["recompute"].recomputed_tokens == sum(p - 16 for p in restored) > 0
    assert runs["snapshot"].recomputed_tokens == 0 and runs["replay"].recomputed_tokens == 0
    assert runs["replay"].stats.fallback_restores == 0
    # snapshot: a copy per node on the cache's path (root included) at the deepest expansion
    copy = sum(
        spec.zero_state(1, torch.float32, "cpu").nbytes()
        for spec in MODEL.cache_spec().recurrent.values()
    )
    deepest = max(len(t["node"]) for t in trace)
    assert runs["snapshot"].stats.peak_by_component["snapshots"] == (deepest + 1) * copy


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="one sequence"):
        best_first_search(MODEL, prompt_of(4, 0).repeat(2, 1), 3)
    with pytest.raises(ValueError, match="frontier"):
        best_first_search(MODEL, prompt_of(4, 0), 3, frontier=0)
