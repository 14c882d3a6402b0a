"""Speculation rounds on the device (``serving.device_rounds``): every part of a round is a
tensor operation on the engine's device and the host reads the progress a round late. The
tokens equal the engine's own greedy ones, the slot table the rounds hand back continues
greedily, and bad input is refused before the first step. On CPU the replay kernels run
through Triton's interpreter; the GPU run covers more rings, paths and batches."""

import dataclasses

import pytest
import torch

from replaylab.bench.serve import greedy_ragged
from replaylab.model import HybridLM, preset
from replaylab.serving import BatchPromptLookupDrafter, BatchSyntheticDrafter, DecodeEngine

# one Mamba-2 layer of two small heads: the interpreter's time per launch grows with the heads
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dataclasses.replace(preset("tiny"), pattern="M*-", ssm_heads=2, d_state=16)
MODEL = HybridLM(SMALL, seed=0).eval().to(DEVICE)
PROMPTS = [torch.tensor(p) for p in ([3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9])]
N_NEW, K, L = 9, 3, 4


def kernel_engine(**kw):
    return DecodeEngine(MODEL, 4, 48, "replay", log_length=L, max_verify=K + 1,
                        use_kernels=True, **kw)  # fmt: skip


def fresh(engine, prompts):
    """Retire every slot, admit ``prompts`` again: their first tokens (S, 1)."""
    for s in engine.slots:
        engine.retire(s)
    return torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]


@torch.no_grad()
def test_device_rounds_give_the_greedy_tokens_and_hand_back_a_cursor_that_continues_greedily():
    engine = kernel_engine()
    extra = N_NEW + K + 3  # past what a round can overshoot, and two steps more
    refs, _ = greedy_ragged(engine, PROMPTS, extra)
    pending = fresh(engine, PROMPTS)
    full = [torch.cat([p, r]) for p, r in zip(PROMPTS, refs)]
    drafter = BatchSyntheticDrafter(full, 0.7, seed=1)
    tokens, proposed, accepted = engine.speculate_batch(
        PROMPTS, pending, N_NEW, drafter, k=K, on_device=True
    )
    assert all(torch.equal(t, r[:N_NEW]) for t, r in zip(tokens, refs))
    assert 0 < sum(accepted) < sum(proposed)  # some drafts kept, some rolled back
    assert engine.stats.rollbacks > 0 and engine.stats.folds > 0
    # the host's slot table after the rounds: each slot holds its prompt and some of its
    # greedy tokens, and decoding from there gives the next ones
    held = [engine.pos[s] - p.numel() for s, p in zip(engine.slots, PROMPTS)]
    assert all(N_NEW - 1 <= h <= N_NEW - 1 + K for h in held)
    assert all(engine.log_len[s] <= engine.table.capacity for s in engine.slots)
    tok = torch.stack([r[h] for r, h in zip(refs, held)])[:, None]
    for j in range(2):
        tok = engine.step(tok)[:, -1].argmax(-1, keepdim=True)
        assert tok.flatten().tolist() == [int(r[h + 1 + j]) for r, h in zip(refs, held)]


class Patterned:
    """A drafter with no randomness, the same on the host and the device: the reference's
    next k tokens with draft ``length % (k + 1)`` wrong (none when that is k), so rounds keep
    1 .. k + 1 tokens by a pattern the host round and the device round share."""

    def __init__(self, references):
        self.reference = torch.nn.utils.rnn.pad_sequence(references, batch_first=True)

    def _drafts(self, reference, lengths, k, vocab_size):
        steps = torch.arange(k, device=lengths.device)
        at = (lengths[:, None] + steps).clamp(max=reference.shape[1] - 1)
        true = reference.to(lengths.device).gather(1, at)
        wrong = steps == (lengths % (k + 1))[:, None]
        return torch.where(wrong, (true + 1) % vocab_size, true)

    def propose_batch(self, contexts, lengths, rows, k, vocab_size):
        return self._drafts(self.reference[rows], lengths, k, vocab_size)

    def propose_on_device(self, contexts, lengths, k, vocab_size):
        return self._drafts(self.reference[: lengths.numel()], lengths, k, vocab_size)


