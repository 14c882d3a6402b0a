"""The serving engine (``replaylab.serving.DecodeEngine``) against the teaching cache, on CPU:
the same tokens, the same logits under ragged programs of admit / step / rollback / retire,
replay's folds on a fixed grid, speculative decoding equal to the engine's own greedy decoding
bit for bit, and bad input refused with every slot left as it was.

On a GPU machine the tiny model runs on the device (the fused kernels compiled); on CPU the
fused path runs through Triton's interpreter, on the tiny layout with two heads of state 16."""

import copy
import random
from unittest.mock import patch

import pytest
import torch

from replaylab.cache import CacheConfig
from replaylab.decoding import PromptLookupDrafter, SyntheticDrafter, greedy, speculative
from replaylab.model import HybridLM, preset
from replaylab.serving import STRATEGIES, DecodeEngine
from replaylab.serving.slots import SlotTable
from replaylab.testing import DEVICE, kernel_sized

MODEL = HybridLM(preset("tiny"), seed=0).eval()
TEACHING = {"snapshot": "snapshot", "recompute": "recompute", "replay": "replay"}


KERNEL_MODEL = kernel_sized(MODEL)  # the fused path's (on CPU: two heads of state 16)
DEVICE_MODEL = copy.deepcopy(KERNEL_MODEL).to(DEVICE)  # compiled on a GPU


# the row-invariant product through the interpreter is slow and has its own tests
# (test_matmul.py); on CPU the fused engine tests take cuBLAS's place, torch's product
FUSED_MATMUL = "row_invariant" if torch.cuda.is_available() else "torch"


def engine_model():
    return DEVICE_MODEL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_tokens_equal_the_teaching_path(strategy):
    prompts = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(0))
    ref = greedy(MODEL, prompts, 24, CacheConfig(strategy, log_length=4)).tokens
    engine = DecodeEngine(MODEL, 4, 48, strategy, log_length=4, max_verify=4)
    assert torch.equal(engine.greedy(prompts, 24), ref)
    if strategy == "replay":  # checkpoint at the largest multiple of L held at a step's start
        per_slot = (9 + 22) // 4
        assert engine.stats.folds == 3 * per_slot
        assert engine.stats.folded_tokens == 3 * 4 * per_slot


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fused", [False, True])
def test_speculative_tokens_equal_greedy_bit_for_bit(strategy, fused):
    """Within one arithmetic, speculation (verify steps, ragged rollbacks) gives the engine's
    own greedy tokens; the drafter and acceptance counts match the teaching loop's."""
    model = engine_model() if fused else MODEL
    prompt = torch.tensor([[5, 9, 2, 5, 9, 2, 7, 5, 9]], device=model.lm_head.weight.device)
    kw = dict(log_length=6, use_kernels=fused, fused=fused, matmul=FUSED_MATMUL if fused else None)
    engine = DecodeEngine(model, 1, 40, strategy, **kw)
    n = 16 if not fused or torch.cuda.is_available() else 10  # 9 + 10 tokens: 3 folds of L=6
    ref = engine.greedy(prompt, n)
    full = torch.cat([prompt, ref], 1).cpu()
    tokens, proposed, accepted = engine.speculative(prompt, n, SyntheticDrafter(full, 0.6, 1))
    assert torch.equal(tokens.cpu(), ref.cpu()) and engine.stats.rollbacks > 0
    if not fused:
        teaching = speculative(
            MODEL, prompt, 16, SyntheticDrafter(full, 0.6, 1), k=4, cache=TEACHING[strategy]
        )
        if strategy == "replay":  # a round that reaches the fold grid verifies fewer drafts
            assert proposed < teaching.proposed and accepted <= teaching.accepted
        else:
            assert (proposed, accepted) == (teaching.proposed, teaching.accepted)
        assert torch.equal(teaching.tokens, ref)
        tokens, _, _ = engine.speculative(prompt, 16, PromptLookupDrafter(), k=4)
        assert torch.equal(tokens, ref)
    if strategy == "recompute":
        assert engine.stats.reruns > 0 and engine.stats.rerun_tokens > 0


