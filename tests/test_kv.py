"""The KV cache: append, truncate, fork (shared, not copied), reorder, against a plain list of
tensors kept per branch."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.kv import LayerKV


def plain_append(plain, k, v):
    return [
        (torch.cat([pk, k[i]], 1), torch.cat([pv, v[i]], 1)) for i, (pk, pv) in enumerate(plain)
    ]


ops = st.lists(
    st.tuples(st.sampled_from(["append", "truncate", "fork", "reorder"]), st.integers(0, 7)),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_any_sequence_of_operations_matches_per_branch_lists(program):
    H, D = 2, 3
    kv = LayerKV(batch=2, kv_heads=H, head_dim=D, block=4)
    plain = [(torch.zeros(H, 0, D), torch.zeros(H, 0, D)) for _ in range(2)]
    for op, arg in program:
        if op == "append":
            t = arg % 3 + 1
            k, v = torch.randn(kv.batch, H, t, D), torch.randn(kv.batch, H, t, D)
            kv.append(k, v)
            plain = plain_append(plain, k, v)
        elif op == "truncate":
            p = arg % (kv.length + 1)
            kv.truncate_to(p)
            plain = [(pk[:, :p], pv[:, :p]) for pk, pv in plain]
        elif op == "fork" and kv.batch <= 4:
            kv.fork(2)
            plain = [b for b in plain for _ in range(2)]
        elif op == "reorder":
            idx = torch.randint(0, kv.batch, (max(1, kv.batch - arg % 2),))
            kv.reorder(idx)
            plain = [plain[i] for i in idx.tolist()]
        k_all, v_all = kv.keys_values()
        assert kv.length == plain[0][0].shape[1]
        assert torch.equal(k_all, torch.stack([pk for pk, _ in plain]))
        assert torch.equal(v_all, torch.stack([pv for _, pv in plain]))


def test_fork_shares_the_prefix():
    kv = LayerKV(batch=1, kv_heads=1, head_dim=4, block=16)
    kv.append(torch.randn(1, 1, 16, 4), torch.randn(1, 1, 16, 4))
    before = kv.nbytes()
    kv.fork(8)
    assert kv.batch == 8 and kv.nbytes() == before  # eight branches, one stored prefix
    kv.append(torch.randn(8, 1, 1, 4), torch.randn(8, 1, 1, 4))
    assert kv.nbytes() == before + 8 * 2 * 16 * 4 * 4  # each branch's own block for new tokens


def test_errors_name_the_value_and_range():
    import pytest

    kv = LayerKV(batch=2, kv_heads=1, head_dim=2)
    kv.append(torch.randn(2, 1, 3, 2), torch.randn(2, 1, 3, 2))
    with pytest.raises(ValueError, match=r"0 <= position <= 3, got 5"):
        kv.truncate_to(5)
    with pytest.raises(ValueError, match=r"values in \[0, 2\), got \[0, 2\]"):
        kv.reorder([0, 2])
    with pytest.raises(ValueError, match=r"k: expected shape \(2, 1, t, 2\), got \(3, 1, 1, 2\)"):
        kv.append(torch.randn(3, 1, 1, 2), torch.randn(3, 1, 1, 2))
    assert kv.length == 3
