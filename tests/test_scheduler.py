"""Continuous batching (``replaylab.serving.Scheduler``) over the engine, on CPU: every
request's tokens are its own greedy tokens decoded alone by the teaching path, with and
without speculation; the byte budget holds at every engine step; admission is first come,
first served; freed slots are reused; bad input is refused with the scheduler unchanged; the
rollback cursor is the engine's; the request-stream benchmark writes its fields."""

import json
import math
import random

import pytest
import torch

from replaylab.bench.stream import (
    StreamSpec,
    make_stream,
    run_stream_bench,
    stream_metrics,
    stream_requests,
)
from replaylab.decoding import PromptLookupDrafter, SyntheticDrafter, greedy
from replaylab.serving import (
    STRATEGIES,
    BatchModelDrafter,
    BatchSyntheticDrafter,
    DecodeEngine,
    EnginePrefixCache,
    Request,
    Scheduler,
    admissible,
    request_bytes,
    rollback_cursor,
    slot_bytes,
)
from replaylab.testing import perturbed, tiny_hybrid

MODEL = tiny_hybrid()


@pytest.fixture(autouse=True)
def one_thread():
    """One CPU thread for these small models: on a busy two-core machine a second thread only
    waits (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


VOCAB = MODEL.cfg.vocab_size


def _workload(n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, outs = [], []
    for _ in range(n):
        prompts.append(torch.randint(0, VOCAB, (int(torch.randint(2, 14, (1,), generator=g)),)))
        outs.append(int(torch.randint(1, 11, (1,), generator=g)))
    return prompts, outs


PROMPTS, OUTS = _workload()
# each request decoded alone by the teaching cache (no engine), greedily
ALONE = [greedy(MODEL, p[None], n, "snapshot").tokens[0] for p, n in zip(PROMPTS, OUTS)]


class Watched:
    """An engine whose every step checks the scheduler's budget and slot count first."""

    def __init__(self, engine):
        self.engine, self.sched, self.checked = engine, None, 0
        inner = engine.step

        def step(*args, **kwargs):
            s = self.sched
            held = sum(r.reserved for r in s.running)
            assert held == s.used <= s.budget, (held, s.used, s.budget)
            assert engine.batch == len(s.running) <= s.max_running
            self.checked += 1
            return inner(*args, **kwargs)

        engine.step = step


def _requests(mode, arrivals):
    out = []
    for i, (p, n) in enumerate(zip(PROMPTS, OUTS)):
        drafter = None
        if mode == "synthetic":
            drafter = SyntheticDrafter(torch.cat([p, ALONE[i]]), 0.6, seed=i)
        elif mode == "lookup":
            drafter = PromptLookupDrafter()
        out.append(Request(i, p, n, arrival=arrivals[i], drafter=drafter))
    return out


def _arrivals(rate, seed=1):
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in PROMPTS:
        t += rng.expovariate(rate)
        out.append(t)
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("mode", ["decode", "synthetic", "lookup"])
def test_every_request_gets_its_own_greedy_tokens_under_a_binding_budget(strategy, mode):
    engine = DecodeEngine(MODEL, 3, 28, strategy, log_length=5, max_verify=5)
    watch = Watched(engine)
    k = 0 if mode == "decode" else 4
    sizes = slot_bytes(engine)
    # room for two of the longest requests: the budget, not the slots, binds
    budget = 2 * request_bytes(sizes, max(map(len, PROMPTS)), max(OUTS), k)
    sched = Scheduler(engine, budget_bytes=budget, k=k)
    watch.sched = sched
    for r in _requests(mode, _arrivals(rate=400.0)):
        sched.add(r)
    finished = sched.run()
    assert sorted(r.id for r in finished) == list(range(len(PROMPTS)))
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id]), f"request {r.id} differs"
        assert len(r.token_times) == r.max_new_tokens and r.ttft >= 0
        assert r.token_times == sorted(r.token_times) and r.finished_at >= r.token_times[-1]
    assert watch.checked > 0 and engine.batch == 0 and sched.used == 0
    assert all(h.used <= budget for h in sched.history)
    assert sched.peak_running == 2 < engine.max_batch  # the budget bound, not the slots
    if mode == "synthetic":
        assert sum(r.proposed for r in finished) > 0 and sum(r.accepted for r in finished) > 0
        assert engine.stats.rollbacks > 0 and any(h.rejected for h in sched.history)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_batched_draft_model_drafts_for_every_request_as_they_come_and_go(strategy):
    engine = DecodeEngine(MODEL, 3, 28, strategy, log_length=5, max_verify=5)
    drafts = DecodeEngine(perturbed(MODEL, 0.1), 3, 28, "replay", log_length=5, max_verify=5)
    drafter = BatchModelDrafter(drafts)
    sched = Scheduler(engine, k=4, drafter=drafter)
    finished = sched.run(_requests("decode", [0.0] * len(PROMPTS)))  # 9 requests, 3 slots
    assert sorted(r.id for r in finished) == list(range(len(PROMPTS)))
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id]), f"request {r.id} differs"
    proposed, accepted = sum(r.proposed for r in finished), sum(r.accepted for r in finished)
    assert 0 < accepted < proposed
    assert drafts.stats.admitted >= 6  # slots freed by finished requests seat new ones
    with pytest.raises(ValueError, match="carries its own drafter"):
        Scheduler(DecodeEngine(MODEL, 1, 28, strategy), k=2, drafter=drafter).add(
            Request(0, PROMPTS[0], 2, drafter=PromptLookupDrafter())
        )
    with pytest.raises(ValueError, match="needs k >= 1"):
        Scheduler(DecodeEngine(MODEL, 1, 28, strategy), drafter=drafter)
    with pytest.raises(ValueError, match="its engine is the scheduler's own"):
        fresh = DecodeEngine(MODEL, 3, 28, "replay", log_length=5, max_verify=5)
        Scheduler(fresh, k=2, drafter=BatchModelDrafter(fresh))
    small = BatchModelDrafter(DecodeEngine(MODEL, 2, 28, "replay", log_length=5, max_verify=5))
    with pytest.raises(ValueError, match="expected at least max_running=3 slots"):
        Scheduler(DecodeEngine(MODEL, 3, 28, strategy), k=2, drafter=small)
    with pytest.raises(TypeError, match="expected a batched drafter"):
        Scheduler(DecodeEngine(MODEL, 1, 28, strategy), k=2, drafter=PromptLookupDrafter())


