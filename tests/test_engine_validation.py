"""Bad input to the serving engine, its scheduler and both prefix caches (issue 34): each call
is checked before anything changes, so a refused call leaves every pool tensor and host number
bitwise as it was and the next call behaves as if it never happened; the error names the
argument, what was given and what is allowed. Ids of every integer dtype and numpy integer
scalars are accepted where ids and ints go; speculation near max_len verifies fewer drafts
instead of failing part-way.

Oracle: a fresh teaching-cache prefill of the slot's whole sequence (``prefill_logits``), to
2e-4 as in ``test_engine``."""

import dataclasses
import random

import numpy as np
import pytest
import torch
from test_engine_prefix import one_thread_no_grad  # noqa: F401 (autouse: one thread, no grad)
from test_scheduler import _state as scheduler_state

from replaylab.cache import CacheConfig
from replaylab.decoding import SyntheticDrafter
from replaylab.model import HybridLM, preset
from replaylab.prefix import PrefixCache
from replaylab.serving import DecodeEngine, EnginePrefixCache, Request, Scheduler

MODEL = HybridLM(preset("tiny"), seed=0).eval()
VOCAB = MODEL.cfg.vocab_size
STRATEGIES = ("snapshot", "recompute", "replay")
TOL = 2e-4


@torch.no_grad()
def prefill_logits(tokens, strategy="replay", model=MODEL):
    """Logits (T, vocab) of a fresh teaching cache's prefill of ``tokens`` (a list)."""
    cache = CacheConfig(strategy, log_length=4).build(model, 1)
    return model(torch.tensor([tokens]), cache)[0]


def assert_rows(got, tokens, strategy="replay", model=MODEL):
    """``got`` (n, vocab): the logits of the last n positions of ``tokens``."""
    want = prefill_logits(tokens, strategy, model)[-got.shape[0] :]
    torch.testing.assert_close(got.float().cpu(), want.float(), atol=TOL, rtol=TOL)


def engine_state(engine):
    """Every pool tensor (states, windows, draft and saved copies, logs, KV, the step's device
    numbers), cloned, and every host number of ``engine``."""
    out = {
        "host": (
            list(engine.live),
            sorted(engine.prefilling),
            list(engine.pos),
            list(engine.log_len),
            list(engine.head),
            list(engine.last),
            dataclasses.asdict(engine.stats),
        ),
        "meta": engine._meta.clone(),
        "dev_pos": engine._pos.clone(),
        "last_tokens": engine._last_tokens.clone(),
    }
    for l, p in engine.ssm.items():
        for i, t in enumerate(p._held()):
            out[f"ssm{l}.{i}"] = t.clone()
    for l, p in engine.kv.items():
        out[f"k{l}"], out[f"v{l}"] = p.k.clone(), p.v.clone()
    return out


def tree_state(tree):
    """What a prefix tree holds: every node's tokens, tensors and LRU stamp, its bytes."""
    nodes = []
    for node in tree.nodes():
        tensors = [t for kv in node.kv.values() for t in kv]
        tensors += [x for s in (node.end_state or {}).values() for x in (s.ssm, s.conv)]
        tensors += [t for f in (node.log or {}).values() for t in f.values()]
        nodes.append((tree._prefix_of(node), node.last_used, [t.clone() for t in tensors]))
    return {"nodes": nodes, "bytes": tree.held_bytes, "evicted": list(tree.evicted_prefixes)}


def assert_same(before, after, what=""):
    """Bitwise equality of two ``engine_state`` / ``tree_state`` values."""
    if isinstance(before, torch.Tensor):
        assert before.dtype == after.dtype and torch.equal(before, after), what
    elif isinstance(before, dict):
        assert before.keys() == after.keys(), what
        for k in before:
            assert_same(before[k], after[k], f"{what}/{k}")
    elif isinstance(before, (list, tuple)):
        assert len(before) == len(after), what
        for i, (b, a) in enumerate(zip(before, after)):
            assert_same(b, a, f"{what}[{i}]")
    else:
        assert before == after, what


def refused(engine, call, error, match, tree=None):
    """``call()`` raises ``error`` matching ``match`` and leaves ``engine`` (and ``tree``)
    bitwise as they were."""
    before = engine_state(engine), tree_state(tree) if tree is not None else None
    with pytest.raises(error, match=match):
        call()
    assert_same(before, (engine_state(engine), tree_state(tree) if tree is not None else None))


