"""Issue 38's prefill target at its own shape: a batch of B prompts of T tokens (default 32 x
2,048) prefilled into an empty engine, against the batch's two-term roofline
(``bench.prefix.prefill_roofline`` per prompt, summed), two ways per strategy:

- ``together``: ``DecodeEngine(batched_admission=True, prefill_chunk=T).admit_many``, the
  prompts' products, norms and MLPs over their concatenated tokens in one pass (each prompt's
  conv, scan and attention on its own);
- ``alone``: the engine's defaults (chunks of 256), ``admit`` one prompt after another, as the
  TTFT bench admits them.

Each arm: one untimed round (compiles, allocations), then ``--repeats`` timed rounds (the
device synchronised before and after; every slot retired between rounds); seconds and the
roofline's share per round, and whether the two arms' first logits agree (argmax, and the
largest difference over the scale: two arithmetics, the batched products row-invariant).
The rates are measured (``bench.timing.copy_bandwidth_gbs``, ``bench.serve.matrix_rate_tflops``)
on a GPU and given by ``--rates GBS,TFLOPS`` elsewhere. Writes OUT.json with provenance and
prints a table.

    python tools/prefill_batch_roofline.py OUT.json [--batch 32] [--tokens 2048]
        [--strategies replay,snapshot] [--repeats 3] [--model 8b-layers] [--rates 3350,790]
"""

from __future__ import annotations

import argparse
import time

import torch

from replaylab.bench.prefix import prefill_roofline
from replaylab.bench.provenance import write_tool_result
from replaylab.bench.timing import sync
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine


def _round(engine, prompts, together):
    """(seconds, [last logits] in prompt order) of one round into an empty ``engine``."""
    sync(engine.device)
    t0 = time.perf_counter()
    if together:
        out = engine.admit_many(prompts)
    else:
        out = [engine.admit(p) for p in prompts]
    sync(engine.device)
    seconds = time.perf_counter() - t0
    logits = [row.float().cpu() for _, row in out]
    for slot, _ in out:
        engine.retire(slot)
    return seconds, logits


def measure(model, strategy, prompts, rates, repeats=3, log_length=16):
    """One strategy's arms (see the module docstring): a dict per arm of its round seconds,
    their median's roofline share, and the two arms' agreement."""
    B, T = len(prompts), len(prompts[0])
    copy_gbs, matrix_tflops = rates
    rows = {}
    logits = {}
    for arm, together in (("together", True), ("alone", False)):
        kw = dict(batched_admission=True, prefill_chunk=T) if together else {}
        engine = DecodeEngine(model, B, T + 1, strategy, log_length=log_length, max_verify=1, **kw)
        roofs = [prefill_roofline(engine, T, copy_gbs, matrix_tflops) for _ in prompts]
        roof_s = sum(r["seconds"] for r in roofs)
        _round(engine, prompts, together)  # untimed: compiles and allocations
        times = []
        for _ in range(repeats):
            seconds, logits[arm] = _round(engine, prompts, together)
            times.append(seconds)
        median = sorted(times)[len(times) // 2]
        rows[arm] = dict(
            prefill_chunk=engine.prefill_chunk,
            batched_admission=engine.batched_admission,
            round_s=times,
            median_s=median,
            tokens_per_s=B * T / median,
            roofline_s=roof_s,
            roofline_binds="flops"
            if sum(r["flop_seconds"] for r in roofs) >= sum(r["byte_seconds"] for r in roofs)
            else "bytes",
            roofline_share=roof_s / median,
        )
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    a, b = logits["together"], logits["alone"]
    scale = max(float(x.abs().max()) for x in b)
    agreement = dict(
        argmax_equal=sum(int(x.argmax()) == int(y.argmax()) for x, y in zip(a, b)),
        prompts=B,
        max_difference_over_scale=max(float((x - y).abs().max()) for x, y in zip(a, b)) / scale,
    )
    return dict(
        strategy=strategy, batch=B, tokens=T, rates=dict(copy_gbs=copy_gbs, matrix_tflops=matrix_tflops),
        arms=rows, logits_together_vs_alone=agreement,
    )  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--strategies", default="replay,snapshot")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="8b-layers", help="a model preset (default 8b-layers)")
    p.add_argument(
        "--rates", default=None, help="GBS,TFLOPS: copy bandwidth and matrix rate (CPU runs)"
    )
    args = p.parse_args(argv)
    for name in ("batch", "tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = HybridLM(preset(args.model), seed=0).eval()
    if device.type == "cuda":
        model = model.to(device, torch.bfloat16)
    if args.rates:
        rates = tuple(float(v) for v in args.rates.split(","))
    elif device.type == "cuda":
        from replaylab.bench.serve import matrix_rate_tflops
        from replaylab.bench.timing import copy_bandwidth_gbs

        rates = copy_bandwidth_gbs(), max(matrix_rate_tflops() for _ in range(3))
        torch.cuda.empty_cache()
    else:
        p.error("--rates GBS,TFLOPS: no GPU here to measure them")
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, model.cfg.vocab_size, (args.tokens,), generator=gen).to(device)
        for _ in range(args.batch)
    ]
    rows = []
    with torch.no_grad():
        for strategy in args.strategies.split(","):
            rows.append(measure(model, strategy, prompts, rates, args.repeats))
            r = rows[-1]
            for arm, a in r["arms"].items():
                print(f"{strategy:8s} {arm:8s} {1e3 * a['median_s']:9.1f} ms  "
                      f"{a['tokens_per_s']:10,.0f} tok/s  roofline share {a['roofline_share']:.3f} "
                      f"({a['roofline_binds']})")  # fmt: skip
            g = r["logits_together_vs_alone"]
            print(f"{strategy:8s} argmax equal {g['argmax_equal']}/{g['prompts']}, "
                  f"difference / scale {g['max_difference_over_scale']:.2e}")  # fmt: skip
    write_tool_result(args.out, "prefill_batch_roofline.py", rows)


if __name__ == "__main__":
    main()