def test_admission_is_first_come_first_served_and_blocks_behind_a_large_request():
    engine = DecodeEngine(MODEL, 4, 40, "replay", log_length=5, max_verify=5)
    sizes = slot_bytes(engine)
    small = request_bytes(sizes, 3, 2)
    big = request_bytes(sizes, 30, 8)
    sched = Scheduler(engine, budget_bytes=big + small)
    g = torch.Generator().manual_seed(0)
    reqs = [
        Request(0, torch.randint(0, VOCAB, (3,), generator=g), 2, arrival=0.0),
        Request(1, torch.randint(0, VOCAB, (30,), generator=g), 8, arrival=0.001),
        Request(2, torch.randint(0, VOCAB, (3,), generator=g), 2, arrival=0.002),
    ]
    for r in reversed(reqs):  # added out of order: the queue orders them by arrival
        sched.add(r)
    assert [r.id for r in sched.waiting] == [0, 1, 2]
    sched.run()
    assert [r.id for r in sorted(reqs, key=lambda r: r.admitted_at)] == [0, 1, 2]
    # request 2 fits beside request 0 but not beside 1: it waits for 1 (no overtaking)
    assert reqs[2].admitted_at >= reqs[0].finished_at
    assert all(h.used <= sched.budget for h in sched.history)


def test_admissible_is_the_longest_prefix_that_fits():
    assert admissible([5, 5, 5], used=0, budget=10, free_slots=3) == 2
    assert admissible([5, 5, 5], used=0, budget=15, free_slots=3) == 3  # an exact fit
    assert admissible([5, 5, 5], used=1, budget=15, free_slots=3) == 2
    assert admissible([5, 5, 5], used=0, budget=100, free_slots=1) == 1
    assert admissible([20, 1, 1], used=0, budget=10, free_slots=3) == 0  # the head blocks
    assert admissible([], used=0, budget=10, free_slots=3) == 0
    assert admissible([1, 1], used=0, budget=10, free_slots=0) == 0


def test_freed_slots_are_reused():
    engine = DecodeEngine(MODEL, 2, 28, "snapshot", max_verify=1)
    sched = Scheduler(engine)
    slots = []
    admit = engine.admit

    def record(prompt):
        slot, logits = admit(prompt)
        slots.append(slot)
        return slot, logits

    engine.admit = record
    finished = sched.run(_requests("decode", [0.0] * len(PROMPTS)))
    assert len(finished) == len(PROMPTS) and engine.stats.admitted == len(PROMPTS)
    assert set(slots) == {0, 1} and engine.stats.retired == len(PROMPTS)
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id])


def _state(sched):
    return (
        [r.id for r in sched.waiting],
        [r.id for r in sched.running],
        sched.used,
        sched.now,
        len(sched.history),
        sorted(sched._ids),
    )


