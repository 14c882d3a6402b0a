"""Where an admission's time goes, snapshot against replay (GPU): one 2,048-token prompt on
``8b-layers`` (bf16, the TTFT bench's engine settings), warmed up, then one admission of each
under ``torch.profiler``: wall time, device-busy time, launches, and the operators with the most
device and host time. With ``--hit S`` the same for a prefix hit: an ``EnginePrefixCache``
(``--block``, 512) warmed with S shared tokens, then the shared prompt plus ``--suffix`` unique tokens,
and the hit's wall time split into its phases (seat, prefill, insertion with eviction), each
timed between device synchronisations; and, on a GPU, each place one admission makes the host
wait for the device (``host_syncs``). Writes OUT.json and prints a short table.

    python tools/prefill_profile.py OUT.json [--tokens 2048] [--fused --prefill-kernels]
                                    [--hit 2000 --suffix 48]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from replaylab.bench.provenance import write_tool_result
from replaylab.bench.timing import sync
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine, EnginePrefixCache


def _top(events, key, n=12):
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:n]
    return [dict(name=e.key[:90], calls=e.count, device_us=e.self_device_time_total,
                 host_us=e.self_cpu_time_total) for e in rows]  # fmt: skip


def _profiled(admit, device):
    """(wall seconds of one ``admit()``, then a profiled second call's summary)."""
    sync(device)
    t0 = time.perf_counter()
    admit()
    sync(device)
    wall = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        admit()
        sync(device)
    events = prof.key_averages()
    device_events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    return dict(
        wall_ms=wall * 1e3,
        device_busy_ms=sum(e.device_time_total for e in device_events) / 1e3,
        device_launches=len(device_events),
        top_device=_top(events, "self_device_time_total"),
        top_host=_top(events, "self_cpu_time_total"),
    )


def _python_profile(admit, device, calls=3, top=30):
    """The Python functions with the most cumulative time over ``calls`` admissions
    (``cProfile``): [dict(function, calls, own_ms, cumulative_ms)] per admission."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        admit()
    sync(device)
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    rows = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)[:top]
    return [
        dict(function=f"{file.split('replaylab/')[-1]}:{line} {name}", calls=nc // calls,
             own_ms=tt / calls * 1e3, cumulative_ms=ct / calls * 1e3)
        for (file, line, name), (_, nc, tt, ct, _) in rows
    ]  # fmt: skip


def _host_syncs(admit, device):
    """Where one ``admit()`` makes the host wait for the device (``torch.cuda``'s sync debug
    mode: a warning at each synchronising call, a device-to-host copy or a stream sync):
    [dict(site, message, calls)], the site being the Python line that made the call; None off
    a GPU. A hit that never waits overlaps its host work with the device's; each wait
    serialises them."""
    if device.type != "cuda":
        return None
    sync(device)
    seen = collections.Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            admit()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        site = f"{w.filename.split('replaylab/')[-1].split('main/')[-1]}:{w.lineno}"
        seen[site, str(w.message).splitlines()[0][:120]] += 1
    return [dict(site=site, message=m, calls=n) for (site, m), n in seen.most_common()]


def _phase_timer(obj, name, phases, device):
    """Wrap ``obj.name`` so each call adds its synchronised wall seconds to ``phases[name]``."""
    inner = getattr(obj, name)

    def timed(*args, **kwargs):
        sync(device)
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        sync(device)
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return out

    setattr(obj, name, timed)


def profile_admit(
    model, strategy, T, fused=False, prefill_kernels=None, hit=None, suffix=48, block=512
):
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(T)
    shared = hit or 0
    engine = DecodeEngine(model, 2, max(T, shared + suffix) + 1, strategy, log_length=16,
                          max_verify=1, prefill_chunk=256, fused=fused, graphs=False,
                          prefill_kernels=prefill_kernels)  # fmt: skip
    row = dict(strategy=strategy, fused=fused, prefill_kernels=engine.prefill_kernels)
    with torch.no_grad():
        if hit is None:
            prompt = torch.randint(0, model.cfg.vocab_size, (T,), generator=gen).to(device)

            def admit():
                engine.admit(prompt)
                engine.retire(0)

            for _ in range(2):  # warm-up: Triton compiles, the allocator settles
                admit()
            out = _profiled(admit, device)
            row["host_syncs"] = _host_syncs(admit, device)
            return dict(row, tokens=T, **out, python=_python_profile(admit, device))
        cache = EnginePrefixCache(engine, block_size=block)
        head = torch.randint(0, model.cfg.vocab_size, (shared,), generator=gen).tolist()
        slot, _, _ = cache.admit(head)
        engine.retire(slot)
        phases = {}

        def admit():
            tail = torch.randint(0, model.cfg.vocab_size, (suffix,), generator=gen).tolist()
            slot, _, got = cache.admit(head + tail)
            engine.retire(slot)
            row["hit"] = dict(resumed_from=got.resumed_from, prefilled=got.prefilled,
                              folded=got.folded, recomputed=got.recomputed)  # fmt: skip

        for _ in range(2):
            admit()
        out = _profiled(admit, device)
        row["host_syncs"] = _host_syncs(admit, device)
        for name in ("_seat", "_insert", "_evict_to_budget"):
            _phase_timer(cache, name, phases, device)
        _phase_timer(engine, "_prefill", phases, device)
        sync(device)
        t0 = time.perf_counter()
        admit()
        sync(device)
        phases["total"] = time.perf_counter() - t0
        row["phases_ms"] = {k: v * 1e3 for k, v in phases.items()}
        row["python"] = _python_profile(admit, device)  # with the phases' synchronisations
        return dict(row, shared=shared, suffix=suffix, **out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--fused", action="store_true", help="the engine's fused path")
    p.add_argument("--prefill-kernels", choices=("on", "off"), default=None,
                   help="the engine's prefill_kernels (default: its own default)")  # fmt: skip
    p.add_argument(
        "--hit", type=int, default=None, help="profile a prefix hit on this many shared tokens"
    )
    p.add_argument("--suffix", type=int, default=48, help="--hit: the unique suffix's tokens")
    p.add_argument("--block", type=int, default=512, help="--hit: the tree's block size")
    p.add_argument("--model", default="8b-layers", help="a model preset (default 8b-layers)")
    args = p.parse_args(argv)
    kernels = None if args.prefill_kernels is None else args.prefill_kernels == "on"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = HybridLM(preset(args.model), seed=0).eval()
    if device.type == "cuda":
        model = model.to(device, torch.bfloat16)
    rows = [
        profile_admit(model, s, args.tokens, args.fused, kernels, hit, args.suffix, args.block)
        for hit in ((None, args.hit) if args.hit else (None,))
        for s in ("snapshot", "replay")
    ]
    for r in rows:
        what = f"hit {r['shared']}+{r['suffix']}" if "shared" in r else f"cold {r['tokens']}"
        print(f"{what:12s} {r['strategy']:8s} wall {r['wall_ms']:7.1f} ms  device busy {r['device_busy_ms']:7.1f} ms  "
              f"device ops {r['device_launches']}")  # fmt: skip
        for e in r["top_device"][:6]:
            print(f"    {e['device_us'] / 1e3:7.2f} ms dev {e['host_us'] / 1e3:7.2f} ms host "
                  f"x{e['calls']:5d} {e['name'][:60]}")  # fmt: skip
        for f in r.get("python", [])[:20]:
            print(f"    py {f['cumulative_ms']:6.2f} ms cum {f['own_ms']:6.2f} own x{f['calls']:4d} "
                  f"{f['function'][-70:]}")  # fmt: skip
        for w in r.get("host_syncs") or []:
            print(f"    host waits x{w['calls']} at {w['site']}: {w['message'][:70]}")
        if "phases_ms" in r:
            print(
                "    phases (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_ms"].items())
            )
    write_tool_result(args.out, "prefill_profile.py", rows)


if __name__ == "__main__":
    main()
