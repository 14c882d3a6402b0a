"""The prefix cache (``replaylab.prefix``) and chunked prefill of the teaching cache.

Oracle: a cold run of the model on the whole token sequence (``model(ids, None)``). On CPU the
logits after a prefix hit equal it to fp32 rounding, not bitwise: the in_proj / attention
matmuls of a T-token chunk round differently from those of the whole sequence (measured: at most
~2e-7 on logits of size ~1, ~1e-10 on states). The tolerance below (1e-5) is 50x that and far
below what a wrong state, a misaligned checkpoint or a missing KV row gives (~1e-1).
"""

import pytest
import torch

from replaylab.cache import HybridCache
from replaylab.checks import assert_close
from replaylab.prefix import PrefixCache

STRATEGIES = ("replay", "snapshot", "recompute")
ATOL = 1e-5


@pytest.fixture(autouse=True)
def one_thread_no_grad():
    """One intra-op thread: on the shared 2-core CI machine two threads contend and a tiny
    conv1d takes 10x longer. No autograd graph either."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        yield
    torch.set_num_threads(threads)


def cold_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens]), None)[0]


def random_tokens(generator, n):
    return torch.randint(0, 50, (n,), generator=generator).tolist()


def request_stream(generator):
    """A shared system prompt with varied user turns, then a multi-turn chat whose every turn
    extends the previous conversation (prompt + the reply + a new user turn)."""
    system = random_tokens(generator, 29)
    stream = [system + random_tokens(generator, int(n)) for n in (3, 9, 1, 14)]
    chat = system + random_tokens(generator, 5)
    for n in (4, 11, 2):
        stream.append(list(chat))
        chat = chat + random_tokens(generator, n)
    stream.append(system[:13])  # shorter than the shared prefix: ends inside a block
    return stream


def tree_picture(prefix):
    return (
        sorted((prefix._prefix_of(n), n.nbytes, n.last_used) for n in prefix.nodes()),
        prefix.held_bytes,
        prefix.budget_bytes,
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_stream_logits_equal_cold_run(tiny_model, generator, strategy):
    prefix = PrefixCache(tiny_model, strategy, block_size=8, max_len=96, budget_bytes=None)
    prefix.set_budget(12 * prefix.block_bytes)
    reused = 0
    for tokens in request_stream(generator):
        served = prefix.serve(tokens)
        assert_close(served.logits, cold_logits(tiny_model, tokens)[-1], atol=ATOL, rtol=0)
        hit = served.hit
        assert hit.prompt_length == len(tokens)
        assert hit.resumed_from + hit.recomputed + hit.prefilled == len(tokens)
        assert hit.resumed_from <= hit.matched and hit.folded < prefix.block_size
        reused += hit.resumed_from
        assert prefix.held_bytes <= prefix.budget_bytes
        prefix.check_rebuildable()
    assert reused > 100  # the stream did hit


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_decoding_after_a_hit_gives_the_cold_greedy_tokens(tiny_model, generator, strategy):
    prefix = PrefixCache(tiny_model, strategy, block_size=4, max_len=64)
    system = random_tokens(generator, 19)
    prefix.serve(system + random_tokens(generator, 3))
    tokens = system + random_tokens(generator, 4)
    served = prefix.serve(tokens)
    assert served.hit.matched == 19
    cache, logits, seq = served.cache, served.logits, list(tokens)
    handle = cache.snapshot()
    with torch.no_grad():
        for _ in range(8):
            cold = cold_logits(tiny_model, seq)[-1]
            assert_close(logits, cold, atol=ATOL, rtol=0)
            nxt = int(cold.argmax())
            assert int(logits.argmax()) == nxt
            seq.append(nxt)
            logits = tiny_model(torch.tensor([[nxt]]), cache)[0, -1]
        # rollback on the served cache never touches the tree
        before = tree_picture(prefix)
        cache.restore(handle)
        again = tiny_model(torch.tensor([seq[len(tokens) : len(tokens) + 2]]), cache)[0, -1]
    assert_close(again, cold_logits(tiny_model, seq[: len(tokens) + 2])[-1], atol=ATOL, rtol=0)
    assert tree_picture(prefix) == before


def test_replay_resumes_between_grid_points_where_align_cannot(tiny_model, generator):
    shared = random_tokens(generator, 37)  # 4 blocks of 8 and 5 tokens into the fifth
    first, second = shared + [1, 2, 3], shared + [4, 5, 6]
    hits = {}
    for strategy in STRATEGIES:
        prefix = PrefixCache(tiny_model, strategy, block_size=8, max_len=64)
        prefix.serve(first)
        served = prefix.serve(second)
        assert_close(served.logits, cold_logits(tiny_model, second)[-1], atol=ATOL, rtol=0)
        hits[strategy] = served.hit
    assert hits["replay"].resumed_from == 37 and hits["replay"].folded == 5
    assert hits["replay"].prefilled == 3 and hits["replay"].limited_by == "unique tokens"
    for align in ("snapshot", "recompute"):
        assert hits[align].matched == 37 and hits[align].resumed_from == 32
        assert hits[align].limited_by == "not on the grid"
    assert hits["snapshot"].prefilled == 8
    assert hits["recompute"].recomputed == 5 and hits["recompute"].prefilled == 3


def test_a_prompt_the_tree_holds_whole_recomputes_only_its_last_token(tiny_model, generator):
    tokens = random_tokens(generator, 21)
    prefix = PrefixCache(tiny_model, "replay", block_size=8, max_len=64)
    prefix.serve(tokens)
    hit = prefix.serve(tokens).hit
    assert (hit.matched, hit.resumed_from, hit.folded, hit.prefilled) == (21, 20, 4, 1)
    assert hit.limited_by == "end of prompt"


@pytest.mark.parametrize("eviction", ("lru-fit", "lru", "cost"))
@pytest.mark.parametrize("strategy", ("replay", "recompute"))
def test_eviction_keeps_every_node_rebuildable(tiny_model, generator, strategy, eviction):
    prefix = PrefixCache(
        tiny_model,
        strategy,
        block_size=4,
        max_len=64,
        eviction=eviction,
        checkpoint_interval=8 if strategy == "recompute" else None,
    )
    prefix.set_budget(5 * prefix.block_bytes)
    first = random_tokens(generator, 22)
    prefix.serve(first)
    for _ in range(6):
        tokens = random_tokens(generator, 17)
        served = prefix.serve(tokens)
        assert_close(served.logits, cold_logits(tiny_model, tokens)[-1], atol=ATOL, rtol=0)
        assert prefix.held_bytes <= prefix.budget_bytes
        prefix.check_rebuildable()
    hit = prefix.serve(first).hit  # its deep blocks went; the report says so
    assert hit.matched < len(first) and hit.match_stop == "evicted"


def test_bad_inputs_are_refused_with_the_tree_unchanged(tiny_model, generator):
    with pytest.raises(ValueError, match=r"budget_bytes: expected at least one .* got 100"):
        PrefixCache(tiny_model, "replay", block_size=8, budget_bytes=100)
    with pytest.raises(ValueError, match=r"checkpoint_interval=12 serves .*\[1, 2, 3, 4, 6, 12\]"):
        PrefixCache(tiny_model, "recompute", block_size=8, checkpoint_interval=12)
    with pytest.raises(ValueError, match=r"1\.\.max_len=32; got 64"):
        PrefixCache(tiny_model, "snapshot", block_size=64, max_len=32)
    for zero in (0, 0.0, False):  # each became max_len without a word
        with pytest.raises((ValueError, TypeError), match=r"chunk_size: expected"):
            PrefixCache(tiny_model, "replay", block_size=8, chunk_size=zero)
    for interval in (-5, "x", 16):  # ignored under replay and snapshot before
        with pytest.raises(ValueError, match=r"checkpoint_interval: only the recompute strategy"):
            PrefixCache(tiny_model, "replay", block_size=8, checkpoint_interval=interval)
    prefix = PrefixCache(tiny_model, "replay", block_size=8, max_len=32)
    prefix.serve(random_tokens(generator, 20))
    before = tree_picture(prefix)
    with pytest.raises(ValueError, match=r"1\.\.max_len=32 tokens, got 33"):
        prefix.serve(random_tokens(generator, 33))
    with pytest.raises(ValueError, match=r"\[0, 50\), got 50"):
        prefix.serve([1, 2, 50])
    with pytest.raises(ValueError, match=r"budget_bytes: expected at least one .* got 10"):
        prefix.set_budget(10)
    with pytest.raises(TypeError, match="prompt"):
        prefix.serve(torch.ones(4))
    assert tree_picture(prefix) == before


def _prefill_in_chunks(model, strategy, ids, chunk):
    cache = HybridCache(model, 1, strategy, log_length=1000)
    with torch.no_grad():
        logits = torch.cat(
            [model(ids[:, s : s + chunk], cache) for s in range(0, ids.shape[1], chunk)], dim=1
        )
    return cache, logits


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_chunked_prefill_equals_one_shot(tiny_model, generator, strategy):
    """A prompt fed in chunks of 1, 3, 7 and 64 tokens gives the logits, every recurrent
    layer's state and conv window, and (replay) the logged scan inputs of a one-shot prefill,
    to fp32 rounding: not bitwise, since in_proj and attention are matmuls over a chunk and round
    differently for another T (about 2e-7 on logits, 1e-10 on states, measured). Bitwise: the
    same chunking repeated, and the prefix cache's grid checkpoints whatever its chunk size
    when chunks already break at the grid (chunk_size a multiple of block_size)."""
    ids = torch.randint(0, 50, (1, 70), generator=generator)
    one_cache, one_logits = _prefill_in_chunks(tiny_model, strategy, ids, 70)
    for chunk in (1, 3, 7, 64):
        cache, logits = _prefill_in_chunks(tiny_model, strategy, ids, chunk)
        assert_close(logits, one_logits, atol=ATOL, rtol=0, name=f"logits, chunk {chunk}")
        for layer in cache.spec.recurrent:
            got, want = cache.state(layer), one_cache.state(layer)
            assert_close(got.ssm, want.ssm, atol=1e-7, rtol=0, name=f"state, chunk {chunk}")
            assert_close(got.conv, want.conv, atol=1e-6, rtol=0, name=f"conv, chunk {chunk}")
            if strategy == "replay":
                assert cache.ssm.n[layer] == one_cache.ssm.n[layer] == 70
                for name, buf in cache.ssm.log[layer].items():
                    want_log = one_cache.ssm.log[layer][name][:, :70]
                    assert_close(buf[:, :70], want_log, atol=1e-6, rtol=0, name=name)
        again, again_logits = _prefill_in_chunks(tiny_model, strategy, ids, chunk)
        assert torch.equal(again_logits, logits)
    # the prefix cache keeps its checkpoints on the grid whatever the chunk size
    trees = {}
    for chunk in (3, 7, 8, 16):
        prefix = PrefixCache(tiny_model, strategy, block_size=8, max_len=96, chunk_size=chunk)
        served = prefix.serve(ids[0].tolist())
        assert_close(served.logits, one_logits[0, -1], atol=ATOL, rtol=0)
        prefix.check_rebuildable()
        trees[chunk] = {n.end: n.end_state for n in prefix.nodes() if n.end_state}
    assert sorted(trees[3]) == list(range(8, 70, 8))
    for chunk in (3, 7, 16):
        for end, state in trees[chunk].items():
            for layer, s in state.items():
                assert_close(s.ssm, trees[8][end][layer].ssm, atol=1e-7, rtol=0)
    for end, state in trees[16].items():  # chunks of 16 break at every grid point of 8
        for layer, s in state.items():
            assert torch.equal(s.ssm, trees[8][end][layer].ssm)


def test_prefix_bench_rows(tiny_model):
    from replaylab.bench.prefix import prefix_summary, run_prefix_bench

    result = run_prefix_bench(
        tiny_model, block_sizes=(64,), strategies=("replay", "snapshot"), log=lambda line: None
    )
    rows = {(r["workload"], r["strategy"]): r for r in result["rows"]}
    assert len(rows) == 8 and len(prefix_summary(result)) == 5
    for name in ("shared_system", "multi_turn", "few_shot", "shared_docs"):
        replay, align = rows[(name, "replay")], rows[(name, "snapshot")]
        assert replay["token_hit_rate"] == replay["ideal_hit_rate"] > 0.5
        assert align["token_hit_rate"] < replay["token_hit_rate"]
        assert align["computed_tokens"] > replay["computed_tokens"]


def test_the_committed_budget_sweep_and_its_table_in_prefix_md():
    """data/bench_prefix_cpu.json (default eviction, lru-fit) beside bench_prefix_lru_cpu.json
    (the same tree, LRU): PREFIX.md shows the first's table, replay hits at least align in
    every cell of it, and the LRU losses the prose quotes are the LRU run's."""
    import json
    from pathlib import Path

    from replaylab.bench.prefix import budget_markdown

    data = Path(__file__).resolve().parents[1] / "data"
    fit = json.loads((data / "bench_prefix_cpu.json").read_text())
    lru = json.loads((data / "bench_prefix_lru_cpu.json").read_text())
    assert (fit["eviction"], lru["eviction"]) == ("lru-fit", "lru")
    assert fit["commit"] == lru["commit"] and {"device", "versions", "date"} <= set(fit)
    assert "\n".join(budget_markdown(fit["budget_sweep"])) in (data / "PREFIX.md").read_text()

    def cells(sweep):
        return {(r["workload"], r["block_size"], r["strategy"], r["budget"]): r for r in sweep}

    got, old = cells(fit["budget_sweep"]), cells(lru["budget_sweep"])
    for (name, b, strategy, budget), row in got.items():
        if strategy == "replay":
            assert "skipped" not in row, (name, b, budget)
            assert row["token_hit_rate"] >= got[(name, b, "snapshot", budget)]["token_hit_rate"]
    assert "skipped" in old[("few_shot", 64, "replay", 50_000)]  # LRU refuses it
    assert old[("few_shot", 16, "replay", 100_000)]["token_hit_rate"] == 0.0227
    assert old[("shared_docs", 64, "replay", 100_000)]["token_hit_rate"] == 0


def test_replay_drops_inner_logs_first_and_then_resumes_on_the_grid(tiny_model, generator):
    first = random_tokens(generator, 37)
    prefix = PrefixCache(tiny_model, "replay", block_size=8, max_len=64)
    prefix.serve(first)
    leaves = {n.start for n in prefix.nodes() if not n.children}
    prefix.set_budget(prefix.held_bytes - 1)  # one log goes, no node
    prefix.check_rebuildable()
    bare = [n for n in prefix.nodes() if n.log is None]
    assert len(bare) == 1 and bare[0].children and len(list(prefix.nodes())) == 5
    assert {n.start for n in prefix.nodes() if not n.children} == leaves
    diverge = bare[0].start + 3
    second = first[:diverge] + [(first[diverge] + 1) % 50, 7, 7]
    served = prefix.serve(second)
    assert_close(served.logits, cold_logits(tiny_model, second)[-1], atol=ATOL, rtol=0)
    hit = served.hit
    assert (hit.matched, hit.resumed_from, hit.folded) == (diverge, bare[0].start, 0)
    assert hit.limited_by == "evicted"