class FixedDrafter:
    """Proposes ``ids`` (whatever they are) every round."""

    def __init__(self, ids):
        self.ids = ids

    def propose(self, context, k, vocab):
        return self.ids


def issue_engine(strategy):
    """The issue's engine with its two sequences (replay: L = 8, so slot 0's 3-token step fits
    before its fold)."""
    L = 8 if strategy == "replay" else 4
    eng = DecodeEngine(MODEL, 2, 32, strategy, log_length=L, max_verify=3)
    eng.admit(torch.tensor([5, 6, 7]))
    eng.admit(torch.tensor([9, 10]))
    return eng


def zeros_drafter():
    return SyntheticDrafter(torch.zeros(20, dtype=torch.long), 1.0)


# --- 1. speculate_batch checks pending and the drafts before its step -------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_issue_reproduction_is_refused_and_the_rollback_is_right(strategy):
    """Issue 34's reproduction: an id >= vocab in ``pending`` is refused with a ValueError
    naming it before the step (under recompute it used to overwrite every slot's saved
    state), and slot 0's rollback of its own step then gives the prefill's logits."""
    eng = issue_engine(strategy)
    eng.step(torch.tensor([[11, 12, 13]]), counts=[3], slots=[0])
    refused(
        eng,
        lambda: eng.speculate_batch(
            [torch.tensor([9, 10])], torch.tensor([[128]]), 3, [zeros_drafter()], k=2, slots=[1]
        ),
        ValueError,
        r"pending: token id 128 at row 0 is outside the vocabulary \[0, 128\)",
    )
    eng.rollback([1], slots=[0])
    out = eng.step(torch.tensor([[20]]), slots=[0])
    assert_rows(out[0], [5, 6, 7, 11, 20], strategy)
    out = eng.step(torch.tensor([[30]]), slots=[1])
    assert_rows(out[0], [9, 10, 30], strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_drafter_proposing_bad_ids_is_refused_before_its_round(strategy):
    """A drafter's proposal outside the vocabulary, of floats or of the wrong length is refused
    naming the slot before the round's step: the engine is as it was, and a rollback of the
    last step is still right."""
    eng = issue_engine(strategy)
    eng.step(torch.tensor([[11, 12, 13]]), counts=[3], slots=[0])
    bad = [
        (torch.tensor([3, 128]), ValueError, r"drafts of slot 1: token id 128 at index 1 is out"),
        (torch.tensor([-1, 2]), ValueError, r"drafts of slot 1: token id -1 at index 0 is out"),
        (torch.tensor([1.0, 2.0]), TypeError, r"drafts of slot 1: .*got dtype torch.float32"),
        (torch.tensor([1, 2, 3]), ValueError, r"shape \(k=2,\) or \(1, k=2\), got shape \(3,\)"),
        (None, TypeError, r"drafts of slot 1: expected an integer tensor .*got NoneType None"),
    ]
    for ids, error, match in bad:
        call = lambda ids=ids: eng.speculate_batch(  # noqa: E731
            [torch.tensor([9, 10])], torch.tensor([[4]]), 5, [FixedDrafter(ids)], k=2, slots=[1]
        )
        refused(eng, call, error, match)
    eng.rollback([2], slots=[0])
    assert_rows(eng.step(torch.tensor([[20]]), slots=[0])[0], [5, 6, 7, 11, 12, 20], strategy)
    # a list of ints (and any integer dtype) is a proposal too
    tokens, _, _ = eng.speculate_batch(
        [torch.tensor([9, 10])], torch.tensor([4]), 3, [FixedDrafter([1, 2])], k=2, slots=[1]
    )
    assert tokens[0].shape == (3,)


# --- 2. speculate_batch checks every length --------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_speculation_lengths_are_checked_before_the_first_step(strategy):
    eng = issue_engine(strategy)
    eng.step(torch.tensor([[11, 12]]), slots=[0])
    prompt, one, four = [torch.tensor([9, 10])], [zeros_drafter()], torch.tensor([[4]])

    def spec(prompts=prompt, pending=four, n_new=3, drafters=one, k=2, slots=(1,)):
        return lambda: eng.speculate_batch(prompts, pending, n_new, drafters, k, list(slots))

    bad = [
        (
            spec(pending=torch.tensor([[4, 5]])),
            ValueError,
            r"pending: expected token ids of "
            r"shape \(slots=1, 1\) or \(slots=1,\), got shape \(1, 2\)",
        ),  # fmt: skip
        (spec(pending=[4]), TypeError, r"pending: expected an integer tensor .*got list \[4\]"),
        (spec(prompts=prompt * 2), ValueError, r"prompts: expected a list of 1, one per slot"),
        (spec(prompts=[torch.tensor([[9, 10]])]), ValueError, r"prompts\[0\]: .*shape \(1, 2\)"),
        (spec(prompts=[torch.tensor([9, 300])]), ValueError, r"prompts\[0\]: token id 300 at"),
        (spec(drafters=[]), ValueError, r"drafters: expected a list of 1, one per slot, got"),
        (spec(drafters=[object()]), TypeError, r"drafters\[0\]: expected a drafter with prop"),
        (spec(n_new=0), ValueError, r"n_new: expected 1 <= n_new, got 0"),
        (spec(n_new=2.0), TypeError, r"n_new: expected an integer, got float 2.0"),
        (spec(n_new=32), ValueError, r"n_new: slot 1 at position 2 cannot take n_new=32"),
        (spec(k=3), ValueError, r"k: a verify of k \+ 1 = 4 tokens exceeds max_verify=3"),
        (spec(k=-1), ValueError, r"k: expected 0 <= k, got -1"),
        (spec(slots=(1, 1)), ValueError, r"slots: expected distinct live slots, got \[1, 1\]"),
        (
            lambda: eng.speculate_batch(prompt, torch.tensor([[4]]), 3, one, 2, 1),
            TypeError,
            r"slots: expected a list of live slots \[0, 1\], got int 1",
        ),  # fmt: skip
    ]
    for call, error, match in bad:
        refused(eng, call, error, match)
    eng.rollback([1], slots=[0])  # the last step is still the one to roll back
    assert_rows(eng.step(torch.tensor([[20]]), slots=[0])[0], [5, 6, 7, 11, 20], strategy)


# --- 3. ids of any integer dtype ---------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int8])
def test_ids_of_any_integer_dtype_are_served_as_int64(strategy, dtype):
    """int32 ids crashed ``step`` after its id check; every integer dtype now gives int64's
    logits bit for bit, in admit, step, speculation and both prefix caches."""
    kw = dict(log_length=4, max_verify=3)
    ref, eng = (DecodeEngine(MODEL, 2, 32, strategy, **kw) for _ in range(2))
    prompt, tokens = torch.tensor([5, 6, 7, 8, 9]), torch.tensor([[11, 12, 13]])
    _, want = ref.admit(prompt)
    _, got = eng.admit(prompt.to(dtype))
    assert torch.equal(got, want)
    assert torch.equal(eng.step(tokens.to(dtype), [2]), ref.step(tokens, [2]))
    eng.rollback(np.int32(1))
    ref.rollback(1)
    drafter = lambda: SyntheticDrafter(torch.arange(40) % 7, 0.5, seed=1)  # noqa: E731
    want = ref.speculate_batch([prompt], torch.tensor([[3]]), 6, [drafter()], k=2)
    got = eng.speculate_batch([prompt.to(dtype)], torch.tensor([[3]], dtype=dtype), 6,
                              [drafter()], k=2)  # fmt: skip
    assert torch.equal(got[0][0], want[0][0]) and got[1:] == want[1:]
    cache = PrefixCache(MODEL, strategy, block_size=4, max_len=32)  # the teaching one
    a, b = cache.serve(prompt.to(dtype)), cache.serve(prompt)
    assert cache.lookup(prompt.to(dtype)) == (5, "end of prompt")
    torch.testing.assert_close(a.logits, b.logits, atol=TOL, rtol=TOL)
    engine = DecodeEngine(MODEL, 1, 32, strategy, **kw)
    _, logits, _ = EnginePrefixCache(engine, block_size=4).admit(prompt.to(dtype))
    assert_rows(logits[None], prompt.tolist(), strategy)


def test_ids_of_other_kinds_are_refused_naming_what_was_given():
    eng = DecodeEngine(MODEL, 2, 32, "recompute", log_length=4, max_verify=3)
    eng.admit(torch.tensor([5, 6, 7]))
    eng.step(torch.tensor([[1, 2]]))
    bad = [
        (lambda: eng.step(torch.tensor([[1.0]])), TypeError, r"tokens: .*got dtype torch.float32"),
        (lambda: eng.step(torch.tensor([[True]])), TypeError, r"tokens: .*got dtype torch.bool"),
        (
            lambda: eng.step([[1]]),
            TypeError,
            r"tokens: expected an integer tensor of token ids "
            r"\(slots=1, T\), got list \[\[1\]\]",
        ),  # fmt: skip
        (
            lambda: eng.step(torch.tensor([[1, 128]])),
            ValueError,
            r"tokens: token id 128 at row 0, column 1 is outside the vocabulary \[0, 128\)",
        ),  # fmt: skip
        (lambda: eng.admit(torch.tensor([1.5])), TypeError, r"prompt: .*got dtype torch.float32"),
        (lambda: eng.admit(torch.tensor([3, -4])), ValueError, r"prompt: token id -4 at index 1"),
        (lambda: eng.prefill(torch.tensor([[1.0]])), TypeError, r"prompts: .*dtype torch.float"),
    ]
    for call, error, match in bad:
        refused(eng, call, error, match)


# --- 4. refusals name the value -----------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_prompts_of_the_wrong_kind_are_refused_naming_them(strategy):
    eng = DecodeEngine(MODEL, 2, 32, strategy, log_length=4, max_verify=3)
    eng.admit(torch.tensor([5, 6, 7]))
    prefix_engine = DecodeEngine(MODEL, 1, 32, strategy, log_length=4, max_verify=3)
    engine_prefix = EnginePrefixCache(prefix_engine, block_size=4)
    engine_prefix.admit([1, 2, 3, 4, 5, 6])
    prefix_engine.retire(0)
    teaching = PrefixCache(MODEL, strategy, block_size=4, max_len=32)
    teaching.serve([1, 2, 3, 4, 5])
    expected = r"expected an integer tensor of token ids \(T0,\) or \(1, T0\), got "
    refused(eng, lambda: eng.admit([1, 2, 3]), TypeError, rf"prompt: {expected}list \[1, 2, 3\]")
    refused(eng, lambda: eng.begin_admit(None), TypeError, rf"prompt: {expected}NoneType None")
    refused(
        eng,
        lambda: eng.admit(torch.tensor([[[1, 2, 3]]])),
        ValueError,
        r"prompt: expected token ids of shape \(T0,\) or \(1, T0\), got shape \(1, 1, 3\)",
    )
    named = r"prompt: expected token ids \(T,\) or \(1, T\): an integer tensor or a list of ints"
    for bad, shown in ((None, "NoneType None"), (5, "int 5"), ("abc", "str 'abc'")):
        with pytest.raises(TypeError, match=rf"{named}, got {shown}"):
            teaching.serve(bad)
        with pytest.raises(TypeError, match=rf"{named}, got {shown}"):
            teaching.lookup(bad)
        refused(
            prefix_engine,
            lambda bad=bad: engine_prefix.admit(bad),
            TypeError,
            rf"{named}, got {shown}",
            tree=engine_prefix,
        )
    refused(
        prefix_engine,
        lambda: engine_prefix.admit([1, 2.5]),
        TypeError,
        r"prompt\[1\]: expected an integer, got float 2.5",
        tree=engine_prefix,
    )
    assert teaching.lookup([1, 2, 3, 4, 5, 9]) == (5, "unique tokens")
    with pytest.raises(TypeError, match=r"engine: expected a DecodeEngine, got NoneType None"):
        EnginePrefixCache(None)


# --- 5. numpy integers, and speculation near max_len ----------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_numpy_integers_for_keep_counts_slots_and_n(strategy):
    kw = dict(log_length=8, max_verify=3)  # replay: room for every count below
    ref, eng = (DecodeEngine(MODEL, 2, 32, strategy, **kw) for _ in range(2))
    for e in (ref, eng):
        e.admit(torch.tensor([5, 6, 7]))
        e.admit(torch.tensor([8, 9]))
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert torch.equal(eng.step(tokens, np.int64(1)), ref.step(tokens, 1))
    assert torch.equal(
        eng.step(tokens[:, :2], np.array([1, 2]), slots=np.array([0, 1])),
        ref.step(tokens[:, :2], [1, 2], slots=[0, 1]),
    )
    eng.rollback(np.int64(1))
    ref.rollback(1)
    assert torch.equal(
        eng.step(tokens[:, :2], torch.tensor([2, 1]), slots=[np.int32(0), 1]),
        ref.step(tokens[:, :2], [2, 1]),
    )
    eng.rollback(torch.tensor([1, 1]))
    ref.rollback([1, 1])
    assert eng.pos == ref.pos and eng.room(np.int16(0)) == ref.room(0)
    bad = [
        (lambda: eng.rollback(1.0), TypeError, r"keep: expected an int or a list of 2 ints"),
        (lambda: eng.rollback("1"), TypeError, r"keep: expected an int or a list of 2 ints"),
        (lambda: eng.rollback(np.array([[1, 1]])), ValueError, r"keep: expected one int or 2"),
        (lambda: eng.step(tokens, [1, 1.5]), TypeError, r"counts of slot 1: expected an int"),
        (lambda: eng.step(tokens, np.int64(4)), ValueError, r"counts of slot 0: expected 1 <="),
        (lambda: eng.retire(np.int64(5)), ValueError, r"slot: expected 0 <= slot <= 1, got 5"),
    ]
    for call, error, match in bad:
        refused(eng, call, error, match)
    one = DecodeEngine(MODEL, 1, 16, "replay", log_length=8, max_verify=3)
    twin = DecodeEngine(MODEL, 1, 16, "replay", log_length=8, max_verify=3)
    for e in (one, twin):
        e.admit(torch.tensor([1, 2, 3]))
    # a one-slot engine's per-slot values as a 1-element tensor (refused for a while by as_int)
    assert torch.equal(one.step(tokens[:1], torch.tensor([2])), twin.step(tokens[:1], [2]))
    one.rollback(torch.tensor([1]))
    twin.rollback([1])
    assert one.pos == twin.pos
    eng.retire(np.int64(1))
    for ask in (eng.room, eng.provisional_room):  # each gave a number for the empty slot before
        with pytest.raises(ValueError, match=r"slot: slot 1 is not live \(live slots: \[0\]\)"):
            ask(1)
    adm = eng.begin_admit(torch.tensor([1, 2, 3, 4, 5]))
    assert not adm.advance(np.int64(2)) and adm.advance(np.int32(3))


def test_an_engine_needs_a_replaylab_model():
    for model in (None, torch.nn.Linear(2, 2)):  # None gave a raw AttributeError
        with pytest.raises(TypeError, match=r"model: expected a replaylab HybridLM .* got "):
            DecodeEngine(model, 2, 16)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_speculation_up_to_max_len_returns_every_greedy_token(strategy):
    """n_new that greedy decoding fits exactly (position + n_new - 1 == max_len for the slot
    nearest the end): the last rounds verify fewer drafts, and every sequence gets all n_new
    of its greedy tokens, at max_len afterwards."""
    max_len = 24
    eng = DecodeEngine(MODEL, 3, max_len, strategy, log_length=4, max_verify=4)
    prompts = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6] * 9), torch.tensor([7, 8])]
    n_new = max_len - 9 + 1
    refs = [eng.greedy(p[None], n_new)[0] for p in prompts]
    for s in eng.slots:
        eng.retire(s)
    pending = torch.stack([eng.admit(p)[1].argmax() for p in prompts])[:, None]
    drafters = [SyntheticDrafter(torch.cat([p, r]), 1.0, seed=0) for p, r in zip(prompts, refs)]
    tokens, proposed, accepted = eng.speculate_batch(prompts, pending, n_new, drafters, k=3)
    assert [t.tolist() for t in tokens] == [r.tolist() for r in refs]
    assert eng.pos[1] == max_len and proposed[1] == accepted[1]


