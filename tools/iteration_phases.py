"""Where a scheduler's steady iteration spends its wall time, phase by phase, on the machine
it runs on: bench spec-steady's workload (every slot busy, one PromptKeyedDrafter, acceptance
0.8), plain decode and then k drafts a round, with the scheduler's and the engine's methods
wrapped in wall-clock timers (no profiler: the phases add up to the iteration, and the rest
is the bookkeeping inline in ``Scheduler._decode`` / ``_verify``).

Phases (ms, the median over the steady iterations; nested ones are not subtracted):
    admit         Scheduler._admit (nothing arrives in a steady iteration)
    drafts        scheduler._round_drafts (the contexts' rows, the drafter, the check)
    step          Scheduler._step: a sync, DecodeEngine.step, argmax, the copy to the host
      enqueue     DecodeEngine._step inside it (the host's uploads and the graph's launch)
    accept        scheduler.accepted
    extend        SlotContexts.extend
    rollback      DecodeEngine.rollback (the scheduler syncs before and after it)
    clock         Scheduler._clock (each a device sync)
    retire        Scheduler._retire
    rest          the iteration less admit, drafts, step, accept, extend, rollback, clock, retire

    python tools/iteration_phases.py OUT.json [--batches 8,32] [--k 4] [--preset matched]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch

from replaylab.bench import spec_steady as S
from replaylab.bench.provenance import provenance
from replaylab.bench.serve import random_prompts
from replaylab.serving import DecodeEngine, Scheduler
from replaylab.serving import contexts as contexts_module
from replaylab.serving import scheduler as scheduler_module

TOP = ("admit", "drafts", "step", "accept", "extend", "rollback", "clock", "retire")
current: dict = {}
iterations: list = []


def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            current[name] = current.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def install():
    """Wrap the phases (module attributes, so the scheduler's own calls go through them)."""
    for owner, attr, name in (
        (Scheduler, "_admit", "admit"),
        (scheduler_module, "_round_drafts", "drafts"),
        (Scheduler, "_step", "step"),
        (DecodeEngine, "_step", "enqueue"),
        (scheduler_module, "accepted", "accept"),
        (contexts_module.SlotContexts, "extend", "extend"),
        (DecodeEngine, "rollback", "rollback"),
        (Scheduler, "_clock", "clock"),
        (Scheduler, "_retire", "retire"),
    ):
        setattr(owner, attr, timed(name, getattr(owner, attr)))
    step = Scheduler.step

    @functools.wraps(step)
    def whole(self):
        current.clear()
        n = len(self.history)
        done = step(self)
        if len(self.history) > n:
            iterations.append((self.history[-1], dict(current)))
        return done

    Scheduler.step = whole


def phases(batch):
    """Median ms per phase over the steady iterations recorded since the last call."""
    steady = [
        (h, p)
        for h, p in iterations
        if h.running == batch and not h.admitted and not h.prefilled and not h.captures
    ]
    iterations.clear()
    if not steady:
        return {"steady_iterations": 0}
    rows = []
    for h, p in steady:
        row = {name: 1e3 * p.get(name, 0.0) for name in (*TOP, "enqueue")}
        row["iteration"] = 1e3 * (h.end - h.start)
        row["rest"] = row["iteration"] - sum(row[name] for name in TOP)
        rows.append(row)
    out = {name: statistics.median(r[name] for r in rows) for name in rows[0]}
    out["steady_iterations"] = len(steady)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--preset", default="matched")
    ap.add_argument("--n-new", type=int, default=96)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = S.model_for(a.preset, device)
    install()
    result = dict(provenance(), command="python tools/iteration_phases.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if k != "out"), rows=[])  # fmt: skip
    for batch in map(int, a.batches.split(",")):
        n = 3 * batch
        g = torch.Generator().manual_seed(7 + batch)
        lengths = (a.n_new * (0.5 + torch.rand(n, generator=g))).round().long().clamp(min=2)
        prompts = random_prompts(n, model.cfg.vocab_size, seed=7 + batch)
        engine = DecodeEngine(model, batch, 40 + int(lengths.max()) + a.k + 2, "replay", 16,
                              max_verify=a.k + 1)  # fmt: skip
        warm = [min(int(x), 16 + a.k + 2) for x in lengths[:batch]]
        S.serve_all(engine, S.waiting_requests(prompts[:batch], warm), 0, None)
        plain, _ = S.serve_all(engine, S.waiting_requests(prompts, lengths.tolist()), 0, None)
        row = {"batch": batch, "k": a.k, "plain": phases(batch)}
        refs = [torch.cat([p, torch.tensor(r.tokens)]) for p, r in zip(prompts, plain)]
        drafter = S.PromptKeyedDrafter(prompts, refs, 0.8, seed=7)
        S.serve_all(engine, S.waiting_requests(prompts[:batch], warm), a.k, drafter)
        iterations.clear()
        got, _ = S.serve_all(engine, S.waiting_requests(prompts, lengths.tolist()), a.k, drafter)
        row[f"k={a.k}"] = phases(batch)
        row["speculative_equal_greedy"] = all(x.tokens == y.tokens for x, y in zip(got, plain))
        result["rows"].append(row)
        del engine
        for arm in ("plain", f"k={a.k}"):
            p = row[arm]
            print(f"batch {batch:4d} {arm:6s} " + " ".join(
                f"{name} {p[name]:.3f}" for name in ("iteration", *TOP, "enqueue", "rest")
                if name in p), flush=True)  # fmt: skip
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
