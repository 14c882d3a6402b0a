"""tools/prefill_batch_roofline.py (issue 38's batch-32 prefill against its roofline) on CPU:
every arm prefills the batch the way it names, agrees on the first tokens, and divides the
batch's roofline (the weights read once) by its median round."""

import importlib.util
import statistics
from pathlib import Path

import pytest
import torch

import replaylab.serving.batched_admission as batched
from replaylab.bench.prefix import prefill_roofline
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine

TOOL = Path(__file__).resolve().parents[1] / "tools" / "prefill_batch_roofline.py"


def _tool():
    spec = importlib.util.spec_from_file_location("prefill_batch_roofline", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_batch_roofline_reads_the_weights_once():
    model = HybridLM(preset("tiny"), seed=0).eval()
    engine = DecodeEngine(model, 2, 13, "replay", log_length=4)
    one = prefill_roofline(engine, 12, 100.0, 1.0)
    three = prefill_roofline(engine, 12, 100.0, 1.0, prompts=3)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights -= model.model.embeddings.weight.nbytes * (
        model.lm_head.weight is not model.model.embeddings.weight
    )
    assert three["flops"] == 3 * one["flops"]
    assert three["bytes"] == weights + 3 * (one["bytes"] - weights)
    with pytest.raises(ValueError, match=r"prompts: expected .*1"):
        prefill_roofline(engine, 12, 100.0, 1.0, prompts=0)


def test_every_arm_prefills_the_batch_as_named_against_one_roofline(one_torch_thread, monkeypatch):
    model = HybridLM(preset("tiny"), seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.cfg.vocab_size, (12,), generator=gen) for _ in range(2)]
    rates = (100.0, 1.0)
    passes, original = [], batched.prefill_many

    def counted(engine, slots, tokens):
        passes.append(len(tokens))
        return original(engine, slots, tokens)

    monkeypatch.setattr(batched, "prefill_many", counted)
    with torch.no_grad():
        row = _tool().measure(model, "snapshot", prompts, rates, repeats=2)
    assert passes == [2] * 3  # together: the untimed round and two timed, both prompts each
    assert (row["batch"], row["tokens"], row["strategy"]) == (2, 12, "snapshot")
    engine = DecodeEngine(model, 2, 13, "snapshot", log_length=16)
    roof = prefill_roofline(engine, 12, *rates, prompts=2)
    chunks = {"together": 12, "alone, one chunk": 12, "alone": engine.prefill_chunk}
    for arm, a in row["arms"].items():
        assert a["batched_admission"] is (arm == "together") and len(a["round_s"]) == 2
        assert a["prefill_chunk"] == chunks[arm]
        assert a["roofline"] == roof
        assert a["median_s"] == statistics.median(a["round_s"])
        assert a["roofline_share"] == pytest.approx(roof["seconds"] / a["median_s"])
    assert set(row["logits_against_alone"]) == {"together", "alone, one chunk"}
    for agree in row["logits_against_alone"].values():
        assert agree["first_tokens_equal"] == 2 and agree["max_difference_over_scale"] < 1e-4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "0", "--rates", "1,1"], "--batch: expected an integer >= 1, got 0"),
        (["--rates", "1"], "--rates: expected GBS,TFLOPS, two numbers > 0, got '1'"),
        (["--rates", "1,-2"], "--rates: expected GBS,TFLOPS, two numbers > 0, got '1,-2'"),
    ],
)
def test_the_tool_refuses_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit):
        _tool().main(["out.json", *argv])
    assert message in capsys.readouterr().err
