"""``replaylab bench``: one subcommand per benchmark; each writes JSON with provenance.

replaylab bench kernels [--quick] [--batches 1,32] [--log-lens 4,16] [--ts 1,4] [--no-fold]
replaylab bench gdn-kernels [--batches 1,128] [--log-lens 4,16,64]
replaylab bench sweep
replaylab bench matmul [--sweep] [--rows 1,8,640]
replaylab bench matched [--batches 1,8,64,128,256] [--spec-batches 1,8,32,128]
replaylab bench decode [--preset tiny] [--batches 1,4] [--n-new 32]
replaylab bench serve-stream [--preset cpu|8b-layers] [--strategies ...] [--modes ...]
replaylab bench prefix [--blocks | --engine [--ttft --preset cpu|gpu]]
replaylab bench engine-families [--presets ...] [--strategies ...] [--batches 1,8,32,128,256]
replaylab bench hf-cache [--device cpu|cuda] [--dtype float32] [--n-new 48] [--drafts 1,...,8]
replaylab bench draft-model [--device cpu|cuda] [--batches 1,8] [--n-new 48] [--k 4]
replaylab bench workload-stream [--preset cpu|gpu] [--workloads ...] [--modes ...]
replaylab bench spec-steady [--preset matched|tiny-gdn|...] [--batches 8,32,128] [--ring L|L+k]
    [--other-k 1,2] [--adaptive]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

__all__ = ["add_bench_parser", "main"]


def _ints(text, low=1):
    """Comma-separated integers >= ``low`` (sizes, counts and lengths: 1 by default)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = None
    if values is None or min(values) < low:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= {low}, got {text!r}"
        ) from None
    return values


def _ints0(text):
    return _ints(text, low=0)


def _count(text):
    """One integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _fraction(text):
    """A number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}")
    return value


def _write(result, out):
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)


def _need_gpu(what):
    import torch

    if not torch.cuda.is_available():
        sys.exit(
            f"replaylab bench {what} times GPU kernels: no CUDA device here. The committed "
            f"results are in data/bench_kernels*.json."
        )


def _kernels(args):
    from replaylab.bench.mamba2_kernels import SHAPE, run_kernels, summary
    from replaylab.bench.provenance import provenance

    _need_gpu("kernels")
    t0 = time.time()
    result = run_kernels(
        quick=args.quick,
        batches=args.batches,
        log_lens=args.log_lens,
        ts=args.ts,
        fold=not args.no_fold,
    )
    result.update(provenance(args.argv), shape=SHAPE, seconds=round(time.time() - t0, 1))
    _write(result, args.out or "data/bench_kernels.json")
    print(
        f"device {result['device']}; copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s; "
        f"peer errors: {result['peer_errors'] or 'none'}"
    )
    for line in summary(result):
        print(line)
    return 0


def _gdn_kernels(args):
    from replaylab.bench.gdn_kernels import run_gdn_kernels, summary

    _need_gpu("gdn-kernels")
    t0 = time.time()
    result = run_gdn_kernels(batches=args.batches, log_lens=args.log_lens)
    result["provenance"]["command"] = "replaylab bench " + " ".join(args.argv)
    result["seconds"] = round(time.time() - t0, 1)
    _write(result, args.out or "data/bench_gdn_kernels.json")
    print(summary(result))
    return 0


