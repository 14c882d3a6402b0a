"""Request streams that share prefixes (``replaylab bench workload-stream``; issue 38, item 3):
four workloads arrive as Poisson processes at a serving ``Scheduler`` with the engine's prefix
cache (``serving.EnginePrefixCache``, default eviction), interleaved prefill and a byte budget
that binds, per strategy and decoding mode.

Workloads (``workload_prompts``; lengths in units of the block size b, so that prefixes span
one to two blocks and part off the block grid where the workload says so):

    multi_turn      3 conversations of 4 turns, round robin; each turn's prompt is the
                    previous one extended by b/4..b/2 tokens (opening b/2..b)
    system_prompts  3 system prompts of about 0.6b, 1.3b and 1.75b tokens, each with unique
                    user turns of b/8..b/3; 12 requests, round robin
    few_shot        2 example sets of 1.4b tokens and unique queries of b/16..b/5; 10 requests
    agents          one shared context of 1.3b tokens, then one of 3 tool calls of b/3 tokens,
                    then unique arguments of b/8..b/4; 12 requests. Every divergence is off
                    the grid (1.3b, 1.3b + b/3): replay resumes at the match, align below it

The counts are one round; ``rounds`` (the presets' 1, ``--rounds``) repeats each workload's
requests with fresh unique parts over the same shared ones, for streams long enough that a
rate is not only how a burst of 10-12 requests is absorbed.

Modes: "decode"; "synthetic" (each request its own drafter right with probability
``acceptance`` against the request's greedy tokens, k drafts); "lookup" (prompt lookup, k
drafts); "draft-model" (one ``serving.BatchModelDrafter`` over ``draft`` in its own replay
engine; the CPU preset's draft is the target with its weights perturbed, a stand-in).

The budget (``budget_bytes``, per mode): ``budget_share`` of the bytes every request of the
workload's first round would hold at once under snapshot (``Scheduler.need`` summed) on the
engines that serve the mode (plain decode's, or those built for k drafts), the same bytes for
every strategy and any ``rounds``, so that in every mode the budget holds about that share of
the requests' bytes under snapshot; the prefix tree's bytes count inside it. (Files before 2026-12-07's
per-mode budgets hold one budget, sized on the k-draft engines, for every mode: with plain
decode's smaller snapshot slots it left room for most of a workload's requests.)

Replay's prefix cache resumes as the preset's ``resume`` says (``EnginePrefixCache``): the gpu
preset's "chunk" makes a hit the cold prefill's bits and the scheduler's grants keep the alone
admission's chunk grid, so on a GPU too ``tokens_equal_alone`` compares one arithmetic (the
references of each row come from a batch-1 engine built as the one serving the row: for plain
decode or for k drafts); the timed batch-1 references are served twice there, the second
timed.

Plain decode runs on engines built for it (``max_verify`` 1: a snapshot slot holds no draft
states), the speculative modes on engines built for k drafts (files before 2026-12-07's
engine split ran plain decode on the speculative engines, whose snapshot slots held their
k + 1 states unused). One engine per strategy and kind (and
one draft engine) serves every stream of a workload, each
stream through a fresh scheduler and prefix cache; on a GPU every batch bucket's CUDA graphs
are captured before the first timed stream, and each row and rate probe records the graphs
its stream still captured (``graph_captures``, ``draft_graph_captures``: their eager runs are
inside its times).

Per (workload, strategy, mode, rate): TTFT and TPOT p50 / p99 (``stream.stream_metrics``),
output tokens/s, acceptance, the token hit rate (prompt tokens the prefix cache resumed from /
prompt tokens) and prompt tokens computed, peak bytes, and how many requests' tokens equal
their greedy tokens served alone by the same strategy without a prefix cache
(``tokens_equal_alone``). Per (workload, strategy, mode in ``rate_modes``): the sustainable
rate (``stream.sustainable_rate``: the largest rate at which p99 TPOT stays within 2x the
lowest batch-1 TPOT among the strategies and p90 wait within the batch-1 time to serve one
request; one objective for every row of a workload), and beside it a prediction
(``predicted_rate``): concurrency the budget allows over the time a request holds its slot,

    rate ~ C / (t_prefill x (T - h T) + n_out x t_token),    C = min(max_batch, B / bytes)

with t_prefill, t_token a strategy's measured batch-1 prefill time per computed token and
TPOT, h its measured token hit rate (its row at the lowest rate), T and n_out the mean prompt
and output lengths, B the budget and bytes a request's mean accounted bytes. The prefix tree
takes no share of B: the scheduler evicts it down to what the running requests leave (files
written before 2026-12-07 subtracted the tree's peak bytes from B, which held replay's C at 1;
the summary computes the prediction from a file's measured inputs). It takes a step
of C requests to cost a batch-1 step (the memory-bound regime of a GPU at small batches), so
where a step's time grows with the batch (a CPU) it overestimates; the ratio replay /
snapshot is what it is for.

Glossary: b block size, L log length, k drafts per round, T prompt length, TTFT, TPOT
(``serving.request``).
"""

