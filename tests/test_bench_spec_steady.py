"""``bench spec-steady``'s plumbing on CPU (a tiny model): the scheduler keeps every slot busy,
speculation gives the plain run's greedy tokens, the steady iterations exclude admissions and
partial batches. The GPU run is ``replaylab bench spec-steady``."""

import pytest
import torch

from replaylab.bench.spec_steady import (
    PromptKeyedDrafter,
    run_spec_steady,
    spec_steady_summary,
    steady_timing,
)
from replaylab.model import HybridLM, preset
from replaylab.serving.scheduler import StepRecord

MODEL = HybridLM(preset("tiny"), seed=0).eval()


@pytest.mark.parametrize("strategy", ["replay", "snapshot"])
def test_spec_steady_smoke_run_gives_the_greedy_tokens(strategy):
    torch.manual_seed(0)
    with torch.no_grad():
        result = run_spec_steady(
            MODEL, batches=(3,), strategies=(strategy,), k=3, n_new=12, log_length=4,
            requests_per_slot=2, progress=False,
        )  # fmt: skip
    (row,) = result["rows"]
    assert (row["strategy"], row["batch"], row["requests"]) == (strategy, 3, 6)
    assert row["speculative_equal_greedy"]
    for run in ("plain", "speculative"):
        assert row[run]["steady_iterations"] > 0 and 0 < row[run]["steady_share"] <= 1
        assert row[run]["steady_tokens_per_s"] > 0
    assert row["steady_speculation_over_decode"] == pytest.approx(
        row["speculative"]["steady_tokens_per_s"] / row["plain"]["steady_tokens_per_s"]
    )
    plain = row["plain"]  # every request admitted once; on CPU no graph is captured
    assert plain["admitting_iterations"] >= 1 and plain["captures"] == plain["capture_s"] == 0
    share = plain["admitting_s"] / plain["seconds"]
    assert 0 < share < 1 and f"time admitting: plain {share:.0%}" in spec_steady_summary(result)[0]


def test_spec_steady_replay_ring_of_l_plus_k():
    with torch.no_grad():
        result = run_spec_steady(
            MODEL, batches=(2,), k=3, n_new=10, log_length=4, requests_per_slot=2,
            log_capacity="L+k", progress=False,
        )  # fmt: skip
    (row,) = result["rows"]
    assert row["log_capacity"] == 4 + 3 and row["speculative_equal_greedy"]


def test_spec_steady_times_other_ks_and_the_adaptive_k_on_the_same_engine():
    with torch.no_grad():
        result = run_spec_steady(
            MODEL, batches=(3,), k=2, n_new=14, log_length=4, requests_per_slot=2,
            other_k=(1, 3), adaptive=True, progress=False,
        )  # fmt: skip
    (row,) = result["rows"]
    assert list(row["arms"]) == ["k=1", "k=3", "adaptive, k <= 2"]
    plain = row["plain"]["steady_tokens_per_s"]
    for label, arm in row["arms"].items():
        assert arm["equal_greedy"], label
        assert arm["steady_over_decode"] == pytest.approx(arm["steady_tokens_per_s"] / plain)
        assert sum(arm["steady_widths"].values()) == arm["steady_iterations"] > 0
    assert set(row["arms"]["k=1"]["steady_widths"]) == {2}
    assert 4 in row["arms"]["k=3"]["steady_widths"]  # (fewer drafts near the end or a fold)
    adaptive = row["arms"]["adaptive, k <= 2"]
    assert 4 not in adaptive["steady_widths"] and len(adaptive["steady_widths"]) >= 2
    # synthetic drafts right with probability 0.8 each: the estimate of a finds it
    assert adaptive["acceptance_estimate"] == pytest.approx(0.8, abs=0.15)
    assert (result["other_k"], result["adaptive"]) == ([1, 3], True)
    with pytest.raises(ValueError, match=r"other_k\[1\]: expected 1 <= other_k\[1\], got 0"):
        run_spec_steady(MODEL, batches=(3,), k=2, other_k=(1, 0), progress=False)


