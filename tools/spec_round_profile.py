"""Where a speculation round's time goes, on the engine a user would run (replay by default, CUDA graphs,
kernels) at one preset and batch: the round against a plain decode step, split into its phases.

1. Greedy decoding of the drafters' reference, then an untimed speculation run (graphs captured).
2. Plain decode: ms per step (CUDA events), and the kernels' share of it (torch.profiler).
3. Speculation, timed as a user runs it: ms per round, tokens per round, tokens/s against decode.
4. The same run with a device synchronisation around each phase, so each phase's wall time is
   its own: drafting and the drafts' upload, the verify step (graph replay, its GPU work), the argmax and
   copy of the predictions to the host, acceptance (host), the rollback.
5. torch.profiler over one more speculation run: the GPU-busy fraction of a round and its
   kernels by total time, beside the decode step's.

    python tools/spec_round_profile.py OUT.json [--preset qwen3.5-9b-layers|matched] [--batch 32]
        [--k 4] [--acceptance 0.8] [--n-spec 48] [--strategy replay]

Meant for a GPU (on a CPU it runs as a smoke test: no graphs, no GPU kernels). Prints a short table; writes everything to OUT.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch

from replaylab.bench.families import decode_seconds, load_preset
from replaylab.bench.provenance import provenance
from replaylab.bench.serve import admit_all, greedy_ragged, random_prompts
from replaylab.bench.spec_steady import model_for
from replaylab.decoding import SyntheticDrafter
from replaylab.model import HybridLM
from replaylab.serving import DecodeEngine


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _drafters(prompts, ref, acceptance):
    return [
        SyntheticDrafter(torch.cat([p, r]), acceptance, seed=i)
        for i, (p, r) in enumerate(zip(prompts, ref))
    ]


def _speculate(engine, prompts, ref, k, acceptance, around=None):
    """Admit the prompts, then time speculate_batch alone (inside ``around()`` when given:
    a profiler that should see the rounds, not the admissions)."""
    import contextlib

    pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
    drafters = _drafters(prompts, ref, acceptance)
    calls = [0] * len(drafters)  # a sequence's rounds: the engine asks its drafter once a round
    for i, d in enumerate(drafters):
        d.propose = _counted(d.propose, calls, i)
    steps = engine.stats.steps
    _sync()
    with (around or contextlib.nullcontext)():
        t0 = time.perf_counter()
        tokens, proposed, accepted = engine.speculate_batch(
            prompts, pending, ref[0].numel(), drafters, k=k
        )
        _sync()
        seconds = time.perf_counter() - t0
    rounds = engine.stats.steps - steps
    return dict(
        seconds=seconds,
        rounds=rounds,
        proposed=sum(proposed),
        accepted=sum(accepted),
        sequence_rounds=calls,
    ), tokens


def _counted(propose, calls, i):
    def counted(*args, **kwargs):
        calls[i] += 1
        return propose(*args, **kwargs)

    return counted


class _Phases:
    """Wall time per phase, with a device synchronisation at each boundary."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.mark = None

    def start(self):
        _sync()
        self.mark = time.perf_counter()

    def close(self, name):
        _sync()
        now = time.perf_counter()
        self.seconds[name] += now - self.mark
        self.mark = now


def _phased(engine, prompts, ref, k, acceptance):
    """One speculation run with each phase timed on its own (instance attributes shadow the
    engine's methods and the drafters' ``propose`` for this run only)."""
    phases = _Phases()
    step, rollback = engine._step, engine._rollback
    pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
    drafters = _drafters(prompts, ref, acceptance)

    def timed_step(*args):
        phases.close("drafting, upload and host bookkeeping")
        out = step(*args)
        phases.close("verify step (graph replay: forward, folds)")
        return _Argmax(out, phases)

    def timed_rollback(*args):
        phases.close("acceptance (host)")
        rollback(*args)
        phases.close("rollback")

    engine._step, engine._rollback = timed_step, timed_rollback
    try:
        steps = engine.stats.steps
        phases.start()
        engine.speculate_batch(prompts, pending, ref[0].numel(), drafters, k=k)
        phases.close("drafting, upload and host bookkeeping")
    finally:
        del engine._step, engine._rollback
    rounds = engine.stats.steps - steps
    return {name: s * 1e3 / rounds for name, s in phases.seconds.items()}, rounds


