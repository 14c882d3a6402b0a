"""The request-stream benchmark (``replaylab bench serve-stream``): the seed's measurements at
serving shape. Requests arrive as a Poisson process, with prompt and output lengths drawn
from stated distributions (seeded), and a ``Scheduler`` serves them by continuous batching
under one byte budget for KV + state + logs, per strategy, with and without speculation.

What ``run_stream_bench`` reports, per strategy and mode ("decode"; "synthetic": each request
its own Bernoulli drafter of per-draft acceptance 0.8 over the greedy continuation, k = 4;
"lookup": prompt lookup, k = 4):

- at the reference rate: TTFT and TPOT at p50 / p99 (and their per-request values, for the
  distributions), output tokens/s, acceptance (accepted / proposed drafts), bytes per
  sequence (pool bytes of a slot and the request's accounted bytes; on a GPU the device's
  peak memory less the weights, per slot, CUDA graph pools and activations included),
  rollback cost, how many requests' tokens equal their tokens in the plain-decode stream and,
  for the first eight requests, their tokens when served alone (batch 1). Plain decode runs
  on an engine built for it (``max_verify`` 1, ``pool_bytes_per_slot_plain_decode``: a
  snapshot slot holds no draft states), speculation on one built for k drafts
  (``pool_bytes_per_slot``); until 2026-12-07 one engine built for k drafts served every
  mode. Each row's references (served alone) and the batch-1 times come from engines built
  the same way (plain decode's for the objective); the device's peak per slot is over both
  engines' slots. ``tokens_equal_decode_stream`` compares a speculative row with the plain
  decode stream, served by the other engine;
- the largest sustainable request rate: a geometric search over rates (from the rate that
  keeps about two requests in flight at batch-1 latency, doubling or halving, then
  bisecting) for the largest one at which p99 TPOT <= 2x the batch-1 TPOT (one objective for
  every row: twice the lowest batch-1 median TPOT among the strategies) and the queue keeps up
  (p90 wait for admission <= the batch-1 time to serve one request). With ``warm_up`` (a
  GPU's default) plain decode's engine serves the batch-1 requests twice and the second pass
  is timed (the
  first compiles the prompts' shapes and allocates; ``request_latency_first_pass_s``); until
  2026-12-08 one pass was timed, and the first strategy's could carry a warm-up;
- the crossover: decode and speculative (synthetic, 0.8, k = 4) tokens/s over a sweep of
  batches (every request arriving at once, concurrency capped at the batch, decode-only time:
  iterations after the one that admitted them), and the batch from which speculation stops
  beating decode; beside it the cost model's prediction, a two-term roofline (bytes over the
  copy bandwidth, FLOPs over the bf16 matrix rate) of a decode step and of a (k+1)-token
  verify round, and the batch at which the verify becomes compute-bound.

Rollback cost: a verify step costs the same whatever is accepted, so what a rejection adds is
the rollback itself (snapshot: copy a kept state back; recompute: copy the saved state back
and re-run the kept tokens; replay: move a cursor). It is timed around ``engine.rollback``
(synchronised on a GPU) and divided by the drafts it rejected: extra ms per rejected draft.

Glossary: rate (requests/s), TTFT, TPOT (``serving.request``), k drafts per round, B batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from replaylab.decoding import PromptLookupDrafter, SyntheticDrafter
from replaylab.serving import STRATEGIES, DecodeEngine, Request, Scheduler
from replaylab.serving.request import percentile
from replaylab.serving.validate import given
from replaylab.validation import as_int, as_real

__all__ = [
    "StreamSpec",
    "make_stream",
    "stream_requests",
    "serve_stream",
    "stream_metrics",
    "sustainable_rate",
    "crossover_sweep",
    "predicted_crossover",
    "run_stream_bench",
    "stream_summary",
    "MODES",
    "PRESETS",
    "MATMUL_RATE",
]

MODES = ("decode", "synthetic", "lookup")
# bf16 FLOP/s for the cost model's crossover: the figure DESIGN.md section 6 records from an
# earlier H200 run on random data, which no file in data/ holds (the one measured run committed,
# data/bench_serve_ragged.json, has its own `matrix_rate_tflops`); kept as a constant so that
# importing this module reads no file, and labelled as such wherever a result quotes it
MATMUL_RATE = 790e12
MATMUL_RATE_SOURCE = "DESIGN.md section 6's figure from an earlier H200 run, not in data/"


# the runs' sizes: "cpu" is a smoke run in seconds (tiny model); "8b-layers" is the GPU run
PRESETS = {
    "cpu": dict(
        model="tiny",
        n_requests=10,
        prompt_len=(6, 24),
        output_len=(4, 16),
        rate=40.0,
        max_batch=4,
        budget_requests=3,
        log_length=8,
        sweep_batches=(1, 2, 4),
        sweep_tokens=12,
        rate_probes=3,
    ),
    "8b-layers": dict(
        model="8b-layers",
        n_requests=40,
        prompt_len=(32, 128),
        output_len=(16, 64),
        rate=50.0,
        max_batch=64,
        budget_gib=3.0,
        log_length=16,
        sweep_batches=(1, 4, 8, 16, 32, 64),
        sweep_tokens=32,
        rate_probes=5,
    ),
}


@dataclass(frozen=True)
class StreamSpec:
    """A seeded request stream: ``n_requests``; prompt lengths uniform on the integers
    ``prompt_len`` = (low, high), each prompt a random segment of half its length repeated
    (so prompt lookup has n-grams to find); output lengths uniform on ``output_len``;
    inter-arrival gaps exponential with mean 1 / rate (a Poisson process)."""

    n_requests: int = 10
    prompt_len: tuple = (6, 24)
    output_len: tuple = (4, 16)
    seed: int = 0

    def __post_init__(self):
        as_int("n_requests", self.n_requests, low=1)
        as_int("seed", self.seed, low=0)
        for name in ("prompt_len", "output_len"):
            span = getattr(self, name)
            if not isinstance(span, (tuple, list)) or len(span) != 2:
                raise ValueError(f"{name}: expected (low, high), got {span!r}")
            low = as_int(f"{name}[0]", span[0], low=1)
            as_int(f"{name}[1]", span[1], low=low)


def make_stream(spec: StreamSpec, vocab):
    """(prompts: list of (T0,), output lengths: list of ints, unit-rate arrival times: list,
    the cumulative sum of Exp(1) gaps; divide by a rate for that rate's arrivals)."""
    g = torch.Generator().manual_seed(spec.seed)
    lo, hi = spec.prompt_len
    olo, ohi = spec.output_len
    prompts, outs, arrivals, t = [], [], [], 0.0
    for _ in range(spec.n_requests):
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        half = torch.randint(0, vocab, ((n + 1) // 2,), generator=g)
        prompts.append(torch.cat([half, half])[:n])
        outs.append(int(torch.randint(olo, ohi + 1, (1,), generator=g)))
        t += float(-torch.log1p(-torch.rand(1, generator=g, dtype=torch.float64)))
        arrivals.append(t)
    return prompts, outs, arrivals


def stream_requests(stream, rate, mode="decode", references=None, acceptance=0.8, seed=0):
    """Fresh ``Request`` s of ``stream`` (``make_stream``'s triple) arriving at ``rate``
    requests/s (``math.inf``: all at once), each with its own drafter for ``mode``:
    "decode" none, "synthetic" a ``SyntheticDrafter`` over ``references[i]`` (the prompt and
    its greedy tokens), "lookup" a ``PromptLookupDrafter``."""
    rate = as_real("rate", rate, above=0, unit=" (requests/s)", finite=False)
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    prompts, outs, arrivals = stream
    if mode == "synthetic" and (references is None or len(references) < len(prompts)):
        raise ValueError(
            f"references: the synthetic mode needs one reference per request ({len(prompts)}), "
            f"got {given(references)}"
        )
    reqs = []
    for i, (p, n, a) in enumerate(zip(prompts, outs, arrivals)):
        if mode == "decode":
            drafter = None
        elif mode == "synthetic":
            drafter = SyntheticDrafter(references[i], acceptance, seed=seed + i)
        elif mode == "lookup":
            drafter = PromptLookupDrafter()
        else:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        arrival = 0.0 if math.isinf(rate) else a / rate
        reqs.append(Request(i, p, n, arrival=arrival, drafter=drafter))
    return reqs


def serve_stream(engine, requests, k=0, budget_bytes=None, max_running=None):
    """Serve ``requests`` through a fresh ``Scheduler``; returns (finished requests, the
    scheduler). The engine is left empty."""
    sched = Scheduler(engine, budget_bytes=budget_bytes, k=k, max_running=max_running)
    sched.run(requests)
    return sorted(sched.finished, key=lambda r: r.id), sched


def _dist(values):
    vals = [v for v in values if v == v]
    return dict(
        p50=percentile(vals, 50),
        p99=percentile(vals, 99),
        mean=sum(vals) / len(vals) if vals else float("nan"),
        values=vals,
    )


def stream_metrics(finished, sched, references=None, alone=None):
    """The distributions and totals of one served stream (see the module docstring).
    ``references``: per request id, its prompt and tokens from the plain-decode stream
    (``tokens_equal_decode_stream`` counts the requests whose tokens equal them); ``alone``:
    {request id: tokens (list) when that request was served alone} (``tokens_equal_alone``
    counts those requests whose tokens equal them)."""
    if not finished:
        raise ValueError("finished: expected the finished requests of a stream, got none")
    first = min(r.arrival for r in finished)
    last = max(r.finished_at for r in finished)
    tokens = sum(len(r.tokens) for r in finished)
    proposed = sum(r.proposed for r in finished)
    accepted = sum(r.accepted for r in finished)
    rollback_s = sum(h.rollback_s for h in sched.history)
    rejected = sum(h.rejected for h in sched.history)
    rolled = sum(h.rolled_back for h in sched.history)
    out = dict(
        requests=len(finished),
        output_tokens=tokens,
        seconds=last - first,
        tokens_per_s=tokens / (last - first) if last > first else float("nan"),
        ttft_s=_dist([r.ttft for r in finished]),
        tpot_s=_dist([r.tpot for r in finished]),
        wait_s=_dist([r.admitted_at - r.arrival for r in finished]),
        acceptance=accepted / proposed if proposed else None,
        tokens_per_round=sum(len(r.tokens) - 1 for r in finished)
        / max(1, sum(r.rounds for r in finished)),
        proposed=proposed,
        accepted=accepted,
        rollback=dict(
            seconds=rollback_s,
            rejected_drafts=rejected,
            slots_rolled_back=rolled,
            ms_per_rejected_draft=1e3 * rollback_s / rejected if rejected else None,
            ms_per_slot_rolled_back=1e3 * rollback_s / rolled if rolled else None,
        ),
        peak_running=sched.peak_running,
        peak_used_bytes=sched.peak_used,
        budget_bytes=sched.budget,
        accounted_bytes_per_request=_dist([r.reserved for r in finished]),
        engine_steps=len(sched.history),
        graph_captures=sum(h.captures for h in sched.history),
    )
    if references is not None:
        out["tokens_equal_decode_stream"] = sum(
            torch.equal(torch.tensor(r.tokens), references[r.id][-len(r.tokens) :])
            for r in finished
        )
    if alone is not None:
        out["tokens_equal_alone"] = sum(r.tokens == alone[r.id] for r in finished if r.id in alone)
        out["requests_served_alone"] = sum(r.id in alone for r in finished)
    return out


def _slim(metrics):
    """Metrics without the per-request value lists (for the rate-search probes)."""
    return {
        k: ({kk: vv for kk, vv in v.items() if kk != "values"} if isinstance(v, dict) else v)
        for k, v in metrics.items()
    }


def sustainable_rate(probe, start, objective, probes=6):
    """The largest rate that meets ``objective`` (dict with ``tpot_p99_max_s`` and
    ``wait_p90_max_s``), found by doubling from ``start`` while it holds (or halving while it
    does not), then bisecting geometrically with the probes left; ``probe(rate)`` returns
    ``stream_metrics``. Returns (rate or None, the probes as [{rate, tpot_p99, wait_p90,
    ok}])."""

    def ok(rate):
        m = probe(rate)
        good = (
            m["tpot_s"]["p99"] <= objective["tpot_p99_max_s"]
            and percentile(m["wait_s"]["values"], 90) <= objective["wait_p90_max_s"]
        )
        tried.append(
            dict(
                rate=rate,
                tpot_p99_s=m["tpot_s"]["p99"],
                wait_p90_s=percentile(m["wait_s"]["values"], 90),
                tokens_per_s=m["tokens_per_s"],
                graph_captures=m.get("graph_captures"),
                draft_graph_captures=m.get("draft_graph_captures"),
                ok=good,
            )
        )
        return good

    start = as_real("start", start, above=0, unit=" (requests/s)")
    probes = as_int("probes", probes, low=1)
    for key in ("tpot_p99_max_s", "wait_p90_max_s"):
        if not isinstance(objective, dict) or key not in objective:
            raise ValueError(f"objective: expected a dict with {key!r}, got {objective!r}")
        as_real(f"objective[{key!r}]", objective[key], above=0, unit=" (s)", finite=False)
    tried = []
    lo, hi = None, None
    rate = start
    while len(tried) < probes and (lo is None or hi is None):
        if ok(rate):
            lo = rate
            rate = rate * 2
        else:
            hi = rate
            rate = rate / 2
        if lo is not None and hi is not None:
            break
    while len(tried) < probes and lo is not None and hi is not None:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, tried


def preset_config(presets, preset, overrides) -> dict:
    """``presets[preset]`` with ``overrides`` replacing its fields; refuses an unknown preset
    or field, naming the known ones."""
    if preset not in presets:
        raise ValueError(f"preset: expected one of {sorted(presets)}, got {preset!r}")
    unknown = set(overrides) - set(presets[preset])
    if unknown:
        raise ValueError(
            f"overrides: unknown fields {sorted(unknown)}; known {sorted(presets[preset])}"
        )
    return {**presets[preset], **overrides}


def _closed_batch(engine, reqs, k, budget=None):
    """``reqs`` arriving at once, all running together (concurrency capped at their number).
    Returns (tokens/s on the scheduler's clock, tokens/s of engine time alone (its steps and
    rollbacks, without the drafters and the scheduler's own work), acceptance or None, the
    mean ms of an engine step while every request takes part), all over the iterations after
    the first, which admits them."""
    sched = Scheduler(engine, budget_bytes=budget, k=k, max_running=len(reqs))
    for r in reqs:
        sched.add(r)
    sched.step()  # admits every request and decodes one step
    if sched.peak_running < len(reqs):
        sched.run()
        raise ValueError(
            f"batch: {len(reqs)} requests do not fit the budget of {sched.budget} bytes "
            f"({sched.peak_running} admitted at once)"
        )
    t0, tokens0 = sched.now, sum(len(r.tokens) for r in reqs)
    sched.run()
    tokens = sum(len(r.tokens) for r in reqs) - tokens0
    full = [h for h in sched.history[1:] if h.running == len(reqs)] or sched.history[1:]
    engine_s = sum(h.step_s + h.rollback_s for h in sched.history[1:])
    proposed = sum(r.proposed for r in reqs)
    acc = sum(r.accepted for r in reqs) / proposed if proposed else None
    step_ms = 1e3 * sum(h.step_s for h in full) / len(full) if full else None
    return tokens / (sched.now - t0), tokens / engine_s, acc, step_ms


def crossover_sweep(engine, stream, batches, n_new, k, acceptance=0.8, budget=None, seed=0):
    """Per batch B: tokens/s of B requests decoding together (the stream's first prompts,
    ``n_new`` tokens each) and of the same requests speculating, each with its own synthetic
    drafter over the tokens plain decoding gave it; both on the scheduler's clock (drafters
    and scheduling included) and in engine time alone; and the time of one (k+1)-token verify
    step over one decode step at that batch (the measured side of "compute-bound"). Returns (rows, the smallest batch of
    the sweep from which speculation is slower in engine time, the same on the clock; None:
    faster at every batch)."""
    prompts = stream[0]
    rows = []
    for b in batches:
        sub = ([prompts[i % len(prompts)] for i in range(b)], [n_new] * b, [0.0] * b)
        plain = stream_requests(sub, math.inf)
        dec, dec_engine, _, dec_ms = _closed_batch(engine, plain, 0, budget)
        refs = [torch.cat([r.prompt, torch.tensor(r.tokens)]) for r in plain]
        spec_reqs = stream_requests(sub, math.inf, "synthetic", refs, acceptance, seed)
        spec, spec_engine, acc, ver_ms = _closed_batch(engine, spec_reqs, k, budget)
        differ = sum(s.tokens != r.tokens for s, r in zip(spec_reqs, plain))
        rows.append(
            dict(
                batch=b,
                decode_tokens_per_s=dec,
                speculative_tokens_per_s=spec,
                decode_engine_tokens_per_s=dec_engine,
                speculative_engine_tokens_per_s=spec_engine,
                acceptance=acc,
                decode_step_ms=dec_ms,
                verify_step_ms=ver_ms,
                # 1 while a (k+1)-row verify costs what a decode step does (memory-bound);
                # towards k + 1 as its matrix products turn compute-bound
                verify_over_decode_step=ver_ms / dec_ms if dec_ms and ver_ms else None,
                speculation_faster=spec_engine > dec_engine,
                speculation_faster_on_the_clock=spec > dec,
                speculative_tokens_differ=differ,
            )
        )
    cross = next((r["batch"] for r in rows if not r["speculation_faster"]), None)
    wall = next((r["batch"] for r in rows if not r["speculation_faster_on_the_clock"]), None)
    return rows, cross, wall


def _matmul_params(model):
    """Parameters that a forward multiplies (the embedding table is looked up, not
    multiplied, unless it is tied to the head)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.model.embeddings.weight
    tied = emb is getattr(model.lm_head, "weight", None)
    return total if tied else total - emb.numel()


def predicted_crossover(
    cfg,
    n_params,
    strategy,
    batches,
    *,
    k=4,
    acceptance=0.8,
    log_length=16,
    context_len=128,
    bandwidth=None,
    matmul_rate=MATMUL_RATE,
    esize=2,
):
    """The cost model's decode and speculative time per output token per batch, each a
    two-term roofline max(bytes / bandwidth, FLOPs / matmul_rate):

    decode step: ``costmodel.decode_token_bytes`` x B (weights once, state, conv, log, KV);
    FLOPs 2 n_params B. Verify round: the weights once, per sequence the state traffic of a
    round (``costmodel.predict``'s ``moved_per_round``) and the KV of the context; FLOPs
    2 n_params B (k + 1); it yields 1 + E[a] tokens per sequence. Returns (rows for
    ``batches``, the smallest batch from 1 to about 4,000 at which speculation is predicted
    no faster (None: faster throughout), the batch from which the verify round's FLOP term
    exceeds its byte term)."""
    from replaylab import costmodel as cm

    bw = cm.HARDWARE["H200"].bandwidth if bandwidth is None else bandwidth
    bw = as_real("bandwidth", bw, above=0, unit=" (bytes/s)")
    matmul_rate = as_real("matmul_rate", matmul_rate, above=0, unit=" (FLOP/s)")
    batches = tuple(as_int(f"batches[{i}]", b, low=1) for i, b in enumerate(batches))
    shape = cm.shape_from_config(cfg)
    rate_label = f"matrix rate {matmul_rate / 1e12:.0f} TFLOP/s" + (
        f" ({MATMUL_RATE_SOURCE})" if matmul_rate == MATMUL_RATE else " (given by the caller)"
    )
    hw = cm.Hardware(f"H200, {rate_label}", bw, matmul_rate)
    weights = n_params * esize
    kv_token = shape.kv_elems_per_token * esize

    def at(b):
        parts = cm.decode_token_bytes(
            shape,
            strategy,
            batch=b,
            context_len=context_len,
            log_length=log_length,
            interval=10**9,  # the engine checkpoints before a verify only
            weight_bytes=weights,
            kv_bytes=esize,
            act_bytes=esize,
        )
        dec_bytes = b * sum(parts.values())
        dec_flops = 2.0 * n_params * b
        dec_step = max(dec_bytes / bw, dec_flops / matmul_rate)
        w = cm.Workload(
            batch=b, k=k, acceptance=acceptance, interval=log_length, context_len=context_len
        )
        p = cm.predict(shape, w, hw, n_params)[strategy]
        ver_bytes = weights + b * (p["moved_per_round"] + kv_token * (context_len + k + 1))
        ver_flops = 2.0 * n_params * b * (k + 1)
        ver_round = max(ver_bytes / bw, ver_flops / matmul_rate)
        return dict(
            batch=b,
            decode_s_per_token=dec_step / b,
            speculative_s_per_token=ver_round / (b * p["tokens_per_round"]),
            decode_bound="flops" if dec_flops / matmul_rate > dec_bytes / bw else "bytes",
            verify_bound="flops" if ver_flops / matmul_rate > ver_bytes / bw else "bytes",
        )

    rows = [at(b) for b in batches]
    grid = sorted({int(1.05**i) for i in range(171)} | set(batches))  # 1 .. 4,128
    cross = next(
        (b for b in grid if (r := at(b))["speculative_s_per_token"] >= r["decode_s_per_token"]),
        None,
    )
    # the verify's FLOP term overtakes its byte term: 2 n (k+1) B / rate = bytes(B) / bw, with
    # bytes(B) = weights + B x (the state traffic of a round + the KV it reads)
    one = cm.Workload(
        batch=1, k=k, acceptance=acceptance, interval=log_length, context_len=context_len
    )
    per_seq = cm.predict(shape, one, hw, n_params)[strategy]["moved_per_round"]
    per_seq += kv_token * (context_len + k + 1)
    slope = 2.0 * n_params * (k + 1) / matmul_rate - per_seq / bw
    compute_bound = math.ceil(weights / bw / slope) if slope > 0 else None
    return rows, cross, compute_bound


def _model(name, device):
    from replaylab.model import HybridLM, preset

    model = HybridLM(preset(name), seed=0).eval()
    if device.type == "cuda":
        model = model.to(device, torch.bfloat16)
    return model


def _warm_up(engine, stream, k, n_new, buckets=None):
    """Capture every CUDA graph the timed runs can meet before timing them: each batch bucket
    (default: all of the engine's) decoding and speculating past a fold (replay) and through
    rollbacks (recompute's re-runs); k = 0: decoding only."""
    prompts = stream[0]
    for b in buckets or engine.buckets:
        sub = ([prompts[i % len(prompts)] for i in range(b)], [n_new] * b, [0.0] * b)
        plain = stream_requests(sub, math.inf)
        _closed_batch(engine, plain, 0)
        if k:
            refs = [torch.cat([r.prompt, torch.tensor(r.tokens)]) for r in plain]
            _closed_batch(engine, stream_requests(sub, math.inf, "synthetic", refs, 0.5), k)


def run_stream_bench(
    preset="cpu",
    device=None,
    strategies=STRATEGIES,
    modes=MODES,
    k=4,
    acceptance=0.8,
    seed=0,
    rate=None,
    budget_bytes=None,
    sweep=True,
    rate_search=("decode", "synthetic"),
    warm_up=None,
    log=None,
    checkpoint=None,
    **overrides,
):
    """The whole benchmark for one ``PRESETS`` entry (``overrides`` replace its fields);
    returns a JSON-ready dict (without provenance; the CLI adds it). ``warm_up``: capture
    the graphs before timing (default: on a GPU); ``log``: a function that takes a progress
    line (default: none); ``checkpoint``: a function called with the result so far after
    the batch-1 pass and after each strategy (the CLI writes it, so a cut run keeps what it
    measured)."""
    cfg_run = preset_config(PRESETS, preset, overrides)
    for m in modes:
        if m not in MODES:
            raise ValueError(f"modes: expected some of {MODES}, got {m!r}")
    if rate is not None:  # 0 ran at the preset's rate; inf: all at once
        as_real("rate", rate, above=0, unit=" (requests/s)", finite=False)
    as_real("acceptance", acceptance, low=0, high=1)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    warm_up = cuda if warm_up is None else warm_up
    t_start = time.perf_counter()

    def say(text):
        if log is not None:
            log(f"[{time.perf_counter() - t_start:7.1f} s] {text}")

    model = _model(cfg_run["model"], device)
    vocab = model.cfg.vocab_size
    spec = StreamSpec(
        cfg_run["n_requests"], tuple(cfg_run["prompt_len"]), tuple(cfg_run["output_len"]), seed
    )
    stream = make_stream(spec, vocab)
    rate = cfg_run["rate"] if rate is None else rate
    n_new_max = max(spec.output_len[1], cfg_run["sweep_tokens"])
    max_len = spec.prompt_len[1] + n_new_max + k + 1
    n_params = _matmul_params(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    L = cfg_run["log_length"]

    def engine_for(strategy, verify=k + 1):
        return DecodeEngine(
            model, cfg_run["max_batch"], max_len, strategy, log_length=L, max_verify=verify
        )

    result = dict(
        kind="serve-stream",
        preset=preset,
        model=cfg_run["model"],
        device_type=device.type,
        dtype=str(next(model.parameters()).dtype),
        stream=dict(
            asdict(spec),
            distributions="prompt length ~ uniform integers on prompt_len (a random half, "
            "repeated), output length ~ uniform integers on output_len, arrivals Poisson "
            "(exponential gaps of mean 1 / rate)",
            rate=rate,
        ),
        k=k,
        acceptance_setting=acceptance,
        max_batch=cfg_run["max_batch"],
        max_len=max_len,
        log_length=L,
        weight_bytes=weight_bytes,
        matmul_params=n_params,
        clock="time.perf_counter after torch.cuda.synchronize() on a GPU; idle gaps between "
        "arrivals skipped (Scheduler docstring)",
        warm_up=warm_up,
        strategies={},
    )
    # pass 1: batch 1 (the first requests, each served alone), for the common objective
    n1 = min(len(stream[0]), 8)
    alone_stream = tuple(x[:n1] for x in stream)
    alone_tokens = {}  # strategy -> {0: built for plain decode, k: for k drafts} -> tokens
    for strategy in strategies:
        alone_tokens[strategy] = {}
        for kind in (k, 0):  # the references of the rows each kind of engine serves
            engine = engine_for(strategy, kind + 1)
            if warm_up:
                _warm_up(engine, stream, kind, L + k + 2, buckets=[1])
            alone, sched = serve_stream(
                engine, stream_requests(alone_stream, math.inf), max_running=1
            )
            if warm_up and kind == 0:  # the timed pass: the first one compiled and allocated
                first = {r.id: r.tokens for r in alone}
                first_latency = sum(r.finished_at - r.admitted_at for r in alone) / n1
                alone, sched = serve_stream(
                    engine, stream_requests(alone_stream, math.inf), max_running=1
                )
                if {r.id: r.tokens for r in alone} != first:
                    raise RuntimeError(f"{strategy}: the same requests served alone twice differ")
            alone_tokens[strategy][kind] = {r.id: r.tokens for r in alone}
            if kind == k:
                pool = engine.nbytes_per_slot()
            del engine
        b1 = _slim(stream_metrics(alone, sched))  # plain decode's batch-1 times
        b1["request_latency_s"] = sum(r.finished_at - r.admitted_at for r in alone) / n1
        if warm_up:
            b1["request_latency_first_pass_s"] = first_latency
        result["strategies"][strategy] = dict(pool_bytes_per_slot=pool, batch1=b1)
        say(f"{strategy}: batch 1, TPOT {1e3 * b1['tpot_s']['p50']:.2f} ms")
        del sched
    if budget_bytes is not None:
        budget = int(budget_bytes)
    elif "budget_gib" in cfg_run:
        budget = int(cfg_run["budget_gib"] * 2**30)
    else:  # what budget_requests of the longest requests hold under snapshot
        from replaylab.serving.scheduler import request_bytes, slot_bytes

        sizes = slot_bytes(engine_for("snapshot"))
        longest = request_bytes(sizes, spec.prompt_len[1], spec.output_len[1], k)
        budget = cfg_run["budget_requests"] * longest
    result["budget_bytes"] = budget
    b1s = [r["batch1"] for r in result["strategies"].values()]
    objective = dict(
        tpot_p99_max_s=2 * min(b["tpot_s"]["p50"] for b in b1s),
        wait_p90_max_s=max(b["request_latency_s"] for b in b1s),
        rule="p99 TPOT <= 2x the lowest batch-1 median TPOT among the strategies, and p90 "
        "wait for admission <= the longest batch-1 mean time to serve one request",
    )
    result["objective"] = objective
    if checkpoint is not None:
        checkpoint(result)
    # pass 2: the stream, per strategy and mode; the rate search; the crossover sweep
    for strategy in strategies:
        row = result["strategies"][strategy]
        if cuda:
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        engine = engine_for(strategy)  # built for k drafts: speculation and the crossover
        plain = engine_for(strategy, 1)  # built for plain decode: no room for drafts
        if warm_up:
            _warm_up(engine, stream, k, L + k + 2)
            _warm_up(plain, stream, 0, L + k + 2)
        row["pool_bytes_per_slot_plain_decode"] = plain.nbytes_per_slot()
        row["modes"] = {}
        references = None
        for mode in ("decode", *[m for m in modes if m != "decode"]):
            kk = 0 if mode == "decode" else k
            served_by = plain if kk == 0 else engine
            reqs = stream_requests(stream, rate, mode, references, acceptance, seed)
            done, sched = serve_stream(served_by, reqs, kk, budget)
            if mode == "decode":  # its tokens are greedy: the synthetic drafters' references
                references = [torch.cat([r.prompt, torch.tensor(r.tokens)]) for r in done]
            m = stream_metrics(done, sched, references, alone_tokens[strategy][kk])
            if mode in rate_search:

                def probe(r, mode=mode, kk=kk, references=references, engine=served_by):
                    reqs = stream_requests(stream, r, mode, references, acceptance, seed)
                    done, sched = serve_stream(engine, reqs, kk, budget)
                    return stream_metrics(done, sched)

                start = 2.0 / objective["wait_p90_max_s"]  # about two requests in flight
                best, tried = sustainable_rate(probe, start, objective, cfg_run["rate_probes"])
                m["sustainable_rate"] = best
                m["rate_probes"] = tried
            if mode in modes:
                row["modes"][mode] = m
            say(
                f"{strategy} {mode}: TPOT p99 {1e3 * m['tpot_s']['p99']:.2f} ms, "
                f"{m['tokens_per_s']:.0f} tok/s, sustainable {m.get('sustainable_rate')}"
            )
        if sweep:
            rows, cross, wall = crossover_sweep(
                engine, stream, cfg_run["sweep_batches"], cfg_run["sweep_tokens"], k, acceptance
            )
            ctx = sum(spec.prompt_len) / 2 + cfg_run["sweep_tokens"] / 2
            pred, pcross, bound = predicted_crossover(
                model.cfg,
                n_params,
                strategy,
                cfg_run["sweep_batches"],
                k=k,
                acceptance=acceptance,
                log_length=L,
                context_len=int(ctx),
            )
            row["crossover"] = dict(
                measured_rows=rows,
                measured_batch=cross,
                measured_batch_on_the_clock=wall,
                measured="engine time (steps and rollbacks); *_on_the_clock: the scheduler's "
                "clock, with the Python drafters and the scheduler's own work",
                predicted_rows=pred,
                predicted_batch=pcross,
                verify_compute_bound_from_batch=bound,
                prediction_hardware="H200: copy bandwidth of costmodel.HARDWARE['H200'], "
                f"{MATMUL_RATE / 1e12:.0f} TFLOP/s bf16 matrix rate ({MATMUL_RATE_SOURCE})",
            )
            say(f"{strategy} crossover: measured {cross}, predicted {pcross}")
        if cuda:
            # the device's peak during this strategy's runs less what was allocated before
            # its two engines (the weights), over both engines' slots (until 2026-12-07 one
            # engine's: not comparable with earlier files)
            row["device_peak_less_weights_bytes_per_slot"] = (
                torch.cuda.max_memory_allocated() - base
            ) / (2 * cfg_run["max_batch"])
        row["engine_stats"] = asdict(engine.stats)
        row["plain_decode_engine_stats"] = asdict(plain.stats)
        del engine, plain
        result["seconds"] = round(time.perf_counter() - t_start, 2)
        if checkpoint is not None:
            checkpoint(result)
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    return result


def stream_summary(result):
    """Printable lines: per strategy and mode, TTFT / TPOT p50 and p99, tokens/s,
    acceptance, rollback cost, sustainable rate; then the crossover."""
    lines = [
        f"{result['model']} on {result['device_type']}, budget {result['budget_bytes']} bytes, "
        f"objective: p99 TPOT <= {1e3 * result['objective']['tpot_p99_max_s']:.2f} ms",
        f"{'strategy':>10} {'mode':>9} {'TTFT p50/p99 ms':>16} {'TPOT p50/p99 ms':>16} "
        f"{'tok/s':>9} {'accept':>6} {'rb ms/rej':>9} {'rate req/s':>10}",
    ]
    for strategy, row in result["strategies"].items():
        for mode, m in row.get("modes", {}).items():
            rb = m["rollback"]["ms_per_rejected_draft"]
            acc = m["acceptance"]
            sus = m.get("sustainable_rate")
            lines.append(
                f"{strategy:>10} {mode:>9} "
                f"{1e3 * m['ttft_s']['p50']:7.2f}/{1e3 * m['ttft_s']['p99']:<8.2f} "
                f"{1e3 * m['tpot_s']['p50']:7.2f}/{1e3 * m['tpot_s']['p99']:<8.2f} "
                f"{m['tokens_per_s']:9.0f} {'' if acc is None else f'{acc:.2f}':>6} "
                f"{'' if rb is None else f'{rb:.3f}':>9} "
                f"{'' if sus is None else f'{sus:.1f}':>10}"
            )
    st = result["strategies"]
    if (
        "replay" in st
        and "snapshot" in st
        and "modes" in st["replay"]
        and "modes" in st["snapshot"]
    ):
        for mode in st["replay"]["modes"]:
            a = st["replay"]["modes"][mode].get("sustainable_rate")
            b = st["snapshot"]["modes"].get(mode, {}).get("sustainable_rate")
            if a and b:
                lines.append(f"sustainable rate, replay / snapshot ({mode}): {a / b:.2f}x")
    for strategy, row in result["strategies"].items():
        c = row.get("crossover")
        if c:
            lines.append(
                f"crossover {strategy}: measured batch {c['measured_batch']} (engine time; "
                f"{c['measured_batch_on_the_clock']} on the clock), predicted "
                f"{c['predicted_batch']}, verify compute-bound from batch "
                f"{c['verify_compute_bound_from_batch']}"
            )
    return lines
