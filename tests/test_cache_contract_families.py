"""The cache contract over the layer families beyond Mamba-2: Mamba-1 (Jamba) and Gated
DeltaNet (Qwen3-Next, Qwen3.5). After any sequence of advance / snapshot / restore / truncate /
fork / reorder, what the cache holds equals what it held on first reaching that position and a
fresh prefill of the same tokens; every workload gives identical tokens under every strategy,
equal to transformers' own greedy tokens.

Exactness: snapshot is bitwise (copies of the states the scan produced). Replay is compared
within 1e-5: its fold is the closed form (Mamba-1) or the chunked WY / UT form (Gated
DeltaNet), which associate the sums differently from the token loop, so the same position
folded from two different checkpoints agrees to rounding, not bitwise."""

import pytest
import torch
from family_models import VOCAB, tiny_family_model, tiny_jamba, tiny_qwen3_5, tiny_qwen3_next
from hypothesis import HealthCheck, given, settings
from test_cache_contract import ops, run_program

from replaylab.cache import CacheConfig
from replaylab.decoding import (
    ModelDrafter,
    PromptLookupDrafter,
    SyntheticDrafter,
    beam_search,
    best_of_n,
    greedy,
    speculative,
    tree_search,
)
from replaylab.model import HybridConfig, HybridLM, load_transformers_hybrid
from replaylab.strategies import STRATEGY_NAMES as STRATEGIES

MODELS = {family: tiny_family_model(family) for family in ("mamba1", "gdn")}


def both(strategy, interval, **options):
    return CacheConfig(strategy, checkpoint_interval=interval, log_length=interval, **options)


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
def test_any_operation_sequence_gives_the_state_of_a_fresh_prefill(family, strategy, program):
    # half the replay runs take their outputs from checkpoint + log (closed forms, backward
    # recursion); those and the chunked folds add in another order: snapshot alone is bitwise
    kernels = strategy == "replay" and len(program) % 2 == 0
    run_program(MODELS[family], strategy, program, bitwise=("snapshot",), use_kernels=kernels)


HF = {"jamba": tiny_jamba, "qwen3_next": tiny_qwen3_next, "qwen3_5": tiny_qwen3_5}
DRAFT_PATTERN = {"jamba": "S-", "qwen3_next": "G-", "qwen3_5": "G-"}


@pytest.mark.parametrize("name", sorted(HF))
def test_workloads_give_transformers_greedy_tokens_under_every_strategy(name):
    hf = HF[name]()
    hf.generation_config.eos_token_id = None  # decode the full length, as replaylab does
    model = load_transformers_hybrid(hf).eval()
    prompt = torch.tensor([[3, 7, 1, 3, 7, 2, 9, 3, 7]])
    n = 16
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=n, do_sample=False)[:, prompt.shape[1] :]
    full = torch.cat([prompt, ref], 1)
    draft = HybridLM(HybridConfig(vocab_size=VOCAB, pattern=DRAFT_PATTERN[name]), seed=5).eval()
    configs = [both(s, 5) for s in STRATEGIES] + [both("replay", 5, use_kernels=True)]
    for config in configs:
        label = f"{config.strategy} kernels={config.use_kernels}"
        assert torch.equal(greedy(model, prompt, n, config).tokens, ref), label
        for drafter in [
            SyntheticDrafter(full, 0.6, seed=1),
            PromptLookupDrafter(),
            ModelDrafter(draft),
        ]:
            run = speculative(model, prompt, n, drafter, k=4, cache=config)
            assert torch.equal(run.tokens, ref), f"{label} {type(drafter).__name__}"
    beams = {s: beam_search(model, prompt, 6, 3, s).extra["beams"] for s in STRATEGIES}
    samples = {
        s: best_of_n(model, prompt, 6, 3, seed=3, cache=s).extra["samples"] for s in STRATEGIES
    }
    trees = {
        s: tree_search(model, prompt, 7, branch=2, keep=2, depth=3, cache=both(s, 4)).extra["paths"]
        for s in STRATEGIES
    }
    for got in (beams, samples, trees):
        first = got[STRATEGIES[0]]
        assert all(torch.equal(first, other) for other in got.values())
    # beam search with one beam is greedy decoding
    one = beam_search(model, prompt, 6, 1, "replay").extra["beams"]
    assert torch.equal(one[0], ref[0, :6])


def test_replay_keeps_less_than_snapshot_when_speculating_on_a_gdn_model():
    """Speculation under snapshot copies the (H, K, V) state per draft position; replay keeps
    one checkpoint and a log of per-token inputs."""
    model = MODELS["gdn"]
    prompt = torch.randint(0, 50, (1, 8))
    ref = torch.cat([prompt, greedy(model, prompt, 12).tokens], 1)
    peak = {
        s: speculative(
            model, prompt, 12, SyntheticDrafter(ref, 0.5), k=4, cache=both(s, 8)
        ).peak_bytes
        for s in STRATEGIES
    }
    assert peak["replay"] < peak["snapshot"]


@pytest.mark.parametrize("name", sorted(HF))
def test_replaylab_generate_decodes_the_new_folders(name, tmp_path, capsys):
    import json

    from replaylab.cli import main

    hf = HF[name]()
    hf.save_pretrained(tmp_path)
    hf.generation_config.eos_token_id = None  # 6 tokens: before the tiny Jamba emits its EOS
    prompt = [3, 7, 1, 3, 7, 2, 9, 3, 7]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, 9:]
    ids = ",".join(map(str, prompt))
    for draft in ("none", "prompt-lookup"):
        argv = ["generate", str(tmp_path), "--prompt-ids", ids, "--max-new-tokens", "6"]
        assert main(argv + ["--draft", draft, "--log-length", "4"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["tokens"] == ref.tolist(), draft