class Teaching:
    """One teaching cache per sequence: the oracle the engine's ragged programs follow."""

    def __init__(self, strategy, L, model=MODEL):
        self.strategy, self.L, self.seqs, self.model = strategy, L, {}, model

    @torch.no_grad()
    def admit(self, slot, prompt):
        cache = CacheConfig(TEACHING[self.strategy], log_length=self.L).build(self.model, 1)
        self.seqs[slot] = [cache, prompt.tolist(), []]
        return self.model(prompt[None], cache)[0, -1]

    @torch.no_grad()
    def step(self, slot, tokens):
        cache, held, last = self.seqs[slot][:3]
        if len(self.seqs[slot]) > 3:
            cache.release(self.seqs[slot].pop())
        self.seqs[slot].append(cache.snapshot())  # so a rollback into this step can be served
        out = self.model(torch.tensor([tokens]), cache)[0]
        held += tokens
        self.seqs[slot][2] = tokens
        return out

    @torch.no_grad()
    def rollback(self, slot, keep):
        cache, held, last = self.seqs[slot][:3]
        drop = len(last) - keep
        if drop:
            del held[len(held) - drop :]
            cache.truncate_to(len(held))
        self.seqs[slot][2] = last[:keep]


def run_program(
    strategy,
    fused,
    seed,
    n_ops=24,
    slots=3,
    L=4,
    max_verify=3,
    max_len=40,
    model=None,
    tol=2e-4,
    partial_rollbacks=False,
    use_kernels=None,
    teaching_model=None,
    log_capacity=None,
    step_kernels=None,
):
    """A random program of admit / step (per-slot T and counts) / rollback (per-slot keep) /
    retire, on the engine and on teaching caches, comparing every logit the engine returns
    (``model``: default the tiny NemotronH; its teaching twin is the same model on CPU).
    A rollback takes every live slot, once each took part in the last step; with
    ``partial_rollbacks`` it takes the slots that did. ``use_kernels``: default ``fused``;
    ``teaching_model``: the oracle's model (default ``model``; its CPU twin when ``model`` is
    on a GPU); ``log_capacity``: replay's ring rows (default L); ``step_kernels``: the
    engine's (default None)."""
    rng = random.Random(seed)
    teaching = teaching_model or ((KERNEL_MODEL if fused else MODEL) if model is None else model)
    model = (engine_model() if fused else MODEL) if model is None else model
    vocab = model.cfg.vocab_size
    engine = DecodeEngine(
        model,
        slots,
        max_len,
        strategy,
        log_length=L,
        max_verify=max_verify,
        use_kernels=fused if use_kernels is None else use_kernels,
        fused=fused,
        matmul=FUSED_MATMUL if fused else None,
        log_capacity=log_capacity,
        step_kernels=step_kernels,
    )
    oracle, worst = Teaching(strategy, L, teaching), 0.0

    def compare(got, want):
        nonlocal worst
        worst = max(worst, float((got.cpu().float() - want.float()).abs().max()))
        torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)

    for i in range(n_ops):
        live = engine.slots
        op = (
            "admit"
            if i < 2
            else rng.choice(["admit", "step", "step", "step", "rollback", "retire"])
        )
        if op == "admit" and len(live) < slots:
            prompt = torch.tensor([rng.randrange(vocab) for _ in range(rng.randint(1, 9))])
            slot, logits = engine.admit(prompt.to(model.lm_head.weight.device))
            compare(logits, oracle.admit(slot, prompt))
        elif op == "retire" and len(live) > 1:
            slot = rng.choice(live)
            engine.retire(slot)
        elif (
            op == "rollback"
            and (rolled := [s for s in live if engine.last[s]])
            and (partial_rollbacks or len(rolled) == len(live))
        ):
            keep = [rng.randint(1, engine.last[s]) for s in rolled]
            engine.rollback(keep, slots=rolled)
            for s, k in zip(rolled, keep):
                oracle.rollback(s, k)
        elif live:
            chosen = [s for s in live if rng.random() < 0.8] or live[:1]
            T = rng.randint(1, max_verify)
            room = [min(T, max_len - engine.pos[s], engine.room(s)) for s in chosen]
            if min(room) < 1:
                continue
            counts = [rng.randint(1, r) for r in room]
            tokens = torch.tensor([[rng.randrange(vocab) for _ in range(T)] for _ in chosen])
            logits = engine.step(tokens.to(model.lm_head.weight.device), counts, slots=chosen)
            for i, (s, c) in enumerate(zip(chosen, counts)):
                compare(logits[i, :c], oracle.step(s, tokens[i, :c].tolist()))
        for s in engine.slots:  # replay: every checkpoint on the grid
            assert engine.pos[s] == len(oracle.seqs[s][1])
            if strategy == "replay":
                assert (engine.pos[s] - engine.log_len[s]) % L == 0
                assert 0 <= engine.log_len[s] <= engine.capacity
    return engine, worst


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(4))
def test_ragged_programs_give_the_teaching_logits(strategy, seed):
    engine, worst = run_program(strategy, fused=False, seed=seed)
    assert engine.stats.steps > 0 and worst < 2e-4


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_a_ring_past_the_fold_grid_gives_the_teaching_logits(fused, seed):
    """log_capacity L + max_verify - 1: a step may pass the fold grid (the fold waits for the
    next step), through the reference path and the fused kernels, against the teaching cache;
    some step left a slot's log past L."""
    if fused and seed and not torch.cuda.is_available():
        pytest.skip("CI time: 12-15 s a program through the interpreter on CPU")
    past = []
    original = SlotTable.commit

    def commit(table, step_counts):
        original(table, step_counts)
        past.extend(s for s in step_counts if table.log_len[s] > table.L)

    with patch.object(SlotTable, "commit", commit):
        engine, worst = run_program(
            "replay", fused=fused, seed=20 + seed, n_ops=30 if not fused else 12, slots=2,
            log_capacity=4 + 3 - 1,
        )  # fmt: skip
    assert engine.capacity == 6 and past and worst < 2e-4


