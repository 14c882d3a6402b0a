"""Issue 38's prefill target at its own shape: a batch of B prompts of T tokens (default 32 x
2,048) prefilled into an empty engine, against the batch's two-term roofline
(``bench.prefix.prefill_roofline(..., prompts=B)``: the weights read once), three ways per
strategy (``ARMS``):

- ``together``: ``DecodeEngine(batched_admission=True, prefill_chunk=T).admit_many``, the
  prompts' products (row-invariant), norms and MLPs over their concatenated tokens in one
  pass, each prompt's conv, scan and attention on its own;
- ``alone, one chunk``: ``admit`` one prompt after another, each in one chunk of T (torch's
  products): what batching adds over this arm is the batching alone;
- ``alone``: the engine's defaults (chunks of 256), one prompt after another, as the TTFT
  bench admits them.

Each arm: one untimed round (compiles, allocations), then ``--repeats`` timed rounds (the
device synchronised before and after; every slot retired between rounds): their seconds, the
median, and the roofline's seconds over the median (the share); and each arm's first tokens
and logits against ``alone``'s (another arithmetic: a count of equal argmaxes and the largest
difference over the scale). The rates are measured (``bench.timing.copy_bandwidth_gbs``,
``bench.serve.matrix_rate_tflops``) on a GPU and given by ``--rates GBS,TFLOPS`` elsewhere.
Writes OUT.json with provenance after each strategy (a cut run keeps those done) and prints a
table.

    python tools/prefill_batch_roofline.py OUT.json [--batch 32] [--tokens 2048]
        [--strategies replay,snapshot] [--repeats 3] [--model 8b-layers] [--rates 3350,790]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from replaylab.bench.prefix import prefill_roofline
from replaylab.bench.provenance import write_tool_result
from replaylab.bench.timing import sync
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine

ARMS = {  # arm -> (batched_admission, prefill_chunk: None for the engine's default)
    "together": (True, "T"),
    "alone, one chunk": (False, "T"),
    "alone": (False, None),
}


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
    """One strategy's arms (``ARMS``, see the module docstring): per arm its rounds' seconds,
    their median and the batch roofline's share of it, and each arm's first tokens against
    the last arm's (the engine's defaults)."""
    B, T = len(prompts), len(prompts[0])
    copy_gbs, matrix_tflops = rates
    rows, logits = {}, {}
    for arm, (together, chunk) in ARMS.items():
        kw = dict(prefill_chunk=T) if chunk == "T" else {}
        engine = DecodeEngine(
            model, B, T + 1, strategy, log_length=log_length, max_verify=1,
            batched_admission=together, **kw,
        )  # fmt: skip
        roof = prefill_roofline(engine, T, copy_gbs, matrix_tflops, prompts=B)
        _round(engine, prompts, together)  # untimed: compiles and allocations
        times = []
        for _ in range(repeats):
            seconds, logits[arm] = _round(engine, prompts, together)
            times.append(seconds)
        median = statistics.median(times)
        rows[arm] = dict(
            batched_admission=engine.batched_admission,
            prefill_chunk=engine.prefill_chunk,
            round_s=times,
            median_s=median,
            tokens_per_s=B * T / median,
            roofline=roof,
            roofline_share=roof["seconds"] / median,
        )
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base = logits["alone"]
    scale = max(float(x.abs().max()) for x in base)
    agreement = {
        arm: dict(
            first_tokens_equal=sum(int(x.argmax()) == int(y.argmax()) for x, y in zip(got, base)),
            max_difference_over_scale=max(float((x - y).abs().max()) for x, y in zip(got, base))
            / scale,
        )
        for arm, got in logits.items()
        if arm != "alone"
    }
    return dict(
        strategy=strategy, batch=B, tokens=T,
        rates=dict(copy_gbs=copy_gbs, matrix_tflops=matrix_tflops),
        arms=rows, logits_against_alone=agreement,
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
        try:
            rates = tuple(float(v) for v in args.rates.split(","))
        except ValueError:
            rates = ()
        if len(rates) != 2 or not all(0 < v < float("inf") for v in rates):
            p.error(f"--rates: expected GBS,TFLOPS, two numbers > 0, got {args.rates!r}")
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
            write_tool_result(args.out, "prefill_batch_roofline.py", rows)  # kept if cut
            r = rows[-1]
            for arm, a in r["arms"].items():
                print(f"{strategy:8s} {arm:17s} {1e3 * a['median_s']:9.1f} ms  "
                      f"{a['tokens_per_s']:10,.0f} tok/s  roofline share {a['roofline_share']:.3f} "
                      f"({a['roofline']['binds']})")  # fmt: skip
            for arm, g in r["logits_against_alone"].items():
                print(f"{strategy:8s} {arm} against alone: first tokens equal "
                      f"{g['first_tokens_equal']}/{r['batch']}, difference / scale "
                      f"{g['max_difference_over_scale']:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
