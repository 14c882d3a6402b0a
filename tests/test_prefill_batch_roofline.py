"""tools/prefill_batch_roofline.py (issue 38's batch-32 prefill against its roofline) on CPU:
both arms prefill every prompt, agree on the first tokens, and divide the summed roofline by
the median round."""

import importlib.util
from pathlib import Path

import pytest
import torch

from replaylab.bench.prefix import prefill_roofline
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine

TOOL = Path(__file__).resolve().parents[1] / "tools" / "prefill_batch_roofline.py"


def _tool():
    spec = importlib.util.spec_from_file_location("prefill_batch_roofline", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread():
    """Batched admission's products are row-invariant on CPU with one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_both_arms_prefill_the_batch_and_report_their_roofline_share(one_thread):
    model = HybridLM(preset("tiny"), seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.cfg.vocab_size, (12,), generator=gen) for _ in range(2)]
    rates = (100.0, 1.0)
    with torch.no_grad():
        row = _tool().measure(model, "snapshot", prompts, rates, repeats=2)
    assert (row["batch"], row["tokens"], row["strategy"]) == (2, 12, "snapshot")
    roof = prefill_roofline(DecodeEngine(model, 2, 13, "snapshot", log_length=16), 12, *rates)
    for arm, together in (("together", True), ("alone", False)):
        a = row["arms"][arm]
        assert a["batched_admission"] is together and len(a["round_s"]) == 2
        assert a["roofline_s"] == pytest.approx(2 * roof["seconds"])
        assert a["roofline_share"] == pytest.approx(a["roofline_s"] / a["median_s"])
        assert a["median_s"] == sorted(a["round_s"])[1]
    assert row["arms"]["together"]["prefill_chunk"] == 12
    agree = row["logits_together_vs_alone"]
    assert agree["argmax_equal"] == 2 and agree["max_difference_over_scale"] < 1e-4


def test_the_tool_refuses_a_batch_of_none(capsys):
    with pytest.raises(SystemExit):
        _tool().main(["out.json", "--batch", "0", "--rates", "1,1"])
    assert "--batch: expected an integer >= 1, got 0" in capsys.readouterr().err