@pytest.mark.parametrize("strategy", STRATEGIES if torch.cuda.is_available() else ["replay"])
def test_ragged_programs_fused(strategy):
    """The fused kernels (interpreter on CPU) in lockstep with the teaching caches. Replay
    only on CPU, where the interpreter is slow: its kernels (ring, folds, append counts) are
    the ones a ragged program exercises beyond decode; snapshot's and recompute's fused paths
    run in the speculative test above, and every strategy runs here on a GPU."""
    engine, worst = run_program(strategy, fused=True, seed=11, n_ops=10, slots=2)
    assert engine.stats.steps > 0 and worst < 2e-4


def test_a_ring_past_the_fold_grid_never_shrinks_the_drafts():
    """With log_capacity L + k, a round just before a fold verifies all k drafts: the drafter
    and acceptance counts are the teaching loop's (which never clips), and the tokens are the
    engine's own greedy ones; with capacity L the same rounds verify fewer."""
    prompt = torch.tensor([[5, 9, 2, 5, 9, 2, 7, 5, 9]])
    engine = DecodeEngine(MODEL, 1, 48, "replay", log_length=6, log_capacity=6 + 4)
    ref = engine.greedy(prompt, 24)
    full = torch.cat([prompt, ref], 1)
    counts = {}
    for capacity in (6, 10):
        e = DecodeEngine(MODEL, 1, 48, "replay", log_length=6, log_capacity=capacity)
        tokens, *counts[capacity] = e.speculative(prompt, 24, SyntheticDrafter(full, 0.8, 3))
        assert torch.equal(tokens, ref)
    teaching = speculative(
        MODEL, prompt, 24, SyntheticDrafter(full, 0.8, 3), k=4, cache=TEACHING["replay"]
    )
    assert counts[10] == [teaching.proposed, teaching.accepted]
    assert counts[6][0] < counts[10][0]


