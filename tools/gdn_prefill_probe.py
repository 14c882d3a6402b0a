"""A Gated DeltaNet replay prefill's log, side by side in one run: its corrected updates u by the
token recurrence (``kernels.gdn.corrected_updates``, the default until 2026-12-04) and by the
chunked form (``GatedDeltaNetSpec.corrected_updates`` from ``UPDATES_CHUNKED_MIN_TOKENS``).

Two measurements, each arm alternating within one process:
- the function alone at Qwen3.5-9B's layer shape (batch 1, 32 value heads of 128, 16 key heads),
  bf16 inputs, median of 5 after a warm-up, with each arm's error against the float64 recurrence;
- the serving engine's admission of one prompt on ``qwen3.5-9b-layers`` (bf16, replay, kernels
  on): median of 3 admissions, and whether both arms' logits after the prompt pick one token.

    python tools/gdn_prefill_probe.py OUT.json [--lengths 512,2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from replaylab.bench.provenance import write_tool_result
from replaylab.gated_deltanet import GatedDeltaNetSpec, l2_normalize

ARMS = {"token recurrence (previous)": 10**9, "chunked (default)": None}


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median_seconds(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _updates_f64(state, k, v, g, beta):
    """u_t = β_t (v_t - α_t S_{t-1}ᵀ k_t) from the float64 recurrence's states."""
    from replaylab.scan import gdn_scan

    f64 = dict(q=k.double(), k=k.double(), v=v.double(), g=g.double(), beta=beta.double())
    run = gdn_scan(**f64, initial_state=state.double(), return_states=True,
                   compute_dtype=torch.float64)  # fmt: skip
    before = torch.cat([state.double()[:, None], run.states[:, :-1]], 1)
    kh = k.double().repeat_interleave(v.shape[2] // k.shape[2], dim=2)
    read = torch.einsum("bthkv,bthk->bthv", before, kh) * g.double().exp()[..., None]
    return beta.double()[..., None] * (v.double() - read)


def function_rows(T, device, H=32, Hk=16, K=128, V=128):
    gen = torch.Generator().manual_seed(T)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    k = l2_normalize(r(1, T, Hk, K)).to(device, torch.bfloat16)
    v = r(1, T, H, V).to(device, torch.bfloat16)
    g = (-torch.rand(1, T, H, generator=gen) * 0.5).to(device)
    beta = torch.rand(1, T, H, generator=gen).to(device, torch.bfloat16)
    state = (r(1, H, K, V) * 0.1).to(device)
    want = _updates_f64(state, k, v, g, beta)
    entries = dict(k=k, v=v, g=g, beta=beta)
    spec = GatedDeltaNetSpec.__new__(GatedDeltaNetSpec)
    rows = []
    for arm, threshold in ARMS.items():
        spec.UPDATES_CHUNKED_MIN_TOKENS = threshold or GatedDeltaNetSpec.UPDATES_CHUNKED_MIN_TOKENS
        seconds = _median_seconds(lambda: spec.corrected_updates(state, entries), 5)
        u = spec.corrected_updates(state, entries)
        err = float((u.double() - want).abs().max() / want.abs().max())
        rows.append(dict(kind="function", tokens=T, arm=arm, seconds=seconds, error_vs_f64=err))
    return rows


def engine_rows(T, device):
    from replaylab.bench.families import load_preset
    from replaylab.model import HybridLM
    from replaylab.serving import DecodeEngine

    _, cfg = load_preset("qwen3.5-9b-layers")
    model = HybridLM(cfg, seed=0).to(device=device, dtype=torch.bfloat16).eval()
    engine = DecodeEngine(model, 1, T + 16, "replay", 16, max_verify=5, use_kernels=True)
    prompt = torch.randint(0, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(engine.device)
    rows, picks = [], {}

    def admit():
        for s in engine.slots:
            engine.retire(s)
        return engine.admit(prompt)[1]

    default = GatedDeltaNetSpec.UPDATES_CHUNKED_MIN_TOKENS
    try:
        for arm, threshold in ARMS.items():
            GatedDeltaNetSpec.UPDATES_CHUNKED_MIN_TOKENS = threshold or default
            with torch.no_grad():
                seconds = _median_seconds(admit, 3)
                picks[arm] = int(admit().argmax())
            rows.append(dict(kind="engine admission", tokens=T, arm=arm, seconds=seconds))
    finally:
        GatedDeltaNetSpec.UPDATES_CHUNKED_MIN_TOKENS = default
    for row in rows:
        row["same_next_token_as_other_arm"] = len(set(picks.values())) == 1
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--lengths", default="512,2048")
    p.add_argument("--engine-lengths", default="2048")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for T in (int(t) for t in args.lengths.split(",") if t):
        rows += function_rows(T, device)
    for T in (int(t) for t in args.engine_lengths.split(",") if t):
        rows += engine_rows(T, device)
    for row in rows:
        print(
            f"{row['kind']:17s} T={row['tokens']:5d} {row['arm']:28s} {row['seconds'] * 1e3:9.2f} ms"
            f"  {row.get('error_vs_f64', '')}"
        )
    write_tool_result(args.out, "gdn_prefill_probe.py", rows)


if __name__ == "__main__":
    main()
