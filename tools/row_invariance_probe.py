"""Where a verify's rows part from single steps: run T tokens per slot in one engine step, and
the same T tokens one step at a time in a second engine, and compare every module's output
row by row (forward hooks on every submodule, plus the engine runner's recurrent ``advance`` and
attention). Prints, per preset and arithmetic, the modules whose rows differ, in call order.

    python tools/row_invariance_probe.py OUT.json [--presets qwen3.5-9b-layers,...]
        [--batches 8,32] [--strategies snapshot,replay] [--matmul torch,row_invariant]

A GPU diagnostic (bf16); on CPU use the tiny-* presets (slow: Triton's interpreter).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch

from replaylab.bench.families import load_preset
from replaylab.bench.provenance import provenance
from replaylab.bench.serve import admit_all, random_prompts
from replaylab.model import HybridLM
from replaylab.serving import DecodeEngine


def _record(engine):
    """Attach recorders: name -> list of outputs (one per call), in call order."""
    seen, handles = defaultdict(list), []
    order = []

    def keep(name, out):
        if isinstance(out, torch.Tensor):
            if name not in seen:
                order.append(name)
            seen[name].append(out.detach().clone())

    for name, mod in engine.model.named_modules():
        if name:
            handles.append(mod.register_forward_hook(lambda m, a, o, n=name: keep(n, o)))
    runner = engine.runner  # the engine's model runner: the recurrent pool work and attention
    advance, attention = runner.advance, runner.attention

    def advance_hook(layer, inputs, bucket, T):
        y = advance(layer, inputs, bucket, T)
        keep(f"advance[{layer}]", y)
        return y

    def attention_hook(layer, h, bucket, T):
        y = attention(layer, h, bucket, T)
        keep(f"attention[{layer}]", y)
        return y

    runner.advance, runner.attention = advance_hook, attention_hook
    return seen, order, handles


def _rows(t, bucket, T):
    """(bucket, T, ...) view of a module output, or None if it has no such leading dims."""
    if t.dim() >= 2 and t.shape[0] == bucket and t.shape[1] == T:
        return t
    if t.dim() >= 1 and t.shape[0] == bucket * T:
        return t.reshape(bucket, T, *t.shape[1:])
    return None


def probe(model, strategy, batch, matmul, T=4, seed=7):
    prompts = random_prompts(batch, model.cfg.vocab_size, seed=seed, low=8, high=11)
    engines = []
    for _ in range(2):
        e = DecodeEngine(model, batch, 64, strategy, 16, max_verify=T, matmul=matmul)
        admit_all(e, prompts)
        engines.append(e)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, model.cfg.vocab_size, (batch, T), generator=g).to(e.device)
    many, order_m, hooks = _record(engines[0])  # the engines share the model: hook one at a time
    engines[0].step(tokens)
    for h in hooks:
        h.remove()
    one, _, hooks = _record(engines[1])
    for t in range(T):
        engines[1].step(tokens[:, t : t + 1])
    for h in hooks:
        h.remove()
    differs, checked = [], 0
    for name in order_m:
        if len(many[name]) != 1 or len(one.get(name, ())) != T:
            continue
        whole = _rows(many[name][0], batch, T)
        if whole is None:
            continue
        parts = [_rows(x, batch, 1) for x in one[name]]
        if any(p is None for p in parts):
            continue
        checked += 1
        single = torch.cat(parts, 1)
        if single.shape != whole.shape:
            continue
        if not torch.equal(whole, single):
            frac = (whole != single).float().mean().item()
            differs.append(dict(module=name, fraction_differing=frac))
    return dict(checked=checked, differs=differs)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--presets", default="qwen3.5-9b-layers,jamba-1.5-mini-layers,bamba-9b-layers")
    p.add_argument("--batches", default="8,32")
    p.add_argument("--strategies", default="snapshot,replay")
    p.add_argument("--matmul", default="torch,row_invariant")
    a = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    results = []
    for name in a.presets.split(","):
        _, cfg = load_preset(name)
        model = HybridLM(cfg, seed=0).to(device, dtype).eval()
        for matmul in a.matmul.split(","):
            for strategy in a.strategies.split(","):
                for batch in map(int, a.batches.split(",")):
                    with torch.no_grad():
                        r = probe(model, strategy, batch, matmul)
                    r.update(preset=name, matmul=matmul, strategy=strategy, batch=batch)
                    results.append(r)
                    mods = ", ".join(d["module"] for d in r["differs"][:6]) or "none"
                    print(
                        f"{name:22s} {matmul:13s} {strategy:9s} b={batch:<4d} "
                        f"{len(r['differs'])}/{r['checked']} differ: {mods}",
                        flush=True,
                    )
                    json.dump(
                        dict(results=results, provenance=provenance(sys.argv)), open(a.out, "w"),
                        indent=1, default=str,
                    )  # fmt: skip
        del model
        torch.cuda.empty_cache() if device == "cuda" else None


if __name__ == "__main__":
    main()