def test_log_capacity_outside_its_range_is_refused():
    for capacity, message in (
        (3, r"log_capacity: expected 4 <= log_capacity <= 8, got 3"),  # L + min(5 - 1, L)
        (9, r"log_capacity: expected 4 <= log_capacity <= 8, got 9"),
        (6.5, r"log_capacity: expected an integer"),
    ):
        with pytest.raises((ValueError, TypeError), match=message):
            DecodeEngine(MODEL, 1, 32, "replay", log_length=4, log_capacity=capacity)
    with pytest.raises(ValueError, match=r"log_capacity: only replay keeps a log; the 'snapshot'"):
        DecodeEngine(MODEL, 1, 32, "snapshot", log_length=4, log_capacity=6)
    engine = DecodeEngine(MODEL, 1, 32, "replay", log_length=2, max_verify=5, log_capacity=4)
    assert engine.capacity == 4  # L + min(max_verify - 1, L): at most 2L


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_speculative_batch_equals_greedy_with_per_sequence_acceptance(strategy):
    """Sequences at different positions, each accepting its own number of drafts per round,
    give each sequence's greedy tokens."""
    engine = DecodeEngine(MODEL, 3, 48, strategy, log_length=5, max_verify=5)
    prompts = [torch.tensor(p) for p in ([3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9])]
    refs = []
    for p in prompts:
        refs.append(engine.greedy(p[None], 20)[0])
    for s in engine.slots:
        engine.retire(s)
    pending, drafters = [], []
    for p, ref, a in zip(prompts, refs, (0.9, 0.5, 0.7)):
        _, logits = engine.admit(p)
        pending.append(logits.argmax())
        drafters.append(SyntheticDrafter(torch.cat([p, ref]), a, seed=int(a * 10)))
    tokens, proposed, accepted = engine.speculate_batch(
        prompts, torch.stack(pending)[:, None], 20, drafters, k=4
    )
    for got, ref in zip(tokens, refs):
        assert got.device == ref.device and torch.equal(got, ref)
    rates = [a / p for a, p in zip(accepted, proposed)]
    assert rates[0] > rates[1]  # each sequence kept its own acceptance


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_freed_slot_keeps_nothing_of_its_last_tenant(strategy):
    engine = DecodeEngine(MODEL, 2, 32, strategy, log_length=4, max_verify=3)
    slot, _ = engine.admit(torch.tensor([7, 7, 7, 7, 7, 7]))
    for _ in range(3):
        engine.step(torch.tensor([[1, 2, 3]]), [2])
    engine.retire(slot)
    again, logits = engine.admit(torch.tensor([4, 2]))
    fresh = DecodeEngine(MODEL, 2, 32, strategy, log_length=4, max_verify=3)
    _, want = fresh.admit(torch.tensor([4, 2]))
    assert again == slot and torch.equal(logits, want)
    count = engine.room(again)  # replay: 2 tokens before the fold of the new tenant's log
    assert count == fresh.room(again) == (2 if strategy == "replay" else 3)
    got = engine.step(torch.tensor([[5, 6, 1]]), [count])
    assert torch.equal(got, fresh.step(torch.tensor([[5, 6, 1]]), [count]))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_step_places_its_rows_at_their_slots_in_any_order(strategy):
    """A step's row i goes to ``slots[i]`` whatever their order, and a slot left out of it stays
    as it was: two engines, one stepping slots (3, 0) in that order with slot 1 left out, the
    other stepping (0, 3) then slot 1, give the same logits, row for row, and the same state."""
    prompts = torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([[5, 9, 2], [4, 4, 1]])
    shuffled = DecodeEngine(MODEL, 4, 32, strategy, log_length=4, max_verify=3)
    ordered = DecodeEngine(MODEL, 4, 32, strategy, log_length=4, max_verify=3)
    for engine in (shuffled, ordered):
        engine.prefill(prompts)
    got = shuffled.step(tokens, [2, 1], slots=[3, 0])
    want = ordered.step(tokens.flip(0), [1, 2], slots=[0, 3]).flip(0)
    assert torch.equal(got, want)
    step = torch.tensor([[8]])
    for slot in range(4):  # every slot, stepped or left out, holds the same state after
        assert torch.equal(shuffled.step(step, slots=[slot]), ordered.step(step, slots=[slot]))


