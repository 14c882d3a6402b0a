"""Where a cold admission's time goes, snapshot against replay (GPU): one 2,048-token prompt on
``8b-layers`` (bf16, the TTFT bench's engine settings), warmed up, then one admission of each
under ``torch.profiler``: wall time, device-busy time, launches, and the operators with the most
device and host time. Writes OUT.json and prints a short table.

    python tools/prefill_profile.py OUT.json [--tokens 2048]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from replaylab.bench.provenance import write_tool_result
from replaylab.bench.timing import sync
from replaylab.model import HybridLM, preset
from replaylab.serving import DecodeEngine


def _top(events, key, n=12):
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:n]
    return [dict(name=e.key[:90], calls=e.count, device_us=e.self_device_time_total,
                 host_us=e.self_cpu_time_total) for e in rows]  # fmt: skip


def profile_admit(model, strategy, T):
    device = next(model.parameters()).device
    engine = DecodeEngine(model, 1, T + 1, strategy, log_length=16, max_verify=1,
                          prefill_chunk=256, fused=False, graphs=False)  # fmt: skip
    prompt = torch.randint(
        0, model.cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(T)
    )
    prompt = prompt.to(device)
    with torch.no_grad():
        for _ in range(2):  # warm-up: Triton compiles, the allocator settles
            engine.admit(prompt)
            engine.retire(0)
        sync(device)
        t0 = time.perf_counter()
        engine.admit(prompt)
        sync(device)
        wall = time.perf_counter() - t0
        engine.retire(0)
        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.type == "cuda" else []
        )
        with profile(activities=activities) as prof:
            engine.admit(prompt)
            sync(device)
    events = prof.key_averages()
    device_events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    return dict(
        strategy=strategy,
        tokens=T,
        wall_ms=wall * 1e3,
        device_busy_ms=sum(e.device_time_total for e in device_events) / 1e3,
        device_launches=len(device_events),
        top_device=_top(events, "self_device_time_total"),
        top_host=_top(events, "self_cpu_time_total"),
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=2048)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = HybridLM(preset("8b-layers"), seed=0).eval()
    if device.type == "cuda":
        model = model.to(device, torch.bfloat16)
    rows = [profile_admit(model, s, args.tokens) for s in ("snapshot", "replay")]
    for r in rows:
        print(f"{r['strategy']:8s} wall {r['wall_ms']:7.1f} ms  device busy {r['device_busy_ms']:7.1f} ms  "
              f"device ops {r['device_launches']}")  # fmt: skip
        for e in r["top_device"][:6]:
            print(f"    {e['device_us'] / 1e3:7.2f} ms dev {e['host_us'] / 1e3:7.2f} ms host "
                  f"x{e['calls']:5d} {e['name'][:60]}")  # fmt: skip
    write_tool_result(args.out, "prefill_profile.py", rows)


if __name__ == "__main__":
    main()