def test_bad_input_is_refused_and_the_scheduler_is_unchanged():
    engine = DecodeEngine(MODEL, 2, 16, "replay", log_length=5, max_verify=5)
    sizes = slot_bytes(engine)
    smallest = request_bytes(sizes, 1, 1, 4)
    with pytest.raises(ValueError, match=rf"budget_bytes: {smallest - 1} is smaller than one"):
        Scheduler(engine, budget_bytes=smallest - 1, k=4)
    with pytest.raises(ValueError, match=r"k: expected 0 <= k <= 4, got 5"):
        Scheduler(engine, k=5)
    with pytest.raises(ValueError, match=r"max_running: expected 1 <= max_running <= 2, got 3"):
        Scheduler(engine, max_running=3)
    budget = request_bytes(sizes, 10, 6)
    sched = Scheduler(engine, budget_bytes=budget)
    sched.add(Request(0, torch.tensor([1, 2, 3]), 4))
    before = _state(sched)
    bad = [
        (Request(0, torch.tensor([1]), 2), r"id 0 was already added"),
        (
            Request(1, torch.tensor([1, 2, VOCAB]), 2),
            rf"request 1: prompt: token id {VOCAB} at index 2 is outside the vocabulary "
            rf"\[0, {VOCAB}\)",
        ),
        (
            Request(2, torch.tensor([[1, 2]]), 2),
            r"request 2: prompt: expected token ids of shape \(T0,\), got shape \(1, 2\)",
        ),
        (Request(3, torch.tensor([1, 2]), 0), r"max_new_tokens: expected 1 <= .*, got 0"),
        (
            Request(4, torch.arange(12) % VOCAB, 6),
            r"prompt of 12 tokens \+ max_new_tokens=6 needs 17 positions: .*max_len=16",
        ),
        (Request(5, torch.arange(16) % VOCAB, 1), r"expected 1 <= prompt < max_len"),
        (
            Request(6, torch.arange(10) % VOCAB, 7),
            rf"needs {request_bytes(sizes, 10, 7)} bytes, more than the whole "
            rf"budget_bytes={budget}",
        ),
        (
            Request(7, torch.tensor([1]), 2, arrival=-1.0),
            r"arrival: expected a finite time >= 0 s, got -1.0",
        ),
        (
            Request(7, torch.tensor([1]), 2, arrival=math.inf),
            r"request 7: arrival: expected a finite time >= 0 s, got inf",
        ),
    ]
    for request, message in bad:
        with pytest.raises(ValueError, match=message):
            sched.add(request)
        assert _state(sched) == before, message
    with pytest.raises(TypeError, match=r"expected a Request, got tuple"):
        sched.add((8, torch.tensor([1]), 2))
    assert _state(sched) == before
    with pytest.raises(TypeError, match=r"request 9: drafter: expected an object with propose"):
        sched.add(Request(9, torch.tensor([1]), 2, drafter=object()))  # it would stall every step
    assert _state(sched) == before
    plain = Scheduler(DecodeEngine(MODEL, 2, 28, "replay", log_length=5, max_verify=5), k=0)
    with pytest.raises(ValueError, match=r"request 9: carries a drafter, but .* k=0 tokens"):
        plain.add(Request(9, torch.tensor([1]), 2, drafter=PromptLookupDrafter()))  # ignored before
    assert not plain.waiting and not plain.running
    sched.run()
    assert (
        sched.finished[0].tokens == greedy(MODEL, torch.tensor([[1, 2, 3]]), 4).tokens[0].tolist()
    )
    engine.admit(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"engine: 1 slots are live \(\[0\]\)"):
        Scheduler(engine)
    with pytest.raises(TypeError, match=r"engine: expected a DecodeEngine, got NoneType None"):
        Scheduler(None)  # a raw AttributeError before
    pos = list(engine.pos)
    with pytest.raises(TypeError, match=r"check: expected True or False, got 'no'"):
        engine.step(torch.tensor([[3]]), check="no")  # taken as true before
    assert list(engine.pos) == pos


def test_a_drafter_proposing_ids_outside_the_vocabulary_is_named():
    class Bad:
        def propose(self, context, k, vocab):
            return torch.full((k,), vocab)

    engine = DecodeEngine(MODEL, 2, 28, "replay", log_length=5, max_verify=5)
    sched = Scheduler(engine, k=4)
    sched.add(Request(0, torch.tensor([1, 2]), 4, drafter=Bad()))
    with pytest.raises(
        ValueError, match=rf"request 0: drafts: token id {VOCAB} at index 0 is outside"
    ):
        sched.run()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_rollback_cursor_is_the_engines(strategy):
    rng = random.Random(3)
    engine = DecodeEngine(MODEL, 3, 60, strategy, log_length=5, max_verify=5)
    for n in (4, 9, 6):
        engine.admit(torch.randint(0, VOCAB, (n,)))
    for _ in range(8):
        counts = [rng.randint(1, engine.room(s)) for s in range(3)]  # replay: up to its fold
        engine.step(torch.randint(0, VOCAB, (3, 5)), counts)
        keep = [rng.randint(1, c) for c in counts]
        logged = engine.log_len if strategy == "replay" else None  # the others keep no log
        want = rollback_cursor(engine.pos, logged, engine.last, keep)
        engine.rollback(keep)
        assert (engine.pos, engine.last) == (want[0], want[2])
        if strategy == "replay":
            assert engine.log_len == want[1]
    with pytest.raises(ValueError, match=r"keep of slot 1: expected 1 <= keep of slot 1 <= 2"):
        rollback_cursor([5, 5], [3, 3], [3, 2], [1, 3])
    with pytest.raises(ValueError, match=r"keep: expected 2 values, one per slot, got 1"):
        rollback_cursor([5, 5], [3, 3], [3, 2], [1])
    # a slot cannot hold fewer tokens or log entries than its last step took (learners' -4)
    with pytest.raises(ValueError, match=r"slot 0: log_len=0 but its last step took last=5"):
        rollback_cursor([10], [0], [5], [1])
    with pytest.raises(ValueError, match=r"slot 0: pos=2 but its last step took last=3"):
        rollback_cursor([2], None, [3], [1])
    assert rollback_cursor([10], None, [5], [2]) == ([7], None, [2])