def test_steady_iterations_are_full_and_admission_free():
    history = [
        StepRecord(start=0.0, end=1.0, admitted=(0, 1), running=2, tokens=2),  # admits
        StepRecord(start=1.0, end=2.0, running=2, tokens=6),
        StepRecord(start=2.0, end=4.0, running=2, tokens=4, prefilled=3),  # a prefill chunk
        StepRecord(start=4.0, end=5.0, running=1, tokens=3),  # a partial batch
        StepRecord(start=5.0, end=8.0, running=2, tokens=5, captures=2),  # captured graphs
    ]
    t = steady_timing(history, batch=2)
    assert t["steady_tokens_per_s"] == 6.0 and t["steady_iterations"] == 1
    assert t["tokens_per_s"] == 20 / 8 and t["steady_share"] == 1 / 8
    assert (t["steady_captures"], t["captures"], t["capture_s"]) == (1, 2, 3.0)
    assert (t["admitting_iterations"], t["admitting_s"], t["seconds"]) == (1, 1.0, 8.0)
    # skewed times (medians, not means): iterations 0.5, 0.6 and 2.5 s; steps 0.1, 0.1, 1.6 s
    spans, steps, rollbacks = (0.5, 0.6, 2.5), (0.1, 0.1, 1.6), (0.01, 0.05, 0.9)
    more, at = [], 8.0
    for span, step, rollback in zip(spans, steps, rollbacks):
        more.append(StepRecord(start=at, end=at + span, running=2, T=3, tokens=4, step_s=step,
                               rollback_s=rollback))  # fmt: skip
        at += span
    t = steady_timing(history[:2] + more, batch=2)
    assert t["steady_ms_by_width"] == pytest.approx({0: 1000.0, 3: 600.0})
    assert t["steady_step_ms_by_width"][3] == pytest.approx(100.0)
    assert t["steady_rollback_ms_by_width"][3] == pytest.approx(50.0)
    with pytest.raises(ValueError, match=r"history: expected the records of a run that took"):
        steady_timing([], batch=2)


def test_prompt_keyed_drafter_finds_each_rows_request():
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9, 9]), torch.tensor([5, 6, 8, 1])]
    refs = [torch.cat([p, torch.arange(10) + 10 * i]) for i, p in enumerate(prompts)]
    drafter = PromptKeyedDrafter(prompts, refs, acceptance=1.0)
    contexts = torch.zeros(2, 12, dtype=torch.long)
    contexts[0, :5] = refs[2][:5]  # request 2's prompt and its first token, in row 0
    contexts[1, :3] = refs[1][:3]
    got = drafter.propose_batch(contexts, torch.tensor([5, 3]), torch.tensor([7, 3]), 2, 100)
    assert got.tolist() == [refs[2][5:7].tolist(), refs[1][3:5].tolist()]
    with pytest.raises(ValueError, match=r"prompts: expected prompts none of which starts"):
        PromptKeyedDrafter([torch.tensor([1, 2]), torch.tensor([1, 2, 3])], refs[:2], 1.0)
    with pytest.raises(ValueError, match=r"context: its prompt is none of the drafter's"):
        drafter.propose_batch(torch.ones(1, 6, dtype=torch.long), torch.tensor([3]),
                              torch.tensor([0]), 2, 100)  # fmt: skip


