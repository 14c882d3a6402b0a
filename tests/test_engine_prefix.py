"""The serving engine's prefix cache (``replaylab.serving.prefix.EnginePrefixCache``) on CPU
(the reference path; the fused path and kernel logs under the interpreter), against cold runs: a twin ``DecodeEngine`` without a prefix cache that
admits every prompt from scratch and runs the same steps, and the model's own forward over the
whole sequence (``model(ids, None)``).

Tolerance: logits agree to ``TOL`` = 1e-5 absolute. A hit prefills from the resumed position,
a cold admit from 0 in chunks of ``prefill_chunk``: the chunks' matmuls (in_proj, attention)
and scans round differently for other chunk boundaries, and replay's seated checkpoint comes
from folding logged entries that a cold prefill computed in other chunks. Measured here: at
most ~1e-7 on logits of size ~0.1-1 (a few fp32 ulps); 1e-5 leaves a margin of ~100 and is far
below what a wrong state, a checkpoint off the decode grid, a missing log entry or KV row
gives. The models are ``sharp``: their recurrent mixers' input and output projections scaled
by 4, because in the plain tiny models the recurrent layers move the logits so little that
one token missing from a seated state shifts them by only ~5e-6 (under the tolerance); scaled,
that error is ~3e-4 while the rounding stays ~1e-7. Tokens are compared exactly (greedy after a hit equals greedy cold; the
tiny models have no near-ties on these prompts), and speculation after a hit equals the
engine's own greedy decoding bit for bit (the same arithmetic).
"""

import random

import pytest
import torch
from family_models import decode_after_admissions, tiny_family_model

from replaylab.checks import assert_close
from replaylab.decoding import SyntheticDrafter
from replaylab.prefix import _node_bytes
from replaylab.serving import DecodeEngine, EnginePrefixCache, Request, Scheduler
from replaylab.testing import tiny_hybrid

STRATEGIES = ("replay", "snapshot", "recompute")
TOL = 1e-5


def sharp(model):
    """``model`` with its recurrent mixers' in_proj (Gated DeltaNet: in_proj_qkv) and out_proj
    weights scaled by 4 (see the module docstring)."""
    with torch.no_grad():
        for i in model.cfg.recurrent_layers:
            for name, p in model.model.layers[i].mixer.named_parameters():
                if name in ("in_proj.weight", "in_proj_qkv.weight", "out_proj.weight"):
                    p.mul_(4.0)
    return model


MODEL = sharp(tiny_hybrid())