def pools(engine):
    out = {
        "live": list(engine.live),
        "pos": list(engine.pos),
        "log_len": list(engine.log_len),
        "head": list(engine.head),
        "last": list(engine.last),
    }
    for l, p in engine.ssm.items():
        out[f"s{l}"], out[f"c{l}"] = p.state.clone(), p.conv.clone()
        for k, v in p.log.items():
            out[f"log{l}{k}"] = v.clone()
    for l, p in engine.kv.items():
        out[f"k{l}"] = p.k.clone()
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_input_is_refused_and_every_slot_stays_as_it_was(strategy):
    engine = DecodeEngine(MODEL, 2, 16, strategy, log_length=4, max_verify=3)
    with pytest.raises(ValueError, match=r"slots: no live sequence: admit one"):
        engine.step(torch.tensor([[1], [2]]))
    with pytest.raises(
        ValueError, match=r"batch 3 does not fit the pools: expected 1 <= batch <= max_batch=2"
    ):
        engine.prefill(torch.zeros(3, 4, dtype=torch.long))
    a, _ = engine.admit(torch.tensor([1, 2, 3, 4, 5]))
    b, _ = engine.admit(torch.tensor([6, 7]))
    engine.step(torch.tensor([[1, 2], [3, 4]]), [2, 1])
    before = pools(engine)
    bad = [
        (lambda: engine.admit(torch.tensor([1, 2])), r"all max_batch=2 slots are in use"),
        (
            lambda: engine.step(torch.zeros(2, 4, dtype=torch.long)),
            r"4 per step, expected 1 <= T <= max_verify=3 \(the captured verify size\)",
        ),
        (lambda: engine.rollback([3, 1]), r"keep of slot 0: expected 1 <= keep of slot 0 <= 2"),
        (lambda: engine.rollback([1, 2]), r"keep of slot 1: expected 1 <= keep of slot 1 <= 1"),
        (lambda: engine.rollback([0, 1]), r"keep of slot 0: expected 1 <= "),
        (lambda: engine.rollback([1, 1, 1]), r"keep: expected 2 values, one per slot, got 3"),
        (
            lambda: engine.step(torch.tensor([[128], [0]])),
            r"tokens: token id 128 at row 0 is outside the vocabulary \[0, 128\)",
        ),
        (lambda: engine.step(torch.tensor([[1]])), r"shape \(slots=2, T\)"),
        (lambda: engine.step(torch.tensor([[1, 2]]), [1, 1], slots=[a]), r"expected 1 values"),
        (lambda: engine.step(torch.tensor([[1, 2]]), [3], slots=[a]), r"counts of slot 0: "),
        (lambda: engine.step(torch.tensor([[1]]), slots=[a, a]), r"distinct live slots"),
        (
            lambda: engine.speculative(torch.tensor([[1, 2]]), 4, PromptLookupDrafter(), k=3),
            r"k \+ 1 = 4 tokens exceeds max_verify=3",
        ),
    ]
    if strategy == "replay":  # slot 0 holds 3 of L=4 entries: one token before its fold
        bad.append(
            (
                lambda: engine.step(torch.tensor([[1, 2]]), [2], slots=[a]),
                r"counts: slot 0 may take at most room=1 tokens in this step \(replay folds",
            )
        )
    for call, message in bad:
        with pytest.raises(ValueError, match=message):
            call()
        after = pools(engine)
        for k, v in before.items():
            same = torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v
            assert same, f"{message}: {k} changed"
    engine.retire(b)
    with pytest.raises(ValueError, match=r"slots: slot 1 is not live \(live slots: \[0\]\)"):
        engine.step(torch.tensor([[1]]), slots=[b])
    with pytest.raises(ValueError, match=r"slot: 1 is not live \(live slots: \[0\]\)"):
        engine.retire(b)
    with pytest.raises(ValueError, match=r"prompt: length 16: expected 1 <= length < max_len=16"):
        engine.admit(torch.zeros(16, dtype=torch.long))
    while engine.pos[a] < 16:
        n = min(engine.room(a), 16 - engine.pos[a])
        engine.step(torch.ones(1, n, dtype=torch.long), slots=[a])
    with pytest.raises(ValueError, match=r"slot 0 at position 16 \+ 1 exceeds max_len=16"):
        engine.step(torch.tensor([[1]]), slots=[a])


