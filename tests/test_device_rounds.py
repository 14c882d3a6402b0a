"""Speculation rounds on the device (``serving.device_rounds``): every part of a round is a
tensor operation on the engine's device and the host reads the progress a round late. With the
same drafts, host rounds and device rounds leave the engine alike, bit for bit; the tokens
equal the engine's own greedy ones; a draft outside the vocabulary is refused with the rounds
run kept and a cursor that continues greedily; other bad input is refused before any step. On
CPU the replay kernels run through Triton's interpreter; the GPU run covers the other rings
and the fused path."""

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
OTHER = torch.tensor([7, 7, 2])  # a live sequence left out of the speculation
N_NEW, K, L = 9, 3, 4


def kernel_engine(**kw):
    return DecodeEngine(MODEL, 4, 48, "replay", log_length=L, max_verify=K + 1,
                        use_kernels=True, **kw)  # fmt: skip


def fresh(engine, prompts):
    """Retire every slot, admit ``prompts`` again: their first tokens (S, 1)."""
    for s in engine.slots:
        engine.retire(s)
    return torch.stack([engine.admit(p)[1].argmax() for p in prompts])[:, None]


def references(prompts, refs):
    return [torch.cat([p, r.cpu()]) for p, r in zip(prompts, refs)]


class Patterned:
    """A drafter with no randomness, the same on the host and the device: the reference's
    next k tokens with draft ``length % (k + 1)`` wrong (none when that is k), so rounds keep
    1 .. k + 1 tokens by a pattern the host round and the device round share."""

    def __init__(self, refs):
        self.reference = torch.nn.utils.rnn.pad_sequence(refs, batch_first=True)

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


def spread_out(engine, prompts=PROMPTS):
    """``prompts`` (three) in slots 3, 0 and 2 (in that order), OTHER live in slot 1 and left
    out: (slots, the first tokens (S, 1), the greedy tokens of each prompt)."""
    refs, _ = greedy_ragged(engine, prompts, N_NEW + K)
    for s in engine.slots:
        engine.retire(s)
    order = [prompts[1], OTHER, prompts[2], prompts[0]]  # admitted into slots 0 .. 3
    first = [engine.admit(p)[1].argmax() for p in order]
    return [3, 0, 2], torch.stack([first[3], first[0], first[2]])[:, None], refs


@torch.no_grad()
@pytest.mark.parametrize("capacity", [None, L + K])
@pytest.mark.parametrize("fused", [False, True])
def test_device_rounds_leave_the_engine_as_the_host_rounds_do(capacity, fused):
    """The same drafts through the host's rounds and the device's, for three of four live
    slots out of order: the same tokens (the greedy ones) and counts, the same slot table
    and stats, and every recurrent pool's state, window and log ring equal bit for bit
    (capacity L + k: verifies that pass the fold grid)."""
    if DEVICE == "cpu" and (capacity or fused):
        pytest.skip("CI time: 20 s and more through the interpreter; all run on a GPU")
    runs = []
    for on_device in (False, True):
        engine = kernel_engine(log_capacity=capacity, fused=fused)
        slots, pending, refs = spread_out(engine)
        drafter = Patterned(references(PROMPTS, refs))
        out = engine.speculate_batch(
            PROMPTS, pending, N_NEW, drafter, K, slots=slots, on_device=on_device
        )
        runs.append((engine, out))
        assert all(torch.equal(t.cpu(), r[:N_NEW].cpu()) for t, r in zip(out[0], refs))
    (host, (_, *counts)), (device, (_, *device_counts)) = runs
    assert counts == device_counts and 0 < sum(counts[1]) < sum(counts[0])
    for name in ("pos", "log_len", "head", "last"):
        assert getattr(host, name) == getattr(device, name), name
    for name in ("steps", "verify_steps", "folds", "rollbacks"):
        assert getattr(host.stats, name) == getattr(device.stats, name), name
    assert device.stats.rollbacks > 0 and device.stats.folds > 0
    for layer, pool in host.ssm.items():
        other = device.ssm[layer]
        for name, a, b in (("state", pool.state, other.state), ("conv", pool.conv, other.conv),
                           *((f"log {f}", v, other.log[f]) for f, v in pool.log.items())):  # fmt: skip
            assert torch.equal(a, b), f"layer {layer}: {name}"