def test_make_stream_is_seeded_and_poisson_shaped():
    spec = StreamSpec(400, (6, 24), (4, 16), seed=5)
    prompts, outs, arrivals = make_stream(spec, VOCAB)
    again = make_stream(spec, VOCAB)
    assert all(torch.equal(a, b) for a, b in zip(prompts, again[0])) and outs == again[1]
    assert all(6 <= p.numel() <= 24 for p in prompts) and all(4 <= n <= 16 for n in outs)
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals)]
    assert 0.85 < sum(gaps) / len(gaps) < 1.15  # Exp(1) gaps: mean 1
    reqs = stream_requests((prompts, outs, arrivals), 20.0)
    assert math.isclose(reqs[-1].arrival, arrivals[-1] / 20.0)


FIELDS = ("ttft_s", "tpot_s", "tokens_per_s", "acceptance", "rollback", "peak_running")


def test_the_stream_benchmark_writes_its_fields(tmp_path):
    from replaylab.bench.cli import main

    out = tmp_path / "stream.json"
    argv = ["serve-stream", "--preset", "cpu", "--device", "cpu", "--n-requests", "3"]
    argv += ["--sweep-batches", "1,2", "--rate-probes", "1", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert {"device", "versions", "date", "command"} <= set(result)
    assert result["command"].startswith("replaylab bench serve-stream")
    assert result["objective"]["tpot_p99_max_s"] > 0 and result["budget_bytes"] > 0
    assert set(result["strategies"]) == set(STRATEGIES)
    for strategy, row in result["strategies"].items():
        assert row["pool_bytes_per_slot"] > 0 and row["batch1"]["tpot_s"]["p50"] > 0
        # plain decode ran on an engine built for it: a snapshot slot holds no draft states
        plain = row["pool_bytes_per_slot_plain_decode"]
        assert plain < row["pool_bytes_per_slot"] / (2 if strategy == "snapshot" else 1)
        assert row["plain_decode_engine_stats"]["steps"] > 0
        assert set(row["modes"]) == {"decode", "synthetic", "lookup"}
        for mode, m in row["modes"].items():
            assert set(FIELDS) <= set(m), (strategy, mode)
            assert m["requests"] == 3 and m["tokens_equal_decode_stream"] == 3, (strategy, mode)
            assert m["tokens_equal_alone"] == m["requests_served_alone"] == 3, (strategy, mode)
            assert 0 < m["ttft_s"]["p50"] <= m["ttft_s"]["p99"]
            assert m["peak_used_bytes"] <= m["budget_bytes"]
            assert (m["acceptance"] is None) == (mode == "decode")
        assert "sustainable_rate" in row["modes"]["synthetic"]
        assert len(row["modes"]["decode"]["rate_probes"]) == 1
        c = row["crossover"]
        assert [r["batch"] for r in c["measured_rows"]] == [1, 2]
        for r in c["measured_rows"]:
            assert r["speculative_tokens_differ"] == 0
            assert r["decode_engine_tokens_per_s"] >= r["decode_tokens_per_s"] > 0
            assert r["speculative_engine_tokens_per_s"] >= r["speculative_tokens_per_s"] > 0
            assert r["verify_over_decode_step"] > 0
        assert "measured_batch_on_the_clock" in c
        assert {"predicted_batch", "verify_compute_bound_from_batch"} <= set(c)
        assert [r["batch"] for r in c["predicted_rows"]] == [1, 2]


def test_the_cost_model_predicts_a_compute_bound_verify_on_8b_layer_shapes():
    """On Nemotron-H 8B layer shapes a 5-row verify becomes compute-bound near batch 40
    (2 n (k+1) B / 790 TFLOP/s against the weights over the copy bandwidth)."""
    from replaylab.bench.stream import predicted_crossover
    from replaylab.model import HybridLM, preset

    with torch.device("meta"):
        model = HybridLM(preset("8b-layers"), seed=0)
    n = sum(p.numel() for p in model.parameters()) - model.model.embeddings.weight.numel()
    rows, cross, bound = predicted_crossover(
        model.cfg, n, "replay", (1, 256), context_len=128, bandwidth=4.3e12
    )
    assert 30 <= bound <= 80 and rows[0]["verify_bound"] == "bytes"
    assert rows[1]["verify_bound"] == "flops"
    rows, cross, _ = predicted_crossover(model.cfg, n, "snapshot", (1,), bandwidth=4.3e12)
    assert cross is not None and cross > 64
    # bandwidth 0 ran with the H200's; a rate of 0 or a batch of 0 divided by zero
    for bad, match in (
        (dict(bandwidth=0), r"bandwidth: expected a finite number \(bytes/s\) > 0"),
        (dict(matmul_rate=0), r"matmul_rate: expected a finite number \(FLOP/s\) > 0"),
        (dict(batches=(0,)), r"batches\[0\]: expected 1 <= batches\[0\], got 0"),
    ):
        kw = dict(batches=(1,), **bad) if "batches" not in bad else bad
        with pytest.raises(ValueError, match=match):
            predicted_crossover(model.cfg, n, "snapshot", **kw)
    many = (b for b in (1, 256))  # a generator: the check must not use it up
    assert len(predicted_crossover(model.cfg, n, "replay", many, bandwidth=4.3e12)[0]) == 2


def test_the_committed_cpu_stream_result_has_provenance():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "bench_serve_stream_cpu.json"
    result = json.loads(path.read_text())
    assert result["device_type"] == "cpu" and result["model"] == "tiny"
    assert result["date"] and result["versions"]["torch"]
    assert set(result["strategies"]) == set(STRATEGIES)


def test_run_stream_bench_refuses_unknown_settings():
    with pytest.raises(ValueError, match=r"preset: expected one of \['8b-layers', 'cpu'\]"):
        run_stream_bench("tiny")
    with pytest.raises(ValueError, match=r"overrides: unknown fields \['n_reqs'\]"):
        run_stream_bench("cpu", n_reqs=3)
    with pytest.raises(ValueError, match=r"modes: expected some of"):
        run_stream_bench("cpu", modes=("beam",))
    # a rate of 0 divided by zero, reversed ranges raised inside torch, no requests a bare min()
    stream = make_stream(StreamSpec(2), VOCAB)
    for call, match in (
        (lambda: stream_requests(stream, 0), r"rate: expected a number \(requests/s\) > 0, got 0"),
        (lambda: stream_requests(stream, 5.0, "beam"), r"mode: expected one of"),
        (
            lambda: stream_requests(stream, 5.0, "synthetic"),
            r"references: the synthetic mode needs",
        ),
        (
            lambda: StreamSpec(prompt_len=(24, 6)),
            r"prompt_len\[1\]: expected 24 <= prompt_len\[1\], got 6",
        ),
        (lambda: StreamSpec(output_len=(0, 0)), r"output_len\[0\]: expected 1 <= output_len\[0\]"),
        (lambda: StreamSpec(n_requests=-3), r"n_requests: expected 1 <= n_requests, got -3"),
        (lambda: stream_metrics([], None), r"finished: expected the finished requests"),
    ):
        with pytest.raises(ValueError, match=match):
            call()
    # rate 0 ran at the preset's 40 requests/s
    with pytest.raises(ValueError, match=r"rate: expected a number \(requests/s\) > 0, got 0"):
        run_stream_bench("cpu", rate=0)
    with pytest.raises(ValueError, match=r"acceptance: expected a finite number >= 0 and <= 1"):
        run_stream_bench("cpu", acceptance=1.5)


@pytest.mark.figures
def test_the_serving_figures_draw_a_stream_and_the_committed_result():
    from replaylab.results import load_bench
    from replaylab.teaching.plotting_serving import (
        crossover_figure,
        latency_figure,
        load_stream_result,
        round_split,
        round_split_figure,
        slot_timeline_figure,
    )

    engine = DecodeEngine(MODEL, 2, 28, "replay", log_length=5, max_verify=5)
    sched = Scheduler(engine)
    done = sched.run(_requests("decode", _arrivals(rate=400.0)))
    run = {"replay": stream_metrics(done, sched)}
    fig = latency_figure(run)
    assert len(fig.data) == 2 and len(fig.data[0].y) == len(done)
    timeline = slot_timeline_figure(done)
    bars = [t for t in timeline.data if t.type == "bar"]
    assert len(bars) == len(done) and {b.y[0] for b in bars} <= {0, 1}
    result, path = load_stream_result(gpu="data/no_such_file.json")
    assert path.endswith("bench_serve_stream_cpu.json")
    fig = crossover_figure(result)
    assert len(fig.data) == 2 * len(result["strategies"]) and "CPU" in fig.layout.title.text
    assert run["replay"]["requests"] == len(done)
    widths = load_bench("data/bench_spec_steady_widths_h100_e466a9d.json")
    split = round_split(widths)  # the one-width arms: plain, k = 4 and k = 3, per batch
    assert {b: list(a) for b, a in split.items()} == {b: ["plain", "k=4", "k=3"] for b in (8, 32, 128)}  # fmt: skip
    row = widths["rows"][0]["arms"]["k=3"]
    assert split[8]["k=3"]["host"] == pytest.approx(
        row["steady_ms_by_width"]["4"] - row["steady_step_ms_by_width"]["4"]
        - row["steady_rollback_ms_by_width"]["4"]
    )  # fmt: skip
    bars = round_split_figure(widths)
    assert [t.type for t in bars.data] == ["bar"] * 3 + ["scatter"] and len(bars.data[0].y) == 9
    assert bars.data[3].text[4] == f"{split[32]['k=4']['over_plain']:.2f}x"
    with pytest.raises(ValueError, match=r"result: its rows record no steady_ms_by_width"):
        round_split(load_bench("data/bench_spec_steady_k_h100_cfbdb4f.json"))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_streams_of_mixed_requests_keep_every_requests_tokens(strategy, seed):
    """Random arrivals, budgets, concurrency caps and k; requests with a synthetic drafter
    (acceptance from 0 to 1), prompt lookup or none, in one stream."""
    rng = random.Random(seed)
    k = rng.randint(1, 4)
    engine = DecodeEngine(MODEL, 4, 28, strategy, log_length=5, max_verify=5)
    watch = Watched(engine)
    need = request_bytes(slot_bytes(engine), max(map(len, PROMPTS)), max(OUTS), k)
    sched = Scheduler(
        engine, budget_bytes=rng.randint(need, 4 * need), k=k, max_running=rng.randint(1, 4)
    )
    watch.sched = sched
    t = 0.0
    for i, (p, n) in enumerate(zip(PROMPTS, OUTS)):
        t += rng.expovariate(300.0) * rng.choice([0, 1, 3])
        kind = rng.choice(["none", "synthetic", "lookup"])
        drafter = {
            "none": None,
            "synthetic": SyntheticDrafter(torch.cat([p, ALONE[i]]), rng.random(), seed=i),
            "lookup": PromptLookupDrafter(),
        }[kind]
        sched.add(Request(i, p, n, arrival=t, drafter=drafter))
    finished = sched.run()
    assert len(finished) == len(PROMPTS) and watch.checked > 0
    for r in finished:
        assert torch.equal(torch.tensor(r.tokens), ALONE[r.id]), f"request {r.id} differs"


def test_an_admission_rule_can_be_plugged_in_and_cannot_break_the_budget():
    def one_at_a_time(needs, used, budget, free_slots):
        return min(1, admissible(needs, used, budget, free_slots))

    engine = DecodeEngine(MODEL, 3, 28, "replay", log_length=5, max_verify=5)
    sched = Scheduler(engine, admission=one_at_a_time)
    finished = sched.run(_requests("decode", [0.0] * len(PROMPTS)))
    assert all(len(h.admitted) <= 1 for h in sched.history)
    assert all(torch.equal(torch.tensor(r.tokens), ALONE[r.id]) for r in finished)

    def greedy_rule(needs, used, budget, free_slots):
        return len(needs)

    budget = request_bytes(slot_bytes(engine), max(map(len, PROMPTS)), max(OUTS))
    sched = Scheduler(engine, budget_bytes=budget, admission=greedy_rule)
    for r in _requests("decode", [0.0] * len(PROMPTS)):
        sched.add(r)
    with pytest.raises(ValueError, match=r"admission: the rule admitted n=9; expected 0 <= n <= 3 \(9 requests arrived, 3 slots free\)"):  # fmt: skip
        sched.step()
    assert engine.batch == 0 and sched.used == 0 and len(sched.waiting) == len(PROMPTS)
    sched = Scheduler(engine, admission=lambda needs, used, budget, free: 0)  # never moves
    for r in _requests("decode", [0.0] * len(PROMPTS)):
        sched.add(r)
    with pytest.raises(
        ValueError, match=r"admitted none of 9 waiting requests, all arrived, with none running"
    ):
        sched.run(max_steps=50)  # it looped forever (50 steps: a failure, not a hang)
    assert engine.batch == 0 and sched.used == 0 and len(sched.waiting) == len(PROMPTS)

    opened = []

    def three_at_once(needs, used, budget, free_slots):  # waits for the first three arrivals
        opened.append(opened[-1] if opened and opened[-1] else len(needs) >= 3)
        return admissible(needs, used, budget, free_slots) if opened[-1] else 0

    sched = Scheduler(engine, admission=three_at_once)
    finished = sched.run(_requests("decode", [0.0, 0.002, 0.004] + [0.004] * (len(PROMPTS) - 3)))
    assert sorted(r.id for r in finished) == list(range(len(PROMPTS)))
    sched = Scheduler(
        engine, budget_bytes=budget, admission=lambda needs, used, budget, free: min(2, free)
    )
    for r in _requests("decode", [0.0] * len(PROMPTS)):
        sched.add(r)
    with pytest.raises(ValueError, match=r"admitted 2 requests holding .* at most budget_bytes"):
        sched.step()
    assert engine.batch == 0 and sched.used == 0
    with pytest.raises(TypeError, match=r"admission: expected a function, got int"):
        Scheduler(engine, admission=3)


class _ContextChecker:
    """A batched drafter that checks each row it is handed against its request's context
    rebuilt from scratch (prompt, then tokens; zeros past it), then drafts synthetically."""

    def __init__(self, references):
        self.inner = BatchSyntheticDrafter(references, 0.6, seed=1)
        self.sched, self.calls = None, 0

    def propose_batch(self, contexts, lengths, rows, k, vocab):
        by_slot = {r.slot: r for r in self.sched.running}
        for row, n, slot in zip(contexts, lengths.tolist(), rows.tolist()):
            want = by_slot[slot].context()
            assert n == want.numel() and torch.equal(row[:n], want) and not row[n:].any()
        assert contexts.shape[1] == int(lengths.max()) + k + 1
        self.calls += 1
        ids = torch.tensor([by_slot[s].id for s in rows.tolist()])
        return self.inner.propose_batch(contexts, lengths, ids, k, vocab)


@pytest.mark.parametrize("strategy", ["snapshot", "replay"])
@pytest.mark.parametrize("mode", ["plain", "prefix", "interleaved", "prefix+interleaved"])
def test_the_batched_drafter_reads_each_requests_own_context_on_every_admission_path(
    strategy, mode
):
    """The scheduler's context table (``serving.contexts``) holds each running request's prompt
    and tokens, with no tail of a slot's previous tenant, whichever way it was admitted (plain,
    through the prefix cache, interleaved, both); 10 requests share 3 slots, and every request
    still gets its greedy tokens."""
    gen = torch.Generator().manual_seed(7)
    vocab = MODEL.cfg.vocab_size
    shared = torch.randint(0, vocab, (20,), generator=gen)
    prompts, outs = [], []
    for i in range(10):
        tail = torch.randint(
            0, vocab, (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen
        )
        prompts.append(torch.cat([shared[: 16 if i % 2 else 3], tail]))
        outs.append(int(torch.randint(1, 12, (1,), generator=gen)))
    alone = [greedy(MODEL, p[None], n, "snapshot").tokens[0] for p, n in zip(prompts, outs)]
    engine = DecodeEngine(MODEL, 3, 40, strategy, log_length=4, max_verify=4)
    drafter = _ContextChecker([torch.cat([p, a]) for p, a in zip(prompts, alone)])
    kw = dict(prefix=EnginePrefixCache(engine, block_size=4)) if "prefix" in mode else {}
    if "interleaved" in mode:
        kw["prefill_per_step"] = 5
    sched = drafter.sched = Scheduler(engine, k=3, drafter=drafter, **kw)
    done = sched.run(
        [Request(i, p, n, arrival=0.1 * i) for i, (p, n) in enumerate(zip(prompts, outs))]
    )
    assert sorted(r.id for r in done) == list(range(10)) and drafter.calls > 0
    for r in done:
        assert torch.equal(torch.tensor(r.tokens), alone[r.id]), r.id
    if "prefix" in mode:
        assert any(r.prefix_hit.matched for r in done)


def test_each_iteration_records_the_graphs_captured_in_it():
    """``StepRecord.captures``: the graphs the engine captured inside that iteration (here the
    runner's 2nd and 5th calls stand in for captures; graphs run only on a GPU)."""
    engine = DecodeEngine(MODEL, 2, 28, "snapshot", max_verify=1)
    run, calls, capturing = engine.runner.run, [], {2, 5}

    def counted(*args):
        calls.append(len(sched.history))  # the iteration this call belongs to
        if len(calls) in capturing:
            engine.stats.graph_captures += 1
        return run(*args)

    engine.runner.run = counted
    sched = Scheduler(engine)
    sched.run(_requests("decode", [0.0] * len(PROMPTS)))
    expected = [0] * len(sched.history)
    for n in capturing:
        expected[calls[n - 1]] += 1
    assert [h.captures for h in sched.history] == expected and sum(expected) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_on_a_gpu_the_captures_recorded_are_the_engines_and_a_warm_engine_captures_none():
    model = tiny_hybrid().cuda()
    engine = DecodeEngine(model, 2, 28, "replay", 4, max_verify=3, graphs=True)

    def serve():
        sched = Scheduler(engine, k=2)
        requests = _requests("synthetic", [0.0] * len(PROMPTS))
        for r in requests:
            r.prompt = r.prompt.cuda()
        sched.run(requests)
        return sum(h.captures for h in sched.history)

    first = serve()
    graphs = len(engine.runner.captured) + len(engine.runner.rollbacks)  # steps, rollbacks
    assert first == engine.stats.graph_captures == graphs and engine.runner.rollbacks
    assert serve() == 0


def test_the_budget_functions_refuse_negative_counts_by_name():
    """Found by a learner: these returned numbers for a negative request or budget."""
    from replaylab.serving.budget import SlotBytes

    sizes = SlotBytes(100, 10, 8)
    with pytest.raises(ValueError, match=r"k: expected 0 <= k, got -1"):
        request_bytes(sizes, 4, 3, k=-1)
    with pytest.raises(ValueError, match=r"prompt_len: expected 1 <= prompt_len, got 0"):
        request_bytes(sizes, 0, 3)
    with pytest.raises(ValueError, match=r"needs\[0\] = -5; expected bytes >= 0"):
        admissible([-5, 20], 0, 10, 3)
    with pytest.raises(ValueError, match=r"free_slots: expected 0 <= free_slots, got -1"):
        admissible([1], 0, 10, -1)
    assert request_bytes(sizes, 4, 3, k=2) == 100 + 10 * 8 and admissible([4, 4], 2, 10, 3) == 2
    with pytest.raises(TypeError, match=r"free_slots: expected an integer, got float 1.5"):
        admissible([1, 1, 1], 0, 10, 1.5)  # admitted 2 of "1.5" slots
    with pytest.raises(ValueError, match=r"needs\[0\] = nan; expected bytes >= 0"):
        admissible([float("nan")], 0, 10, 2)
    with pytest.raises(TypeError, match=r"pos of slot 0: expected an integer, got float 10.5"):
        rollback_cursor([10.5], [5], [3], [1])


@pytest.mark.parametrize(
    "needs, used, budget, match",
    [
        (["2"], 0, 10, r"needs\[0\] = '2'; expected bytes >= 0"),
        ([1, None], 0, 10, r"needs\[1\] = None; expected bytes >= 0"),
        ([1], "0", 10, r"expected used >= 0 bytes, got '0'"),
        ([1], 0, True, r"expected budget >= 0 bytes, got True"),
        ([torch.tensor([1, 2])], 0, 10, r"needs\[0\] = tensor\(\[1, 2\]\)"),
        ([torch.tensor([5])], 0, 10, r"needs\[0\] = tensor\(\[5\]\)"),
    ],
)
def test_admissible_names_a_byte_count_that_is_no_number(needs, used, budget, match):
    """A text, None, a bool or a tensor of many elements gave a raw TypeError (or a bool's 1)."""
    with pytest.raises(ValueError, match=match):
        admissible(needs, used, budget, 2)


def test_admissible_takes_numpy_and_0d_torch_byte_counts():
    import numpy as np

    assert admissible([np.int64(4), torch.tensor(4), 4.0], np.float64(1), torch.tensor(9), 3) == 2


def test_best_k_takes_numpy_and_torch_numbers_and_refuses_words_and_booleans():
    import numpy as np

    from replaylab.serving.adaptive_k import best_k

    times = [1.0, 1.2]
    assert best_k(0.8, np.array(times, dtype=np.float32)) == best_k(0.8, times) == 1
    assert best_k(np.float32(0.8), torch.tensor(times)) == 1
    assert best_k(0.8, [np.int64(1), 2]) == 0
    for bad, shown in (("0.8", "str '0.8'"), (True, "bool True")):
        with pytest.raises(ValueError, match=f"acceptance: expected a probability in \\[0, 1\\], got {shown}"):  # fmt: skip
            best_k(bad, times)


def test_the_stream_benchmark_times_a_second_batch_one_pass_when_warming_up(monkeypatch):
    """The objective's wait bound is the batch-1 time to serve a request: with ``warm_up`` the
    first pass (compiles, allocations) is served and left out, and only the second is timed."""
    import replaylab.bench.stream as stream_bench

    passes, original = [], stream_bench.serve_stream

    def serve(engine, requests, *args, **kwargs):
        done, sched = original(engine, requests, *args, **kwargs)
        if kwargs.get("max_running") == 1:
            passes.append(done)
            if len(passes) == 2:  # plain decode's first pass (after the k-draft engine's), slow
                for r in done:
                    r.finished_at += 10.0
        return done, sched

    monkeypatch.setattr(stream_bench, "serve_stream", serve)
    result = run_stream_bench(
        "cpu", strategies=("replay",), modes=("decode",), sweep=False, rate_search=(),
        warm_up=True, n_requests=3, k=2,
    )  # fmt: skip
    b1 = result["strategies"]["replay"]["batch1"]
    assert b1["request_latency_first_pass_s"] > 10 > b1["request_latency_s"] > 0
    assert result["objective"]["wait_p90_max_s"] == b1["request_latency_s"]
    assert len(passes) == 3  # the k-draft engine's references once, plain decode's twice


def test_the_stream_benchmark_refuses_batch_one_passes_that_differ(monkeypatch):
    """The two batch-1 passes must give the same tokens: else one of them is not greedy."""
    import replaylab.bench.stream as stream_bench

    passes, original = [], stream_bench.serve_stream

    def serve(engine, requests, *args, **kwargs):
        done, sched = original(engine, requests, *args, **kwargs)
        if kwargs.get("max_running") == 1:
            passes.append(done)
            if len(passes) == 3:  # plain decode's second pass
                done[0].tokens[-1] += 1
        return done, sched

    monkeypatch.setattr(stream_bench, "serve_stream", serve)
    with pytest.raises(RuntimeError, match="replay: the same requests served alone twice differ"):
        run_stream_bench(
            "cpu", strategies=("replay",), modes=("decode",), sweep=False, rate_search=(),
            warm_up=True, n_requests=3, k=2,
        )  # fmt: skip
