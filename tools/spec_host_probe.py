"""The host's share of a speculation round: ``DecodeEngine.speculate_batch`` with the model's
forward replaced by a stub that returns zero logits at once, so what is timed is the Python
around it (drafting, the step's and rollback's bookkeeping and uploads, acceptance), per
round, at each batch. Drafters follow an all-zero reference (the stub's greedy token), right
with probability ``acceptance``. Prints a table; writes the rows to OUT.json.

    python tools/spec_host_probe.py OUT.json [--batches 8,32,128] [--k 4] [--rounds 40]
        [--drafters list|batched|device] [--label NAME]

``--drafters batched`` times one ``serving.BatchSyntheticDrafter`` instead of a list of
per-sequence drafters; ``device`` that drafter with the rounds on the device
(``speculate_batch(on_device=True)``, an engine with the replay kernels): on a CPU, where
nothing runs ahead, the host's work to enqueue a round; ``scheduler`` a ``Scheduler``'s
iteration with every slot busy and nothing admitted, one batched drafter (``bench.spec_steady``'s
``PromptKeyedDrafter``), as ``bench spec-steady`` runs it. ``--append`` adds the rows to OUT's
(several trees one after another, each on PYTHONPATH with ``python -P``, ``--label`` naming it). Run it on the machine whose host you
want to know (a GPU machine's host sets the floor under its speculation rounds there); the
pools are the tiny-gdn preset's, on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from replaylab.bench.families import DRAFTERS, load_preset
from replaylab.bench.provenance import provenance
from replaylab.bench.serve import admit_all, random_prompts
from replaylab.decoding import SyntheticDrafter
from replaylab.model import HybridLM
from replaylab.serving import DecodeEngine


def probe(batch, k, rounds, acceptance=0.8, repeats=3, drafters="list"):
    _, cfg = load_preset("tiny-gdn")
    model = HybridLM(cfg, seed=0).eval()
    best, logits = None, torch.zeros(batch, k + 1, cfg.vocab_size)
    for _ in range(repeats):
        engine = DecodeEngine(model, batch, 48 + rounds * (k + 1), "replay", 16, k + 1,
                              use_kernels=drafters == "device")  # fmt: skip
        prompts = random_prompts(batch, cfg.vocab_size, seed=7)
        pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
        engine._run = lambda tokens, *step, **kw: logits[:, : tokens.shape[1]]  # every slot's row
        zeros = torch.zeros(48 + rounds * (k + 1) + k, dtype=torch.long)
        if drafters in ("batched", "device"):  # one BatchSyntheticDrafter for the whole batch
            from replaylab.serving import BatchSyntheticDrafter

            proposer = BatchSyntheticDrafter([zeros] * batch, acceptance, seed=0)
        else:
            proposer = [SyntheticDrafter(zeros, acceptance, seed=i) for i in range(batch)]
        n_new = rounds * (1 + k) // 2  # about `rounds` rounds at this acceptance
        t0 = time.perf_counter()
        on_device = drafters == "device"
        engine.speculate_batch(prompts, pending, n_new, proposer, k=k, on_device=on_device)
        seconds = time.perf_counter() - t0
        per_round = seconds / engine.stats.steps
        if best is None or per_round < best["ms_per_round"] / 1e3:
            best = dict(batch=batch, k=k, drafters=drafters, rounds=engine.stats.steps,
                        ms_per_round=per_round * 1e3, us_per_sequence=per_round * 1e6 / batch)  # fmt: skip
    return best


def probe_scheduler(batch, k, rounds, acceptance=0.8, repeats=3, prompt_length=None):
    """ms per scheduler iteration (a speculation round of every request) with the forward
    stubbed out; the admissions' iteration is not timed. ``prompt_length``: prompts of that
    many ids plus their index (default: ``random_prompts``' 8-40)."""
    from replaylab.bench.spec_steady import PromptKeyedDrafter
    from replaylab.serving import Request, Scheduler

    _, cfg = load_preset("tiny-gdn")
    model = HybridLM(cfg, seed=0).eval()
    n_new = rounds * (k + 1)  # no request finishes within the timed iterations
    logits = torch.zeros(batch, k + 1, cfg.vocab_size)
    if prompt_length is None:
        prompts = random_prompts(batch, cfg.vocab_size, seed=7)
    else:
        gen = torch.Generator().manual_seed(7)
        prompts = [torch.randint(0, cfg.vocab_size, (prompt_length + i,), generator=gen)
                   for i in range(batch)]  # fmt: skip
    longest = max(p.numel() for p in prompts)
    references = [torch.cat([p, torch.zeros(n_new + k + 2, dtype=torch.long)]) for p in prompts]
    best = None
    for _ in range(repeats):
        engine = DecodeEngine(
            model, batch, max(longest, 39) + 9 + n_new + k + 2, "replay", 16, k + 1
        )
        drafter = PromptKeyedDrafter(prompts, references, acceptance, seed=0)
        sched = Scheduler(engine, k=k, drafter=drafter)
        for i, p in enumerate(prompts):
            sched.add(Request(i, p, n_new))
        sched.step()  # every request admitted, its first token
        engine._run = lambda tokens, *step, **kw: logits[:, : tokens.shape[1]]
        t0 = time.perf_counter()
        for _ in range(rounds):
            sched.step()
        per_round = (time.perf_counter() - t0) / rounds
        if best is None or per_round < best["ms_per_round"] / 1e3:
            best = dict(batch=batch, k=k, drafters="scheduler", rounds=rounds,
                        prompt_length=prompt_length,
                        ms_per_round=per_round * 1e3, us_per_sequence=per_round * 1e6 / batch)  # fmt: skip
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", default="8,32,128")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--drafters", default="list",
                    help="list (a SyntheticDrafter per sequence), batched (one "
                    "BatchSyntheticDrafter), device (that drafter, the rounds on the device) or "
                    "scheduler (a Scheduler's round, one batched drafter); several "
                    "comma-separated take turns at each batch, in one process")  # fmt: skip
    ap.add_argument("--label", default=None, help="names the tree, for side-by-side runs")
    ap.add_argument("--append", action="store_true", help="add the rows to OUT's")
    ap.add_argument("--prompt-length", type=int, default=None,
                    help="scheduler: prompts of this many ids (plus their index)")  # fmt: skip
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    kinds = a.drafters.split(",")
    if not set(kinds) <= {*DRAFTERS, "scheduler"}:
        ap.error(f"--drafters: expected names of {(*DRAFTERS, 'scheduler')}, got {a.drafters!r}")
    rows = [
        probe_scheduler(int(b), a.k, a.rounds, prompt_length=a.prompt_length) if d == "scheduler"
        else probe(int(b), a.k, a.rounds, drafters=d)
        for b in a.batches.split(",") for d in kinds
    ]  # fmt: skip
    found = provenance()
    found["command"] = "python tools/spec_host_probe.py " + " ".join(sys.argv[1:])
    import replaylab

    for r in rows:  # each row names its tree and the run that made it
        r.update(label=a.label, replaylab=replaylab.__file__, command=found["command"])
    runs = [found]
    if a.append:
        with open(a.out) as f:
            before = json.load(f)
        rows, runs = before["rows"] + rows, before.get("runs", [before["provenance"]]) + runs
    with open(a.out, "w") as f:
        json.dump(dict(provenance=runs[0], runs=runs, torch_threads=1, rows=rows), f, indent=1)
    print(
        f"{'batch':>5s} {'drafters':>8s} {'rounds':>6s} {'ms / round':>10s} {'us / sequence':>13s}"
    )
    for r in rows:
        print(
            f"{r['batch']:5d} {r['drafters']:>8s} {r['rounds']:6d} {r['ms_per_round']:10.2f} "
            f"{r['us_per_sequence']:13.1f}"
        )


if __name__ == "__main__":
    main()