class _Argmax:
    """The verify's logits, with their ``argmax(-1).cpu()`` timed as a phase of its own."""

    def __init__(self, logits, phases):
        self.logits, self.phases = logits, phases

    def argmax(self, dim):
        return _Timed(self.logits.argmax(dim), self.phases)


class _Timed:
    def __init__(self, t, phases):
        self.t, self.phases = t, phases

    def cpu(self):
        out = self.t.cpu()
        self.phases.close("argmax and copy to host")
        return out


def _kernels(fn):
    """Run ``fn(around)`` where ``around()`` opens torch.profiler over the part to profile:
    (wall ms, GPU kernel ms, top kernels by total ms, count of kernel launches)."""
    import contextlib

    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    held, wall = {}, [0.0]

    @contextlib.contextmanager
    def around():
        _sync()
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            yield
            _sync()
            wall[0] = time.perf_counter() - t0
        held["prof"] = prof

    value = fn(around)
    prof, wall = held["prof"], wall[0]
    per = defaultdict(lambda: [0.0, 0])
    busy = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            per[e.name][0] += e.device_time_total / 1e3
            per[e.name][1] += 1
            busy.append((e.time_range.start, e.time_range.end))
    busy.sort()
    covered, end = 0.0, None  # the union of kernel intervals (µs): overlap counted once
    for a, b in busy:
        if end is None or a > end:
            covered += b - a
            end = b
        elif b > end:
            covered += b - end
            end = b
    top = sorted(per.items(), key=lambda kv: -kv[1][0])[:12]
    top = [dict(kernel=n[:90], ms=m, calls=c) for n, (m, c) in top]
    return wall * 1e3, covered / 1e3, top, len(busy), value


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--preset", default="qwen3.5-9b-layers")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--n-spec", type=int, default=48)
    ap.add_argument("--log-length", type=int, default=16)
    ap.add_argument("--strategy", default="replay", choices=("snapshot", "recompute", "replay"))
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()  # on a CPU: a smoke run (no graphs, fp32, no GPU kernels)
    if a.preset == "matched":  # bench spec-steady's model (Nemotron-H 8B shapes)
        model = model_for("matched", "cuda" if cuda else "cpu")
        cfg = model.cfg
    else:
        _, cfg = load_preset(a.preset)
        model = HybridLM(cfg, seed=0).to(*(("cuda", torch.bfloat16) if cuda else ("cpu",))).eval()
    max_len = 40 + 4 * a.n_spec + a.k + 8
    engine = DecodeEngine(
        model, a.batch, max_len, a.strategy, a.log_length, max_verify=a.k + 1, use_kernels=True,
        graphs=cuda,
    )  # fmt: skip
    prompts = random_prompts(a.batch, cfg.vocab_size, seed=7)
    ref, _ = greedy_ragged(engine, prompts, a.n_spec)
    _speculate(engine, prompts, ref, a.k, a.acceptance)  # warm-up: graphs captured

    tok = admit_all(engine, prompts).argmax(-1, keepdim=True)
    decode_seconds(engine, tok, 4)
    decode_s, tok = decode_seconds(engine, tok, 16)
    spec, tokens = _speculate(engine, prompts, ref, a.k, a.acceptance)
    equal = all(torch.equal(t.cpu(), r) for t, r in zip(tokens, ref))
    round_ms = spec["seconds"] * 1e3 / spec["rounds"]
    tokens_per_round = a.batch * a.n_spec / spec["rounds"]

    def alloc_retries():
        return torch.cuda.memory_stats().get("num_alloc_retries", 0) if cuda else 0

    retries = alloc_retries()
    phases, _ = _phased(engine, prompts, ref, a.k, a.acceptance)
    # the caching allocator's retries (a cudaFree of its cache, then cudaMalloc again) in the
    # phased run: each costs milliseconds where memory runs short
    retries = alloc_retries() - retries

    tok = admit_all(engine, prompts).argmax(-1, keepdim=True)
    decode_seconds(engine, tok, 4)

    def decode(around):
        with around():
            decode_seconds(engine, tok, 16)

    d_wall, d_busy, d_top, d_launches, _ = _kernels(decode)
    s_wall, s_busy, s_top, s_launches, (profiled, _) = _kernels(
        lambda around: _speculate(engine, prompts, ref, a.k, a.acceptance, around)
    )
    rounds = profiled["rounds"]
    result = dict(
        provenance=dict(provenance(), command="python tools/spec_round_profile.py " + " ".join(sys.argv[1:])),
        preset=a.preset, batch=a.batch, k=a.k, acceptance=a.acceptance, n_spec=a.n_spec,
        log_length=a.log_length, strategy=a.strategy, graphs=cuda, kernels=True,
        alloc_retries_in_phased_run=retries,
        memory_reserved_gib=torch.cuda.memory_reserved() / 2**30 if cuda else None,
        memory_total_gib=torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
        decode_ms_per_step=decode_s * 1e3,
        decode_tokens_per_s=a.batch / decode_s,
        round_ms=round_ms,
        rounds=spec["rounds"],
        tokens_per_round=tokens_per_round,
        speculative_tokens_per_s=a.batch * a.n_spec / spec["seconds"],
        measured_acceptance=spec["accepted"] / max(1, spec["proposed"]),
        speculative_equal_greedy=equal,
        round_in_decode_steps=round_ms / (decode_s * 1e3),
        # a static batch runs until its slowest sequence is done: the rounds each sequence
        # needed against the batch's, and the tokens/s with no such tail (every sequence's
        # own tokens per round at the measured round time)
        # tokens a sequence's round yields on average if drafts are right independently with
        # probability `acceptance`: 1 + a + ... + a^k (the counts above include the admission's
        # first token in n_spec, as the family bench does)
        drafter_tokens_per_round=sum(a.acceptance**i for i in range(a.k + 1)),
        sequence_rounds_mean=sum(spec["sequence_rounds"]) / a.batch,
        sequence_rounds_max=max(spec["sequence_rounds"]),
        tokens_per_s_without_tail=a.batch * a.n_spec
        / (sum(spec["sequence_rounds"]) / a.batch * round_ms / 1e3),
        phases_ms_per_round=phases,
        profiler=dict(
            decode=dict(wall_ms_per_step=d_wall / 16, gpu_busy_ms_per_step=d_busy / 16,
                        busy_fraction=d_busy / d_wall, launches_per_step=d_launches / 16,
                        top=d_top),
            speculation=dict(rounds=rounds, wall_ms_per_round=s_wall / rounds,
                             gpu_busy_ms_per_round=s_busy / rounds, busy_fraction=s_busy / s_wall,
                             launches_per_round=s_launches / rounds, top=s_top),
        ),
    )  # fmt: skip
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(
        f"{a.preset} batch {a.batch}: decode {decode_s * 1e3:.2f} ms/step "
        f"({a.batch / decode_s:,.0f} tok/s, GPU busy {d_busy / d_wall:.0%}); round {round_ms:.2f} ms "
        f"= {round_ms / (decode_s * 1e3):.2f} steps, {tokens_per_round / a.batch:.2f} tokens/seq; "
        f"speculation {result['speculative_tokens_per_s']:,.0f} tok/s "
        f"({result['speculative_tokens_per_s'] * decode_s / a.batch:.2f}x decode), "
        f"GPU busy {s_busy / s_wall:.0%}, spec = greedy: {equal}"
    )
    print(
        f"GPU busy per round {s_busy / rounds:.2f} ms ({s_launches / rounds:.0f} launches) vs per "
        f"decode step {d_busy / 16:.2f} ms ({d_launches / 16:.0f}); rounds per sequence "
        f"{result['sequence_rounds_mean']:.1f} mean, {result['sequence_rounds_max']:.0f} max, "
        f"batch {spec['rounds']}: {result['tokens_per_s_without_tail']:,.0f} tok/s with no tail"
    )
    for name, ms in phases.items():
        print(f"  {name:40s} {ms:7.2f} ms/round")
    for r in s_top[:6]:
        print(f"  {r['ms'] / rounds:7.3f} ms/round {r['calls'] / rounds:5.1f}x  {r['kernel']}")


if __name__ == "__main__":
    main()
