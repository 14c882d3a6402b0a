"""Whether the engine's reference path holds in a CUDA graph, per preset and strategy: decode
``n`` greedy tokens for a ragged batch with ``graphs=True`` and with ``graphs=False`` (the
same arithmetic), compare tokens and logits bit for bit, then speculate with the graphed
engine against its own greedy tokens; a capture that fails is recorded with the last frames of
its traceback. Prints a table; writes every row to OUT.json.

    python tools/graph_probe.py OUT.json [--presets qwen3.5-9b-layers,...] [--batch 8] [--n 24]

A GPU diagnostic (CUDA graphs need a CUDA device).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from replaylab.bench.families import PRESETS, load_preset, timed_speculation
from replaylab.bench.provenance import provenance
from replaylab.bench.serve import admit_all, random_prompts
from replaylab.model import HybridLM
from replaylab.serving import STRATEGIES, DecodeEngine


def _greedy(engine, prompts, n):
    """Greedy tokens (batch, n) and the stacked logits of every step (n, batch, vocab)."""
    logits = admit_all(engine, prompts)
    toks, seen = [], []
    for _ in range(n):
        seen.append(logits.float())
        tok = logits.argmax(-1, keepdim=True)
        toks.append(tok)
        logits = engine.step(tok, check=False)[:, -1]
    return torch.cat(toks, 1), torch.stack(seen)


def probe(name, strategy, batch, n, k=4):
    _, cfg = load_preset(name)
    model = HybridLM(cfg, seed=0).to("cuda", torch.bfloat16).eval()
    prompts = random_prompts(batch, cfg.vocab_size, seed=7)
    max_len = 48 + 2 * n + k
    row = dict(preset=name, strategy=strategy, batch=batch, n=n)
    kw = dict(max_verify=k + 1, use_kernels=True)
    eager = DecodeEngine(model, batch, max_len, strategy, 16, graphs=False, **kw)
    t0 = time.perf_counter()
    ref_tok, ref_logits = _greedy(eager, prompts, n)
    torch.cuda.synchronize()
    row["eager_seconds"] = round(time.perf_counter() - t0, 3)
    try:
        graphed = DecodeEngine(model, batch, max_len, strategy, 16, graphs=True, **kw)
        t0 = time.perf_counter()
        tok, logits = _greedy(graphed, prompts, n)
        torch.cuda.synchronize()
        row["graphed_seconds"] = round(time.perf_counter() - t0, 3)
        row["graphs_captured"] = len(graphed._graphs)
        row["tokens_equal_eager"] = bool(torch.equal(tok, ref_tok))
        row["logits_equal_eager"] = bool(torch.equal(logits, ref_logits))
        row["max_logit_diff"] = float((logits - ref_logits).abs().max())
        greedy = [t.cpu() for t in tok]
        row.update(timed_speculation(graphed, prompts, greedy, k, 0.8))
        row["graphs_after_speculation"] = len(graphed._graphs)
    except Exception as err:  # noqa: BLE001 - record what broke the capture
        row["error"] = f"{type(err).__name__}: {err}"[:600]
        row["where"] = traceback.format_exc().splitlines()[-12:]
    del model
    torch.cuda.empty_cache()
    return row


def _provenance():
    found = provenance()
    found["command"] = "python tools/graph_probe.py " + " ".join(sys.argv[1:])
    return found


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--n", type=int, default=24)
    a = ap.parse_args(argv)
    rows = []
    for name in a.presets.split(","):
        for strategy in a.strategies.split(","):
            rows.append(probe(name, strategy, a.batch, a.n))
            r = rows[-1]
            print(
                f"{name:22s} {strategy:9s} "
                + (
                    f"ERROR {r['error'][:150]}"
                    if "error" in r
                    else f"graphs {r['graphs_captured']:2d} tokens= {r['tokens_equal_eager']} "
                    f"logits= {r['logits_equal_eager']} spec=greedy {r['speculative_equal_greedy']} "
                    f"eager {r['eager_seconds']}s graphed {r['graphed_seconds']}s"
                ),
                flush=True,
            )
            with open(a.out, "w") as f:
                json.dump(dict(provenance=_provenance(), rows=rows), f, indent=1, default=str)


if __name__ == "__main__":
    main()
