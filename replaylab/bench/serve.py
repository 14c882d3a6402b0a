"""The serving engine at serving shape (GPU): is speculative decoding lossless, and how fast
are ragged decode and batched speculation under each strategy?

``run_lossless``: for each preset, strategy, batch, k and per-sequence acceptance, the engine's
greedy tokens against its speculative tokens (each sequence with its own synthetic drafter,
accepting its own number of drafts per round), bit for bit; where they part, the sequence, the
token and the top-2 logit gap of the greedy step there. Alongside, whether a matrix product's
rows depend on how many rows it is given (the one operation a verify cannot make row-local).

``run_ragged``: tokens/s of decode-only steps (CUDA graphs, step + argmax as a user calls it)
and of batched speculation (acceptance 0.8, k = 4) per strategy and batch, every sequence at
its own position (prompts of different lengths).
"""

from __future__ import annotations

import time

import torch

from replaylab.decoding import SyntheticDrafter
from replaylab.model import HybridLM, preset
from replaylab.serving import STRATEGIES, DecodeEngine

__all__ = ["run_lossless", "run_ragged", "matmul_row_invariance", "serve_summary"]


def _model(name):
    return HybridLM(preset(name), seed=0).to("cuda", torch.bfloat16).eval()


def _prompts(batch, vocab, seed, low=8, high=40):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (batch,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def _admit_all(engine, prompts):
    for s in engine.slots:
        engine.retire(s)
    return torch.stack([engine.admit(p.cuda())[1] for p in prompts])


def _greedy_ragged(engine, prompts, n_new):
    """Greedy tokens of every prompt decoded together (each at its own position): a list of
    (n_new,) and, per sequence, the top-2 logit gaps of each step."""
    logits = _admit_all(engine, prompts)
    out, gaps = [], []
    for i in range(n_new):
        top = logits.float().topk(2, dim=-1)
        gaps.append((top.values[:, 0] - top.values[:, 1]).cpu())
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
        if i < n_new - 1:
            logits = engine.step(tok, check=False)[:, -1]
    return list(torch.cat(out, 1).cpu()), torch.stack(gaps, 1)


def run_lossless(
    presets=("8b-layers", "1b"),
    batches=(1, 8, 32),
    ks=(1, 2, 4),
    acceptances=(0.5, 0.8, 1.0),
    n_new=48,
    log_length=16,
):
    rows = []
    for name in presets:
        model = _model(name)
        vocab = model.cfg.vocab_size
        for strategy in STRATEGIES:
            engine = DecodeEngine(model, max(batches), 40 + n_new + 8, strategy, log_length)
            for batch in batches:
                prompts = _prompts(batch, vocab, seed=batch)
                ref, gaps = _greedy_ragged(engine, prompts, n_new)
                ties = int((gaps < 0.1).sum())
                for k in ks:
                    for a in acceptances:
                        pending = _admit_all(engine, prompts).argmax(-1, keepdim=True)
                        drafters = [
                            SyntheticDrafter(torch.cat([p, r]), a, seed=1000 * k + i)
                            for i, (p, r) in enumerate(zip(prompts, ref))
                        ]
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        toks, proposed, accepted = engine.speculate_batch(
                            prompts, pending, n_new, drafters, k=k
                        )
                        torch.cuda.synchronize()
                        seconds = time.perf_counter() - t0
                        parted = [
                            (i, int((t.cpu() != r).nonzero()[0]))
                            for i, (t, r) in enumerate(zip(toks, ref))
                            if not torch.equal(t.cpu(), r)
                        ]
                        first = parted[0] if parted else None
                        rows.append(
                            dict(
                                preset=name,
                                strategy=strategy,
                                batch=batch,
                                k=k,
                                acceptance=a,
                                equal=not parted,
                                sequences_parted=len(parted),
                                first_parted=None
                                if first is None
                                else dict(
                                    sequence=first[0],
                                    token=first[1],
                                    greedy_top2_gap=float(gaps[first[0], first[1]]),
                                ),
                                greedy_steps_within_0p1=ties,
                                measured_acceptance=sum(accepted) / max(1, sum(proposed)),
                                tokens_per_s=batch * n_new / seconds,
                            )
                        )
            del engine
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    return {"kind": "lossless", "n_new": n_new, "log_length": log_length, "rows": rows}


def matmul_row_invariance(name="8b-layers", batches=(1, 8, 64, 128), ks=(1, 2, 4)):
    """For each weight shape of the preset's blocks, whether rows of x @ W^T (bf16) computed
    among batch rows equal the same rows computed among batch * (k + 1) rows, bit for bit."""
    model = _model(name)
    weights = {}
    for n, p in model.named_parameters():
        if p.dim() == 2 and "embed" not in n:
            weights.setdefault(tuple(p.shape), p)
    out = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for shape, w in weights.items():
        for batch in batches:
            for k in ks:
                x = torch.randn(batch * (k + 1), shape[1], device="cuda", generator=g).bfloat16()
                wide = torch.nn.functional.linear(x, w)
                narrow = torch.nn.functional.linear(x[:batch], w)
                out.append(
                    dict(
                        weight=list(shape),
                        batch=batch,
                        k=k,
                        rows_equal=bool(torch.equal(wide[:batch], narrow)),
                        max_abs_diff=float((wide[:batch].float() - narrow.float()).abs().max()),
                    )
                )
    return out


def run_ragged(
    name="8b-layers",
    batches=(1, 8, 64, 128, 256),
    n_steps=32,
    k=4,
    acceptance=0.8,
    log_length=16,
    spec_batches=(1, 8, 64, 128),
):
    model = _model(name)
    vocab = model.cfg.vocab_size
    rows = []
    for strategy in STRATEGIES:
        for batch in batches:
            engine = DecodeEngine(model, batch, 40 + 4 * n_steps + 8, strategy, log_length)
            prompts = _prompts(batch, vocab, seed=7)
            tok = _admit_all(engine, prompts).argmax(-1, keepdim=True)
            for _ in range(log_length + 2):  # capture both graphs (with and without a fold)
                tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n_steps):
                tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            decode = batch * n_steps / (time.perf_counter() - t0)
            row = dict(
                strategy=strategy,
                batch=batch,
                decode_tokens_per_s=decode,
                pool_bytes_per_slot=engine.nbytes_per_slot(),
            )
            if batch in spec_batches:
                ref, _ = _greedy_ragged(engine, prompts, 2 * n_steps)
                pending = _admit_all(engine, prompts).argmax(-1, keepdim=True)
                drafters = [
                    SyntheticDrafter(torch.cat([p, r]), acceptance, seed=i)
                    for i, (p, r) in enumerate(zip(prompts, ref))
                ]
                engine.speculate_batch(prompts, pending, 8, drafters, k=k)  # capture
                pending = _admit_all(engine, prompts).argmax(-1, keepdim=True)
                drafters = [
                    SyntheticDrafter(torch.cat([p, r]), acceptance, seed=i)
                    for i, (p, r) in enumerate(zip(prompts, ref))
                ]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                toks, proposed, accepted = engine.speculate_batch(
                    prompts, pending, 2 * n_steps, drafters, k=k
                )
                torch.cuda.synchronize()
                row.update(
                    speculative_tokens_per_s=batch * 2 * n_steps / (time.perf_counter() - t0),
                    speculative_equal_greedy=all(
                        torch.equal(t.cpu(), r) for t, r in zip(toks, ref)
                    ),
                    measured_acceptance=sum(accepted) / sum(proposed),
                    rollbacks=engine.stats.rollbacks,
                    reruns=engine.stats.reruns,
                )
            rows.append(row)
            del engine
            torch.cuda.empty_cache()
    return {
        "kind": "ragged",
        "preset": name,
        "k": k,
        "acceptance": acceptance,
        "log_length": log_length,
        "rows": rows,
    }


def serve_summary(lossless, ragged):
    lines = []
    if lossless:
        bad = [r for r in lossless["rows"] if not r["equal"]]
        lines.append(
            f"lossless: {len(lossless['rows']) - len(bad)}/{len(lossless['rows'])} "
            "configurations give greedy tokens bit for bit"
        )
        for r in bad[:12]:
            lines.append(
                f"  parted: {r['preset']} {r['strategy']} batch {r['batch']} k {r['k']} "
                f"a {r['acceptance']}: {r['sequences_parted']} seqs, first {r['first_parted']}"
            )
    if ragged:
        lines.append(
            f"{'strategy':>10} {'batch':>6} {'decode tok/s':>13} {'spec tok/s':>11} {'equal':>6}"
        )
        for r in ragged["rows"]:
            spec = r.get("speculative_tokens_per_s")
            lines.append(
                f"{r['strategy']:>10} {r['batch']:>6} {r['decode_tokens_per_s']:>13,.0f} "
                f"{'' if spec is None else f'{spec:,.0f}':>11} {str(r.get('speculative_equal_greedy', '')):>6}"
            )
    return lines