@pytest.fixture(autouse=True, scope="module")
def one_thread_no_grad():
    """One intra-op thread (a shared 2-core machine: two threads contend on tiny ops)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        yield
    torch.set_num_threads(threads)


def engines(strategy, model=MODEL, slots=2, max_len=96, L=4, **kw):
    """(an engine, its cold twin): the same configuration; prefill chunks of 16 tokens, so a
    cold admit's chunk boundaries differ from a hit's."""
    make = lambda: DecodeEngine(  # noqa: E731
        model, slots, max_len, strategy, log_length=L, max_verify=4, prefill_chunk=16, **kw
    )
    return make(), make()


def ids(rng, n, vocab=50):
    return [rng.randrange(vocab) for _ in range(n)]


def forward_logits(model, tokens):
    return model(torch.tensor([tokens]), None)[0, -1]


def tree_tensors(prefix):
    """Every tensor the tree holds, copied, keyed by (prefix tokens, what, layer, field)."""
    out = {}
    for node in prefix.nodes():
        key = prefix._prefix_of(node)
        for layer, (k, v) in node.kv.items():
            out[key, "k", layer] = k.clone()
            out[key, "v", layer] = v.clone()
        for layer, s in (node.end_state or {}).items():
            out[key, "state", layer] = s.ssm.clone()
            out[key, "conv", layer] = s.conv.clone()
        for layer, fields in (node.log or {}).items():
            for f, t in fields.items():
                out[key, f, layer] = t.clone()
    return out


def assert_same_tree(before, after):
    assert before.keys() == after.keys()
    for key, t in before.items():
        assert torch.equal(t, after[key]), key


def greedy_steps(engine, slot, logits, n):
    """n greedy tokens of ``slot`` after its admission logits; returns (tokens, logits)."""
    tokens, seen = [], []
    for _ in range(n):
        tokens.append(int(logits.argmax()))
        logits = engine.step(torch.tensor([[tokens[-1]]]), slots=[slot])[0, -1]
        seen.append(logits)
    return tokens, seen


def assert_decodes_like_cold(engine, slot, logits, cold, cslot, clogits, n):
    """n greedy steps of ``slot`` after a hit and of its cold twin ``cslot``: the same tokens,
    the same logits to TOL."""
    got, got_logits = greedy_steps(engine, slot, logits, n)
    want, want_logits = greedy_steps(cold, cslot, clogits, n)
    assert got == want
    for a, b in zip(got_logits, want_logits):
        assert_close(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_shared_system_prompt_hits_and_gives_the_cold_logits_and_tokens(strategy):
    """Varied suffixes after a 37-token system prompt (block 8, L 4): grid and off-grid hits,
    the whole prompt held, a suffix ending inside the system prompt."""
    rng = random.Random(0)
    system = ids(rng, 37)
    engine, cold = engines(strategy)
    prefix = EnginePrefixCache(engine, block_size=8)
    prompts = [
        system + ids(rng, 3),  # miss
        system + ids(rng, 9),  # hit at 37: off the grid
        system[:32] + ids(rng, 5),  # hit at 32: on the grid
        system,  # the whole prompt held: only its last token computed
        system[:13] + ids(rng, 2),  # ends inside the system prompt
    ]
    hits = []
    for tokens in prompts:
        slot, logits, hit = prefix.admit(tokens)
        cslot, clogits = cold.admit(torch.tensor(tokens))
        assert_close(logits, clogits, atol=TOL, rtol=0)
        assert_close(logits, forward_logits(MODEL, tokens), atol=TOL, rtol=0)
        assert_decodes_like_cold(engine, slot, logits, cold, cslot, clogits, 6)
        assert hit.resumed_from + hit.recomputed + hit.prefilled == len(tokens)
        hits.append(hit)
        engine.retire(slot)
        cold.retire(cslot)
        prefix.check_rebuildable()
    assert hits[0].matched == 0 and hits[0].limited_by == "unique tokens"
    resumed = [h.resumed_from for h in hits]
    if strategy == "replay":  # any held position
        assert resumed == [0, 37, 32, 36, 13]
        assert [h.folded for h in hits] == [0, 5, 0, 4, 5]
        assert hits[3].limited_by == "end of prompt"
    else:  # the last grid point: align
        assert resumed == [0, 32, 32, 32, 8]
        assert hits[1].limited_by == hits[4].limited_by == "not on the grid"
        assert hits[2].limited_by == "unique tokens"
    if strategy == "recompute":
        assert [h.recomputed for h in hits] == [0, 5, 0, 4, 5]
    assert prefix.block_bytes == _node_bytes(next(n for n in prefix.nodes() if n.end_state))


@pytest.mark.parametrize("block_size", (4, 12))
def test_replay_block_sizes_that_are_multiples_of_L(block_size):
    """b = L and b = 3L: the seated checkpoint is on the decode grid (a multiple of L) whatever
    b is; the slot folds on that grid afterwards, as a cold one does."""
    rng = random.Random(1)
    system = ids(rng, 30)
    engine, cold = engines("replay")
    prefix = EnginePrefixCache(engine, block_size=block_size)
    for first in (1, 2):  # the suffixes differ at their first token
        tokens = system + [first] + ids(rng, 5 * first)
        slot, logits, hit = prefix.admit(tokens)
        cslot, clogits = cold.admit(torch.tensor(tokens))
        assert_close(logits, clogits, atol=TOL, rtol=0)
        assert (engine.log_len[slot], engine.head[slot] == 0) == (cold.log_len[cslot], True)
        assert_decodes_like_cold(engine, slot, logits, cold, cslot, clogits, 9)  # past two folds
        engine.retire(slot)
        cold.retire(cslot)
    assert hit.resumed_from == 30 and hit.folded == 30 % block_size


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_prompts_shorter_than_a_block(strategy):
    """A first prompt shorter than a block is a miss ("unique tokens"); a second one sharing
    it hits under replay (its tail node's logged entries) and misses on the grid otherwise."""
    rng = random.Random(2)
    short = ids(rng, 6)
    engine, cold = engines(strategy)
    prefix = EnginePrefixCache(engine, block_size=8)
    slot, _, first = prefix.admit(short)
    engine.retire(slot)
    assert (first.matched, first.resumed_from, first.limited_by) == (0, 0, "unique tokens")
    tokens = short[:5] + [(short[5] + 1) % 50]
    slot, logits, hit = prefix.admit(tokens)
    assert_close(logits, cold.admit(torch.tensor(tokens))[1], atol=TOL, rtol=0)
    assert hit.matched == 5
    if strategy == "replay":
        assert (hit.resumed_from, hit.folded, hit.prefilled) == (5, 5, 1)
    else:
        assert (hit.resumed_from, hit.limited_by) == (0, "not on the grid")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_speculation_after_a_hit_gives_the_engines_own_greedy_tokens(strategy):
    rng = random.Random(3)
    system = ids(rng, 26)
    engine, cold = engines(strategy, slots=1)
    prefix = EnginePrefixCache(engine, block_size=8)
    slot, _, _ = prefix.admit(system + ids(rng, 4))
    engine.retire(slot)
    tokens = system + ids(rng, 3)
    slot, logits, hit = prefix.admit(tokens)
    assert hit.matched == 26
    greedy, _ = greedy_steps(engine, slot, logits, 14)
    cslot, clogits = cold.admit(torch.tensor(tokens))
    assert greedy == greedy_steps(cold, cslot, clogits, 14)[0]
    engine.retire(slot)
    before = tree_tensors(prefix)
    slot, logits, again = prefix.admit(tokens)  # the same hit, the same seat
    assert again.resumed_from == hit.resumed_from + (3 if strategy == "replay" else 0) or again
    after_admit = tree_tensors(prefix)
    pending = logits.argmax()[None, None]
    full = torch.tensor(tokens + greedy)
    out, proposed, accepted = engine.speculate_batch(
        [torch.tensor(tokens)], pending, 14, [SyntheticDrafter(full, 0.6, 1)], k=3, slots=[slot]
    )
    assert out[0].tolist() == greedy
    assert engine.stats.rollbacks > 0 and 0 < accepted[0] < proposed[0]
    assert_same_tree(after_admit, tree_tensors(prefix))  # verify and rollback: tree untouched
    assert set(before) <= set(after_admit)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_decode_rollback_and_retire_after_a_hit_never_change_the_tree(strategy):
    rng = random.Random(4)
    system = ids(rng, 21)
    engine, _ = engines(strategy)
    prefix = EnginePrefixCache(engine, block_size=4)
    prefix.admit(system + ids(rng, 2))
    slot, logits, hit = prefix.admit(system + ids(rng, 3))
    assert hit.matched == 21
    before = tree_tensors(prefix)
    for _ in range(3):
        room = engine.room(slot)
        engine.step(torch.tensor([ids(rng, room)]), slots=[slot])
        engine.rollback(1, slots=[slot])
        engine.step(torch.tensor([ids(rng, 1)]), slots=[slot])
    engine.retire(slot)
    other = engine.admit(torch.tensor(ids(rng, 30)))[0]  # the same slot, a new tenant
    engine.step(torch.tensor([ids(rng, 1)]), slots=[other])
    assert_same_tree(before, tree_tensors(prefix))


@pytest.mark.parametrize(
    ("strategy", "eviction"),
    [*((s, "lru") for s in STRATEGIES), ("replay", "logs-first"), ("replay", "lru-fit")],
)
def test_random_request_streams_equal_cold_runs(strategy, eviction):
    """A fuzz: admissions with shared prefixes (system prompts, multi-turn extensions,
    prefixes cut anywhere), ragged steps (speculation-sized, up to each slot's room),
    rollbacks and retirements, under a budget of a few blocks (evictions on the way): every
    logit of every request equals the cold twin's, the tree stays rebuildable and within
    budget, and the stream did hit."""
    rng = random.Random(10 + STRATEGIES.index(strategy))
    engine, cold = engines(strategy, slots=3, max_len=80)
    prefix = EnginePrefixCache(engine, block_size=8, budget_bytes=None, eviction=eviction)
    prefix.set_budget(14 * prefix.floor_bytes)
    systems = [ids(rng, n) for n in (23, 9, 40)]
    history = []  # earlier prompts, for multi-turn extensions
    seq = {}  # slot -> tokens held (for the model-forward oracle at the end)
    resumed = admitted = 0
    for _ in range(110):
        op = rng.choice(["admit", "admit", "step", "step", "step", "retire"])
        live = engine.slots
        if op == "admit" and len(live) < engine.max_batch:
            kind = rng.random()
            if kind < 0.5:
                base = rng.choice(systems)
            elif kind < 0.8 and history:
                base = rng.choice(history)
            else:
                base = []
            tokens = base[: rng.randint(0, len(base))] if rng.random() < 0.3 else list(base)
            tokens = (tokens + ids(rng, rng.randint(1, 12)))[:60]
            slot, logits, hit = prefix.admit(tokens)
            cslot, clogits = cold.admit(torch.tensor(tokens))
            assert slot == cslot
            assert_close(logits, clogits, atol=TOL, rtol=0, name=f"admit {hit}")
            seq[slot] = list(tokens)
            history.append(tokens)
            resumed, admitted = resumed + hit.resumed_from, admitted + 1
            assert prefix.held_bytes <= prefix.budget_bytes
        elif op == "step" and live:
            slots = sorted(rng.sample(live, rng.randint(1, len(live))))
            slots = [s for s in slots if engine.pos[s] + engine.max_verify <= engine.max_len]
            if not slots:
                continue
            T = rng.randint(1, engine.max_verify)
            counts = [min(T, engine.room(s), rng.randint(1, T)) for s in slots]
            tokens = torch.tensor([ids(rng, T) for _ in slots])
            got = engine.step(tokens, counts, slots=slots)
            want = cold.step(tokens, counts, slots=slots)
            for i, (s, c) in enumerate(zip(slots, counts)):
                assert_close(got[i, :c], want[i, :c], atol=TOL, rtol=0, name=f"slot {s}")
                seq[s] += tokens[i, :c].tolist()
            if rng.random() < 0.5:
                keep = [rng.randint(1, c) for c in counts]
                engine.rollback(keep, slots=slots)
                cold.rollback(keep, slots=slots)
                for s, c, k in zip(slots, counts, keep):
                    del seq[s][len(seq[s]) - (c - k) :]
        elif op == "retire" and live:
            s = rng.choice(live)
            engine.retire(s)
            cold.retire(s)
            del seq[s]
    prefix.check_rebuildable()
    assert admitted > 15 and resumed > 100
    assert prefix.evicted_prefixes  # the budget bound
    for s in engine.slots:  # the state each live slot ended in: its next token's logits
        nxt = [rng.randrange(50)]
        got = engine.step(torch.tensor([nxt]), slots=[s])[0, -1]
        assert_close(got, forward_logits(MODEL, seq[s] + nxt), atol=TOL, rtol=0)


@pytest.mark.parametrize("eviction", ("lru", "cost"))
def test_eviction_under_a_small_budget_keeps_every_node_rebuildable(eviction):
    rng = random.Random(5)
    engine, cold = engines("replay", slots=1)
    prefix = EnginePrefixCache(engine, block_size=4, eviction=eviction)
    prefix.set_budget(5 * prefix.block_bytes)
    first = ids(rng, 22)
    slot, _, _ = prefix.admit(first)
    engine.retire(slot)
    for _ in range(5):
        tokens = ids(rng, 17)
        slot, logits, _ = prefix.admit(tokens)
        assert_close(logits, cold.admit(torch.tensor(tokens))[1], atol=TOL, rtol=0)
        engine.retire(slot)
        cold.retire(0)
        assert prefix.held_bytes <= prefix.budget_bytes
        prefix.check_rebuildable()
    slot, logits, hit = prefix.admit(first)  # its deep blocks went; the report says so
    assert hit.matched < len(first) and hit.match_stop == "evicted"
    assert_close(logits, forward_logits(MODEL, first), atol=TOL, rtol=0)


@pytest.mark.parametrize("family", ("mamba1", "gdn"))
@pytest.mark.parametrize("strategy", ("replay", "snapshot"))
def test_other_families_hit_with_the_cold_logits(family, strategy):
    """Mamba-1 (Jamba-like) and Gated DeltaNet with gated RoPE attention (Qwen-like): a hit
    seats each layer through its spec (fold, conv window) alone."""
    model = sharp(tiny_family_model(family))
    rng = random.Random(6)
    system = ids(rng, 19)
    engine, cold = engines(strategy, model=model, slots=1, max_len=48)
    prefix = EnginePrefixCache(engine, block_size=8)
    slot, _, _ = prefix.admit(system + ids(rng, 3))
    engine.retire(slot)
    tokens = system + ids(rng, 4)
    slot, logits, hit = prefix.admit(tokens)
    assert hit.resumed_from == (19 if strategy == "replay" else 16)
    cslot, clogits = cold.admit(torch.tensor(tokens))
    assert_close(logits, clogits, atol=TOL, rtol=0)
    assert_decodes_like_cold(engine, slot, logits, cold, cslot, clogits, 6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_scheduler_admits_through_a_prefix_cache(strategy):
    """Continuous batching with speculation (half the requests carry a drafter): the same
    tokens with the prefix cache as without, and every later request hit the system prompt."""
    rng = random.Random(7)
    system = ids(rng, 24)
    prompts = [torch.tensor(system + ids(rng, n)) for n in (3, 5, 2, 7, 4)]
    out = {}
    for name in ("cold", "prefix"):
        engine = DecodeEngine(MODEL, 2, 64, strategy, log_length=4, max_verify=3)
        prefix = EnginePrefixCache(engine, block_size=8) if name == "prefix" else None
        sched = Scheduler(engine, budget_bytes=2**20, k=2, prefix=prefix)  # room for a tree
        requests = []
        for i, p in enumerate(prompts):
            full = torch.cat([p, torch.zeros(16, dtype=torch.long)])
            drafter = SyntheticDrafter(full, 0.5, i) if i % 2 else None
            requests.append(Request(i, p, 8, arrival=0.1 * i, drafter=drafter))
        done = sched.run(requests)
        out[name] = {r.id: (r.tokens, r.prefix_hit) for r in done}
    assert {i: t for i, (t, _) in out["prefix"].items()} == {
        i: t for i, (t, _) in out["cold"].items()
    }
    hits = [out["prefix"][i][1] for i in range(5)]
    assert hits[0].matched == 0 and all(h.matched >= 24 for h in hits[1:])
    assert all(h.resumed_from >= (24 if strategy == "replay" else 16) for h in hits[1:])
    assert all(h is None for _, h in out["cold"].values())
    with pytest.raises(ValueError, match="prefix: expected an EnginePrefixCache over this"):
        Scheduler(DecodeEngine(MODEL, 1, 64), prefix=prefix)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_chunked_admission_equals_a_whole_one(strategy):
    """``begin_admit`` + ``advance`` in chunks of random sizes: the hit report and the tree
    a whole ``admit`` gives, and the cold twin's logits (within TOL: other chunk boundaries)."""
    rng = random.Random(20 + STRATEGIES.index(strategy))
    system = ids(rng, 21)
    prompts = [system + ids(rng, n) for n in (5, 9, 3, 14)] + [system[:13] + ids(rng, 4)]
    whole, _ = engines(strategy)
    chunked, cold = engines(strategy)
    trees = [EnginePrefixCache(e, block_size=8) for e in (whole, chunked)]
    resumed = []
    for tokens in prompts:
        slot, logits, hit = trees[0].admit(tokens)
        resumed.append(hit.resumed_from)
        admission = trees[1].begin_admit(tokens)
        assert admission.slot == slot and admission.hit == hit
        while not admission.advance(rng.randint(1, 7)):
            pass
        cslot, clogits = cold.admit(torch.tensor(tokens))
        assert admission.inserted and cslot == slot
        assert_close(admission.logits, logits, atol=TOL, rtol=0, name=f"chunked {hit}")
        assert_close(admission.logits, clogits, atol=TOL, rtol=0, name=f"cold {hit}")
        for e in (whole, chunked, cold):
            e.retire(slot)
    assert trees[0].held_bytes == trees[1].held_bytes
    assert sorted(n.end for n in trees[0].nodes()) == sorted(n.end for n in trees[1].nodes())
    assert all(h > 0 for h in resumed[1:])  # every later prompt resumed inside the system one


def test_an_admission_whose_seat_is_evicted_meanwhile_inserts_nothing():
    """A prompt seated from a node that another admission's eviction removes before its last
    chunk: its logits are still the cold ones, and the tree learns nothing from it."""
    engine, cold = engines("replay", slots=2)
    prefix = EnginePrefixCache(engine, block_size=8)
    rng = random.Random(3)
    first = ids(rng, 19)
    slot, _, _ = prefix.admit(first)
    engine.retire(slot)
    admission = prefix.begin_admit(first[:17] + ids(rng, 6))
    assert admission.hit.resumed_from == 17
    prefix.set_budget(prefix.floor_bytes)  # evicts down to one block: the seat's path goes
    other = ids(rng, 9)
    slot2, _, _ = prefix.admit(other)
    while not admission.advance(5):
        pass
    assert not admission.inserted
    prefix.check_rebuildable()
    _, clogits = cold.admit(torch.tensor(first[:17] + admission.tokens[17:]))
    assert_close(admission.logits, clogits, atol=TOL, rtol=0, name="seated, then evicted")


def test_a_logs_first_seat_whose_log_goes_meanwhile_inserts_nothing():
    """Under ``eviction="logs-first"`` a seat that folded a block's logged entries (j > 0)
    loses that log to a budget cut between chunks: no insertion, the tree still rebuildable,
    the logits still the cold ones."""
    engine, cold = engines("replay", slots=2)
    prefix = EnginePrefixCache(engine, block_size=8, eviction="logs-first")
    rng = random.Random(5)
    first = ids(rng, 21)
    slot, _, _ = prefix.admit(first)
    engine.retire(slot)
    tokens = first[:19] + ids(rng, 5)
    admission = prefix.begin_admit(tokens)
    assert admission.plan.j > 0
    admission.advance(2)
    logs = sum(
        t.numel() * t.element_size()
        for n in prefix.nodes()
        for fields in (n.log or {}).values()
        for t in fields.values()
    )
    prefix.set_budget(prefix.held_bytes - logs)  # every log goes before any state
    assert all(n.log is None for n in prefix.nodes())
    while not admission.advance(2):
        pass
    assert not admission.inserted
    prefix.check_rebuildable()
    _, clogits = cold.admit(torch.tensor(tokens))
    assert_close(admission.logits, clogits, atol=TOL, rtol=0, name="folded seat, log dropped")


def test_an_aborted_admission_cannot_go_on_in_the_next_ones_slot():
    engine, _ = engines("replay", slots=1)
    prefix = EnginePrefixCache(engine, block_size=8)
    rng = random.Random(6)
    stale = prefix.begin_admit(ids(rng, 20))
    stale.advance(5)
    stale.abort()
    fresh = prefix.begin_admit(ids(rng, 12))
    assert fresh.slot == stale.slot
    with pytest.raises(ValueError, match="already aborted"):
        stale.advance(100)
    assert fresh.advance(100) and fresh.inserted


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_scheduler_interleaves_prefill_through_a_prefix_cache(strategy):
    """Interleaved chunked prefill (5 tokens an iteration) with a prefix cache: the tokens of
    a cold scheduler, and every request after the first resumed inside the system prompt."""
    rng = random.Random(11)
    system = ids(rng, 24)
    prompts = [torch.tensor(system + ids(rng, n)) for n in (3, 5, 2, 7)]
    out = {}
    for name in ("cold", "prefix"):
        engine = DecodeEngine(MODEL, 2, 64, strategy, log_length=4, max_verify=3)
        prefix = EnginePrefixCache(engine, block_size=8) if name == "prefix" else None
        sched = Scheduler(engine, budget_bytes=2**20, k=2, prefix=prefix, prefill_per_step=5)
        # the first request is done before the rest arrive (an idle clock jumps to the next
        # arrival), so their hits do not depend on how fast this machine runs
        arrivals = [0.0, 100.0, 100.01, 100.02]
        requests = [Request(i, p, 6, arrival=a) for i, (p, a) in enumerate(zip(prompts, arrivals))]
        done = sched.run(requests)
        out[name] = {r.id: (r.tokens, r.prefix_hit) for r in done}
    assert {i: t for i, (t, _) in out["prefix"].items()} == {
        i: t for i, (t, _) in out["cold"].items()
    }
    hits = [out["prefix"][i][1] for i in range(4)]
    assert hits[0].resumed_from == 0
    assert all(h.resumed_from >= (24 if strategy == "replay" else 16) for h in hits[1:])


@pytest.mark.parametrize("prefill_per_step", [None, 6])
def test_the_tree_lives_inside_the_schedulers_one_budget(prefill_per_step):
    """A budget that holds the running requests and about two replay blocks: after every
    iteration's admissions the tree holds at most what the requests leave, it was evicted
    on the way, later requests still hit, and the tokens are the cold scheduler's."""
    rng = random.Random(12)
    systems = [ids(rng, 20), ids(rng, 18)]
    prompts = [torch.tensor(systems[i % 2] + ids(rng, 3 + i)) for i in range(6)]
    out = {}
    for name in ("cold", "prefix"):
        engine = DecodeEngine(MODEL, 2, 64, "replay", log_length=4, max_verify=3)
        prefix = EnginePrefixCache(engine, block_size=8) if name == "prefix" else None
        budget = 2 * Scheduler(engine).sizes.slot + (2 * prefix.block_bytes if prefix else 0)
        sched = Scheduler(
            engine, budget_bytes=budget, prefix=prefix, prefill_per_step=prefill_per_step
        )
        done = sched.run([Request(i, p, 5, arrival=10.0 * i) for i, p in enumerate(prompts)])
        out[name] = {r.id: r.tokens for r in done}
        if prefix is not None:
            assert all(rec.used + rec.tree_bytes <= budget for rec in sched.history)
            assert prefix.evicted_prefixes and max(rec.tree_bytes for rec in sched.history) > 0
            assert sum(r.prefix_hit.resumed_from > 0 for r in done) >= 2
    assert out["prefix"] == out["cold"]


def test_fit_evicts_to_any_size_and_keeps_the_budget():
    engine, _ = engines("replay", slots=1)
    prefix = EnginePrefixCache(engine, block_size=8, budget_bytes=2**20)
    slot, _, _ = prefix.admit(ids(random.Random(1), 30))
    held = prefix.held_bytes
    assert held > 0 and prefix.fit(held) == held
    assert prefix.fit(prefix.block_bytes) <= prefix.block_bytes
    assert prefix.fit(0) == 0 and not list(prefix.nodes()) and prefix.budget_bytes == 2**20
    with pytest.raises(ValueError, match="nbytes"):
        prefix.fit(-1)


def test_bad_input_is_refused_with_the_tree_and_the_engine_unchanged():
    engine, _ = engines("replay", slots=1, max_len=64)
    with pytest.raises(ValueError, match=r"multiples of the engine's log_length L=4 .*4, 8, 12"):
        EnginePrefixCache(engine, block_size=6)
    with pytest.raises(ValueError, match=r"4, 8, 12, \.\.\., 60; got 64"):
        EnginePrefixCache(engine, block_size=64)
    snap, _ = engines("snapshot", slots=1, max_len=48)
    with pytest.raises(ValueError, match=r"1 \.\. max_len - 1 = 47: 1, 2, 3, \.\.\., 47; got 0"):
        EnginePrefixCache(snap, block_size=0)
    with pytest.raises(ValueError, match=r"budget_bytes: expected at least one replay block"):
        EnginePrefixCache(engine, block_size=8, budget_bytes=100)
    with pytest.raises(ValueError, match="eviction"):
        EnginePrefixCache(engine, block_size=8, eviction="fifo")
    gdn = DecodeEngine(tiny_family_model("gdn"), 1, 64, "replay", log_length=4, use_kernels=True)
    EnginePrefixCache(gdn, block_size=8)  # its kernel log (k, u, g) is derived from the inputs
    prefix = EnginePrefixCache(engine, block_size=8)
    rng = random.Random(8)
    slot, _, _ = prefix.admit(ids(rng, 20))
    engine.retire(slot)
    before, held = tree_tensors(prefix), prefix.held_bytes
    with pytest.raises(
        ValueError, match=r"expected 1\.\.63 tokens \(fewer than the engine's max_len=64\), got 64"
    ):
        prefix.admit(ids(rng, 64))
    with pytest.raises(ValueError, match=r"\[0, 50\), got 50"):
        prefix.admit([1, 2, 50])
    with pytest.raises(TypeError, match="prompt"):
        prefix.admit(torch.ones(4))
    with pytest.raises(ValueError, match="budget_bytes: expected at least one"):
        prefix.set_budget(10)
    slot, _, _ = prefix.admit(ids(rng, 5))
    with pytest.raises(ValueError, match="all max_batch=1 slots are in use"):
        prefix.admit(ids(rng, 5))
    assert engine.slots == [slot] and engine.pos[slot] == 5
    engine.retire(slot)
    assert set(before) <= set(tree_tensors(prefix)) and prefix.held_bytes > held
    for key, t in before.items():
        assert torch.equal(t, tree_tensors(prefix)[key])


def test_engine_prefix_bench_rows():
    from replaylab.bench.prefix import engine_prefix_summary, run_engine_prefix_bench

    result = run_engine_prefix_bench(
        tiny_hybrid(),
        block_sizes=(64,),
        strategies=("replay", "snapshot"),
        workloads=("multi_turn",),
        log=lambda line: None,
    )
    replay, align = result["engine_rows"]
    assert replay["token_hit_rate"] == replay["ideal_hit_rate"] > 0.5
    assert align["token_hit_rate"] < replay["token_hit_rate"]
    assert replay["computed_tokens"] < align["computed_tokens"] < align["cold_computed_tokens"]
    assert max(replay["max_logit_diff_vs_cold"], align["max_logit_diff_vs_cold"]) < TOL
    assert len(engine_prefix_summary(result)) == 3


def test_the_committed_engine_prefix_result():
    """data/bench_prefix_engine_cpu.json (data/README.md quotes it): provenance, replay at the
    attention-only ideal in every row, align below it at large blocks, every admission within
    the tolerance of its cold admit."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "bench_prefix_engine_cpu.json"
    result = json.loads(path.read_text())
    assert {"device", "versions", "date", "command"} <= set(result)
    rows = result["engine_rows"]
    assert len(rows) == 4 * 3 * 3
    for r in rows:
        assert r["max_logit_diff_vs_cold"] < TOL
        assert r["computed_tokens"] <= r["cold_computed_tokens"]
        if r["strategy"] == "replay":
            assert r["token_hit_rate"] == r["ideal_hit_rate"]
        elif r["block_size"] == 256:
            assert r["token_hit_rate"] < r["ideal_hit_rate"]


KERNEL_LOGS = pytest.mark.parametrize(
    "family, kw",
    [
        ("mamba2", dict(fused=True, use_kernels=True)),
        ("mamba1", dict(use_kernels=True)),
        ("gdn", dict(use_kernels=True)),
    ],
    ids=["fused", "mamba1-kernels", "gdn-kernels"],
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU models under the Triton interpreter; "
                    "on a GPU the graphed test below serves both engines")  # fmt: skip
@KERNEL_LOGS
def test_a_kernel_log_without_conv_inputs_seats_hits_off_the_grid(family, kw):
    """Replay engines whose log keeps the kernels' fields (the fused path's x, dt, B, C;
    Jamba's x, dt, B; Gated DeltaNet's k, u, g, u its own values): the nodes keep the layer's
    inputs (conv inputs, and Mamba-2's dt, GDN's a and b), from which a seat derives the log's
    fields (GDN's u by the prefill's scan from the block's state), so hits off the grid give the
    cold twin's logits and greedy tokens, and speculation after a hit its own greedy."""
    model = MODEL if family == "mamba2" else sharp(tiny_family_model(family))
    engine, cold = engines("replay", model=model, graphs=False, **kw)
    for pool in engine.ssm.values():
        assert pool.spec.conv_field not in pool.log and pool.seats_from_log
    prefix = EnginePrefixCache(engine, block_size=8)
    rng = random.Random(4)
    system = ids(rng, 29)
    for extra in (3, 7, 2):
        tokens = system + ids(rng, extra)
        slot, logits, hit = prefix.admit(tokens)
        cslot, clogits = cold.admit(torch.tensor(tokens))
        assert_close(logits, clogits, atol=TOL, rtol=0)
        assert_close(logits, forward_logits(model, tokens), atol=TOL, rtol=0)
        assert_decodes_like_cold(engine, slot, logits, cold, cslot, clogits, 5)
        engine.retire(slot)
        cold.retire(cslot)
    assert (hit.matched, hit.resumed_from, hit.folded) == (29, 29, 5)  # off the grid of 8 and 4
    node = next(n for n in prefix.nodes() if n.log)
    for layer, pool in engine.ssm.items():
        assert set(node.log[layer]) == set(pool.spec.input_fields) == set(pool.node_fields)
        assert pool.spec.conv_field in pool.spec.input_fields
    full = next(n for n in prefix.nodes() if n.end_state and len(n.tokens) == 8)
    assert prefix.block_bytes == _node_bytes(full)  # what the nodes keep, counted


@pytest.mark.gpu
@KERNEL_LOGS
def test_a_prefix_cache_seats_a_graphed_kernel_engine_as_an_ungraphed_one(family, kw):
    """The fused path, and Jamba's kernels, under CUDA graphs with a prefix cache (a miss,
    then two hits off the grid), then decode steps of the three slots together: the logits
    of the same engine without graphs, bit for bit (seating writes the pools the captured
    steps read)."""
    import copy

    model = copy.deepcopy(MODEL if family == "mamba2" else sharp(tiny_family_model("mamba1")))
    model = model.cuda()
    cold = DecodeEngine(model, 3, 64, "replay", log_length=4, max_verify=3, graphs=False, **kw)
    rng = random.Random(6)
    system = ids(rng, 29)
    prompts = [system + ids(rng, n) for n in (3, 7, 2)]
    seen = []
    for graphs in (False, True):
        engine = DecodeEngine(model, 3, 64, "replay", log_length=4, max_verify=3, graphs=graphs,
                              **kw)  # fmt: skip
        prefix, logits = EnginePrefixCache(engine, block_size=8), []
        for p in prompts:
            slot, out, hit = prefix.admit(p)
            logits.append(out)
            if not graphs:  # against a cold admission (other chunks: to rounding)
                want = cold.admit(torch.tensor(p, device="cuda"))[1]
                assert_close(out, want, atol=2e-5, rtol=0)
        assert hit.resumed_from == 29  # off the grid
        seen.append(decode_after_admissions(engine, logits, 6))
        assert engine.stats.graph_replays == (6 if graphs else 0)
    for a, b in zip(*seen):
        assert torch.equal(a, b)


# CPU models under the Triton interpreter: on a GPU machine Triton refuses CPU tensors, and the
# bf16 GPU test below serves the fused path
ON_CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU models under the Triton interpreter; on a GPU the "
    "bf16 test below serves the fused path"
)  # fmt: skip
RESUME_CHUNK_PATHS = pytest.mark.parametrize(
    "family, kw",
    [
        ("mamba2", {}),
        pytest.param("mamba2", dict(fused=True, use_kernels=True), marks=ON_CPU_ONLY),
        pytest.param("mamba1", dict(use_kernels=True), marks=ON_CPU_ONLY),
        pytest.param("gdn", dict(use_kernels=True), marks=ON_CPU_ONLY),
    ],
    ids=["reference", "fused", "mamba1-kernels", "gdn-kernels"],
)


@RESUME_CHUNK_PATHS
def test_resume_chunk_gives_replays_hits_the_cold_prefills_logits_bit_for_bit(family, kw):
    """Under ``resume="chunk"`` a replay hit resumes on the prefill's chunk grid (16 here) and
    scans the block's entries a chunk at a time, as a cold prefill does: its logits, and its
    greedy tokens after, equal a cold admit's bit for bit (the same arithmetic); under
    ``resume="match"`` (folded onto the decode grid, other chunk boundaries after) within TOL.
    The hit report says where each resumed."""
    model = MODEL if family == "mamba2" else sharp(tiny_family_model(family))
    rng = random.Random(11)
    system = ids(rng, 57)  # block 64: the match (57) ends past the chunk grid (48, 3 chunks)
    prompts = [system + ids(rng, n) for n in (6, 3)]
    cold = DecodeEngine(model, 2, 96, "replay", log_length=4, max_verify=4, prefill_chunk=16,
                        **kw)  # fmt: skip
    cold_logits = []
    for p in prompts:
        slot, logits = cold.admit(torch.tensor(p))
        cold_logits.append((slot, logits))
    seen, engines_by = {}, {}
    for resume in ("match", "chunk"):
        engine = engines_by[resume] = DecodeEngine(model, 3, 96, "replay", log_length=4,
                                                   max_verify=4, prefill_chunk=16, **kw)  # fmt: skip
        prefix = EnginePrefixCache(engine, block_size=64, resume=resume)
        slot, _, _ = prefix.admit(system)
        engine.retire(slot)
        got = [prefix.admit(p) for p in prompts]
        seen[resume] = got
        for (_, logits, hit), (_, clogits) in zip(got, cold_logits):
            assert hit.matched == 57
            if resume == "chunk":
                assert (hit.resumed_from, hit.folded, hit.limited_by) == (48, 48, "not on the grid")
                assert torch.equal(logits, clogits)
            else:
                assert (hit.resumed_from, hit.folded) == (57, 57)
                assert_close(logits, clogits, atol=TOL, rtol=0)
    # greedy decode after the chunk-resumed hits equals the cold twin's, bit for bit
    chunk_engine = engines_by["chunk"]
    for (slot, logits, _), (cslot, clogits) in zip(seen["chunk"], cold_logits):
        tok, ctok = int(logits.argmax()), int(clogits.argmax())
        for _ in range(6):
            a = chunk_engine.step(torch.tensor([[tok]]), slots=[slot])[0, -1]
            b = cold.step(torch.tensor([[ctok]]), slots=[cslot])[0, -1]
            assert torch.equal(a, b)
            tok, ctok = int(a.argmax()), int(b.argmax())


def test_resume_chunk_is_refused_off_the_chunk_grid_and_for_a_bad_name(monkeypatch):
    engine = DecodeEngine(MODEL, 2, 96, "replay", log_length=4, max_verify=4, prefill_chunk=16)
    with pytest.raises(ValueError, match="block_size=24 must be a multiple of the engine's "
                       "prefill_chunk=16"):  # fmt: skip
        EnginePrefixCache(engine, block_size=24, resume="chunk")
    odd = DecodeEngine(MODEL, 2, 96, "replay", log_length=4, max_verify=4, prefill_chunk=6)
    with pytest.raises(
        ValueError, match="prefill_chunk=6 must be a multiple of its log_length L=4"
    ):
        EnginePrefixCache(odd, block_size=12, resume="chunk")
    with pytest.raises(ValueError, match="resume: expected 'match' or 'chunk', got 'near'"):
        EnginePrefixCache(engine, block_size=32, resume="near")
    layer, pool = next(iter(engine.ssm.items()))
    with monkeypatch.context() as m:  # a spec naming no input fields: nothing to rescan from
        m.setattr(type(pool.spec), "input_fields", None)
        with pytest.raises(ValueError, match=rf"layer {layer}'s spec \(mamba2\) names no input"):
            EnginePrefixCache(engine, block_size=32, resume="chunk")
    assert EnginePrefixCache(engine, block_size=32, resume="chunk").resume_step == 16


@pytest.mark.gpu
def test_on_a_gpu_resume_chunk_hits_equal_cold_admits_in_bf16_where_match_hits_need_not():
    """On a GPU in bf16 (the fused path, its prompt kernels, CUDA graphs), a replay hit under
    ``resume="chunk"`` gives the cold admit's logits bit for bit, and decodes as it does; under
    ``resume="match"`` the same hits are another arithmetic, compared only to a float64
    forward's error bound."""
    import copy

    model = copy.deepcopy(MODEL).to("cuda", torch.bfloat16)
    reference = copy.deepcopy(MODEL).double()
    rng = random.Random(12)
    system = ids(rng, 57)
    prompts = [system + ids(rng, n) for n in (6, 3, 11)]
    make = lambda: DecodeEngine(model, 4, 96, "replay", log_length=4, max_verify=4,  # noqa: E731
                                prefill_chunk=16, prefill_kernels=True)  # fmt: skip
    cold = make()
    cold_out = [cold.admit(torch.tensor(p, device="cuda")) for p in prompts]
    for resume in ("match", "chunk"):
        engine = make()
        prefix = EnginePrefixCache(engine, block_size=32, resume=resume)
        engine.retire(prefix.admit(system)[0])
        for p, (cslot, clogits) in zip(prompts, cold_out):
            slot, logits, hit = prefix.admit(p)
            exact = forward_logits(reference, p)
            bound = 4 * float((clogits.double().cpu() - exact).abs().max()) + 1e-2
            assert float((logits.double().cpu() - exact).abs().max()) <= bound
            if resume == "chunk":
                assert hit.resumed_from == 48 and torch.equal(logits, clogits)
                tok = int(logits.argmax())
                for _ in range(4):
                    a = engine.step(torch.tensor([[tok]], device="cuda"), slots=[slot])[0, -1]
                    b = cold.step(torch.tensor([[tok]], device="cuda"), slots=[cslot])[0, -1]
                    assert torch.equal(a, b)
                    tok = int(a.argmax())
            engine.retire(slot)


@ON_CPU_ONLY
def test_resume_chunk_serves_interleaved_admissions_and_falls_back_to_the_grid_when_evicted():
    """The fused path under ``resume="chunk"``: a prompt admitted a chunk (16) at a time through
    ``begin_admit`` seats from the chunk grid and ends with the cold logits bit for bit, and
    its blocks go into the tree, from which the next hit resumes bit for bit too; with the
    block's log evicted a hit resumes on the block grid ("evicted"). A scheduler that would
    prefill the tree's blocks off the chunk grid (fewer than 16 tokens a step) is refused."""
    kw = dict(log_length=4, max_verify=4, prefill_chunk=16, fused=True, use_kernels=True)
    cold = DecodeEngine(MODEL, 3, 128, "replay", **kw)
    engine = DecodeEngine(MODEL, 3, 128, "replay", **kw)
    prefix = EnginePrefixCache(engine, block_size=32, resume="chunk")
    rng = random.Random(13)
    system = ids(rng, 41)
    first = system + ids(rng, 30)
    second = first[:50] + ids(rng, 9)  # matches 50 of the blocks the first one inserts
    engine.retire(prefix.admit(system)[0])
    for p, resumed in ((first, 32), (second, 48)):
        adm = prefix.begin_admit(p)
        assert adm.hit.resumed_from == resumed
        while not adm.advance(16):
            pass
        assert torch.equal(adm.logits, cold.admit(torch.tensor(p))[1])
        engine.retire(adm.slot)
    assert max(len(n.tokens) + n.start for n in prefix.nodes()) == len(first)
    for node in prefix.nodes():  # every block's log gone: hits resume on the block grid
        node.log = None
    slot, logits, hit = prefix.admit(second)
    assert (hit.resumed_from, hit.limited_by) == (32, "evicted")
    assert torch.equal(logits, cold.admit(torch.tensor(second))[1])
    engine.retire(slot)
    with pytest.raises(ValueError, match="prefill_per_step: a prefix cache under resume='chunk'"):
        Scheduler(engine, prefix=prefix, prefill_per_step=8)
    adm = prefix.begin_admit(first)  # seated at 64 (71 tokens); a chunk may not end at 68
    with pytest.raises(ValueError, match=r"n: under resume='chunk' a chunk ends on a multiple .* "
                       r"prefill_chunk=16 or at the prompt's end \(71\); 4 tokens from 64 end "
                       r"at 68"):  # fmt: skip
        adm.advance(4)
    assert adm.done == 64 and not adm.finished
    assert adm.advance(16) is True  # to the prompt's end


@pytest.mark.parametrize("parts", [57, 56, 32])
@pytest.mark.parametrize("resume", ["match", "chunk"])
@RESUME_CHUNK_PATHS
def test_a_hits_seat_reads_the_tree_and_never_writes_it(family, kw, resume, parts):
    """The seat hands the tree's own tensors (no copies) to the strategy's seat and the pools:
    every tensor the tree held before a hit holds the same values after it. The prompt parts
    in the second block off the fold grid (57: the seat starts from the first block's end
    state), on it (56), and at the block's edge (32: the prefill's scan starts from the tree's
    end state itself)."""
    model = MODEL if family == "mamba2" else sharp(tiny_family_model(family))
    rng = random.Random(12)
    system = ids(rng, 70)  # two full blocks of 32 and a tail
    engine = DecodeEngine(model, 3, 96, "replay", log_length=4, max_verify=4, prefill_chunk=16,
                          **kw)  # fmt: skip
    prefix = EnginePrefixCache(engine, block_size=32, resume=resume)
    engine.retire(prefix.admit(system)[0])
    before = tree_tensors(prefix)
    tokens = system[:parts] + [(system[parts] + 1) % 50] + ids(rng, 4)
    hit = prefix.admit(tokens)[2]
    assert hit.matched == parts
    assert hit.resumed_from == (parts // 16 * 16 if resume == "chunk" else parts)
    after = tree_tensors(prefix)
    assert before.keys() <= after.keys()
    assert_same_tree(before, {key: after[key] for key in before})


@pytest.mark.parametrize("strategy", ["snapshot", "recompute"])
def test_align_seats_read_the_tree_and_never_write_it(strategy):
    rng = random.Random(13)
    system = ids(rng, 44)
    engine, _ = engines(strategy)
    prefix = EnginePrefixCache(engine, block_size=8)
    engine.retire(prefix.admit(system)[0])
    before = tree_tensors(prefix)
    hit = prefix.admit(system[:43] + [(system[43] + 1) % 50, 7])[2]
    assert hit.resumed_from == 40
    assert_same_tree(before, {key: tree_tensors(prefix)[key] for key in before})