from __future__ import annotations

import math
import time

import torch

from replaylab.bench.stream import (
    _model,
    _slim,
    _warm_up,
    preset_config,
    stream_metrics,
    sustainable_rate,
)
from replaylab.validation import as_int, as_real

__all__ = [
    "WORKLOADS",
    "MODES",
    "PRESETS",
    "workload_prompts",
    "arrivals",
    "predicted_rate",
    "workload_budget",
    "workload_prediction",
    "run_workload_stream",
    "workload_summary",
    "unbounded",
    "stopping_probe",
    "burst_point",
]

WORKLOADS = ("multi_turn", "system_prompts", "few_shot", "agents")
MODES = ("decode", "synthetic", "lookup", "draft-model")
STRATEGIES = ("replay", "snapshot", "recompute")

PRESETS = {
    # seconds per workload on a 2-core CPU: the tiny test model, blocks of 16 tokens
    "cpu": dict(
        model="tiny", block=16, log_length=8, max_batch=4, chunk=16, rates=(20.0, 80.0),
        rate_modes=("decode", "synthetic"), rate_probes=6, budget_share=0.25, resume="match",
        rounds=1,
    ),
    # Nemotron-H 8B's layer shapes in bf16, blocks of 512 (the GPU run)
    "gpu": dict(
        model="8b-layers", block=512, log_length=16, max_batch=32, chunk=512,
        rates=(2.0, 8.0, 32.0), rate_modes=("decode", "synthetic"), rate_probes=6,
        budget_share=0.25, resume="chunk", rounds=1,
    ),
}  # fmt: skip


def _ids(g, n, vocab):
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def _n(g, low, high):
    return int(torch.randint(max(1, low), max(1, low, high) + 1, (1,), generator=g))