def test_prompt_keyed_drafter_looks_up_prompts_with_distinct_heads_at_once():
    """Random prompts differ in their first ids: rows are found by a hash of them, the same
    requests the one-by-one search finds; a row whose head is no prompt's is refused."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 50, (int(n),), generator=gen) for n in (6, 9, 7, 12)]
    refs = [torch.cat([p, torch.arange(8) + 10 * i]) for i, p in enumerate(prompts)]
    drafter = PromptKeyedDrafter(prompts, refs, acceptance=1.0)
    assert drafter.by_key is not None
    order = [3, 0, 2, 1, 3]
    contexts = torch.zeros(len(order), 20, dtype=torch.long)
    lengths = torch.tensor([prompts[i].numel() + 2 for i in order])
    for g, i in enumerate(order):
        contexts[g, : lengths[g]] = refs[i][: lengths[g]]
    assert [drafter._request(c) for c in contexts] == order
    got = drafter.propose_batch(contexts, lengths, torch.arange(len(order)), 3, 100)
    assert got.tolist() == [refs[i][n : n + 3].tolist() for i, n in zip(order, lengths.tolist())]
    for at in (0, prompts[0].numel() - 1):  # the hashed head, then the prompt's last id
        changed = contexts.clone()
        changed[1, at] = (changed[1, at] + 1) % 50
        with pytest.raises(ValueError, match=r"context: its prompt is none of the drafter's"):
            drafter.propose_batch(changed, lengths, torch.arange(len(order)), 3, 100)


def test_repeats_rotate_every_arm_and_report_the_median_ratio(monkeypatch):
    import replaylab.bench.spec_steady as bench

    serve, served = bench.serve_all, [0]

    def counted(*args):
        served[0] += 1
        return serve(*args)

    monkeypatch.setattr(bench, "serve_all", counted)
    with torch.no_grad():
        result = run_spec_steady(
            MODEL, batches=(3,), k=2, n_new=10, log_length=4, requests_per_slot=2,
            other_k=(1,), adaptive=True, repeats=3, progress=False,
        )  # fmt: skip
    (row,) = result["rows"]
    labels = ["plain", "k=2", "k=1", "adaptive, k <= 2"]
    orders = [p["order"] for p in row["repeats"]]
    assert orders == [labels, labels[1:] + labels[:1], labels[2:] + labels[:2]]
    assert row["repeats_equal_greedy"] and result["repeats"] == 3
    assert served == [4 * 2 + 2 * 4]  # each arm warmed and timed, then two passes of four
    for label in labels[1:]:
        ratios = sorted(
            p["steady_tokens_per_s"][label] / p["steady_tokens_per_s"]["plain"]
            for p in row["repeats"]
        )
        assert row["median_steady_over_decode"][label] == pytest.approx(ratios[1])
    assert "medians over 3 passes: k=2 " in spec_steady_summary(result)[0]
    with pytest.raises(ValueError, match=r"repeats: expected 1 <= repeats, got 0"):
        run_spec_steady(MODEL, batches=(3,), repeats=0, progress=False)
    with pytest.raises(ValueError, match=r"other_k\[1\]: 2 is k; expected each other k once"):
        run_spec_steady(MODEL, batches=(3,), k=2, other_k=(1, 2), progress=False)
    with pytest.raises(ValueError, match=r"other_k\[1\]: 1 is listed twice"):
        run_spec_steady(MODEL, batches=(3,), k=2, other_k=(1, 1), progress=False)


def test_prompt_keyed_drafter_confirms_a_rows_prompt_once_per_request(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 50, (int(n),), generator=gen) for n in (6, 9, 7)]
    refs = [torch.cat([p, torch.arange(12) + 10 * i]) for i, p in enumerate(prompts)]
    drafter = PromptKeyedDrafter(prompts, refs, acceptance=1.0)
    checked, check = [], drafter._starts_with_prompts

    def counted(contexts, lengths, index):
        checked.append(list(index))
        return check(contexts, lengths, index)

    monkeypatch.setattr(drafter, "_starts_with_prompts", counted)

    def rows_of(tenants, grown):
        contexts = torch.zeros(len(tenants), 30, dtype=torch.long)
        lengths = torch.tensor([prompts[i].numel() + grown for i in tenants])
        for g, i in enumerate(tenants):
            contexts[g, : lengths[g]] = refs[i][: lengths[g]]
        return contexts, lengths

    slots = torch.tensor([4, 7])
    for grown, tenants in ((1, [0, 2]), (3, [0, 2]), (5, [0, 1])):  # slot 7 changes tenant
        contexts, lengths = rows_of(tenants, grown)
        got = drafter.propose_batch(contexts, lengths, slots, 2, 100)
        assert got.tolist() == [refs[i][n : n + 2].tolist() for i, n in zip(tenants, lengths)]
    assert checked == [[0, 2], [1]]  # each (row, request) confirmed once
    contexts, lengths = rows_of([2], 1)
    contexts[0, 6] += 1  # request 2's head (m = 6 ids), another prompt: a new row checks it
    with pytest.raises(ValueError, match=r"context: its prompt is none of the drafter's"):
        drafter.propose_batch(contexts, lengths, torch.tensor([9]), 2, 100)
    assert checked[-1] == [2]  # refused by the prompt check, not the hash
    contexts, lengths = rows_of([0, 1], 2)  # both slots held these requests 5 tokens past
    contexts[1, 7] += 1  # request 1's head, another prompt, a shorter context: checked again
    with pytest.raises(ValueError, match=r"context: its prompt is none of the drafter's"):
        drafter.propose_batch(contexts, lengths, slots, 2, 100)
    assert checked[-1] == [0, 1]  # both contexts shorter than last seen: both checked