# --- the lock-step calls and the scheduler -------------------------------------------------------
def test_lock_step_calls_are_checked_before_they_retire_anything():
    eng = DecodeEngine(MODEL, 2, 16, "replay", log_length=4, max_verify=3)
    eng.admit(torch.tensor([5, 6, 7]))
    prompts = torch.tensor([[1, 2, 3]])
    bad = [
        (
            lambda: eng.greedy(prompts, 15),
            ValueError,
            r"n_new: 15 tokens after a prompt of 3 "
            r"need T0 \+ n_new - 1 = 17 positions: expected at most max_len=16",
        ),  # fmt: skip
        (lambda: eng.greedy(prompts, 0), ValueError, r"n_new: expected 1 <= n_new, got 0"),
        (lambda: eng.speculative(prompts, 15, zeros_drafter(), k=2), ValueError, r"n_new: 15"),
        (lambda: eng.speculative(prompts, 4, None, k=2), TypeError, r"drafters\[0\]: expected"),
        (
            lambda: eng.speculative(torch.tensor([1, 2]), 4, zeros_drafter(), k=2),
            ValueError,
            r"prompt: expected token ids of shape \(1, T0\), got shape \(2,\)",
        ),  # fmt: skip
    ]
    for call, error, match in bad:
        refused(eng, call, error, match)
    eng.begin_admit(torch.tensor([1, 2, 3]))  # one slot prefilling: one left for a prefill
    refused(
        eng,
        lambda: eng.prefill(torch.zeros(2, 3, dtype=torch.long)),
        ValueError,
        r"prompts: batch 2 does not fit the pools: expected 1 <= batch <= max_batch=2 - 1 "
        r"prefilling",
    )
    assert eng.greedy(prompts.int(), 13).shape == (1, 13)


