"""Each round's k chosen by its measured rate (``serving.adaptive_k``): the choice against the
rate computed by hand, the acceptance estimate against the law it samples, and the scheduler's
tokens equal to greedy whatever k each round drafts."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest
import torch

from replaylab.bench.spec_steady import PromptKeyedDrafter
from replaylab.costmodel import expected_accepted, tokens_per_round
from replaylab.decoding import SyntheticDrafter, greedy
from replaylab.serving import (
    STRATEGIES,
    AdaptiveK,
    BatchModelDrafter,
    DecodeEngine,
    Request,
    Scheduler,
)
from replaylab.serving.adaptive_k import best_k
from replaylab.testing import perturbed, tiny_hybrid

MODEL = tiny_hybrid()
VOCAB = MODEL.cfg.vocab_size


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 0.999])
@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_a_rounds_expected_tokens_are_the_mean_of_a_geometric_run_of_accepted_drafts(a, k):
    closed = (1 - a ** (k + 1)) / (1 - a)
    assert 1 + expected_accepted(k, a) == pytest.approx(closed, rel=1e-12)
    rng = random.Random(k)  # the kept tokens of simulated rounds: 1 + the leading right drafts
    kept = []
    for _ in range(20_000):
        right = 0
        while right < k and rng.random() < a:
            right += 1
        kept.append(1 + right)
    assert sum(kept) / len(kept) == pytest.approx(closed, rel=0.02)


def test_best_k_takes_the_most_drafts_where_bytes_bind_and_none_where_flops_do():
    flat = [1.0] * 5  # a verify costs what a step does
    assert best_k(0.6, flat) == 4 and best_k(0.0, flat) == 0  # no drafts right: ties go to 0
    proportional = [1.0 * (k + 1) for k in range(5)]  # a verify of T rows costs T steps
    assert best_k(0.9, proportional) == 0
    # in between, the rate by hand: k = 2 keeps 1 + .7 + .49 = 2.19 tokens in 1.5 s (1.46/s)
    # against 1.7 / 1.2 (1.42), 2.533 / 1.9 (1.33), 1 / 1 and 2.77 / 2.4
    assert best_k(0.7, [1.0, 1.2, 1.5, 1.9, 2.4]) == 2


def _round(policy, bucket, seconds_of, a, rng, S=16):
    """A simulated round at ``bucket``: each sequence's drafts right with probability ``a``
    given the earlier ones; returns the k chosen."""
    k = policy.choose(bucket)
    proposed, accepted = [k] * S, []
    for _ in range(S):
        right = 0
        while right < k and rng.random() < a:
            right += 1
        accepted.append(right)
    policy.observe(bucket, k + 1, seconds_of(k + 1), proposed, accepted)
    return k


def test_adaptive_k_tries_every_width_then_settles_on_the_best_rate_per_bucket():
    policy, rng = AdaptiveK(4, refresh_every=16), random.Random(0)
    small = lambda T: 1.0 + 0.05 * T  # noqa: E731  bytes bind: drafts nearly free
    large = lambda T: 0.2 + 1.0 * T  # noqa: E731  FLOPs bind: a row costs a step
    first = [_round(policy, 8, small, 0.8, rng) for _ in range(10)]
    # each width twice, the largest k first (a first round is left out: a graph's capture)
    assert first == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    settled = [_round(policy, 8, small, 0.8, rng) for _ in range(30)]
    # the bucket's rounds 10 .. 39: the best (k = 4) but for rounds 15 and 31, which re-time
    # the widths timed longest ago, in turn
    assert [k for i, k in enumerate(settled, 10) if i not in (15, 31)] == [4] * 28
    assert (settled[5], settled[21]) == (3, 2)
    assert policy.acceptance == pytest.approx(0.8, abs=0.06)
    times = [statistics.median(policy.times[8, k + 1]) for k in range(5)]
    assert policy.round_seconds(8) == times and settled[-1] == best_k(policy.acceptance, times)
    # a second bucket is measured on its own; there a verify costs what its rows do
    explored = [_round(policy, 128, large, 0.8, rng) for _ in range(10)]
    assert explored == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    later = [_round(policy, 128, large, 0.8, rng) for _ in range(32)]
    # plain decode wins there; the re-timed rounds keep the acceptance measured too
    assert later.count(0) == 30 and (later[5], later[21]) == (4, 3)
    assert _round(policy, 8, small, 0.8, rng) == 4  # and the first bucket keeps its own


def test_a_first_round_is_left_out_and_the_median_stands_for_the_rest():
    policy = AdaptiveK(1, samples=3)
    policy.observe(8, 2, 50.0, [1], [1])  # a capture: left out
    policy.observe(8, 1, 9.0)  # also the first of its width
    assert policy.round_seconds(8) == [None, None] and policy.choose(8) == 1
    for seconds in (1.0, 7.0, 2.0, 3.0):  # the last three count
        policy.observe(8, 2, seconds, [1], [0])
    policy.observe(8, 1, 2.5)
    assert policy.round_seconds(8) == [2.5, 3.0]


def test_the_tokens_a_round_keeps_can_follow_the_fold_grid():
    # replay with a ring of L rows clips rounds near a fold: fewer tokens than 1 + a + .. + a^k
    clipped = lambda k, a: tokens_per_round(k, a, 5)  # noqa: E731
    assert clipped(4, 0.8) < 1 + expected_accepted(4, 0.8)
    times = [1.0, 1.0, 1.1, 1.25, 1.6]
    assert best_k(0.8, times) == 3 and best_k(0.8, times, clipped) == 2
    assert best_k(0.8, times, clipped) == max(range(5), key=lambda k: clipped(k, 0.8) / times[k])


def test_bad_settings_and_observations_are_refused_by_name():
    for kwargs, match in [
        (dict(k_max=0), "k_max"),
        (dict(k_max=2, samples=0), "samples"),
        (dict(k_max=2, samples=2, samples_needed=3), "samples_needed"),
        (dict(k_max=2, decay=0.0), r"decay: expected a finite number > 0 and <= 1, got 0"),
        (dict(k_max=2, refresh_every=1), "refresh_every"),
    ]:
        with pytest.raises(ValueError, match=match):
            AdaptiveK(**kwargs)
    for decay in ("x", True):
        with pytest.raises(TypeError, match=r"decay: expected a number, got"):
            AdaptiveK(2, decay=decay)
    assert AdaptiveK(2, decay=np.float32(0.5)).decay == 0.5  # refused as "not in (0, 1]" before
    for seconds in ([], [1.0, 0.0], [1.0, -2.0], [float("nan")], [float("inf")], [True]):
        with pytest.raises(ValueError, match="seconds: expected one finite time > 0"):
            best_k(0.5, seconds)
    policy = AdaptiveK(2)
    for args, match in [
        ((8, 4, 1.0), "T: expected 1 <= T <= 3, got 4"),
        ((8, 2, 0.0), "seconds"),
        ((8, 2, 1.0, [1, 1], [1]), "one of each per sequence, got 2 and 1"),
        ((8, 2, 1.0, [1], [2]), r"accepted\[0\]: expected 0 <= accepted\[0\] <= 1, got 2"),
        ((8, 3, 1.0, [1], [2]), r"accepted\[0\]: expected 0 <= accepted\[0\] <= 1, got 2"),
        ((8, 3, 1.0, [1, 3], [0, 0]), r"proposed\[1\]: expected 0 <= proposed\[1\] <= 2, got 3"),
        ((8, 2, True), "seconds: expected a finite time > 0, got True"),
    ]:
        with pytest.raises(ValueError, match=match):
            policy.observe(*args)
    assert not policy.times and not policy.rounds and policy.acceptance == 0.5  # unchanged
    engine = DecodeEngine(MODEL, 2, 24, "replay", log_length=4, max_verify=4)
    with pytest.raises(ValueError, match="adaptive_k.*k=0"):
        Scheduler(engine, k=0, adaptive_k=True)
    with pytest.raises(ValueError, match="k_max=2 must equal the scheduler's k=3"):
        Scheduler(engine, k=3, adaptive_k=AdaptiveK(2))
    with pytest.raises(TypeError, match="adaptive_k"):
        Scheduler(engine, k=3, adaptive_k="yes")
    with pytest.raises(TypeError, match="tokens: for_engine chooses E"):
        AdaptiveK.for_engine(engine, 3, tokens=lambda k, a: 1.0)


class Wrong(AdaptiveK):
    def choose(self, bucket):
        return self.k_max + 1


def test_a_policy_choosing_a_k_out_of_range_is_named_before_the_round_runs():
    engine = DecodeEngine(MODEL, 2, 24, "replay", log_length=4, max_verify=4)
    drafter = PromptKeyedDrafter(PROMPTS[:2], REFERENCES[:2], 0.7)
    sched = Scheduler(engine, k=2, drafter=drafter, adaptive_k=Wrong(2))
    sched.add(Request(0, PROMPTS[0], 5))
    with pytest.raises(ValueError, match="adaptive_k: the round's k: expected 0 <= .* <= 2, got 3"):
        sched.step()
    assert engine.stats.verify_steps == 0  # no round ran


class Scripted(AdaptiveK):
    """Rounds of the k in ``script``, in turn (what a policy might pick, made to vary)."""

    def __init__(self, k_max, script):
        super().__init__(k_max)
        self.script, self.chosen = list(script), []

    def choose(self, bucket):
        k = self.script[len(self.chosen) % len(self.script)]
        self.chosen.append(k)
        return k


def _workload(n=7, seed=3):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(2, 10, (1,), generator=g)),)) for _ in range(n)]  # fmt: skip
    outs = [int(torch.randint(3, 14, (1,), generator=g)) for _ in range(n)]
    alone = [greedy(MODEL, p[None], m, "snapshot").tokens[0] for p, m in zip(prompts, outs)]
    return prompts, outs, alone


PROMPTS, OUTS, ALONE = _workload()
REFERENCES = [torch.cat([p, a]) for p, a in zip(PROMPTS, ALONE)]  # rows found by their prompt


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("policy", ["scripted", "measured"])
@pytest.mark.parametrize("drafting", ["batched", "per request"])
def test_a_scheduler_choosing_k_each_round_keeps_every_requests_greedy_tokens(
    strategy, policy, drafting
):
    engine = DecodeEngine(MODEL, 3, 30, strategy, log_length=5, max_verify=4)
    batched = drafting == "batched"
    drafter = PromptKeyedDrafter(PROMPTS, REFERENCES, 0.7, seed=2) if batched else None
    chooser = Scripted(3, [3, 0, 1, 2, 2, 0]) if policy == "scripted" else True
    sched = Scheduler(engine, k=3, drafter=drafter, adaptive_k=chooser)
    arrivals = [0.0, 0.0, 0.0, 1e-4, 2e-4, 3e-4, 4e-4]
    own = [None if batched else SyntheticDrafter(ref, 0.7, seed=i) for i, ref in enumerate(REFERENCES)]  # fmt: skip
    requests = [
        Request(i, p, n, arrival=t, drafter=d)
        for i, (p, n, t, d) in enumerate(zip(PROMPTS, OUTS, arrivals, own))
    ]
    finished = sched.run(requests)
    assert sorted(r.id for r in finished) == list(range(len(PROMPTS)))
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id]), f"request {r.id} differs"
    widths = [h.T for h in sched.history if h.running]
    if policy == "scripted":  # each decoding iteration ran the scripted width
        assert widths == [k + 1 for k in sched.adaptive_k.chosen]
    else:  # widths tried largest first, the acceptance measured from the drafts
        assert widths[:4] == [4, 4, 3, 3] and len(set(widths)) >= 3
        assert type(sched.adaptive_k.acceptance) is float
        assert sched.adaptive_k.acceptance == pytest.approx(0.7, abs=0.2)
    assert sum(r.accepted for r in finished) > 0 and engine.batch == 0


def test_the_scheduler_counts_the_rounds_replays_fold_grid_clips():
    for strategy in STRATEGIES:
        engine = DecodeEngine(MODEL, 2, 24, strategy, log_length=4, max_verify=4)
        tokens = Scheduler(engine, k=3, adaptive_k=True).adaptive_k.tokens
        if strategy == "replay":  # a ring of L rows: rounds near a fold verify fewer drafts
            assert tokens(3, 0.8) == tokens_per_round(3, 0.8, 4, 4) < 1 + expected_accepted(3, 0.8)
            # one Markov chain per k and a to two decimals (each a small least-squares solve):
            # estimates that differ past the second decimal are answered from the cache
            for a in (0.801, 0.7993, 0.8004):
                assert tokens(3, a) == tokens(3, 0.8)
            assert tokens.cache_info().misses == 1 and tokens.cache_info().hits == 6
        else:
            assert tokens(3, 0.8) == 1 + expected_accepted(3, 0.8)


def test_after_rounds_without_drafts_the_batched_drafter_reads_every_token():
    """A drafter that is always right (acceptance 1) keeps every draft it proposes only if
    its contexts hold the tokens of the plain rounds (k = 0) between its own."""
    engine = DecodeEngine(MODEL, 3, 30, "replay", log_length=5, max_verify=4)
    drafter = PromptKeyedDrafter(PROMPTS, REFERENCES, 1.0, seed=2)
    sched = Scheduler(engine, k=2, drafter=drafter, adaptive_k=Scripted(2, [0, 2, 0, 0, 1]))
    finished = sched.run(Request(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTS)))
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id]), f"request {r.id} differs"
    assert 0 in sched.adaptive_k.chosen and sum(r.proposed for r in finished) > 0
    assert [r.accepted for r in finished] == [r.proposed for r in finished]


def test_a_draft_model_catches_up_on_the_tokens_of_rounds_without_drafts():
    """The target's own weights as the draft model: every draft it proposes is the target's
    greedy token, so every one is kept, only if the draft slots catch up on the tokens of the
    rounds with k = 0 before they draft again."""
    engine = DecodeEngine(MODEL, 3, 30, "replay", log_length=5, max_verify=4)
    drafts = DecodeEngine(perturbed(MODEL, 0.0), 3, 30, "replay", log_length=5, max_verify=4)
    sched = Scheduler(
        engine, k=3, drafter=BatchModelDrafter(drafts), adaptive_k=Scripted(3, [0, 3, 0, 0, 2])
    )
    finished = sched.run(Request(i, p, n) for i, (p, n) in enumerate(zip(PROMPTS, OUTS)))
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id]), f"request {r.id} differs"
    assert 0 in sched.adaptive_k.chosen and sum(r.proposed for r in finished) > 0
    assert [r.accepted for r in finished] == [r.proposed for r in finished]
