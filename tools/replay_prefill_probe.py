"""Prefill in the serving engine, side by side in one run, on ``8b-layers`` (Nemotron-H 8B
layer shapes, bf16 on a GPU, the TTFT bench's engine settings: reference path, no graphs,
L = 16, prefill chunks of 256, prefix blocks of 512). Arms alternate within one process; each
row is the median of 5 admissions after a warm-up.

- ``cold``: one prompt admitted whole, under snapshot and replay;
- ``hit``: a prompt that extends a 2,000-token shared prompt already in the prefix cache by a
  fresh suffix each time (the hit resumes off the block grid).

The arms (``--arms``): ``default`` as the tree is; ``torch scan`` the prompt chunks' Mamba-2
scan in PyTorch's chunked form (``DecodeEngine(prefill_kernels=False)``, the default until
2026-12-05); ``triton scan`` in one Triton launch a layer and chunk (``prefill_kernels=True``,
``replaylab.kernels.ssd_chunked``; on a GPU the default since 2026-12-05); ``fused kernels`` that
on the fused path's engine, whose prefill chunks also run the fused decode's norm and MLP
kernels; ``fold by fold`` replay folding L entries at a time,
one launch and its ring writes per fold (the default until 2026-12-04; then every grid point a
chunk reaches folded in one launch, ``RecurrentPool.fold_chains``; since 2026-12-05 a chunk that
ends on the grid takes the scan's state and folds nothing, so the arm differs from ``default``
only in a chunk that ends off the grid: in a prompt whose length is a multiple of 256, nowhere); ``token loop`` prompt chunks
under 64 tokens through the scan's token loop (the default until 2026-12-04; now
``RecurrentSpec.scan_prompt`` takes the chunked form at any length). The replay arms must
leave the same checkpoint bits where only the folds differ, which the probe checks. Every
row's first-token logits (of the last admission) are compared with a float64 forward of the
same weights over the whole prompt: their largest difference over the reference's scale, and
whether the greedy token agrees (beside the reference's top-2 margin over its scale).

    python tools/replay_prefill_probe.py OUT.json [--lengths 2048,2100] [--suffixes 48,100]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

from replaylab.bench.families import PRESETS as FAMILY_PRESETS
from replaylab.bench.families import TINY_PRESETS as TINY_FAMILY_PRESETS
from replaylab.bench.families import load_preset
from replaylab.bench.provenance import write_tool_result
from replaylab.bench.timing import sync
from replaylab.cache import CacheConfig
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine, EnginePrefixCache

ARMS = ("default", "torch scan", "triton scan", "fused kernels", "fold by fold", "token loop")
COLD_ARMS = [("snapshot", "default"), ("snapshot", "triton scan"), ("replay", "default"),
             ("replay", "triton scan")]  # fmt: skip
HIT_ARMS = COLD_ARMS
SHARED, BLOCK = 2000, 512


@contextlib.contextmanager
def _arm(engine, arm):
    """The engine's pools (and their specs, which the model's mixers share) as ``arm`` had
    them, for the duration."""
    pools = list(engine.ssm.values())
    for pool in pools:
        if arm == "fold by fold":
            pool.fold_chains = lambda L: False
        if arm == "token loop":
            pool.spec.scan_prompt = pool.spec.scan
    try:
        yield
    finally:
        for pool in pools:
            vars(pool).pop("fold_chains", None)
            vars(pool.spec).pop("scan_prompt", None)


def _timed(fn, device):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def _free(engine):
    for s in list(engine.slots):
        engine.retire(s)


def cold_rows(model, T, reference, repeats=5):
    device = next(model.parameters()).device
    prompt = torch.randint(
        0, model.cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(T)
    )
    prompt = prompt.to(device)
    engines = {arm: _engine(model, *arm, T + 1) for arm in COLD_ARMS}
    times, picks, states = {arm: [] for arm in COLD_ARMS}, {}, {}
    for rep in range(repeats + 1):  # the first round warms up (Triton compiles)
        for arm in COLD_ARMS:
            engine = engines[arm]
            _free(engine)
            with _arm(engine, arm[1]), torch.no_grad():
                (_, logits), seconds = _timed(lambda e=engine: e.admit(prompt), device)
            picks[arm] = logits
            states[arm] = [p.state.clone() for p in engine.ssm.values()]
            if rep:
                times[arm].append(seconds)
    rows = _rows("cold", T, times, picks, reference(prompt))
    if ("replay", "fold by fold") in states:
        same = all(
            map(torch.equal, states[("replay", "default")], states[("replay", "fold by fold")])
        )
        for row in rows:
            row["same_bits_default_vs_fold_by_fold"] = same
    return rows


def hit_rows(model, suffix, reference, repeats=5):
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(suffix)
    ids = lambda n: torch.randint(0, model.cfg.vocab_size, (n,), generator=gen).tolist()  # noqa: E731
    shared = ids(SHARED)
    caches = {}
    for arm in HIT_ARMS:
        engine = _engine(model, *arm, SHARED + suffix + 1)
        caches[arm] = EnginePrefixCache(engine, block_size=BLOCK)
        with torch.no_grad():
            slot, _, _ = caches[arm].admit(shared)
        engine.retire(slot)
    times, picks, hits = {arm: [] for arm in HIT_ARMS}, {}, {}
    for rep in range(repeats + 1):
        prompt = shared + ids(suffix)  # a fresh suffix: every arm's hit is the same each time
        for arm in HIT_ARMS:
            cache = caches[arm]
            with _arm(cache.engine, arm[1]), torch.no_grad():
                (slot, logits, hit), seconds = _timed(lambda c=cache, p=prompt: c.admit(p), device)
            cache.engine.retire(slot)
            picks[arm], hits[arm] = logits, hit
            if rep:
                times[arm].append(seconds)
    rows = _rows("hit", SHARED + suffix, times, picks, reference(torch.tensor(prompt)))
    for row, arm in zip(rows, HIT_ARMS):
        row.update(resumed_from=hits[arm].resumed_from, prefilled=hits[arm].prefilled)
    return rows


def _engine(model, strategy, arm, max_len):
    """The TTFT bench's engine (reference path, no graphs), or for ``fused kernels`` the fused
    path's; ``prefill_kernels`` on in the kernel arms, off in the others but ``default``."""
    kernels = {"default": None, "triton scan": True, "fused kernels": True,
               "fold by fold": None}.get(arm, False)  # fold by fold: default's scan, its bits  # fmt: skip
    return DecodeEngine(model, 1, max_len, strategy, log_length=16, max_verify=1,
                        prefill_chunk=256, fused=arm == "fused kernels", graphs=False,
                        prefill_kernels=kernels)  # fmt: skip


