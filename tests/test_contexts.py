"""``serving.contexts``: the slots' host contexts kept across rounds equal each request's prompt
and tokens rebuilt from scratch, and ``accepted`` (on tensors and on numpy arrays) equals the
per-row loop it replaced."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.serving.contexts import SlotContexts, accepted


def accepted_by_loop(drafts, predicted, n_drafts):
    out = []
    for d, p, n in zip(drafts.tolist(), predicted.tolist(), n_drafts.tolist()):
        a = 0
        while a < n and d[a] == p[a]:
            a += 1
        out.append(a)
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_accepted_is_the_leading_run_of_matches(data):
    G, k = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 5))
    ids = st.lists(st.integers(0, 2), min_size=k, max_size=k)  # few ids: many matches
    drafts = torch.tensor(data.draw(st.lists(ids, min_size=G, max_size=G)))
    predicted = torch.tensor(
        [
            row + [data.draw(st.integers(0, 2))]
            for row in data.draw(st.lists(ids, min_size=G, max_size=G))
        ]
    )
    n = torch.tensor(data.draw(st.lists(st.integers(0, k), min_size=G, max_size=G)))
    want = accepted_by_loop(drafts, predicted, n)
    assert accepted(drafts, predicted, n).tolist() == want
    on_host = accepted(drafts.numpy(), predicted.numpy(), n.numpy())  # the scheduler's rounds
    assert isinstance(on_host, np.ndarray) and on_host.tolist() == want


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_the_table_holds_each_tenants_prompt_and_tokens(data):
    """Tenants come and go over 3 slots (a shorter prompt after a longer context), rounds
    append what each slot took; every read equals the contexts rebuilt from the lists, with
    zeros past each one, whether the table starts at its full width or grows to it."""
    slots, width, k = 3, 40, 3
    table = SlotContexts(slots, width, initial=data.draw(st.sampled_from([1, 5, 40])))
    truth = {}  # slot -> list of ids
    for _ in range(data.draw(st.integers(1, 8))):
        if not truth or data.draw(st.booleans()):  # a new tenant
            s = data.draw(st.integers(0, slots - 1))
            prompt = data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
            first = data.draw(st.integers(1, 9))
            table.start(s, torch.tensor(prompt), [first])
            truth[s] = prompt + [first]
        going = sorted(truth)
        tokens = torch.tensor(
            data.draw(
                st.lists(
                    st.lists(st.integers(1, 9), min_size=k + 1, max_size=k + 1),
                    min_size=len(going),
                    max_size=len(going),
                )
            )  # fmt: skip
        )
        room = [min(k + 1, width - len(truth[s])) for s in going]
        n = torch.tensor([data.draw(st.integers(0, r)) for r in room])
        table.extend(torch.tensor(going), tokens, n)
        for s, row, m in zip(going, tokens.tolist(), n.tolist()):
            truth[s] += row[:m]
        contexts, lengths = table.rows(torch.tensor(going), extra=k + 1)
        longest = max(len(truth[s]) for s in going)
        assert contexts.shape == (len(going), min(longest + k + 1, width))
        for g, s in enumerate(going):
            expected = truth[s] + [0] * (contexts.shape[1] - len(truth[s]))
            assert contexts[g].tolist() == expected and int(lengths[g]) == len(truth[s])


def test_a_context_past_the_width_is_refused_before_anything_changes():
    table = SlotContexts(2, 6)
    with pytest.raises(
        ValueError, match="slot 1: a context of 7 tokens exceeds the table's width 6"
    ):
        table.start(1, torch.arange(1, 7), [3])
    table.start(0, torch.tensor([1, 2, 3]), [4])
    before = table.table.copy(), table.lengths.copy()
    with pytest.raises(TypeError, match="expected integer token ids, got dtype float"):
        table.extend(torch.tensor([0]), torch.tensor([[5.0, 6.0]]), torch.tensor([2]))
    with pytest.raises(TypeError, match="expected integer token ids"):
        table.start(1, torch.tensor([1.0, 2.0]), [3])
    with pytest.raises(TypeError, match="expected integer token ids"):
        table.start(1, torch.tensor([1, 2]), [3.5])
    with pytest.raises(ValueError, match="a context would exceed the table's width 6"):
        table.extend(torch.tensor([0]), torch.tensor([[5, 6, 7]]), torch.tensor([3]))
    assert (table.table == before[0]).all() and (table.lengths == before[1]).all()


def test_the_table_grows_with_its_longest_context_not_to_its_width():
    """A million-token bound does not cost slots x a million ids up front: the table doubles
    (or jumps to what a context needs) and keeps every row's ids."""
    table = SlotContexts(4, 10**6, initial=16)
    table.start(2, torch.arange(1, 11), [11])
    assert table.table.shape == (4, 16)
    table.start(1, torch.arange(1, 41), [41])
    assert table.table.shape == (4, 41) and table.table[2, :11].tolist() == list(range(1, 12))
    table.extend(torch.tensor([1]), torch.tensor([[7, 8]]), torch.tensor([2]))
    assert table.table.shape == (4, 82) and table.table[1, 41:43].tolist() == [7, 8]