class BadLater(BatchSyntheticDrafter):
    """The synthetic drafter, but sequence 1's third draft is outside the vocabulary once
    its context holds 8 tokens or more."""

    def propose_on_device(self, contexts, lengths, k, vocab_size):
        drafts = super().propose_on_device(contexts, lengths, k, vocab_size)
        drafts[1, 2] = torch.where(lengths[1] >= 8, vocab_size + 5, drafts[1, 2])
        return drafts


@torch.no_grad()
def test_a_draft_outside_the_vocabulary_later_is_refused_with_the_rounds_run_kept():
    """A later round's bad id cannot be checked without waiting for the device: it is
    verified as id 0 (a wrong draft), and the call raises once it reads that round, naming
    the slot, the id and the round; the slot table holds every round run, and decoding from
    it gives the greedy tokens."""
    engine = kernel_engine()
    refs, _ = greedy_ragged(engine, PROMPTS, N_NEW + K + 3)
    pending = fresh(engine, PROMPTS)
    drafter = BadLater(references(PROMPTS, refs), 0.7, seed=1)
    with pytest.raises(ValueError, match=r"drafts of slot 1 \(sequence 1\): token id 133 at "
                       r"index 2 in round \d is outside the vocabulary \[0, 128\)"):  # fmt: skip
        engine.speculate_batch(PROMPTS, pending, N_NEW, drafter, k=K, on_device=True)
    assert engine.stats.steps > 0 and engine.stats.rollbacks > 0
    held = [engine.pos[s] - p.numel() for s, p in zip(engine.slots, PROMPTS)]
    tok = torch.stack([r[h] for r, h in zip(refs, held)])[:, None]
    for j in range(2):
        tok = engine.step(tok)[:, -1].argmax(-1, keepdim=True)
        assert tok.flatten().tolist() == [int(r[h + 1 + j]) for r, h in zip(refs, held)]


@torch.no_grad()
def test_device_rounds_with_no_drafts_or_no_round_match_the_host():
    """k = 0 (every round one token) and n_new = 1 (no round, the last step stays rollable):
    the host's and the device's tokens, counts, positions, last steps and step counts alike."""
    for k, n_new in ((0, 4), (2, 1)):
        runs = []
        for on_device in (False, True):
            engine = kernel_engine()
            pending = fresh(engine, PROMPTS)
            if n_new == 1:
                pending = engine.step(pending)[:, -1].argmax(-1, keepdim=True)
            drafter = Patterned(PROMPTS)
            out = engine.speculate_batch(PROMPTS, pending, n_new, drafter, k, on_device=on_device)
            runs.append((out, [list(engine.pos), list(engine.last), engine.stats.steps]))
        (host, host_table), (device, device_table) = runs
        assert all(torch.equal(a, b) for a, b in zip(host[0], device[0])), (k, n_new)
        assert host[1:] == device[1:] and host_table == device_table, (k, n_new)


def test_device_rounds_refuse_what_they_cannot_serve_before_any_step():
    engine = kernel_engine()
    pending = fresh(engine, PROMPTS)
    steps, pos = engine.stats.steps, list(engine.pos)
    drafter = BatchSyntheticDrafter([torch.arange(40)] * 3, 0.5)

    class HostOnly:  # a batched drafter without propose_on_device
        def propose_batch(self, contexts, lengths, rows, k, vocab_size):
            return contexts[:, :k]

    with pytest.raises(TypeError, match="propose_on_device"):
        engine.speculate_batch(PROMPTS, pending, 5, HostOnly(), 2, on_device=True)
    with pytest.raises(ValueError, match="on_device: expected True or False, got 'yes'"):
        engine.speculate_batch(PROMPTS, pending, 5, drafter, 2, on_device="yes")

    class Wrong(BatchSyntheticDrafter):
        def __init__(self, value):
            super().__init__([torch.arange(40)] * 3, 1.0)
            self.value = value

        def propose_on_device(self, contexts, lengths, k, vocab_size):
            return self.value

    for value, error, match in (
        (torch.zeros(3, 3, dtype=torch.long), ValueError, r"shape \(sequences=3, k=2\), got"),
        (torch.zeros(3, 2), TypeError, "got dtype torch.float32"),
        (torch.zeros(3, 2, dtype=torch.bool), TypeError, "got dtype torch.bool"),
    ):
        with pytest.raises(error, match=match):
            engine.speculate_batch(PROMPTS, pending, 5, Wrong(value), 2, on_device=True)
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
    drafter = BatchSyntheticDrafter([torch.arange(1300)], 0.7, seed=3)
    right = [  # positions 4t .. 4t + 3: 1,200 draws, none drawn twice
        drafter.propose_on_device(contexts[:1], torch.tensor([4 * t]), 4, 1000)
        == torch.arange(4 * t, 4 * t + 4)
        for t in range(300)
    ]
    assert 0.65 < torch.cat(right).float().mean() < 0.75  # 1,200 draws at acceptance 0.7
    # the draws are keyed by (seed, sequence, position): on the engine's device the host's
    # drafts, whatever the calls before, for the sequences of ``rows`` in any order
    drafter = BatchSyntheticDrafter([torch.arange(400)] * 3, 0.5, seed=4)
    lengths = torch.tensor([7, 31, 200])
    drafter.propose_on_device(None, torch.tensor([3, 9, 27], device=DEVICE), 6, 1000)
    device = drafter.propose_on_device(None, lengths.to(DEVICE), 6, 1000).cpu()
    drafter.propose_batch(None, lengths, torch.arange(3), 2, 1000)
    host = drafter.propose_batch(None, lengths.flip(0), torch.tensor([2, 1, 0]), 6, 1000)
    assert (
        torch.equal(device, host.flip(0))
        and 0 < (device != lengths[:, None] + torch.arange(6)).sum() < 18
    )
    with pytest.raises(ValueError, match="3 sequences, this drafter holds 2 references"):
        BatchSyntheticDrafter(refs, 0.5).propose_on_device(contexts, torch.tensor([1, 1, 1]), 2, 10)