def _sweep(args):
    from replaylab.bench.mamba2_kernels import sweep
    from replaylab.bench.provenance import provenance

    _need_gpu("sweep")
    result = sweep()
    _write(dict(**result, **provenance(args.argv)), args.out or "data/bench_kernels_sweep.json")
    print(f"copy bandwidth {result['copy_bandwidth_gbs']:.0f} GB/s; best launch per kernel, batch:")
    best = {}
    for r in result["rows"]:
        key = (r["kernel"], r["batch"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    for (kernel, batch), r in sorted(best.items()):
        print(
            f"{kernel:38s} b={batch:3d} BLOCK_P={r['block_p']} warps={r['num_warps']}: "
            f"{r['us']:7.1f} us, {r['copy_fraction']:.0%} of copy bandwidth"
        )
    return 0


def _decode(args):
    from replaylab.bench.decode import decode_summary, run_decode
    from replaylab.bench.provenance import provenance

    t0 = time.time()
    result = run_decode(
        args.preset,
        args.batches,
        args.n_new,
        checkpoint_interval=args.checkpoint_interval,
        log_length=args.log_length,
    )
    result.update(provenance(args.argv), seconds=round(time.time() - t0, 1))
    _write(result, args.out or "data/bench_decode.json")
    for line in decode_summary(result):
        print(line)
    return 0


def _engine(args):
    from replaylab.bench.engine import engine_summary, run_engine
    from replaylab.bench.provenance import provenance

    _need_gpu("engine")
    t0 = time.time()
    result = run_engine(
        presets=args.presets,
        batches=args.batches,
        n_new=args.n_new,
        log_length=args.log_length,
        baselines=not args.no_baselines,
    )
    result.update(provenance(args.argv), seconds=round(time.time() - t0, 1))
    _write(result, args.out or "data/bench_engine.json")
    for line in engine_summary(result):
        print(line)
    return 0


def _engine_families(args):
    import torch

    from replaylab.bench.families import PRESETS, families_summary, run_families
    from replaylab.bench.provenance import provenance

    if not torch.cuda.is_available() and set(args.presets) & set(PRESETS):
        sys.exit(
            "replaylab bench engine-families: the published-shape presets need a CUDA device; "
            "on CPU use --presets tiny-gdn,tiny-mamba1,tiny-bamba (a smoke run)"
        )
    t0, out = time.time(), args.out or "data/bench_engine_families.json"
    result = run_families(
        presets=args.presets,
        strategies=args.strategies,
        batches=args.batches,
        n_new=args.n_new,
        repeats=args.repeats,
        n_spec=args.n_spec,
        k=args.k,
        acceptance=args.acceptance,
        log_length=args.log_length,
        fla=not args.no_fla,
        ssu=not args.no_ssu,
        graphs=dict(both=(False, True), on=(True,), off=(False,))[args.graphs]
        if torch.cuda.is_available()
        else (False,),
        fused=args.fused == "on",
        step_kernels=args.step_kernels == "on",
        time_budget_s=args.time_budget_s or None,
        checkpoint=lambda partial: _write(dict(partial, **provenance(args.argv)), out),
    )
    result.update(provenance(args.argv), seconds=round(time.time() - t0, 1))
    _write(result, out)
    for line in families_summary(result):
        print(line)
    return 0


def _serve(args):
    from replaylab.bench import serve
    from replaylab.bench.provenance import provenance

    _need_gpu("serve")
    t0 = time.time()
    out = args.out or "data/bench_serve.json"
    result = dict(provenance(args.argv), matmul=args.matmul)
    phases = {
        "matmul": lambda: serve.matmul_row_invariance(ks=(4,)),
        "lossless": lambda: serve.run_lossless(
            presets=args.presets,
            batches=args.batches,
            ks=args.ks,
            acceptances=args.acceptances,
            matmul=args.matmul,
        ),
        "ragged": lambda: [
            serve.run_ragged(matmul=m, batches=args.ragged_batches, spec_batches=args.spec_batches)
            if m == args.matmul
            else serve.run_ragged(matmul=m, batches=args.other_batches, spec_batches=())
            for m in args.ragged_matmuls
        ],
        "prefill": lambda: serve.run_prefill(),
        "logit_error": lambda: serve.run_logit_error(),
    }
    names = {"matmul": "matmul_rows"}
    for phase in args.phases:
        t = time.time()
        result[names.get(phase, phase)] = phases[phase]()
        result.setdefault("phase_seconds", {})[phase] = round(time.time() - t, 1)
        _write(result, out)  # each phase written as it ends: a cut run keeps what it measured
        print(f"{phase}: {time.time() - t:.0f} s", flush=True)
    result.update(seconds=round(time.time() - t0, 1))
    _write(result, out)
    for line in serve.serve_summary(result):
        print(line)
    return 0


def _serve_stream(args):
    import torch

    from replaylab.bench.provenance import provenance
    from replaylab.bench.stream import run_stream_bench, stream_summary

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {}
    if args.n_requests is not None:
        overrides["n_requests"] = args.n_requests
    if args.sweep_batches is not None:
        overrides["sweep_batches"] = tuple(args.sweep_batches)
    if args.rate_probes is not None:
        overrides["rate_probes"] = args.rate_probes
    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.preset != "cpu" and not cuda and args.device is None:
        sys.exit(
            f"replaylab bench serve-stream --preset {args.preset} is the GPU run: no CUDA "
            "device here (pass --device cpu to run it on the CPU anyway, slowly; --preset cpu "
            "is the CPU smoke run)"
        )
    default = "data/bench_serve_stream.json" if cuda else "data/bench_serve_stream_cpu.json"
    out = args.out or default
    result = run_stream_bench(
        args.preset,
        device=args.device,
        strategies=args.strategies,
        modes=args.modes,
        rate=args.rate,
        budget_bytes=None if args.budget_gib is None else int(args.budget_gib * 2**30),
        sweep=not args.no_sweep,
        log=lambda line: print(line, flush=True),
        checkpoint=lambda partial: _write(dict(provenance(args.argv), **partial), out),
        **overrides,
    )
    result = dict(provenance(args.argv), **result)
    _write(result, out)
    for line in stream_summary(result):
        print(line)
    print(f"wrote {out}")
    return 0


def _matmul(args):
    from replaylab.bench.matmul import run, run_summary, sweep, sweep_summary, weight_shapes
    from replaylab.bench.provenance import provenance

    _need_gpu("matmul")
    t0 = time.time()
    shapes = weight_shapes(args.presets) if args.presets else None
    given = {"rows": tuple(args.rows)} if args.rows else {}
    if args.sweep:
        out, lines = args.out or "data/bench_matmul_sweep.json", sweep_summary
        save = lambda r: _write(dict(provenance(args.argv), **r), out)  # noqa: E731
        result = sweep(shapes, checkpoint=save, **given)
    else:
        result = run(shapes, launches=_launch_table(args.launches), **given)
        out, lines = args.out or "data/bench_matmul.json", run_summary
    return _save(args, result, out, lines, t0)


def _drafters(value):
    """``--drafter``: one of ``bench.families.DRAFTERS``, or several comma-separated."""
    from replaylab.bench.families import DRAFTERS

    names = tuple(value.split(","))
    for name in names:
        if name not in DRAFTERS:
            raise argparse.ArgumentTypeError(f"expected names of {DRAFTERS}, got {name!r}")
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"expected each drafter once, got {value!r}")
    return names[0] if len(names) == 1 else names


def _launch_table(path):
    """The launches of a ``bench matmul --sweep`` JSON (``bench.matmul.best_launches``)."""
    if path is None:
        return None
    from replaylab.bench.matmul import best_launches

    with open(path) as f:
        return best_launches(json.load(f))


def _matched(args):
    from replaylab.bench.matched import matched_summary, run_matched

    _need_gpu("matched")
    t0 = time.time()
    result = run_matched(
        batches=args.batches,
        spec_batches=args.spec_batches,
        spec_strategies=args.spec_strategies,
        arms=args.arms,
        mamba_ssm=not args.no_mamba_ssm,
        launches=_launch_table(args.launches),
        drafter=args.drafter,
    )
    return _save(args, result, args.out or "data/bench_matched.json", matched_summary, t0)


def _spec_steady(args):
    import torch

    from replaylab.bench.spec_steady import model_for, run_spec_steady, spec_steady_summary

    t0 = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        result = run_spec_steady(
            model_for(args.preset, device), batches=args.batches,
            strategies=tuple(args.strategies.split(",")), k=args.k, acceptance=args.acceptance,
            n_new=args.n_new, requests_per_slot=args.requests_per_slot,
            log_length=args.log_length, log_capacity=None if args.ring == "L" else "L+k",
            other_k=args.other_k, adaptive=args.adaptive, repeats=args.repeats,
            batched_admission=args.batched_admission,
        )  # fmt: skip
    result["preset"] = args.preset
    out = args.out or f"data/bench_spec_steady_{'gpu' if device == 'cuda' else 'cpu'}.json"
    return _save(args, result, out, spec_steady_summary, t0)


def _save(args, result, out, lines, t0=None):
    """Write ``result`` with provenance (and the seconds since ``t0``) to ``out``, print
    ``lines`` (a summary) and where it went."""
    from replaylab.bench.provenance import provenance

    extra = {} if t0 is None else dict(seconds=round(time.time() - t0, 1))
    result = dict(provenance(args.argv), **result, **extra)
    _write(result, out)
    for line in lines(result):
        print(line)
    print(f"wrote {out}")
    return 0


def _prefix(args):
    import torch

    from replaylab.bench.prefix import budget_sweep, prefix_summary, run_prefix_bench
    from replaylab.testing import tiny_hybrid

    if args.ttft and not args.engine:
        sys.exit("replaylab bench prefix: --ttft times the serving engine; add --engine")
    if args.engine and args.eviction != "lru-fit":
        sys.exit(
            f"replaylab bench prefix: --eviction {args.eviction} has no effect with --engine: "
            f"its trees have no byte budget, so nothing is evicted (--blocks sweeps budgets)"
        )
    if args.ttft:
        return _prefix_ttft(args)
    torch.set_num_threads(args.threads or 1)
    if args.engine:
        return _prefix_engine(args)
    if args.blocks:
        return _prefix_blocks(args)
    out = args.out or f"data/bench_prefix{_eviction_tag(args)}_cpu.json"
    t0 = time.time()
    with torch.no_grad():
        model = tiny_hybrid()
        result = run_prefix_bench(model, block_sizes=tuple(args.block_sizes or [16, 64, 256, 1024]))
        budgets = args.budgets or [50_000, 100_000, 200_000, 400_000, 800_000]
        result["budget_sweep"] = budget_sweep(model, tuple(budgets), eviction=args.eviction)
        result["eviction"] = args.eviction
    return _save(args, result, out, prefix_summary, t0)


def _eviction_tag(args) -> str:
    """ "" for the default eviction, else "_<name>": a default out file that says its policy."""
    return "" if args.eviction == "lru-fit" else "_" + args.eviction.replace("-", "_")


def _prefix_engine(args):
    import torch

    from replaylab.bench.prefix import engine_prefix_summary, run_engine_prefix_bench
    from replaylab.testing import tiny_hybrid

    out = args.out or "data/bench_prefix_engine_cpu.json"
    t0 = time.time()
    with torch.no_grad():
        blocks = tuple(args.block_sizes or [16, 64, 256, 1024])
        result = run_engine_prefix_bench(tiny_hybrid(), block_sizes=blocks)
    return _save(args, result, out, engine_prefix_summary, t0)


def _prefix_blocks(args):
    from replaylab.bench.prefix_blocks import BLOCK_SIZES, blocks_markdown, run_block_bench

    out = args.out or f"data/bench_prefix_blocks{_eviction_tag(args)}_cpu.json"
    t0 = time.time()
    result = run_block_bench(
        block_sizes=tuple(args.block_sizes or BLOCK_SIZES),
        budgets=args.budgets,
        eviction=args.eviction,
        log=lambda line: print(line, flush=True),
    )

    def tables(result):
        return [line for name, t in blocks_markdown(result).items() for line in (f"{name}:", *t)]

    return _save(args, result, out, tables, t0)


def _prefix_ttft(args):
    import torch

    from replaylab.bench.prefix import TTFT_PRESETS, run_engine_ttft, ttft_summary
    from replaylab.bench.provenance import provenance

    fields = {
        "model": args.model,
        "shared_tokens": args.shared_tokens,
        "suffix_tokens": None if args.suffix_tokens is None else tuple(args.suffix_tokens),
        "batch": args.batch,
        "block_size": args.block_size,
        "log_length": args.log_length,
        "prefill_chunk": args.prefill_chunk,
        "warm_up": args.warm_up,
        "passes": args.passes,
        "prefill_kernels": {"on": True, "off": False}.get(args.prefill_kernels),
        "fused": True if args.fused else None,
        "gc": args.gc,
    }
    overrides = {k: v for k, v in fields.items() if v is not None}
    cuda = torch.cuda.is_available() and args.device != "cpu"
    preset = args.preset or ("gpu" if cuda else "cpu")
    if preset not in TTFT_PRESETS:
        sys.exit(f"--preset: expected one of {sorted(TTFT_PRESETS)}, got {preset!r}")
    if not cuda:  # a shared CPU: one thread unless told (the GPU run keeps torch's default)
        torch.set_num_threads(args.threads or 1)
    out = args.out or f"data/bench_prefix_ttft_{preset}.json"
    result = run_engine_ttft(
        preset,
        device=args.device,
        strategies=args.strategies,
        log=lambda line: print(line, flush=True),
        checkpoint=lambda partial: _write(dict(provenance(args.argv), **partial), out),
        **overrides,
    )
    return _save(args, result, out, ttft_summary)


def _draft_model(args):
    import torch

    from replaylab.bench.draft_model import draft_model_summary, run_draft_model_bench

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # a shared CPU: one thread unless told
        torch.set_num_threads(args.threads or 1)
    t0 = time.time()
    result = run_draft_model_bench(
        device, args.batches, args.n_new, args.k, log_length=args.log_length, repeats=args.repeats
    )
    out = args.out or f"data/bench_draft_model_{'gpu' if device == 'cuda' else 'cpu'}.json"
    return _save(args, result, out, draft_model_summary, t0)


def _workload_stream(args):
    import torch

    from replaylab.bench.workload_stream import run_workload_stream, workload_summary

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.preset == "gpu" and device != "cuda":
        sys.exit("replaylab bench workload-stream --preset gpu is the GPU run: no CUDA device")
    if device == "cpu":  # a shared CPU: one thread unless told
        torch.set_num_threads(args.threads or 1)
    out = args.out or f"data/bench_workload_stream_{args.preset}.json"
    t0 = time.time()

    def keep(partial):  # a run cut short (a time limit) keeps its finished rows
        from replaylab.bench.provenance import provenance

        _write(dict(provenance(args.argv), **partial, seconds=round(time.time() - t0, 1)), out)

    with torch.no_grad():
        result = run_workload_stream(
            args.preset,
            workloads=tuple(args.workloads),
            strategies=tuple(args.strategies),
            modes=tuple(args.modes),
            k=args.k,
            device=device,
            log=lambda line: print(line, flush=True),
            progress=keep,
            rounds=args.rounds,
        )
    return _save(args, result, out, workload_summary, t0)


def _hf_cache(args):
    import torch

    from replaylab.bench.hf_cache import run, summary

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # a shared CPU: one thread unless told
        torch.set_num_threads(args.threads or 1)
    out = args.out or f"data/bench_hf_cache_{'cpu' if device == 'cpu' else 'gpu'}.json"
    t0 = time.time()
    result = run(
        device=device,
        dtype=args.dtype,
        n_new=args.n_new,
        repeats=args.repeats,
        log_lengths=tuple(args.log_lengths),
        drafts=tuple(args.drafts),
        presets=tuple(args.presets),
    )
    return _save(args, result, out, summary, t0)


def add_bench_parser(subparsers):
    """Add ``bench`` and its subcommands to an argparse subparsers object."""
    bench = subparsers.add_parser(
        "bench",
        help="run a benchmark and write its JSON to data/",
        description=__doc__.split("\n\n")[0],
    )
    sub = bench.add_subparsers(dest="benchmark", required=True)
    k = sub.add_parser("kernels", help="replay kernels vs mamba-ssm, fla and a copy (GPU)")
    k.add_argument("--quick", action="store_true", help="a few shapes only")
    k.add_argument("--batches", type=_ints, default=None, help="comma-separated batch sizes")
    k.add_argument("--log-lens", type=_ints, default=None, help="comma-separated log lengths")
    k.add_argument("--ts", type=_ints, default=None, help="comma-separated new-token counts")
    k.add_argument("--no-fold", action="store_true", help="skip fold vs copy")
    k.set_defaults(run=_kernels)
    gk = sub.add_parser(
        "gdn-kernels", help="Gated DeltaNet replay kernels vs fla's recurrent and chunk (GPU)"
    )
    gk.add_argument("--batches", type=_ints, default=None, help="comma-separated batch sizes")
    gk.add_argument("--log-lens", type=_ints, default=None, help="comma-separated log lengths")
    gk.set_defaults(run=_gdn_kernels)
    s = sub.add_parser("sweep", help="BLOCK_P x num_warps of the replay kernels (GPU)")
    s.set_defaults(run=_sweep)
    mm = sub.add_parser(
        "matmul", help="the row-invariant matrix product vs cuBLAS at the presets' weights (GPU)"
    )
    mm.add_argument("--sweep", action="store_true", help="time candidate launches per weight")
    mm.add_argument("--rows", type=_ints, default=None, help="comma-separated row counts")
    mm.add_argument("--launches", help="a --sweep JSON whose chosen launches replace TUNED's")
    mm.add_argument(
        "--presets", type=lambda v: v.split(","), default=None, help="weights of these presets"
    )
    mm.set_defaults(run=_matmul)
    mt = sub.add_parser(
        "matched", help="the lossless engine vs mamba-ssm generate(cg=True), same weights (GPU)"
    )
    mt.add_argument("--batches", type=_ints, default=[1, 8, 64, 128, 256])
    mt.add_argument("--spec-batches", type=_ints, default=[1, 8, 32, 128])
    mt.add_argument(
        "--spec-strategies", type=lambda s: tuple(s.split(",")), default=("replay", "snapshot"),
        help="speculation rows per strategy (replay-ring: replay with a log ring of L + k rows)",
    )  # fmt: skip
    mt.add_argument(
        "--arms", type=lambda s: tuple(s.split(",")),
        default=("row_invariant", "row_invariant_previous_launch", "torch"),
        help="decode arms (the first one speculates): row_invariant, "
        "row_invariant_previous_launch, torch",
    )  # fmt: skip
    mt.add_argument("--no-mamba-ssm", action="store_true", help="skip the peer")
    mt.add_argument("--launches", help="a matmul --sweep JSON whose launches replace TUNED's")
    mt.add_argument(
        "--drafter", default="list", type=_drafters,
        help="speculation rows: list (a SyntheticDrafter per sequence), batched (one "
        "BatchSyntheticDrafter) or device (that drafter, the rounds on the device); several "
        "comma-separated are timed one after another on each engine, the first in the row",
    )  # fmt: skip
    mt.set_defaults(run=_matched)
    sp = sub.add_parser(
        "spec-steady",
        help="speculation / plain decode with every slot busy (a scheduler, no static-batch tail)",
    )
    sp.add_argument("--preset", default="matched", help="matched, or a bench.families preset")
    sp.add_argument("--batches", type=_ints, default=[8, 32, 128])
    sp.add_argument("--strategies", default="replay")
    sp.add_argument("--k", type=_count, default=4)
    sp.add_argument("--acceptance", type=_fraction, default=0.8)
    sp.add_argument("--n-new", type=_count, default=64, help="tokens per request (x 0.5 .. 1.5)")
    sp.add_argument("--requests-per-slot", type=int, default=3)
    sp.add_argument("--log-length", type=int, default=16)
    sp.add_argument("--ring", choices=["L", "L+k"], default="L", help="replay's log ring rows")
    sp.add_argument(
        "--other-k", type=_ints, default=[], help="also speculate with each of these k, same engine"
    )
    sp.add_argument(
        "--adaptive", action="store_true",
        help="also let the scheduler choose each round's k in 0 .. k (serving.adaptive_k)",
    )  # fmt: skip
    sp.add_argument(
        "--repeats", type=int, default=1,
        help="run every arm this many times, the order rotated each pass; medians reported",
    )  # fmt: skip
    sp.add_argument(
        "--batched-admission", action="store_true",
        help="the engine prefills the requests an iteration admits in one pass (admit_many)",
    )  # fmt: skip
    sp.set_defaults(run=_spec_steady)
    d = sub.add_parser("decode", help="end-to-end decoding, every strategy and transformers")
    d.add_argument("--preset", default="tiny", help="tiny, 1b or 8b-layers")
    d.add_argument("--batches", type=_ints, default=[1, 4], help="comma-separated batch sizes")
    d.add_argument("--n-new", type=_count, default=32, help="tokens decoded per run")
    d.add_argument("--checkpoint-interval", type=int, default=16)
    d.add_argument("--log-length", type=int, default=16)
    d.set_defaults(run=_decode)
    e = sub.add_parser(
        "engine", help="the CUDA-graphed decode engine vs transformers and mamba-ssm (GPU)"
    )
    e.add_argument(
        "--presets",
        type=lambda t: t.split(","),
        default=["8b-layers"],
        help="comma-separated presets (8b-layers, 1b)",
    )
    e.add_argument("--batches", type=_ints, default=[1, 8, 32, 64, 128, 256])
    e.add_argument("--n-new", type=_count, default=32, help="decode steps per timed run")
    e.add_argument(
        "--log-length",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="replay's L, or auto: the best measured amortised L per batch",
    )
    e.add_argument("--no-baselines", action="store_true", help="skip transformers and mamba-ssm")
    e.set_defaults(run=_engine)
    ef = sub.add_parser(
        "engine-families",
        help="the serving engine per family (Gated DeltaNet, Mamba-1, Mamba-2 + RoPE): decode, "
        "speculation and pool bytes per strategy and batch (GPU; tiny-* presets on CPU)",
    )
    ef.add_argument(
        "--presets",
        type=lambda t: t.split(","),
        default=["qwen3.5-9b-layers", "jamba-1.5-mini-layers", "bamba-9b-layers"],
        help="comma-separated: qwen3.5-9b-layers, jamba-1.5-mini-layers, bamba-9b-layers "
        "(GPU), tiny-gdn, tiny-mamba1, tiny-bamba (CPU smoke)",
    )
    ef.add_argument(
        "--strategies",
        type=lambda t: tuple(t.split(",")),
        default=("snapshot", "recompute", "replay"),
    )
    ef.add_argument("--batches", type=_ints, default=[1, 8, 32, 128, 256])
    ef.add_argument("--n-new", type=_count, default=16, help="decode steps per timed run")
    ef.add_argument("--repeats", type=int, default=3, help="timed decode runs (median)")
    ef.add_argument("--n-spec", type=int, default=24, help="speculated tokens (0: skip)")
    ef.add_argument("--k", type=_count, default=4, help="drafts per speculative round")
    ef.add_argument("--acceptance", type=_fraction, default=0.8, help="per-sequence acceptance")
    ef.add_argument("--log-length", type=int, default=16, help="replay's L")
    ef.add_argument("--no-fla", action="store_true", help="skip the fla snapshot rows")
    ef.add_argument(
        "--no-ssu", action="store_true", help="skip the mamba-ssm (ssu) snapshot rows of Mamba-1"
    )
    ef.add_argument(
        "--graphs",
        choices=("both", "on", "off"),
        default="both",
        help="rows with CUDA graphs, without, or both (GPU; on CPU always without)",
    )
    ef.add_argument(
        "--fused",
        choices=("on", "off"),
        default="off",
        help="also rows through the fused path's kernels for the layouts it serves (every "
        "preset's; graphed on a GPU)",
    )
    ef.add_argument(
        "--step-kernels",
        choices=("on", "off"),
        default="on",
        help="snapshot and recompute through each family's state_update kernel (on, the "
        "engine's default) or the spec's token loop (off: the path before those kernels)",
    )
    ef.add_argument(
        "--time-budget-s",
        type=float,
        default=240,
        help="no new row after this many seconds of rows (0: no limit); rows run batch by "
        "batch, so a stopped run has every preset's smaller batches",
    )
    ef.set_defaults(run=_engine_families)
    v = sub.add_parser(
        "serve", help="the serving engine: lossless speculation, ragged decode per strategy (GPU)"
    )
    v.add_argument("--presets", type=lambda t: t.split(","), default=["8b-layers", "1b"])
    v.add_argument("--batches", type=_ints, default=[1, 8, 32])
    v.add_argument("--ragged-batches", type=_ints, default=[1, 8, 64, 128, 256])
    v.add_argument("--spec-batches", type=_ints, default=[1, 8, 32, 64, 128])
    v.add_argument(
        "--other-batches", type=_ints, default=[1, 64, 256], help="ragged, other matmuls"
    )
    v.add_argument("--ks", type=_ints, default=[1, 4], help="draft lengths (lossless)")
    v.add_argument(
        "--acceptances",
        type=lambda t: [float(v) for v in t.split(",")],
        default=[0.5, 1.0],
        help="per-sequence acceptances (lossless)",
    )
    v.add_argument(
        "--phases",
        type=lambda t: t.split(","),
        default=["matmul", "lossless", "ragged", "prefill", "logit_error"],
        help="comma-separated: matmul, lossless, ragged, prefill, logit_error",
    )
    v.add_argument(
        "--matmul", default="row_invariant", help="the engine's matrix product (lossless runs)"
    )
    v.add_argument(
        "--ragged-matmuls",
        type=lambda t: t.split(","),
        default=["row_invariant", "torch"],
        help="the matrix products the ragged decode runs compare (all but --matmul at "
        "--other-batches, decode only)",
    )
    v.set_defaults(run=_serve)
    ss = sub.add_parser(
        "serve-stream",
        help="a Poisson request stream under continuous batching, per strategy, with and "
        "without speculation; sustainable rate and the speculation crossover (GPU or CPU)",
    )
    ss.add_argument(
        "--preset",
        default="cpu",
        choices=["cpu", "8b-layers"],
        help="cpu (tiny model, seconds) or 8b-layers (GPU)",
    )
    ss.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    ss.add_argument(
        "--strategies",
        type=lambda t: tuple(t.split(",")),
        default=("snapshot", "recompute", "replay"),
    )
    ss.add_argument(
        "--modes",
        type=lambda t: tuple(t.split(",")),
        default=("decode", "synthetic", "lookup"),
        help="decode, synthetic (Bernoulli 0.8, k=4), lookup (prompt lookup, k=4)",
    )
    ss.add_argument("--rate", type=float, default=None, help="reference rate, requests/s")
    ss.add_argument("--budget-gib", type=float, default=None, help="byte budget, GiB")
    ss.add_argument("--n-requests", type=int, default=None, help="requests per stream")
    ss.add_argument("--sweep-batches", type=_ints, default=None, help="crossover batches")
    ss.add_argument("--rate-probes", type=int, default=None, help="streams per rate search")
    ss.add_argument("--no-sweep", action="store_true", help="skip the crossover sweep")
    ss.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ss.set_defaults(run=_serve_stream)
    px = sub.add_parser(
        "prefix", help="prefix-cache token hit rates per strategy and block size (CPU)"
    )
    px.add_argument(
        "--block-sizes",
        type=_ints,
        default=None,
        help="default 16,64,256,1024 (--blocks: 16,64,256,512,1024)",
    )
    px.add_argument(
        "--budgets",
        type=_ints,
        default=None,
        help="byte budgets of the equal-bytes sweep (default 50000,...,800000 at block sizes "
        "16, 64; --blocks: 2 MiB to 512 MiB, two per octave)",
    )
    px.add_argument(
        "--eviction",
        default="lru-fit",
        choices=["lru", "cost", "logs-first", "lru-fit"],
        help="the trees' eviction policy, --blocks and the teaching budget sweep (default "
        "lru-fit, the library's: prefix.DEFAULT_EVICTION)",
    )
    px.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    px.add_argument(
        "--engine",
        action="store_true",
        help="the serving engine's prefix cache against cold admits (default out: "
        "data/bench_prefix_engine_cpu.json; block sizes: multiples of L=16)",
    )
    px.add_argument(
        "--blocks",
        action="store_true",
        help="hit rate against bytes at serving block sizes, a model with Nemotron-H 8B's byte "
        "ratios (default out: data/bench_prefix_blocks_cpu.json)",
    )
    px.add_argument(
        "--ttft",
        action="store_true",
        help="with --engine: time to first token, cold against a prefix hit, a batch sharing "
        "one prompt (default out: data/bench_prefix_ttft_<preset>.json)",
    )
    px.add_argument(
        "--preset", default=None, help="--ttft: cpu (tiny, seconds) or gpu (default: gpu if CUDA)"
    )
    px.add_argument("--device", default=None, help="--ttft: cuda or cpu (default: cuda if present)")
    px.add_argument(
        "--strategies",
        type=lambda t: tuple(t.split(",")),
        default=("replay", "snapshot", "recompute"),
        help="--ttft: comma-separated strategies (replay:chunk: replay with resume='chunk')",
    )
    px.add_argument("--model", default=None, help="--ttft: a model preset (tiny, 1b, 8b-layers)")
    px.add_argument("--shared-tokens", type=int, default=None, help="--ttft: the shared prompt")
    px.add_argument(
        "--suffix-tokens", type=_ints0, default=None, help="--ttft: low,high unique suffix lengths"
    )
    px.add_argument("--batch", type=int, default=None, help="--ttft: requests (engine slots)")
    px.add_argument("--block-size", type=int, default=None, help="--ttft: the tree's block size")
    px.add_argument("--log-length", type=int, default=None, help="--ttft: replay's L")
    px.add_argument("--prefill-chunk", type=int, default=None, help="--ttft: prefill chunk")
    px.add_argument(
        "--prefill-kernels",
        choices=["on", "off"],
        default=None,
        help="--ttft: the engine's prefill_kernels (the recurrent prompt scans in Triton; "
        "default: the engine's, on a GPU)",
    )
    px.add_argument(
        "--fused",
        action="store_true",
        help="--ttft: the engine's fused path (its prefill too, under prefill_kernels)",
    )
    px.add_argument("--warm-up", type=int, default=None, help="--ttft: untimed rounds first")
    px.add_argument(
        "--gc",
        choices=["default", "freeze"],
        default=None,
        help="--ttft: Python's garbage collector as it comes, or gc.freeze() once the engines "
        "are warm (as a server would after start-up)",
    )
    px.add_argument(
        "--passes",
        type=int,
        default=None,
        help="--ttft: timed passes, the strategies' order reversed in turn (gpu preset: 2)",
    )
    px.set_defaults(run=_prefix)
    hc = sub.add_parser(
        "hf-cache",
        help="transformers' assisted generation under its recording vs replaylab.hf's replay and "
        "recompute caches: state bytes per draft length, tokens/s (CPU or GPU)",
    )
    hc.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    hc.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    hc.add_argument("--n-new", type=_count, default=48, help="tokens per assisted generation")
    hc.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median)")
    hc.add_argument("--log-lengths", type=_ints, default=[16, 4], help="replay's L values")
    hc.add_argument("--drafts", type=_ints, default=list(range(1, 9)), help="draft lengths")
    hc.add_argument(
        "--presets",
        type=lambda t: [p for p in t.split(",") if p],
        default=[],
        help="also time random-weight presets (NemotronH: tiny, 1b, 8b-layers; Qwen3.5: "
        "qwen3.5-9b-layers; Jamba: jamba-1.5-mini-layers), drafting with themselves and with "
        "other weights, k = 4 (GPU)",
    )
    hc.add_argument("--threads", type=int, default=None, help="CPU threads (default 1)")
    hc.add_argument("--out", default=None, help="result file (default: data/bench_hf_cache_*.json)")
    hc.set_defaults(run=_hf_cache)
    dm = sub.add_parser(
        "draft-model",
        help="the trained pair speculating in the engine: greedy, a ModelDrafter per sequence "
        "and one BatchModelDrafter (CPU or GPU)",
    )
    dm.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    dm.add_argument("--batches", type=_ints, default=[1, 8], help="comma-separated batch sizes")
    dm.add_argument("--n-new", type=_count, default=48, help="tokens per sequence")
    dm.add_argument("--k", type=_count, default=4, help="drafts per round")
    dm.add_argument("--log-length", type=int, default=16, help="both engines' replay L")
    dm.add_argument("--repeats", type=int, default=3, help="timed runs after a warm-up (median)")
    dm.add_argument("--threads", type=int, default=None, help="CPU threads (default 1)")
    dm.set_defaults(run=_draft_model)
    ws = sub.add_parser(
        "workload-stream",
        help="four prefix-sharing workloads (multi-turn, system prompts, few-shot, agents) at "
        "Poisson rates through the scheduler with the prefix cache, interleaved prefill and a "
        "binding budget, per strategy and mode (CPU or GPU)",
    )
    ws.add_argument("--preset", default="cpu", choices=["cpu", "gpu"], help="run size")
    ws.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    ws.add_argument(
        "--workloads",
        type=lambda t: t.split(","),
        default=["multi_turn", "system_prompts", "few_shot", "agents"],
        help="comma-separated workloads",
    )
    ws.add_argument(
        "--strategies",
        type=lambda t: t.split(","),
        default=["replay", "snapshot", "recompute"],
        help="comma-separated strategies",
    )
    ws.add_argument(
        "--modes",
        type=lambda t: t.split(","),
        default=["decode", "synthetic", "lookup", "draft-model"],
        help="comma-separated modes",
    )
    ws.add_argument("--k", type=_count, default=4, help="drafts per round")
    ws.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="each workload's requests this many times, fresh unique parts over the same "
        "shared ones (longer streams: rates nearer a steady state)",
    )
    ws.add_argument("--threads", type=int, default=None, help="CPU threads (default 1)")
    ws.set_defaults(run=_workload_stream)
    for p in (k, gk, s, mm, mt, d, e, ef, v, ss, px, dm, ws, sp):
        p.add_argument("--out", default=None, help="result file (default: data/bench_<name>.json)")
    return bench


def main(argv=None):
    """``python -m replaylab.bench SUBCOMMAND ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m replaylab.bench", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(["bench", *argv])
    args.argv = argv
    return run_parsed(args)


def run_parsed(args):
    """Run a parsed bench command under its commit (pinned at the start, not the end, of a long
    run); bad input the library refuses (a ValueError naming the value) is one line on stderr
    and exit status 2, as argparse's own refusals are, not a traceback."""
    from replaylab.bench.provenance import pin_commit

    with pin_commit():
        try:
            return args.run(args)
        except ValueError as err:
            print(f"replaylab bench: {err}", file=sys.stderr)
            return 2
