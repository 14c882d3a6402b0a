"""The fast decode path gives the teaching cache's tokens (CPU, graphs off; the GPU run checks
the same with graphs on), and refuses bad input without touching its other slots."""

import pytest
import torch

from replaylab.cache import CacheConfig
from replaylab.decoding import PromptLookupDrafter, SyntheticDrafter, greedy, speculative
from replaylab.engine import DecodeEngine
from replaylab.model import HybridLM, preset

MODEL = HybridLM(preset("tiny"), seed=0).eval()


@pytest.mark.parametrize("strategy", ["snapshot", "replay"])
def test_greedy_tokens_equal_the_teaching_path(strategy):
    prompts = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(0))
    ref = greedy(MODEL, prompts, 24, CacheConfig(strategy, log_length=4)).tokens
    engine = DecodeEngine(MODEL, max_batch=4, max_len=48, strategy=strategy, log_length=4)
    assert torch.equal(engine.greedy(prompts, 24), ref)
    if strategy == "replay":
        assert engine.stats.folds == 23 // 4 and engine.stats.folded_tokens == 3 * 4 * (23 // 4)


@pytest.mark.parametrize("strategy", ["snapshot", "replay"])
@pytest.mark.parametrize("kernels", [False, True])
def test_speculative_tokens_equal_greedy(strategy, kernels):
    prompt = torch.tensor([[5, 9, 2, 5, 9, 2, 7, 5, 9]])
    ref = greedy(MODEL, prompt, 16, "snapshot").tokens
    full = torch.cat([prompt, ref], 1)
    engine = DecodeEngine(MODEL, 1, 40, strategy, log_length=6, use_kernels=kernels)
    tokens, proposed, accepted = engine.speculative(prompt, 16, SyntheticDrafter(full, 0.6, 1))
    assert torch.equal(tokens, ref) and engine.stats.rollbacks > 0
    teaching = speculative(MODEL, prompt, 16, SyntheticDrafter(full, 0.6, 1), k=4, cache=strategy)
    assert (proposed, accepted) == (teaching.proposed, teaching.accepted)
    if not kernels:
        tokens, _, _ = engine.speculative(prompt, 16, PromptLookupDrafter(), k=4)
        assert torch.equal(tokens, ref)


def pools(engine):
    out = {"position": engine.position, "log_len": engine.log_len, "batch": engine.batch}
    for l, p in engine.ssm.items():
        out[f"s{l}"], out[f"c{l}"] = p.state.clone(), p.conv.clone()
    for l, p in engine.kv.items():
        out[f"k{l}"] = p.k[:, :, : engine.position].clone()
    return out


@pytest.mark.parametrize("strategy", ["snapshot", "replay"])
def test_bad_input_is_refused_and_the_pools_stay_intact(strategy):
    engine = DecodeEngine(MODEL, 2, 16, strategy, log_length=4, max_verify=3)
    with pytest.raises(ValueError, match=r"no slot was filled: call prefill first"):
        engine.step(torch.tensor([[1], [2]]))
    with pytest.raises(
        ValueError,
        match=r"batch 3 does not fit the pools: expected 1 <= batch "
        r"<= max_batch=2",
    ):
        engine.prefill(torch.zeros(3, 4, dtype=torch.long))
    engine.prefill(torch.randint(0, 128, (2, 5)))
    engine.step(torch.tensor([[1, 2], [3, 4]]))
    before = pools(engine)
    bad = [
        (
            lambda: engine.step(torch.zeros(2, 4, dtype=torch.long)),
            ValueError,
            r"4 per step, expected 1 <= T <= max_verify=3 \(the captured verify size\)",
        ),
        (lambda: engine.rollback(3), ValueError, r"keep: expected 0 <= keep <= 2, got 3"),
        (lambda: engine.rollback(0), ValueError, r"keep at least the first"),
        (lambda: engine.step(torch.tensor([[128], [0]])), ValueError, r"ids in \[0, 128\)"),
        (lambda: engine.step(torch.tensor([[1]])), ValueError, r"shape \(batch=2, T\)"),
        (
            lambda: engine.speculative(torch.tensor([[1, 2]]), 4, PromptLookupDrafter(), k=3),
            ValueError,
            r"k \+ 1 = 4 tokens exceeds max_verify=3",
        ),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
        after = pools(engine)
        assert all(
            torch.equal(after[k], v) if isinstance(v, torch.Tensor) else after[k] == v
            for k, v in before.items()
        )
    for _ in range(4):
        engine.step(torch.tensor([[1, 2], [3, 4]]))  # 5 + 2 + 8 = 15 positions
    with pytest.raises(ValueError, match=r"15 \+ 2 exceeds max_len=16"):
        engine.step(torch.tensor([[1, 2], [3, 4]]))


def test_engine_configuration_errors():
    with pytest.raises(ValueError, match=r"strategy: expected one of \('snapshot', 'replay'\)"):
        DecodeEngine(MODEL, 1, 8, "recompute")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"graphs: CUDA graphs need a CUDA device"):
            DecodeEngine(MODEL, 1, 8, graphs=True)
    with pytest.raises(TypeError, match=r"max_batch: expected an integer"):
        DecodeEngine(MODEL, 1.5, 8)
