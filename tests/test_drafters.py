"""Batched drafters (``serving.drafters``) against the per-sequence ones of ``decoding``: prompt
lookup proposes the same drafts row for row; the synthetic drafter proposes the reference's
continuation with its acceptance; the draft model in its own engine proposes that model's
greedy tokens, and with the target's weights every one is accepted; through
``speculate_batch`` all give the greedy tokens, and a bad proposal is refused before the
round's step."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.decoding import PromptLookupDrafter
from replaylab.model import HybridLM, preset
from replaylab.serving import (
    STRATEGIES,
    BatchModelDrafter,
    BatchPromptLookupDrafter,
    BatchSyntheticDrafter,
    DecodeEngine,
)
from replaylab.testing import perturbed

MODEL = HybridLM(preset("tiny"), seed=0).eval()


def padded(contexts):
    width = max(len(c) for c in contexts) + 2
    rows = torch.zeros(len(contexts), width, dtype=torch.long)
    for i, c in enumerate(contexts):
        rows[i, : len(c)] = torch.tensor(c)
    return rows, torch.tensor([len(c) for c in contexts])


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    contexts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1, max_size=6),
    k=st.integers(0, 5),
    max_ngram=st.integers(1, 4),
)
def test_batched_prompt_lookup_proposes_what_the_per_sequence_one_does(contexts, k, max_ngram):
    rows, lengths = padded(contexts)
    got = BatchPromptLookupDrafter(max_ngram).propose_batch(
        rows, lengths, torch.arange(len(contexts)), k, 4
    )
    one = PromptLookupDrafter(max_ngram)
    want = torch.stack([one.propose(torch.tensor(c), k, 4).long() for c in contexts])
    assert torch.equal(got, want.reshape(len(contexts), k))  # the host's numpy path
    device = BatchPromptLookupDrafter(max_ngram).propose_on_device(rows, lengths, k, 4)
    assert torch.equal(device, got)  # the device rounds' tensor path, the same rule


def test_batched_synthetic_drafters_lookup_table_gives_the_hashed_drafts():
    """The host's rounds read a table of every draft inside the references; it must give what
    the per-round hashing gives (``_drafts``) at every position, past a reference's end and
    past the table too (where it falls back), for each vocabulary size asked."""
    gen = torch.Generator().manual_seed(5)
    refs = [torch.randint(0, 40, (int(n),), generator=gen) for n in (3, 17, 9, 30)]
    drafter = BatchSyntheticDrafter(refs, 0.6, seed=11)
    for vocab in (40, 41, 40):
        for _ in range(30):
            rows = torch.randint(0, 4, (5,), generator=gen)
            lengths = torch.randint(1, 36, (5,), generator=gen)
            k = int(torch.randint(0, 6, (1,), generator=gen))
            contexts = torch.zeros(5, 40, dtype=torch.long)
            got = drafter.propose_batch(contexts, lengths, rows, k, vocab)
            want = drafter._drafts(drafter.reference, rows, lengths, k, vocab)
            assert torch.equal(got, want), (rows, lengths, k, vocab)
        assert drafter._table[0] == vocab
    with pytest.raises(ValueError, match=r"rows: sequence -1: expected 0 <= row"):
        drafter.propose_batch(contexts, lengths[:2], torch.tensor([-1, 0]), 2, 40)
    drafter.TABLE_ENTRIES = 10  # references past the table's size: hashed each round
    got = drafter.propose_batch(contexts, lengths, rows, 3, 40)
    assert drafter._proposals(40) is None
    assert torch.equal(got, drafter._drafts(drafter.reference, rows, lengths, 3, 40))


def test_batched_synthetic_drafter_follows_its_references():
    refs = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([1, 2, 3])]
    rows, lengths = padded([[5, 6], [1]])
    sure = BatchSyntheticDrafter(refs, 1.0).propose_batch(rows, lengths, torch.arange(2), 4, 10)
    assert sure.tolist() == [[7, 8, 9, 0], [2, 3, 0, 0]]  # 0 past a reference's end
    never = BatchSyntheticDrafter(refs, 0.0).propose_batch(rows, lengths, torch.arange(2), 4, 10)
    assert never.tolist() == [[8, 9, 0, 1], [3, 4, 1, 1]]  # every draft the wrong id + 1
    one_row = BatchSyntheticDrafter(refs, 1.0).propose_batch(
        rows[1:], lengths[1:], torch.tensor([1]), 2, 10
    )
    assert one_row.tolist() == [[2, 3]]  # a row names its own sequence
    drafter = BatchSyntheticDrafter([torch.arange(1300)], 0.7, seed=3)
    many = torch.zeros(1, 1300, dtype=torch.long)
    right = [  # positions 4t .. 4t + 3: 1,200 draws, none drawn twice
        drafter.propose_batch(many, torch.tensor([4 * t]), torch.tensor([0]), 4, 1000)
        == torch.arange(4 * t, 4 * t + 4)
        for t in range(300)
    ]
    assert 0.65 < torch.cat(right).float().mean() < 0.75  # 1,200 draws at acceptance 0.7
    with pytest.raises(ValueError, match="acceptance"):
        BatchSyntheticDrafter(refs, 1.5)
    with pytest.raises(ValueError, match="expected a list of one reference"):
        BatchSyntheticDrafter(torch.zeros(2, 5, dtype=torch.long), 0.5)
    with pytest.raises(ValueError, match="sequence 2 has no reference"):
        BatchSyntheticDrafter(refs, 0.5).propose_batch(rows, lengths, torch.tensor([0, 2]), 4, 10)


def engine_and_refs(strategy, prompts):
    engine = DecodeEngine(MODEL, len(prompts), 48, strategy, log_length=5, max_verify=5)
    refs = [engine.greedy(p[None], 20)[0] for p in prompts]
    for s in engine.slots:
        engine.retire(s)
    pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]
    return engine, refs, pending


PROMPTS = [torch.tensor(p) for p in ([3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9])]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_speculation_with_batched_drafters_gives_the_greedy_tokens(strategy):
    engine, refs, pending = engine_and_refs(strategy, PROMPTS)
    full = [torch.cat([p, r]) for p, r in zip(PROMPTS, refs)]
    tokens, proposed, accepted = engine.speculate_batch(
        PROMPTS, pending, 20, BatchSyntheticDrafter(full, 0.7, seed=1), k=4
    )
    assert all(torch.equal(t, r) for t, r in zip(tokens, refs))
    assert 0 < sum(accepted) < sum(proposed)
    # prompt lookup: the batched drafter and a list of per-sequence ones, draft for draft
    runs = []
    for drafters in (BatchPromptLookupDrafter(), [PromptLookupDrafter() for _ in PROMPTS]):
        engine, refs, pending = engine_and_refs(strategy, PROMPTS)
        runs.append(engine.speculate_batch(PROMPTS, pending, 20, drafters, k=3))
        assert all(torch.equal(t, r) for t, r in zip(runs[-1][0], refs))
    assert runs[0][1:] == runs[1][1:]  # proposed and accepted, sequence by sequence


class Returns:
    def __init__(self, value):
        self.value = value

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        return self.value


@pytest.mark.parametrize(
    "value, error, match",
    [
        (
            torch.zeros(3, 3, dtype=torch.long),
            ValueError,
            r"shape \(sequences going=3, k=2\), got shape \(3, 3\)",
        ),
        (torch.zeros(3, 2), TypeError, "integer tensor"),
        ([[0, 0]] * 3, TypeError, "integer tensor"),
        (torch.tensor([[0, 0], [0, 999], [0, 0]]), ValueError, "token id 999 at index 1"),
    ],
)
def test_a_bad_batched_proposal_is_refused_before_the_step(value, error, match):
    engine, _, pending = engine_and_refs("replay", PROMPTS)
    steps, pos = engine.stats.steps, list(engine.pos)
    with pytest.raises(error, match=match):
        engine.speculate_batch(PROMPTS, pending, 8, Returns(value), k=2)
    assert engine.stats.steps == steps and list(engine.pos) == pos


def test_a_provisional_block_gives_its_tokens_back():
    engine = DecodeEngine(MODEL, 2, 48, "replay", log_length=4, max_verify=3)
    slot, logits = engine.admit(torch.tensor([3, 1, 4, 1, 5, 9]))  # pos 6, log_len 2
    engine.step(torch.tensor([[2]]), slots=[slot])
    engine.rollback(1, [slot])  # nothing dropped: the one token stays
    assert engine.provisional_room(slot) == 1  # position 7, next fold at 8
    conv = {l: p.conv[slot].clone() for l, p in engine.ssm.items()}
    with engine.provisional([slot]) as room:
        assert room == [1]
        engine.step(torch.tensor([[6]]), slots=[slot])
        with pytest.raises(ValueError, match="may reach position 8 inside engine.provisional"):
            engine.step(torch.tensor([[5]]), slots=[slot])
    assert engine.pos[slot] == 7 and engine.last[slot] == 0
    assert all(torch.equal(p.conv[slot], conv[l]) for l, p in engine.ssm.items())
    # the next token sees only the true ones: as an engine that never drafted
    fresh = DecodeEngine(MODEL, 2, 48, "replay", log_length=4, max_verify=3)
    other, _ = fresh.admit(torch.tensor([3, 1, 4, 1, 5, 9]))
    fresh.step(torch.tensor([[2]]), slots=[other])
    got = engine.step(torch.tensor([[7]]), slots=[slot])[0, -1]
    want = fresh.step(torch.tensor([[7]]), slots=[other])[0, -1]
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="'snapshot' strategy cannot give back"):
        with DecodeEngine(MODEL, 1, 48, "snapshot").provisional([0]):
            pass


def spec_with_model_drafter(draft, L, prompts=PROMPTS, n_new=30, k=4, strategy="replay"):
    """speculate_batch on MODEL with ``draft`` in a replay engine of log length L; returns
    (tokens, proposed, accepted, the greedy tokens, the drafter)."""
    engine = DecodeEngine(MODEL, len(prompts), 64, strategy, log_length=L, max_verify=k + 1)
    refs = [engine.greedy(p[None], n_new)[0] for p in prompts]
    for s in engine.slots:
        engine.retire(s)
    pending = torch.stack([engine.admit(p)[1].argmax() for p in prompts])
    drafter = Recording(DecodeEngine(draft, len(prompts), 64, "replay", L, max_verify=k + 1))
    tokens, proposed, accepted = engine.speculate_batch(prompts, pending, n_new, drafter, k)
    return tokens, proposed, accepted, refs, drafter


class Recording(BatchModelDrafter):
    def __init__(self, engine):
        super().__init__(engine)
        self.rounds = []  # per round, (context, drafts) per row

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        drafts = super().propose_batch(contexts, lengths, rows, k, vocab_size)
        self.rounds += [(contexts[g, : lengths[g]].clone(), drafts[g]) for g in range(len(rows))]
        return drafts


@pytest.mark.parametrize("L", [16, 4, 3])
def test_the_target_as_its_own_draft_model_has_every_draft_accepted(L):
    tokens, proposed, accepted, refs, drafter = spec_with_model_drafter(MODEL, L)
    assert all(torch.equal(t, r) for t, r in zip(tokens, refs))
    assert accepted == proposed and min(proposed) > 0  # any state left by a draft would show


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_model_drafter_proposes_its_models_greedy_tokens(strategy):
    draft, L, k = perturbed(MODEL, 0.1), 4, 4
    tokens, proposed, accepted, refs, drafter = spec_with_model_drafter(
        draft, L, strategy=strategy, k=k
    )
    assert all(torch.equal(t, r) for t, r in zip(tokens, refs))
    assert 0 < sum(accepted) < sum(proposed)
    for context, drafts in drafter.rounds:  # oracle: the draft model decoding alone
        T0 = next(p.numel() for p in PROMPTS if torch.equal(context[: p.numel()], p))
        alone = DecodeEngine(draft, 1, 64, "replay", log_length=L, max_verify=k + 1)
        _, logits = alone.admit(context[:T0])
        for t in context[T0:]:
            logits = alone.step(t.view(1, 1))[0, -1]
        want = [int(logits.argmax())]
        for _ in range(k - 1):
            want.append(int(alone.step(torch.tensor([want[-1:]]))[0, -1].argmax()))
        # drafts up to the slot's next fold, then the last one repeated
        j = min(k, 1 + L - context.numel() % L)
        assert drafts.tolist() == want[:j] + want[j - 1 : j] * (k - j)


def test_the_model_drafter_reseats_new_sequences_and_refuses_what_does_not_fit():
    draft = HybridLM(preset("tiny"), seed=1).eval()
    engine = DecodeEngine(draft, 2, 64, "replay", 4, max_verify=3)
    drafter = BatchModelDrafter(engine)
    rows = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    first = drafter.propose_batch(rows, torch.tensor([3, 2]), torch.tensor([0, 1]), 2, 128)
    again = BatchModelDrafter(DecodeEngine(draft, 2, 64, "replay", 4, max_verify=3))
    assert torch.equal(
        first, again.propose_batch(rows, torch.tensor([3, 2]), torch.arange(2), 2, 128)
    )
    # a row whose context does not extend its slot's tokens is admitted afresh
    swapped = drafter.propose_batch(rows.flip(0), torch.tensor([2, 3]), torch.arange(2), 2, 128)
    assert torch.equal(swapped, first.flip(0))
    # new sequences (rows 5, 6) take the slots of sequences not in this round
    other = drafter.propose_batch(rows, torch.tensor([3, 2]), torch.tensor([5, 6]), 2, 128)
    assert torch.equal(other, first) and set(drafter.seats) == {5, 6}
    # bad input is refused before any slot changes
    seats, pos = dict(drafter.seats), list(engine.pos)
    bad = [
        ((torch.ones(3, 4, dtype=torch.long), torch.tensor([2] * 3), torch.arange(3), 2, 128),
         "3 sequences draft at once, the draft engine has max_batch=2 slots"),
        ((rows, torch.tensor([3, 2]), torch.tensor([5, 5]), 2, 128), "expected distinct"),
        ((rows, torch.tensor([3, 0]), torch.tensor([5, 6]), 2, 128), r"lengths\[1\]: expected 1"),
        ((rows, torch.tensor([3, 5]), torch.tensor([5, 6]), 2, 128), r"<= 4 \(the contexts' width"),
        ((rows, torch.tensor([3, 2]), torch.tensor([5, 6]), -1, 128), "k: expected"),
        ((rows, torch.tensor([3, 2]), [5, 6], 2, 128), "rows: expected a 1-d integer tensor"),
        ((rows, torch.tensor([3, 2]), torch.tensor([5]), 2, 128), "expected 2 each"),
        ((rows, torch.tensor([3, 2]), torch.arange(2), 2, 50), "draft model has 128 tokens"),
        # an id outside the vocabulary: in a seated row's catch-up, and in a new row (where
        # rows were retired and admitted before the embedding's raw IndexError)
        ((torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]), torch.tensor([3, 2]), torch.tensor([5, 6]), 2, 128),
         None),
        ((torch.tensor([[5, 6, 7, -3], [8, 9, 0, 0]]), torch.tensor([4, 2]), torch.tensor([5, 6]), 2, 128),
         r"contexts: token id -3 at row 0, column 3 is outside the vocabulary \[0, 128\)"),
        ((torch.tensor([[1, 2, 3, 0], [4, 128, 0, 0]]), torch.tensor([3, 2]), torch.tensor([5, 9]), 2, 128),
         r"contexts: token id 128 at row 1, column 1"),
        ((rows.bool(), torch.tensor([3, 2]), torch.tensor([5, 6]), 2, 128), "contexts: expected a 2-d integer"),
    ]  # fmt: skip
    for args, match in bad:
        if match is None:  # a good call: the seats the next bad ones must leave as they are
            drafter.propose_batch(*args)
            seats, pos = dict(drafter.seats), list(engine.pos)
            continue
        with pytest.raises((ValueError, TypeError), match=match):
            drafter.propose_batch(*args)
        assert drafter.seats.keys() == seats.keys() and list(engine.pos) == pos
        assert all(torch.equal(drafter.seats[r][1], seats[r][1]) for r in seats)
    # a context as long as max_len: its first draft, then that one repeated (no room left)
    long = torch.ones(1, 64, dtype=torch.long)
    with pytest.warns(UserWarning, match=r"max_verify=3 is under min\(k \+ 1, L\) = 4"):
        full = drafter.propose_batch(long, torch.tensor([64]), torch.tensor([7]), 3, 128)
    assert full[0, 1:].eq(full[0, 0]).all()
    wide = BatchModelDrafter(DecodeEngine(draft, 2, 64, "replay", 4, max_verify=4))
    assert torch.equal(
        full, wide.propose_batch(long, torch.tensor([64]), torch.tensor([7]), 3, 128)
    )
    with warnings.catch_warnings():  # once per drafter
        warnings.simplefilter("error")
        drafter.propose_batch(rows, torch.tensor([3, 2]), torch.tensor([5, 6]), 3, 128)
    with pytest.raises(ValueError, match="strategy must be 'replay'"):
        BatchModelDrafter(DecodeEngine(draft, 2, 64, "snapshot"))
    with pytest.raises(TypeError, match="expected a DecodeEngine over the draft model, got"):
        BatchModelDrafter(draft)


def test_a_provisional_block_leaves_a_slot_retired_inside_and_does_not_nest():
    engine = DecodeEngine(MODEL, 2, 48, "replay", log_length=4, max_verify=3)
    a, _ = engine.admit(torch.tensor([3, 1, 4, 1, 5, 9, 2]))
    b, _ = engine.admit(torch.tensor([6, 5, 3]))
    with engine.provisional([a, b]):
        engine.step(torch.tensor([[2], [7]]), slots=[a, b])
        engine.retire(b)
        again, _ = engine.admit(torch.tensor([8, 8, 8, 8, 8]))  # a new sequence in slot b
        with pytest.raises(ValueError, match="blocks do not nest"):
            with engine.provisional([a]):
                pass
    assert again == b and (engine.pos[a], engine.pos[b]) == (7, 5) and engine.log_len[b] == 1
    # an exception inside gives everything back as well
    with pytest.raises(RuntimeError, match="inside"):
        with engine.provisional([a]):
            engine.step(torch.tensor([[2]]), slots=[a])
            raise RuntimeError("inside")
    assert engine.pos[a] == 7 and engine._limits == {}


def test_a_provisional_step_may_fold_a_full_log_of_true_tokens():
    engine = DecodeEngine(MODEL, 1, 48, "replay", log_length=4, max_verify=3)
    fresh = DecodeEngine(MODEL, 1, 48, "replay", log_length=4, max_verify=3)
    for e in (engine, fresh):
        slot, _ = e.admit(torch.tensor([3, 1, 4, 1, 5, 9, 2]))
        e.step(torch.tensor([[6]]), slots=[slot])  # position 8: a full log of L = 4 entries
    assert engine.log_len[0] == 4 and engine.provisional_room(0) == 4
    folds = engine.stats.folds
    with engine.provisional([0]):
        for t in (5, 3, 5, 8):  # the first step folds the true entries, then 4 drafts
            engine.step(torch.tensor([[t]]), slots=[0])
    assert (engine.pos[0], engine.log_len[0], engine.stats.folds - folds) == (8, 0, 1)
    assert torch.equal(engine.step(torch.tensor([[7]]))[0], fresh.step(torch.tensor([[7]]))[0])


def test_batched_prompt_lookup_refuses_a_bad_k_length_or_ngram_by_name():
    rows, lengths = padded([[1, 2, 3], [4]])
    drafter = BatchPromptLookupDrafter()
    with pytest.raises(ValueError, match=r"k: expected 0 <= k, got -1"):
        drafter.propose_batch(rows, lengths, torch.arange(2), -1, 8)
    with pytest.raises(TypeError, match=r"k: expected an integer, got float 2.0"):
        drafter.propose_batch(rows, lengths, torch.arange(2), 2.0, 8)
    w = rows.shape[1]
    with pytest.raises(
        ValueError, match=rf"lengths: row 1 holds 0 tokens: expected 1 <= length <= {w}"
    ):
        drafter.propose_batch(rows, torch.tensor([3, 0]), torch.arange(2), 2, 8)
    with pytest.raises(
        ValueError, match=rf"lengths: row 0 holds {w + 1} tokens: expected 1 <= length"
    ):
        drafter.propose_batch(rows, torch.tensor([w + 1, 1]), torch.arange(2), 2, 8)
    # max_ngram 0 drafted the last token k times for every row, without a word
    for bad, error in ((0, ValueError), (-2, ValueError), (1.5, TypeError), ("3", TypeError)):
        with pytest.raises(error, match=r"max_ngram: expected"):
            BatchPromptLookupDrafter(bad)