def _shared_parts(name, g, b, vocab):
    """What every round of workload ``name`` shares (drawn from ``g`` first)."""
    if name == "system_prompts":
        return [_ids(g, round(f * b), vocab) for f in (0.6, 1.3, 1.75)]
    if name == "few_shot":
        return [_ids(g, round(1.4 * b), vocab) for _ in range(2)]
    if name == "agents":
        shared = _ids(g, round(1.3 * b), vocab)
        return [shared, [_ids(g, max(1, b // 3), vocab) for _ in range(3)]]
    return None  # multi_turn: each round opens its own conversations


def _one_round(name, shared, g, b, vocab):
    """One round of workload ``name``'s prompts over ``shared``, then their output lengths."""
    if name == "multi_turn":
        chats = [_ids(g, _n(g, b // 2, b), vocab) for _ in range(3)]
        prompts = []
        for _ in range(4):
            for c in range(3):
                chats[c] = chats[c] + _ids(g, _n(g, b // 4, b // 2), vocab)
                prompts.append(list(chats[c]))
    elif name == "system_prompts":
        prompts = [shared[i % 3] + _ids(g, _n(g, b // 8, b // 3), vocab) for i in range(12)]
    elif name == "few_shot":
        prompts = [shared[i % 2] + _ids(g, _n(g, b // 16, b // 5), vocab) for i in range(10)]
    else:  # agents
        context, tools = shared
        prompts = [
            context + tools[i % 3] + _ids(g, _n(g, b // 8, b // 4), vocab) for i in range(12)
        ]
    return prompts, [_n(g, b // 8, b // 4) for _ in prompts]


def workload_prompts(name, block, vocab, seed=0, rounds=1) -> tuple[list[list[int]], list[int]]:
    """(prompts as token id lists in arrival order, output lengths b/8..b/4 each) of workload
    ``name`` (see the module docstring) at block size ``block``, ids in [0, vocab).
    ``rounds`` repeats the workload's requests with fresh unique parts over the same shared
    ones (multi_turn: 3 more conversations a round), the later rounds from a second generator
    (seeded 2**31 + seed, apart from any first round's seed below 2**31), so the first round
    (prompts and output lengths) does not depend on it."""
    if name not in WORKLOADS:
        raise ValueError(f"workload: expected one of {WORKLOADS}, got {name!r}")
    b = as_int("block", block)
    if b < 8:
        raise ValueError(f"block: expected at least 8 tokens, got {block}")
    vocab = as_int("vocab", vocab, low=2)
    seed = as_int("seed", seed, low=0)
    rounds = as_int("rounds", rounds, low=1)
    g = torch.Generator().manual_seed(seed)
    shared = _shared_parts(name, g, b, vocab)
    prompts, outs = _one_round(name, shared, g, b, vocab)
    later = torch.Generator().manual_seed(2**31 + seed)  # torch keeps a seed's low 32 bits
    for _ in range(1, rounds):
        more, more_outs = _one_round(name, shared, later, b, vocab)
        prompts, outs = prompts + more, outs + more_outs
    return prompts, outs


def arrivals(n, rate, seed=0) -> list[float]:
    """Arrival times (s) of ``n`` requests of a Poisson process at ``rate`` requests/s
    (``math.inf``: all at 0)."""
    n = as_int("n", n, low=0)
    rate = as_real("rate", rate, above=0, unit=" (requests/s)", finite=False)
    if math.isinf(rate):
        return [0.0] * n
    g = torch.Generator().manual_seed(seed)
    gaps = -torch.log1p(-torch.rand(n, generator=g, dtype=torch.float64)) / rate
    return torch.cumsum(gaps, 0).tolist()


def predicted_rate(max_batch, budget, request_bytes, prefill_s_per_token, tpot_s, prompt_len,
                   n_out, hit_rate):  # fmt: skip
    """The module docstring's prediction (requests/s) and its concurrency C."""
    max_batch = as_int("max_batch", max_batch, low=1)
    budget = as_real("budget", budget, above=0, unit=" (bytes)")
    request_bytes = as_real("request_bytes", request_bytes, low=0, unit=" (bytes)")
    prefill_s_per_token = as_real("prefill_s_per_token", prefill_s_per_token, low=0, unit=" (s)")
    tpot_s = as_real("tpot_s", tpot_s, above=0, unit=" (s)")
    prompt_len = as_real("prompt_len", prompt_len, low=0, unit=" (tokens)")
    n_out = as_real("n_out", n_out, above=0, unit=" (tokens)")
    hit_rate = as_real("hit_rate", hit_rate, low=0, high=1)
    concurrency = max(1, min(max_batch, int(budget // max(1, request_bytes))))
    held = prefill_s_per_token * prompt_len * (1 - hit_rate) + n_out * tpot_s
    return concurrency / held, concurrency


def workload_budget(w, mode) -> int:
    """The byte budget ``mode``'s streams ran under in a workload's entry ``w``: files since
    2026-12-07's per-mode budgets hold one per mode, earlier files one for every mode."""
    budget = w["budget_bytes"]
    if not isinstance(budget, dict):
        return budget
    if mode not in budget:
        raise ValueError(f"mode: expected one of the modes run, {sorted(budget)}, got {mode!r}")
    return budget[mode]


def workload_prediction(w, config, strategy, mode):
    """``predicted_rate`` for ``strategy`` and ``mode`` from a workload's measured entries (``w``
    of a result's ``workloads``, ``config`` its preset): its batch-1 times, and the bytes and
    hit rate of its row at the lowest rate."""
    rows = [r for r in w["rows"] if r["strategy"] == strategy and r["mode"] == mode]
    if not rows:
        ran = sorted({(r["strategy"], r["mode"]) for r in w["rows"]})
        raise ValueError(
            f"strategy, mode: expected a pair the workload ran, {ran}, got {(strategy, mode)}"
        )
    row = min(rows, key=lambda r: r["rate"])
    b1 = w["batch1"][strategy]
    return predicted_rate(
        config["max_batch"], workload_budget(w, mode), row["accounted_bytes_per_request"]["mean"],
        b1["prefill_s_per_token"], b1["tpot_s"], w["prompt_tokens"] / w["prompts"],
        w["output_tokens"] / w["prompts"], row["token_hit_rate"],
    )  # fmt: skip


def _requests(prompts, outs, times, mode, references, acceptance, device):
    from replaylab.decoding import PromptLookupDrafter, SyntheticDrafter
    from replaylab.serving import Request

    reqs = []
    for i, (p, n, t) in enumerate(zip(prompts, outs, times)):
        drafter = None
        if mode == "synthetic":
            drafter = SyntheticDrafter(references[i], acceptance, seed=i)
        elif mode == "lookup":
            drafter = PromptLookupDrafter()
        reqs.append(Request(i, torch.tensor(p, device=device), n, arrival=t, drafter=drafter))
    return reqs


def _served_alone(engine, prompts, outs, device):
    """Each prompt admitted alone into ``engine`` (one slot) and decoded greedily for its
    output length: (tokens per request, seconds prefilling, seconds decoding)."""
    toks, prefill_s, decode_s = [], 0.0, 0.0
    for p, n in zip(prompts, outs):
        t0 = time.perf_counter()
        slot, logits = engine.admit(torch.tensor(p, device=device))
        t1 = time.perf_counter()
        out = [int(logits.argmax())]
        for _ in range(n - 1):
            out.append(int(engine.step(torch.tensor([[out[-1]]], device=device))[0, -1].argmax()))
        decode_s += time.perf_counter() - t1
        prefill_s += t1 - t0
        engine.retire(slot)
        toks.append(out)
    return toks, prefill_s, decode_s


def run_workload_stream(
    preset="cpu",
    workloads=WORKLOADS,
    strategies=STRATEGIES,
    modes=("decode", "synthetic", "lookup", "draft-model"),
    k=4,
    acceptance=0.8,
    device=None,
    seed=0,
    log=print,
    progress=None,
    **overrides,
) -> dict:
    """Every row of the module docstring for one ``PRESETS`` entry (``overrides`` replace its
    fields); a JSON-ready dict without provenance (the CLI adds it). ``progress(result)`` is
    called after every row and every sustainable rate with the result so far (its
    ``complete`` False until the end), so a run cut short keeps what it measured."""
    from replaylab.serving import (
        BatchModelDrafter,
        DecodeEngine,
        EnginePrefixCache,
        Request,
        Scheduler,
    )
    from replaylab.testing import perturbed

    cfg = preset_config(PRESETS, preset, overrides)
    for name, given, allowed in (
        ("workloads", workloads, WORKLOADS),
        ("strategies", strategies, STRATEGIES),
        ("modes", modes, MODES),
    ):
        bad = [v for v in given if v not in allowed]
        if bad or not given:
            raise ValueError(f"{name}: expected some of {allowed}, got {tuple(given)}")
    if not cfg["rates"]:
        raise ValueError(f"rates: expected one rate or more, got {cfg['rates']!r}")
    for r in cfg["rates"]:
        if not r > 0:
            raise ValueError(f"rates: expected > 0 requests/s each, got {r}")
    speculative = sorted(set(modes) - {"decode"})
    k = as_int("k", k, low=0)
    if speculative and k < 1:
        raise ValueError(f"k: expected 1 <= k with the speculative modes {speculative}, got {k}")
    as_real("acceptance", acceptance, low=0, high=1)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t_start = time.perf_counter()

    def say(text):
        if log is not None:
            log(f"[{time.perf_counter() - t_start:7.1f} s] {text}")

    model = _model(cfg["model"], device)
    vocab, b, L = model.cfg.vocab_size, cfg["block"], cfg["log_length"]
    draft = perturbed(model, 0.1) if "draft-model" in modes else None
    result = dict(kind="workload-stream", preset=preset, config=cfg, k=k, acceptance=acceptance,
                  device_type=device.type, complete=False, workloads={})  # fmt: skip

    def measured(name, w):
        result["workloads"][name] = w
        if progress is not None:
            progress(result)

    for name in workloads:
        prompts, outs = workload_prompts(name, b, vocab, seed, cfg["rounds"])
        max_len = max(map(len, prompts)) + max(outs) + k + 2

        def engine(strategy, slots=cfg["max_batch"], model=model, verify=k + 1):
            return DecodeEngine(model, slots, max_len, strategy, log_length=L, max_verify=verify)

        # one engine per (strategy, speculating or not) and one draft engine serve every stream
        # of the workload, so that the warm-up's CUDA graphs are the timed runs' (each stream:
        # a fresh scheduler and prefix cache over an empty engine)
        serving, drafting = {}, {}

        # greedy alone per strategy and engine kind (no prefix cache, one request at a time):
        # each row's references come from an engine built as the one that serves it; the
        # batch-1 times (the objective) from plain decode's kind when it runs, else k drafts'
        kinds = sorted({0 if m == "decode" else k for m in modes})
        alone, batch1 = {}, {}
        for s in strategies:
            for kind in kinds:
                e = engine(s, 1, verify=kind + 1)
                toks, prefill_s, decode_s = _served_alone(e, prompts, outs, device)
                timed = kind == kinds[0]
                if device.type == "cuda" and timed:  # kernels and graphs in: time the second
                    first = toks
                    toks, prefill_s, decode_s = _served_alone(e, prompts, outs, device)
                    if first != toks:
                        raise RuntimeError(f"{s}: the same requests served alone twice differ")
                alone[s, kind] = toks
                if timed:
                    batch1[s] = dict(
                        prefill_s_per_token=prefill_s / sum(map(len, prompts)),
                        tpot_s=decode_s / max(1, sum(n - 1 for n in outs)),
                        serve_s=(prefill_s + decode_s) / len(prompts),
                        engine_max_verify=kind + 1,
                    )
        references = [torch.tensor(p + t) for p, t in zip(prompts, alone[strategies[0], kinds[-1]])]
        one_round = len(prompts) // cfg["rounds"]  # more rounds: a longer stream, same budget
        budgets = {}  # per engine kind: snapshot's bytes for one round at once, on that kind
        for kind in kinds:
            sizes = Scheduler(engine("snapshot", 1, verify=kind + 1), k=kind).need
            total = sum(
                sizes(Request(i, torch.tensor(p), n))
                for i, (p, n) in enumerate(zip(prompts[:one_round], outs[:one_round]))
            )
            budgets[kind] = int(cfg["budget_share"] * total)
        objective = dict(
            tpot_p99_max_s=2 * min(v["tpot_s"] for v in batch1.values()),
            wait_p90_max_s=min(v["serve_s"] for v in batch1.values()),
        )
        w = dict(prompts=len(prompts), prompt_tokens=sum(map(len, prompts)),
                 output_tokens=sum(outs),
                 budget_bytes={m: budgets[0 if m == "decode" else k] for m in modes},
                 budget_rule=f"{cfg['budget_share']} x the bytes of one round's requests at once under snapshot, on the mode's engines",
                 batch1=batch1, objective=objective, rows=[], rates=[])  # fmt: skip

        def serve(strategy, mode, rate, w=w, prompts=prompts, outs=outs, references=references,
                  alone=alone):  # fmt: skip
            kk = 0 if mode == "decode" else k
            budget = w["budget_bytes"][mode]
            if (strategy, kk) not in serving:  # plain decode: no slot room for drafts
                serving[strategy, kk] = engine(strategy, verify=kk + 1)
                if device.type == "cuda":  # every bucket's graphs, decoding (and speculating)
                    warm = [torch.tensor(p) for p in prompts]
                    _warm_up(serving[strategy, kk], (warm, outs, [0.0] * len(warm)), kk, L + k + 2)
            e = serving[strategy, kk]
            prefix = EnginePrefixCache(e, block_size=b, resume=cfg["resume"])
            drafter, drafts_captured = None, 0
            if mode == "draft-model":
                if not drafting:
                    drafting["replay"] = engine("replay", model=draft)
                drafter = BatchModelDrafter(drafting["replay"])
                drafts_captured = drafter.engine.stats.graph_captures
            sched = Scheduler(e, budget_bytes=budget, k=kk, prefix=prefix,
                              prefill_per_step=cfg["chunk"], drafter=drafter)  # fmt: skip
            reqs = _requests(prompts, outs, arrivals(len(prompts), rate, seed), mode,
                             references, acceptance, device)  # fmt: skip
            sched.run(reqs)
            if drafter is not None:  # its slots go back for the next stream's drafter
                drafts_captured = drafter.engine.stats.graph_captures - drafts_captured
                drafter.reset()
            if e.slots:
                raise RuntimeError(f"{strategy}: slots {e.slots} still live after the stream")
            done = sorted(sched.finished, key=lambda r: r.id)
            m = stream_metrics(done, sched, alone={r.id: alone[strategy, kk][r.id] for r in done})
            m["draft_graph_captures"] = drafts_captured
            resumed = sum(r.prefix_hit.resumed_from for r in done)
            m.update(
                token_hit_rate=resumed / w["prompt_tokens"],
                prompt_tokens_computed=w["prompt_tokens"] - resumed,
                tree_peak_bytes=max((h.tree_bytes for h in sched.history), default=0),
            )
            return m

        for s in strategies:
            for mode in modes:
                if device.type == "cuda":  # capture the CUDA graphs before anything is timed
                    serve(s, mode, max(cfg["rates"]))
                for rate in cfg["rates"]:
                    m = serve(s, mode, rate)
                    w["rows"].append(dict(strategy=s, mode=mode, rate=rate, **_slim(m)))
                    measured(name, w)
                    say(f"{name:14s} {s:9s} {mode:11s} rate {rate:6.1f}: TTFT p50 "
                        f"{1e3 * m['ttft_s']['p50']:7.1f} ms, TPOT p99 "
                        f"{1e3 * m['tpot_s']['p99']:6.1f} ms, hit {m['token_hit_rate']:.3f}, "
                        f"equal alone {m['tokens_equal_alone']}/{m['requests']}")  # fmt: skip
            for mode in cfg["rate_modes"]:
                if mode not in modes:
                    continue
                start = 2.0 / batch1[s]["serve_s"]
                found, tried = sustainable_rate(
                    lambda r, s=s, mode=mode: serve(s, mode, r),
                    start,
                    objective,
                    probes=cfg["rate_probes"],
                )
                pred, conc = workload_prediction(w, cfg, s, mode)
                w["rates"].append(dict(strategy=s, mode=mode, sustainable_rate=found,
                                       predicted_rate=pred, predicted_concurrency=conc,
                                       probes=tried))  # fmt: skip
                measured(name, w)
                shown = "none met" if found is None else f"{found:.2f}"
                say(f"{name:14s} {s:9s} {mode:11s} sustainable rate {shown} (predicted {pred:.2f})")
        result["workloads"][name] = w
    result["complete"] = True
    return result


def _ratio(w, mode, key):
    by = {r["strategy"]: r[key] for r in w["rates"] if r["mode"] == mode}
    if by.get("replay") and by.get("snapshot"):
        return by["replay"] / by["snapshot"]
    return None


def stopping_probe(rate_entry):
    """The failed probe just above a rate search's sustainable rate (the slowest failed one
    when none held), or None for an ``unbounded`` search: its ``tpot_p99_s`` and
    ``wait_p90_s`` against the objective say which bound stopped the rate."""
    found = rate_entry["sustainable_rate"]
    failed = [p for p in rate_entry["probes"] if not p["ok"]]
    above = [p for p in failed if found is None or p["rate"] > found]
    return min(above, key=lambda p: p["rate"]) if above else None


def burst_point(w) -> float:
    """Requests/s above which all of a workload's n requests arrive before one served alone
    would finish: n over the shortest batch-1 time to serve one (``w`` of a result's
    ``workloads``). A rate above it measures how a burst of n is absorbed."""
    return w["prompts"] / min(b["serve_s"] for b in w["batch1"].values())


def unbounded(rate_entry) -> bool:
    """Whether a rate search met its objective at every rate it tried: its sustainable rate
    is then a lower bound (the largest rate tried), not the largest rate that holds."""
    return all(p["ok"] for p in rate_entry["probes"])


def workload_summary(result) -> list[str]:
    """A short table: per workload and mode in the rate search, replay's sustainable rate over
    snapshot's (the target: at least 1.3x; ">=": a search that met its objective at every rate
    it tried, ``unbounded``) beside the prediction's ratio, then the hit rates and the
    lossless counts of the decode rows at the lowest rate."""
    lines = [
        "| workload | mode | sustainable rate, replay / snapshot (req/s) | ratio | predicted "
        "ratio | hit rate, replay / snapshot | equal alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, w in result["workloads"].items():
        modes = dict.fromkeys(r["mode"] for r in w["rates"]) or {"decode": None}
        low = min(r["rate"] for r in w["rows"])
        for mode in modes:
            got = _ratio(w, mode, "sustainable_rate")
            pred = None  # this tree's formula from the file's measured inputs
            if {"replay", "snapshot"} <= {r["strategy"] for r in w["rates"] if r["mode"] == mode}:
                cfg = result["config"]
                pred = workload_prediction(w, cfg, "replay", mode)[0]
                pred /= workload_prediction(w, cfg, "snapshot", mode)[0]
            entries = {r["strategy"]: r for r in w["rates"] if r["mode"] == mode}
            found = {s: r["sustainable_rate"] for s, r in entries.items()}
            bound = {s: ">= " if unbounded(r) else "" for s, r in entries.items()}
            rates = " / ".join(
                "none met" if found.get(s) is None else f"{bound[s]}{found[s]:.1f}"
                for s in ("replay", "snapshot")
            )
            if got is not None and bound.get("snapshot"):
                ratio = "? (snapshot's is a lower bound)"
            elif got is not None:
                ratio = f"{bound.get('replay', '')}{got:.2f}x"
            else:
                ratio = "-"
            rows = {r["strategy"]: r for r in w["rows"] if r["mode"] == mode and r["rate"] == low}
            hit = " / ".join(
                f"{rows[s]['token_hit_rate']:.3f}" for s in ("replay", "snapshot") if s in rows
            )
            equal = sum(r["tokens_equal_alone"] for r in rows.values())
            n = sum(r["requests"] for r in rows.values())
            lines.append(
                f"| {name} | {mode} | {rates} | {ratio} | "
                f"{'-' if pred is None else f'{pred:.2f}x'} | {hit} | {equal}/{n} |"
            )
    return lines