@torch.no_grad()
@pytest.mark.parametrize("capacity", [None, L + K])
@pytest.mark.parametrize("fused", [False, True])
def test_device_rounds_leave_the_engine_as_the_host_rounds_do(capacity, fused):
    """The same drafts through the host's rounds and the device's: the same tokens and
    counts, the same slot table, and every recurrent pool's state, window and log ring
    equal bit for bit (capacity L + k: verifies that pass the fold grid)."""
    if DEVICE == "cpu" and (capacity or fused):
        pytest.skip("CI time: 20 s and more through the interpreter; all run on a GPU")
    runs = []
    for on_device in (False, True):
        engine = kernel_engine(log_capacity=capacity, fused=fused)
        refs, _ = greedy_ragged(engine, PROMPTS, N_NEW + K)
        pending = fresh(engine, PROMPTS)
        drafter = Patterned([torch.cat([p, r]) for p, r in zip(PROMPTS, refs)])
        out = engine.speculate_batch(PROMPTS, pending, N_NEW, drafter, K, on_device=on_device)
        runs.append((engine, out))
        assert all(torch.equal(t, r[:N_NEW]) for t, r in zip(out[0], refs))
    (host, (_, *counts)), (device, (_, *device_counts)) = runs
    assert counts == device_counts and 0 < sum(counts[1]) < sum(counts[0])
    for name in ("pos", "log_len", "head", "last"):
        assert getattr(host, name) == getattr(device, name), name
    assert host.stats.rollbacks == device.stats.rollbacks > 0
    assert host.stats.folds == device.stats.folds > 0
    for layer, pool in host.ssm.items():
        other = device.ssm[layer]
        for name, a, b in (("state", pool.state, other.state), ("conv", pool.conv, other.conv),
                           *((f"log {f}", v, other.log[f]) for f, v in pool.log.items())):  # fmt: skip
            assert torch.equal(a, b), f"layer {layer}: {name}"


def test_device_rounds_refuse_what_they_cannot_serve_before_any_step():
    engine = kernel_engine()
    pending = fresh(engine, PROMPTS)
    steps, pos = engine.stats.steps, list(engine.pos)
    drafter = BatchSyntheticDrafter([torch.arange(40)] * 3, 0.5)
    with pytest.raises(TypeError, match="propose_on_device"):
        engine.speculate_batch(PROMPTS, pending, 5, BatchPromptLookupDrafter(), 2, on_device=True)
    with pytest.raises(ValueError, match="on_device: expected True or False, got 'yes'"):
        engine.speculate_batch(PROMPTS, pending, 5, drafter, 2, on_device="yes")

    class Wild(BatchSyntheticDrafter):
        def propose_on_device(self, contexts, lengths, k, vocab_size):
            return super().propose_on_device(contexts, lengths, k, vocab_size) + vocab_size

    with pytest.raises(ValueError, match=r"token id \d+ at index 0 is outside the vocabulary"):
        engine.speculate_batch(PROMPTS, pending, 5, Wild([torch.arange(40)] * 3, 1.0),
                               k=2, on_device=True)  # fmt: skip
    assert engine.stats.steps == steps and list(engine.pos) == pos
    for strategy in ("snapshot", "recompute"):
        other = DecodeEngine(MODEL, 4, 48, strategy)
        first = fresh(other, PROMPTS)
        with pytest.raises(ValueError, match=f"need strategy='replay'.*runs '{strategy}'"):
            other.speculate_batch(PROMPTS, first, 5, drafter, 2, on_device=True)
    plain = DecodeEngine(MODEL, 4, 48, "replay", use_kernels=False)
    first = fresh(plain, PROMPTS)
    with pytest.raises(ValueError, match="use_kernels=False"):
        plain.speculate_batch(PROMPTS, first, 5, drafter, 2, on_device=True)


def test_the_device_synthetic_drafter_follows_its_references():
    refs = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([1, 2, 3])]
    lengths = torch.tensor([2, 1])
    contexts = torch.zeros(2, 4, dtype=torch.long)
    sure = BatchSyntheticDrafter(refs, 1.0).propose_on_device(contexts, lengths, 4, 10)
    assert sure.tolist() == [[7, 8, 9, 0], [2, 3, 0, 0]]  # 0 past a reference's end
    never = BatchSyntheticDrafter(refs, 0.0).propose_on_device(contexts, lengths, 4, 10)
    assert never.tolist() == [[8, 9, 0, 1], [3, 4, 1, 1]]
    drafter = BatchSyntheticDrafter([torch.arange(400)], 0.7, seed=3)
    right = [
        drafter.propose_on_device(contexts[:1], torch.tensor([t]), 4, 1000)
        == torch.arange(t, t + 4)
        for t in range(300)
    ]
    assert 0.65 < torch.cat(right).float().mean() < 0.75  # 1,200 draws at acceptance 0.7
    with pytest.raises(ValueError, match="3 sequences, this drafter holds 2 references"):
        BatchSyntheticDrafter(refs, 0.5).propose_on_device(contexts, torch.tensor([1, 1, 1]), 2, 10)
