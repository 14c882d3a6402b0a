"""A fourth serving strategy touches one new module and the registry, nothing else (issue 35):
a toy strategy, defined here as a contributor would in ``replaylab/serving/strategies/``,
registers itself, serves a ragged program of admit / step / rollback / retire on the engine's
reference path, and gives the teaching cache's logits; then it is unregistered.

The toy is a snapshot variant that copies the whole state of every slot of the bucket after
each token of every step, decode steps included (snapshot keeps them for verifies only).

Oracle: a fresh teaching-cache prefill of the slot's whole sequence, to 2e-4 as in
``test_engine``."""

import random

import pytest
import torch

from replaylab.cache import CacheConfig
from replaylab.model import HybridLM, preset
from replaylab.serving import STRATEGIES, DecodeEngine
from replaylab.serving.strategies import REGISTRY, EngineStrategy, register, unregister

MODEL = HybridLM(preset("tiny"), seed=0).eval()
VOCAB = MODEL.cfg.vocab_size
TOL = 2e-4


class EngineCopyEveryStep(EngineStrategy):
    """Keeps ``copies`` (slots, T_max, *state_shape): the state after each token of the last
    step, written at every step; a rollback copies one back, and the window from
    ``draft_conv``."""

    name = "copy_every_step"
    store = "snapshot"  # the teaching strategy whose outputs it reproduces

    @classmethod
    def allocate(cls, pool, zeros, slots, capacity, max_verify, fused):
        pool.copies = zeros(slots, max_verify, *pool.spec.state_shape, dt=torch.float32)

    def keep_states(self, pool, states, bucket, T):
        pool.copies[:bucket, :T].copy_(states)

    def draft_states(self, pool, T):
        return pool.copies

    def rollback_pool(self, pool, index, kept):
        pool.conv[index] = pool.draft_conv[index, kept]
        pool.state[index] = pool.copies[index, kept]


@pytest.fixture
def toy():
    register(EngineCopyEveryStep)
    try:
        yield EngineCopyEveryStep.name
    finally:
        unregister(EngineCopyEveryStep.name)


@torch.no_grad()
def prefill_logits(tokens):
    """Logits (T, vocab) of a fresh teaching snapshot cache's prefill of ``tokens``."""
    cache = CacheConfig("snapshot").build(MODEL, 1)
    return MODEL(torch.tensor([tokens]), cache)[0]


@torch.no_grad()
def test_a_registered_toy_strategy_serves_a_ragged_program(toy):
    assert toy in REGISTRY and toy not in STRATEGIES  # the built-in list is unchanged
    engine = DecodeEngine(MODEL, 3, 40, toy, max_verify=4)
    assert isinstance(engine.policy, EngineCopyEveryStep)
    assert all(hasattr(p, "copies") for p in engine.ssm.values())
    rng, seqs, steps = random.Random(7), {}, 0
    for i in range(40):
        live = engine.slots
        op = (
            "admit"
            if i < 2
            else rng.choice(["admit", "step", "step", "step", "rollback", "retire"])
        )
        if op == "admit" and len(live) < 3:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 7))]
            slot, logits = engine.admit(torch.tensor(prompt))
            seqs[slot] = prompt
            torch.testing.assert_close(logits, prefill_logits(prompt)[-1], atol=TOL, rtol=TOL)
        elif op == "retire" and len(live) > 1:
            slot = rng.choice(live)
            engine.retire(slot)
            del seqs[slot]
        elif op == "rollback" and (rolled := [s for s in live if engine.last[s] > 1]):
            keep = [rng.randint(1, engine.last[s]) for s in rolled]
            for s, k in zip(rolled, keep):
                del seqs[s][len(seqs[s]) - engine.last[s] + k :]
            engine.rollback(keep, slots=rolled)
            assert all(engine.pos[s] == len(seqs[s]) for s in rolled)
        elif live:
            chosen = [s for s in live if rng.random() < 0.7] or live[:1]
            T = rng.randint(1, 4)
            room = [min(T, 40 - engine.pos[s]) for s in chosen]
            if min(room) < 1:
                continue
            counts = [rng.randint(1, r) for r in room]
            tokens = [[rng.randrange(VOCAB) for _ in range(T)] for _ in chosen]
            logits = engine.step(torch.tensor(tokens), counts, slots=chosen)
            steps += 1
            for j, (s, c) in enumerate(zip(chosen, counts)):
                seqs[s] += tokens[j][:c]
                want = prefill_logits(seqs[s])[-c:]
                torch.testing.assert_close(logits[j, :c], want, atol=TOL, rtol=TOL)
    assert steps >= 10 and engine.stats.rollbacks > 0


def test_unregistered_the_toy_is_refused():
    assert "copy_every_step" not in REGISTRY
    with pytest.raises(ValueError, match=r"strategy: expected one of \('snapshot', 'recompute'"):
        DecodeEngine(MODEL, 1, 8, "copy_every_step")
