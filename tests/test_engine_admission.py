"""Chunked prefill interleaved with decode (``DecodeEngine.begin_admit``, ``Admission``, the
scheduler's ``prefill_per_step``): a prompt admitted a chunk at a time while other slots step
gives the slot ``admit`` gives, bit for bit when the chunks fall where ``admit``'s do; the
steps between its chunks leave the reserved slot alone; bad input is refused.

The oracle is a twin engine that runs the same steps with the slot free and admits the prompt
whole afterwards: same buckets, same arithmetic, so every logit must match exactly."""

import copy

import pytest
import torch

from replaylab.model import HybridLM, preset
from replaylab.serving import STRATEGIES, DecodeEngine, Request, Scheduler
from replaylab.testing import DEVICE, kernel_sized

MODEL = HybridLM(preset("tiny"), seed=0).eval()
KERNEL_MODEL = kernel_sized(MODEL)  # the fused path's (on CPU: two heads of state 16)
DEVICE_MODEL = copy.deepcopy(KERNEL_MODEL).to(DEVICE)


def ids(n, seed):
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))


def engine(strategy, fused, chunk=5):
    model = DEVICE_MODEL if fused else MODEL
    kw = dict(use_kernels=fused, fused=fused, matmul="torch" if fused else None)
    return DecodeEngine(
        model, 3, 64, strategy, log_length=4, max_verify=3, prefill_chunk=chunk, **kw
    )


def setup(e):
    """Slots 0, 1, 2 admitted, slot 1 retired: the next admission takes slot 1, which every
    step of slots 0 and 2 covers (count 0)."""
    for i, n in enumerate((7, 4, 9)):
        e.admit(ids(n, i).to(e.device))
    e.retire(1)


def step_live(e, i, T=1):
    tokens = torch.stack([ids(T, 100 + i), ids(T, 200 + i)]).to(e.device)
    return e.step(tokens, check=False)


# the fused path through Triton's interpreter costs 8-23 s a strategy on CPU: there
# only replay's (its log and folds are where a parked slot could be touched); all on a GPU
FUSED = [(s, False) for s in STRATEGIES] + [
    (s, True) for s in (STRATEGIES if torch.cuda.is_available() else ("replay",))
]