def test_the_scheduler_checks_every_request_before_queueing_any():
    eng = DecodeEngine(MODEL, 2, 16, "replay", log_length=4, max_verify=3)
    sched = Scheduler(eng)
    good = Request(0, torch.tensor([1, 2, 3], dtype=torch.int32), 3)
    before = scheduler_state(sched)
    bad = [
        (
            [good, Request(1, torch.tensor([1, 200]), 2)],
            ValueError,
            r"request 1: prompt: token id 200 at index 1 is outside the vocabulary \[0, 128\)",
        ),
        ([good, Request(0, torch.tensor([1]), 2)], ValueError, r"id 0 was already added"),
        ([Request([1], torch.tensor([1]), 2)], TypeError, r"id \[1\]: expected a hashable id"),
        (
            [Request(2, torch.tensor([1]), 2, arrival=None)],
            TypeError,
            r"request 2: arrival: expected seconds \(a real number\), got NoneType None",
        ),  # fmt: skip
        ([Request(3, [1, 2], 2)], TypeError, r"request 3: prompt: .*got list \[1, 2\]"),
    ]
    for requests, error, match in bad:
        with pytest.raises(error, match=match):
            sched.run(requests)
        assert scheduler_state(sched) == before
    with pytest.raises(TypeError, match=r"max_steps: expected an integer"):
        sched.run([good], max_steps=1.5)
    assert scheduler_state(sched) == before
    sched.add(Request(4, torch.tensor([1, 2, 3]), np.int64(3), arrival=np.float32(0.0)))
    done = sched.run([good], max_steps=np.int64(20))
    assert [r.tokens for r in done] == [eng.greedy(torch.tensor([[1, 2, 3]]), 3)[0].tolist()] * 2