def _rows(kind, T, times, logits, want):
    """One row per arm; ``logits`` (vocab,) of each arm's last admission, ``want`` the float64
    reference's for the same prompt."""
    scale = float(want.abs().max())
    top2 = want.topk(2).values
    rows = []
    for s, a in times:
        got = logits[(s, a)].double().cpu()
        rows.append(dict(kind=kind, tokens=T, strategy=s, arm=a,
                         seconds=statistics.median(times[(s, a)]), values=times[(s, a)],
                         next_token=int(got.argmax()), f64_next_token=int(want.argmax()),
                         f64_top2_margin_over_scale=float(top2[0] - top2[1]) / scale,
                         logit_error_over_scale_vs_f64=float((got - want).abs().max()) / scale))  # fmt: skip
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--lengths", default="2048,2100")
    p.add_argument("--suffixes", default="48,100")
    p.add_argument("--preset", default="8b-layers",
                   help="model size (tiny: a CPU smoke run), or a family layout of bench "
                   "engine-families (qwen3.5-9b-layers, jamba-1.5-mini-layers, ...)")  # fmt: skip
    p.add_argument(
        "--arms",
        default="torch scan,default,fused kernels",
        help=f"comma-separated arms of {ARMS} (each under snapshot and replay; the token "
        f"loop and fold by fold are earlier defaults)",
    )
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if not arms or set(arms) - set(ARMS) or "default" not in arms:
        p.error(f"--arms: expected 'default' and some of {ARMS}, got {args.arms!r}")
    global COLD_ARMS, HIT_ARMS
    COLD_ARMS = [(s, a) for s in ("snapshot", "replay") for a in arms
                 if not (s == "snapshot" and a == "fold by fold")]  # fmt: skip
    HIT_ARMS = [(s, a) for s, a in COLD_ARMS if a != "fold by fold"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.preset in {**FAMILY_PRESETS, **TINY_FAMILY_PRESETS}:
        config = load_preset(args.preset)[1]  # the families bench's layouts (GDN, Mamba-1)
    else:
        config = preset(args.preset)
    model = HybridLM(config, seed=0).eval()  # as the TTFT bench builds it
    if device.type == "cuda":
        model = model.to(device, torch.bfloat16)
    f64 = copy.deepcopy(model).double()  # the same (rounded) weights in float64

    def reference(prompt):
        with torch.no_grad():
            cache = CacheConfig("snapshot").build(f64, 1)
            return f64(prompt.to(device)[None], cache)[0, -1].cpu()

    rows = []
    runs = [(cold_rows, int(t)) for t in args.lengths.split(",") if t]
    runs += [(hit_rows, int(t)) for t in args.suffixes.split(",") if t]
    for run, n in runs:
        new = run(model, n, reference)
        rows += new
        _report(new)
        write_tool_result(
            args.out, "replay_prefill_probe.py", rows
        )  # after each: a cut run keeps it


def _report(rows):
    for row in rows:
        base = next(r for r in rows if r["kind"] == row["kind"] and r["tokens"] == row["tokens"]
                    and (r["strategy"], r["arm"]) == ("snapshot", "default"))  # fmt: skip
        row["over_snapshot"] = row["seconds"] / base["seconds"]
        print(f"{row['kind']:4s} T={row['tokens']:5d} {row['strategy']:8s} {row['arm']:12s} "
              f"{row['seconds'] * 1e3:8.2f} ms {row['over_snapshot']:5.2f}x snapshot  "
              f"token {row['next_token']} (f64 {row['f64_next_token']}, margin "
              f"{row['f64_top2_margin_over_scale']:.1e}) err {row['logit_error_over_scale_vs_f64']:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
