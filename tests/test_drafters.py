"""Batched drafters (``serving.drafters``) against the per-sequence ones of ``decoding``: prompt
lookup proposes the same drafts row for row; the synthetic drafter proposes the reference's
continuation with its acceptance; through ``speculate_batch`` both give the greedy tokens, and
a bad proposal is refused before the round's step."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.decoding import PromptLookupDrafter
from replaylab.model import HybridLM, preset
from replaylab.serving import (
    STRATEGIES,
    BatchPromptLookupDrafter,
    BatchSyntheticDrafter,
    DecodeEngine,
)

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
    assert torch.equal(got, want.reshape(len(contexts), k))


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
    drafter = BatchSyntheticDrafter([torch.arange(400)], 0.7, seed=3)
    many = torch.zeros(1, 400, dtype=torch.long)
    right = [
        drafter.propose_batch(many, torch.tensor([t]), torch.tensor([0]), 4, 1000)
        == torch.arange(t, t + 4)
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