@pytest.mark.parametrize("strategy, fused", FUSED)
def test_an_interleaved_admission_equals_a_whole_one_bit_for_bit(strategy, fused):
    prompt, slow = ids(23, 7), fused and not torch.cuda.is_available()
    n = 8 if slow else 5  # prefill chunk: the admission's chunks fall where admit's do
    a, b = engine(strategy, fused, chunk=n), engine(strategy, fused, chunk=n)
    setup(a)
    setup(b)
    adm = a.begin_admit(prompt)
    assert adm.slot == 1 and a.slots == [0, 2] and a.n_free == 0
    with pytest.raises(ValueError, match=r"1 prefilling"):
        a.admit(prompt)
    got, want = [], []
    i = 0
    while not adm.advance(n):
        T = 1 + i % 2  # decode and 2-token verify steps between the chunks
        got.append(step_live(a, i, T))
        want.append(step_live(b, i, T))
        if T > 1:
            a.rollback([1, 2])
            b.rollback([1, 2])
        i += 1
    assert i == -(-23 // n) - 1 and adm.done == 23 and a.slots == [0, 1, 2]
    slot, logits = b.admit(prompt)
    assert slot == 1 and torch.equal(adm.logits, logits)
    for j in range(3 if slow else 8):  # the three slots on together, across folds
        tokens = torch.stack([ids(1, 300 + j + s) for s in range(3)]).to(a.device)
        got.append(a.step(tokens, check=False))
        want.append(b.step(tokens, check=False))
    for n, (x, y) in enumerate(zip(got, want)):
        assert torch.equal(x, y), f"step {n}: max difference {float((x - y).abs().max()):.3g}"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_chunks_of_any_size_give_the_whole_prefill_within_rounding(strategy):
    """Chunks that fall elsewhere than ``admit``'s change only the scan's grouping: the
    prompt's logits and the next step's within 1e-5 of a whole prefill's."""
    prompt, tok = ids(19, 8), torch.tensor([[3]])
    for sizes in ((3, 7, 9), (1,) * 19, (18, 1)):
        whole, e = engine(strategy, False, chunk=64), engine(strategy, False, chunk=64)
        _, want = whole.admit(prompt)
        adm = e.begin_admit(prompt)
        for n in sizes:
            adm.advance(n)
        assert adm.finished
        torch.testing.assert_close(adm.logits, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            e.step(tok, check=False), whole.step(tok, check=False), atol=1e-5, rtol=1e-5
        )


def test_bad_input_to_an_admission_is_refused_with_the_slot_kept():
    e = engine("replay", False)
    setup(e)
    adm = e.begin_admit(ids(12, 3))
    for bad in (0, -2):
        with pytest.raises(ValueError, match=r"n: expected 1 <= n, got"):
            adm.advance(bad)
    for bad in (1.5, True, None):
        with pytest.raises(TypeError, match=r"n: expected an integer, got"):
            adm.advance(bad)
    with pytest.raises(ValueError, match=r"slots: .*1"):
        e.step(torch.zeros(1, 1, dtype=torch.long), slots=[1])
    with pytest.raises(ValueError, match=r"slot: 1 is not live"):
        e.retire(1)
    assert adm.advance(100)  # at most what remains
    assert adm.done == 12 and e.slots == [0, 1, 2]
    with pytest.raises(ValueError, match=r"already finished"):
        adm.advance(1)
    with pytest.raises(ValueError, match=r"finished; retire the slot instead"):
        adm.abort()
    e.retire(1)
    adm = e.begin_admit(ids(12, 4))
    adm.advance(5)
    adm.abort()
    assert e.n_free == 1 and e.slots == [0, 2]
    with pytest.raises(ValueError, match=r"already aborted"):
        adm.advance(1)
    assert e.admit(ids(6, 5))[0] == 1  # the slot is free again


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_scheduler_interleaving_prefill_serves_the_same_tokens(strategy):
    """Every request's tokens with interleaved prefill (4 prompt tokens per iteration) equal
    its tokens with whole prefills; iterations carry at most 4 prefill tokens, and decoding
    goes on while a prompt is prefilled."""
    reqs = lambda: [  # noqa: E731
        Request(i, ids(n, 50 + i), m, arrival=0.01 * i)
        for i, (n, m) in enumerate(((9, 6), (17, 5), (5, 8), (13, 4)))
    ]
    runs = {}
    for per_step in (None, 4):
        e = DecodeEngine(MODEL, 3, 40, strategy, log_length=4, max_verify=3)
        sched = Scheduler(e, prefill_per_step=per_step)
        finished = sched.run(reqs())
        runs[per_step] = {r.id: r.tokens for r in finished}
        assert all(r.admission is None for r in finished)  # no live slot's Admission kept
        if per_step:
            assert max(h.prefilled for h in sched.history) <= 4
            assert sum(h.prefilled for h in sched.history) == 9 + 17 + 5 + 13
            assert any(h.prefilled and h.running for h in sched.history)
            assert e.n_free == 3 and not sched.prefilling
    assert runs[None] == runs[4]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_interleaved_grants_keep_each_prompt_on_its_alone_chunk_grid(strategy):
    """With prefill_per_step (12) at least the engine's prefill_chunk (8), a prompt is advanced
    to a multiple of 8 or its end, so every chunk it is prefilled in starts where ``admit``
    alone would start one (a grant with no multiple of 8 in reach waits a step); without that,
    the second prompt's share of a step would start it off the grid. Its tokens equal those of
    whole prefills."""
    reqs = lambda: [Request(i, ids(n, 70 + i), 4) for i, n in enumerate((20, 30, 11))]  # noqa: E731
    runs = {}
    for per_step in (None, 12):
        e = DecodeEngine(MODEL, 3, 48, strategy, log_length=4, max_verify=3, prefill_chunk=8)
        starts, prefill = [], e._prefill

        def spy(slot, prompt, start=0, starts=starts, prefill=prefill, **kw):
            starts.append((slot, start, prompt.numel()))
            return prefill(slot, prompt, start=start, **kw)

        e._prefill = spy
        finished = Scheduler(e, prefill_per_step=per_step).run(reqs())
        runs[per_step] = {r.id: r.tokens for r in finished}
        assert all(start % 8 == 0 for _, start, _ in starts), starts
    assert any(start for _, start, _ in starts)  # prompts were split across steps
    assert runs[None] == runs[12]


def test_the_scheduler_refuses_a_prefill_chunk_under_one_token():
    """(Interleaving through a prefix cache is served: ``test_engine_prefix``.)"""
    e = DecodeEngine(MODEL, 2, 40, "replay", log_length=4)
    with pytest.raises(
        ValueError, match=r"prefill_per_step: expected 1 <= prefill_per_step, got 0"
    ):
        Scheduler(e, prefill_per_step=0)
