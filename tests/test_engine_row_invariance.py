"""The engine's reference path under ``matmul="row_invariant"`` (the default on a GPU): every
``nn.Linear`` of the teaching modules runs as ``kernels.matmul.linear`` and attention as
``kernels.decode.attention`` (``serving.invariant``), so a verify of T tokens rounds each row
as T single steps do, and speculation is lossless for the families the fused path does not
serve (Bamba, Jamba, Qwen3.5).

On CPU: the routing (through Triton's interpreter, tiny sizes). On a GPU: a T-token step's
logits equal T one-token steps' bit for bit for each family at bf16, at a batch where
cuBLAS's rows change with the row count."""

import dataclasses

import pytest
import torch
from test_engine_family_kernels import _model

import replaylab.kernels.decode as decode_kernels
import replaylab.kernels.matmul as matmul_kernels
from replaylab.bench.families import load_preset
from replaylab.bench.serve import admit_all, random_prompts
from replaylab.model import HybridLM
from replaylab.serving import DecodeEngine
from replaylab.serving.invariant import RowInvariantLinear

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"  # CPU: the kernels through Triton's interpreter


def test_inside_the_mode_every_linear_is_the_row_invariant_kernel(monkeypatch):
    calls = []
    real = matmul_kernels.linear
    monkeypatch.setattr(matmul_kernels, "linear", lambda x, w: calls.append(1) or real(x, w))
    lin = torch.nn.Linear(16, 8).to(DEVICE)
    x = torch.randn(3, 16, device=DEVICE)
    with torch.no_grad():
        plain = lin(x)
        with RowInvariantLinear():
            routed = lin(x)
    assert len(calls) == 1
    torch.testing.assert_close(routed, plain, rtol=1e-5, atol=1e-5)  # the bias is added


@pytest.mark.parametrize("kind", ["gdn", "bamba"])
def test_the_reference_path_routes_linears_and_attention_through_the_kernels(kind, monkeypatch):
    model = _model(kind).to(DEVICE)
    linear_calls, attention_calls = [], []
    real_linear, real_attention = matmul_kernels.linear, decode_kernels.attention
    monkeypatch.setattr(
        matmul_kernels, "linear", lambda x, w: linear_calls.append(1) or real_linear(x, w)
    )
    monkeypatch.setattr(
        decode_kernels, "attention", lambda *a: attention_calls.append(1) or real_attention(*a)
    )
    engine = DecodeEngine(  # un-graphed: a graph's warm-up and capture would run each call 3 times
        model, 2, 32, "snapshot", matmul="row_invariant", use_kernels=False, graphs=False
    )
    prompts = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7])]
    admit_all(engine, prompts)
    linear_calls.clear(), attention_calls.clear()
    with torch.no_grad():
        engine.step(torch.tensor([[8, 9], [10, 11]], device=DEVICE))
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert len(linear_calls) == n_linear  # each Linear once (lm_head included)
    assert len(attention_calls) == len(model.cfg.attn_layers)


@pytest.mark.skipif(not GPU, reason="cuBLAS's row dependence is a GPU property")
@pytest.mark.parametrize("preset", ["tiny-gdn", "tiny-mamba1", "tiny-bamba"])
@pytest.mark.parametrize("strategy", ["snapshot", "recompute", "replay"])
def test_a_verify_rounds_each_row_as_single_steps_on_a_gpu(preset, strategy):
    _, cfg = load_preset(preset)
    cfg = dataclasses.replace(cfg, hidden_size=1024, intermediate_size=4096)
    model = HybridLM(cfg, seed=0).to("cuda", torch.bfloat16).eval()
    batch, T = 32, 4
    prompts = random_prompts(batch, cfg.vocab_size, seed=3, low=8, high=11)
    engines = [DecodeEngine(model, batch, 64, strategy, 16, max_verify=T) for _ in range(2)]
    assert engines[0].matmul == "row_invariant"  # the default on a GPU
    for e in engines:
        admit_all(e, prompts)
    tokens = torch.randint(0, cfg.vocab_size, (batch, T), device="cuda")
    with torch.no_grad():
        whole = engines[0].step(tokens)
        single = torch.cat([engines[1].step(tokens[:, t : t + 1]) for t in range(T)], 1)
    differ = (whole != single).any(-1)
    assert not differ.any(), f"{int(differ.sum())} of {batch * T} rows differ"