def test_engine_configuration_errors():
    with pytest.raises(ValueError, match=r"strategy: expected one of \('snapshot', 'recompute'"):
        DecodeEngine(MODEL, 1, 8, "revolve")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"graphs: CUDA graphs need a CUDA device"):
            DecodeEngine(MODEL, 1, 8, graphs=True)
    with pytest.raises(TypeError, match=r"max_batch: expected an integer"):
        DecodeEngine(MODEL, 1.5, 8)
    # the path switches take None (the default for the device), True or False, nothing truthy
    for name, value in (
        ("use_kernels", 1),
        ("graphs", "no"),
        ("fused", 0),
        ("prefill_kernels", "yes"),
    ):
        with pytest.raises(
            ValueError, match=rf"{name}: expected None, True or False, got {value!r}"
        ):
            DecodeEngine(MODEL, 1, 8, **{name: value})
    with pytest.raises(ValueError, match=r"batch_invariant: expected True or False, got None"):
        DecodeEngine(MODEL, 1, 8, batch_invariant=None)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_chunked_prefill_gives_the_teaching_logits_and_the_decode_grid(strategy):
    """Prompts of several lengths prefilled in chunks of any size (through the engine's pools,
    the chunked scan for long chunks) give the teaching model's logits, and decoding after
    them too; under replay the checkpoint lands on the grid and the log holds the rest."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen) for n in (1, 9, 23, 70)]
    want = [MODEL(p[None], CacheConfig(strategy, log_length=4).build(MODEL, 1)) for p in prompts]
    for chunk in (3, 256):  # several chunks with folds between; one chunk, the chunked scan
        engine = DecodeEngine(MODEL, 4, 96, strategy, log_length=4, prefill_chunk=chunk)
        for p, w in zip(prompts, want):
            slot, logits = engine.admit(p)
            torch.testing.assert_close(logits, w[0, -1], atol=2e-4, rtol=2e-4)
            if strategy == "replay":
                assert engine.log_len[slot] == len(p) % 4 and engine.head[slot] == 0
        ref = [
            greedy(MODEL, p[None], 6, CacheConfig(strategy, log_length=4)).tokens[0]
            for p in prompts
        ]
        tokens = torch.stack([w[0, -1].argmax() for w in want])[:, None]
        out = [tokens]
        for _ in range(5):
            tokens = engine.step(tokens).argmax(-1)
            out.append(tokens)
        assert torch.equal(torch.cat(out, 1), torch.stack(ref)), chunk


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fewer_drafts_than_the_engine_verifies(strategy):
    """k + 1 below max_verify: each round verifies at most k drafts, and the tokens are still
    greedy's (a replay round near its fold grid verifies fewer)."""
    engine = DecodeEngine(MODEL, 2, 40, strategy, log_length=5, max_verify=5)
    prompts = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6])]
    refs = [engine.greedy(p[None], 12)[0] for p in prompts]
    for s in engine.slots:
        engine.retire(s)
    pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]
    drafters = [SyntheticDrafter(torch.cat([p, r]), 1.0, seed=0) for p, r in zip(prompts, refs)]
    tokens, proposed, _ = engine.speculate_batch(prompts, pending, 12, drafters, k=2)
    assert all(torch.equal(t, r) for t, r in zip(tokens, refs))
    rounds = engine.stats.verify_steps
    assert 0 < max(proposed) <= 2 * rounds


def test_speculation_past_max_len_is_refused_before_the_step():
    """Speculation that greedy decoding could not fit (position + n_new - 1 > max_len for a
    slot) is refused before the first step, naming the slot, its position and the limit,
    with every pool as it was (``test_engine_validation``: up to the limit it runs, its last
    rounds verifying fewer drafts)."""
    engine = DecodeEngine(MODEL, 3, 24, "replay", log_length=4, max_verify=4)
    prompts = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6] * 9), torch.tensor([7, 8])]
    pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]
    drafters = [SyntheticDrafter(torch.zeros(40, dtype=torch.long), 0.0) for _ in prompts]
    before = pools(engine)
    with pytest.raises(
        ValueError,
        match=r"n_new: slot 1 at position 9 cannot take n_new=17 tokens: expected position "
        r"\+ n_new - 1 <= max_len=24",
    ):
        engine.speculate_batch(prompts, pending, 17, drafters, k=3)
    after = pools(engine)
    for k, v in before.items():
        assert torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v, k