def test_the_batched_synthetic_drafter_names_bad_arguments():
    refs = [torch.arange(6), torch.arange(4)]
    for args, error, match in (
        ((refs, "0.5"), TypeError, r"acceptance: expected a number, got str '0.5'"),
        ((refs, None), TypeError, r"acceptance: expected a number, got NoneType"),
        ((refs, 1.5), ValueError, r"acceptance: expected a finite number >= 0 and <= 1"),
        ((refs, float("nan")), ValueError, r"acceptance: expected .* got nan"),
        (([[1, 2, 3]], 0.5), TypeError, r"references\[0\]: expected a tensor of token ids"),
        # float references were truncated to ids
        (([torch.tensor([1.7, 2.2])], 0.5), TypeError, r"references\[0\]: .* dtype torch.float32"),
    ):
        with pytest.raises(error, match=match):
            BatchSyntheticDrafter(*args)
    drafter = BatchSyntheticDrafter(refs, 0.5)
    rows = torch.arange(2)
    with pytest.raises(ValueError, match=r"k: expected 0 <= k, got -1"):
        drafter.propose_batch(None, torch.tensor([1, 1]), rows, -1, 10)
    with pytest.raises(ValueError, match=r"lengths: row 1 holds -2 tokens: expected >= 0"):
        drafter.propose_batch(None, torch.tensor([1, -2]), rows, 2, 10)


@torch.no_grad()
def test_prompt_lookup_drafts_on_the_device_from_the_contexts_the_rounds_keep():
    """Prompt lookup reads each sequence's context, which the device's rounds keep on the
    device (prompt, then every kept token): with the same drafter the host's rounds and the
    device's draft alike, so they give the same tokens (the greedy ones), the same counts and
    the same stats; some drafts are taken and some are not."""
    # this model's greedy tokens repeat n-grams of these prompts (found by trying prompts
    # around its recurring run 81 46 15 112 6 116 117), so lookup's drafts are sometimes right
    prompts = [torch.tensor(p) for p in ([81, 46, 15, 112, 6, 116, 117, 9, 81, 46, 15],
                                         [46, 15, 112, 6, 116, 117, 70, 112, 81, 46], [9, 2, 6])]  # fmt: skip
    runs = []
    for on_device in (False, True):
        engine = kernel_engine()
        slots, pending, refs = spread_out(engine, prompts)
        out = engine.speculate_batch(
            prompts, pending, N_NEW, BatchPromptLookupDrafter(), K, slots=slots,
            on_device=on_device,
        )  # fmt: skip
        assert all(torch.equal(t.cpu(), r[:N_NEW].cpu()) for t, r in zip(out[0], refs))
        runs.append((out[1:], engine.stats.steps, engine.stats.rollbacks, engine.pos))
    assert runs[0] == runs[1]
    proposed, accepted = runs[0][0]
    assert 0 < sum(accepted) < sum(proposed), runs[0]