def test_the_fast_paths_of_the_slot_checks_agree_with_the_named_checks():
    """``check_slots`` and ``per_slot`` return a list of in-range ints at once; anything else
    goes through the per-value checks that name it. Random lists, both ways, same answer or
    the same error."""
    from replaylab.serving.checks import check_slots, per_slot
    from replaylab.serving.validate import as_int, as_ints

    engine = DecodeEngine(MODEL, 4, 24, "replay", log_length=4, max_verify=3)
    for prompt in ([1, 2], [3], [4, 5, 6]):
        engine.admit(torch.tensor(prompt))
    rng = random.Random(0)
    pick = [0, 1, 2, 3, 4, -1, True, 1.0, np.int64(1)]
    for _ in range(400):
        slots = [rng.choice(pick) for _ in range(rng.randint(0, 4))]
        try:
            want = [as_int("slots", s, 0, 3) for s in slots]
            if not want or len(set(want)) != len(want) or not all(engine.live[s] for s in want):
                want = ValueError
        except (TypeError, ValueError) as err:
            want = type(err)
        try:
            got = check_slots(engine, slots)
        except (TypeError, ValueError) as err:
            got = type(err)
        assert got == want, (slots, got, want)
        values = [rng.choice([0, 1, 2, 3, True, 2.0, np.int64(2)]) for _ in range(3)]
        high = rng.choice([2, [1, 2, 3]])
        results = []
        for fn in (per_slot, lambda *a: as_ints(a[0], a[1], [f"slot {s}" for s in a[2]], *a[3:])):
            try:
                results.append(fn("counts", values, [0, 1, 2], 1, high))
            except (TypeError, ValueError) as err:
                results.append(str(err))
        assert results[0] == results[1], (values, high, results)