def outputs_past_the_grid(make_engine, prompt, method, L=4, T=4, after=2):
    """(decoded, verified): per recurrent layer, the layer's outputs (``EngineReplay.<method>``,
    slot 0) of T + ``after`` decode steps with a ring of L rows, and of one verify of the same
    T tokens with a ring of L + T - 1 followed by ``after`` decode steps. ``prompt`` leaves L - 1
    entries in the log, so the verify's last T - 1 rows are past the fold grid.
    ``make_engine(**kw)``: a replay engine of one slot."""
    from replaylab.serving.strategies.replay import EngineReplay

    outputs, original = [], getattr(EngineReplay, method)

    def recorded(self, pool, *args):
        y = original(self, pool, *args)
        outputs.append(y[0].clone())
        return y

    device = prompt.device
    with torch.no_grad(), patch.object(EngineReplay, method, recorded):
        engine = make_engine(log_length=L, max_verify=T)
        tokens = [int(engine.admit(prompt)[1].argmax())]
        outputs.clear()
        for _ in range(T + after):
            logits = engine.step(torch.tensor([tokens[-1:]], device=device))
            tokens.append(int(logits[0, 0].argmax()))
        layers = len(engine.ssm)
        decoded = [[y[0] for y in outputs[layer::layers]] for layer in range(layers)]
        engine = make_engine(log_length=L, max_verify=T, log_capacity=L + T - 1)
        engine.admit(prompt)
        outputs.clear()
        engine.step(torch.tensor([tokens[:T]], device=device))
        assert engine.log_len == [L - 1 + T]
        for token in tokens[T : T + after]:
            engine.step(torch.tensor([[token]], device=device))
    verified = [
        [*outputs[layer], *(y[0] for y in outputs[layers + layer :: layers])]
        for layer in range(layers)
    ]
    assert all(len(d) == len(v) == T + after for d, v in zip(decoded, verified))
    return decoded, verified


def test_a_fused_verify_past_the_fold_grid_rounds_as_decode_steps_bit_for_bit():
    """The fused path's Mamba-2 layers (``EngineReplay.mamba_fused``) with log_capacity > L:
    each verify row past the fold grid, and the steps after it, give the layers' outputs of
    decode steps bit for bit (the families' reference path: test_engine_family_kernels)."""
    kw = dict(fused=True, use_kernels=True, matmul="row_invariant", graphs=False)
    make = lambda **more: DecodeEngine(engine_model(), 1, 32, "replay", **kw, **more)  # noqa: E731
    prompt = torch.tensor([5, 9, 2, 5, 9, 2, 7], device=DEVICE)
    decoded, verified = outputs_past_the_grid(make, prompt, "mamba_fused")
    for layer, (want, got) in enumerate(zip(decoded, verified)):
        for t, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (layer, t, (a - b).abs().max().item())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_rollback_padded_with_its_first_pair_leaves_the_pools_as_the_rollback_does(strategy):
    """Under CUDA graphs a rollback is captured once per bucket and its (slot, kept) pairs are
    padded to the bucket with copies of the first (``runner.padded_pairs``): every built-in
    strategy says its rollback allows that, and here, eagerly, the padded rollback leaves every
    pool buffer bit for bit as the rollback of the pairs alone."""
    from replaylab.serving.runner import padded_pairs
    from replaylab.testing import tiny_hybrid

    engine = DecodeEngine(tiny_hybrid(), 4, 40, strategy, 4, max_verify=4)
    assert engine.policy.rollback_graphable
    gen = torch.Generator().manual_seed(5)
    for n in (5, 9, 3, 7):
        engine.admit(torch.randint(0, 50, (n,), generator=gen))
    engine.step(
        torch.randint(0, 50, (4, 3), generator=gen), [min(3, engine.room(s)) for s in range(4)]
    )
    pair = torch.tensor([[3, 1], [0, 1]])  # slots 3 and 1 keep 1 and 2 of their tokens

    def pools_after(pairs):
        saved = copy.deepcopy([vars(p) for p in engine.ssm.values()])
        engine.policy.rollback(pairs[0], pairs[1])
        after = [
            {k: v.clone() for k, v in vars(p).items() if torch.is_tensor(v)}
            for p in engine.ssm.values()
        ]
        for p, kept in zip(engine.ssm.values(), saved):
            vars(p).update(kept)
        return after

    plain, padded = pools_after(pair), pools_after(padded_pairs(pair, 4))
    assert padded_pairs(pair, 4).tolist() == [[3, 1, 3, 3], [0, 1, 0, 0]]
    assert plain and all(a.keys() == b.keys() for a, b in zip(plain, padded))
    for a, b in zip(plain, padded):
        for name in a:
            assert torch.equal(a[name], b[name]), name
    changed = pools_after(torch.tensor([[2], [0]]))  # another slot's rollback: the test can fail
    assert any(not torch.equal(a[k], c[k]) for a, c in zip(plain, changed) for k in a)
