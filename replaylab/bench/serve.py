"""The serving engine at serving shape (GPU): is speculative decoding lossless, and how fast
are ragged decode and batched speculation under each strategy?

``run_lossless``: for each preset, strategy, batch, k and per-sequence acceptance, the engine's
greedy tokens against its speculative tokens (each sequence with its own synthetic drafter,
accepting its own number of drafts per round), bit for bit; where they part, the sequence, the
token and the top-2 logit gap of the greedy step there. Alongside, whether a matrix product's
rows depend on how many rows it is given (the one operation a verify cannot make row-local).

``run_ragged``: tokens/s of decode-only steps (CUDA graphs, step + argmax as a user calls it)
and of batched speculation (acceptance 0.8, k = 4) per strategy and batch, every sequence at
its own position (prompts of different lengths), each decode step against the two-term
roofline (bytes over the copy bandwidth, FLOPs over the bf16 matrix rate, both measured in the
same run), and the crossover batch where speculation stops beating the best plain decode.

``run_prefill``: the engine's chunked prefill (tokens/s per strategy) and, per layer, the
chunked SSD scan it runs against mamba-ssm's ``mamba_chunk_scan_combined``.

``run_logit_error``: the engine's logits against a float64 forward of the same weights, per
position, as a function of L and of the folds done, with the model (log) in bf16 and fp32.
"""

from __future__ import annotations

import time

import torch

from replaylab.decoding import SyntheticDrafter
from replaylab.model import HybridLM, preset
from replaylab.serving import STRATEGIES, DecodeEngine

__all__ = [
    "run_lossless",
    "run_ragged",
    "run_prefill",
    "run_logit_error",
    "matmul_row_invariance",
    "serve_summary",
]


DEVICE = "cuda"  # a CPU smoke test of these functions sets "cpu"


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _model(name):
    return HybridLM(preset(name), seed=0).to(DEVICE, torch.bfloat16).eval()


def random_prompts(batch, vocab, seed, low=8, high=40):
    """``batch`` prompts of random ids below ``vocab``: a list of (n,) with n in [low, high),
    fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (batch,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def admit_all(engine, prompts):
    """Retire every slot, then admit ``prompts`` (a list of (n,)) in order: the last logits of
    each, (len(prompts), vocab)."""
    for s in engine.slots:
        engine.retire(s)
    return torch.stack([engine.admit(p.to(engine.device))[1] for p in prompts])


def greedy_ragged(engine, prompts, n_new):
    """Greedy tokens of every prompt decoded together (each at its own position): a list of
    (n_new,) and, per sequence, the top-2 logit gaps of each step."""
    logits = admit_all(engine, prompts)
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
    matmul="row_invariant",
):
    rows = []
    for name in presets:
        model = _model(name)
        vocab = model.cfg.vocab_size
        for strategy in STRATEGIES:
            engine = DecodeEngine(
                model, max(batches), 40 + n_new + 8, strategy, log_length, matmul=matmul
            )
            for batch in batches:
                prompts = random_prompts(batch, vocab, seed=batch)
                ref, gaps = greedy_ragged(engine, prompts, n_new)
                ties = int((gaps < 0.1).sum())
                for k in ks:
                    for a in acceptances:
                        pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
                        drafters = [
                            SyntheticDrafter(torch.cat([p, r]), a, seed=1000 * k + i)
                            for i, (p, r) in enumerate(zip(prompts, ref))
                        ]
                        _sync()
                        t0 = time.perf_counter()
                        toks, proposed, accepted = engine.speculate_batch(
                            prompts, pending, n_new, drafters, k=k
                        )
                        _sync()
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
    return {
        "kind": "lossless",
        "n_new": n_new,
        "log_length": log_length,
        "matmul": matmul,
        "rows": rows,
    }


def matmul_row_invariance(name="8b-layers", batches=(1, 8, 64, 128), ks=(1, 2, 4)):
    """For each weight shape of the preset's blocks, whether rows of x @ W^T (bf16) computed
    among batch rows equal the same rows computed among batch * (k + 1) rows, bit for bit,
    with cuBLAS and with the row-invariant kernel (``kernels.matmul.linear``), and what each
    takes (µs, CUDA graphs) at both row counts."""
    from replaylab.bench.timing import time_ms
    from replaylab.kernels.matmul import linear

    model = _model(name)
    weights = {}
    for n, p in model.named_parameters():
        if p.dim() == 2 and "embed" not in n:
            weights.setdefault(tuple(p.shape), p)
    out = []
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for shape, w in weights.items():
        for batch in batches:
            for k in ks:
                x = torch.randn(batch * (k + 1), shape[1], device=DEVICE, generator=g).bfloat16()
                wide = torch.nn.functional.linear(x, w)
                narrow = torch.nn.functional.linear(x[:batch], w)
                tri_wide, tri_narrow = linear(x, w), linear(x[:batch], w)
                us = lambda f, rows: 1e3 * time_ms(lambda: f(x[:rows], w))[0]  # noqa: E731
                cublas, tri = torch.nn.functional.linear, linear
                out.append(
                    dict(
                        weight=list(shape),
                        batch=batch,
                        k=k,
                        rows_equal=bool(torch.equal(wide[:batch], narrow)),
                        max_abs_diff=float((wide[:batch].float() - narrow.float()).abs().max()),
                        row_invariant_rows_equal=bool(torch.equal(tri_wide[:batch], tri_narrow)),
                        row_invariant_max_abs_diff_vs_cublas=float(
                            (tri_wide.float() - wide.float()).abs().max()
                        ),
                        cublas_us=dict(decode=us(cublas, batch), verify=us(cublas, len(x))),
                        row_invariant_us=dict(decode=us(tri, batch), verify=us(tri, len(x))),
                    )
                )
    return out


def matrix_rate_tflops(n=8192):
    """bf16 matrix-product rate (TFLOP/s) of one n x n x n product on random data."""
    from replaylab.bench.timing import time_ms

    a = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    ms, _ = time_ms(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def matrix_weights(model):
    """Weights a forward multiplies each token by (2 FLOPs each per token): every 2-D weight
    but the embedding table, which a token only indexes (unless the LM head shares it)."""
    out = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    if model.cfg.tie_word_embeddings:
        out += model.lm_head.weight.numel()
    return out


def run_ragged(
    name="8b-layers",
    batches=(1, 8, 64, 128, 256),
    n_steps=32,
    k=4,
    acceptance=0.8,
    log_length=16,
    spec_batches=(1, 8, 32, 64, 128),
    matmul="row_invariant",
):
    from replaylab.bench.timing import copy_bandwidth_gbs
    from replaylab.costmodel import decode_step_bytes

    model = _model(name)
    vocab = model.cfg.vocab_size
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.cfg.tie_word_embeddings:  # a step reads B rows of the embedding, not all
        weights -= (
            model.model.embeddings.weight.numel() * model.model.embeddings.weight.element_size()
        )
    bandwidth = max(copy_bandwidth_gbs() for _ in range(3)) * 1e9  # clocks ramp up first
    rate = max(matrix_rate_tflops() for _ in range(3)) * 1e12
    rows = []
    if set(spec_batches) - set(batches):
        raise ValueError(
            f"spec_batches: every batch speculated must also be decoded (batches {batches}), "
            f"got {spec_batches}"
        )
    for strategy in STRATEGIES:
        for batch in batches:
            engine = DecodeEngine(
                model, batch, 40 + 4 * n_steps + 8, strategy, log_length, matmul=matmul
            )
            prompts = random_prompts(batch, vocab, seed=7)
            tok = admit_all(engine, prompts).argmax(-1, keepdim=True)
            for _ in range(log_length + 2):  # capture both graphs (with and without a fold)
                tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
            _sync()
            t0 = time.perf_counter()
            for _ in range(n_steps):
                tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
            _sync()
            seconds = (time.perf_counter() - t0) / n_steps
            decode = batch / seconds
            context = 24 + log_length + 2 + n_steps // 2  # the mean prompt, warm-up, half the run
            moved = decode_step_bytes(
                model.cfg, "snapshot" if strategy != "replay" else "replay", batch, context,
                log_length, weights,
            )  # fmt: skip
            byte_s, flop_s = moved / bandwidth, 2 * matrix_weights(model) * batch / rate
            row = dict(
                strategy=strategy,
                batch=batch,
                decode_tokens_per_s=decode,
                seconds_per_step=seconds,
                roofline=dict(
                    bytes=moved,
                    byte_seconds=byte_s,
                    flop_seconds=flop_s,
                    binds="bytes" if byte_s >= flop_s else "flops",
                    fraction=max(byte_s, flop_s) / seconds,
                    fraction_of_byte_term=byte_s / seconds,
                ),
                pool_bytes_per_slot=engine.nbytes_per_slot(),
            )
            if batch in spec_batches:
                ref, _ = greedy_ragged(engine, prompts, 2 * n_steps)
                pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
                drafters = [
                    SyntheticDrafter(torch.cat([p, r]), acceptance, seed=i)
                    for i, (p, r) in enumerate(zip(prompts, ref))
                ]
                engine.speculate_batch(prompts, pending, 8, drafters, k=k)  # capture
                pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
                drafters = [
                    SyntheticDrafter(torch.cat([p, r]), acceptance, seed=i)
                    for i, (p, r) in enumerate(zip(prompts, ref))
                ]
                _sync()
                t0 = time.perf_counter()
                toks, proposed, accepted = engine.speculate_batch(
                    prompts, pending, 2 * n_steps, drafters, k=k
                )
                _sync()
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
    crossover = {}
    for strategy in STRATEGIES:
        best = {b: max(r["decode_tokens_per_s"] for r in rows if r["batch"] == b) for b in batches}
        spec = [r for r in rows if r["strategy"] == strategy and "speculative_tokens_per_s" in r]
        losing = [r["batch"] for r in spec if r["speculative_tokens_per_s"] < best[r["batch"]]]
        crossover[strategy] = dict(
            first_batch_below_best_plain_decode=min(losing) if losing else None,
            speculated_batches=[r["batch"] for r in spec],
        )
    return {
        "kind": "ragged",
        "preset": name,
        "k": k,
        "acceptance": acceptance,
        "log_length": log_length,
        "matmul": matmul,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "matrix_rate_tflops": rate / 1e12,
        "crossover": crossover,
        "rows": rows,
    }


def run_prefill(name="8b-layers", lengths=(512, 2048), chunk=256, repeats=3):
    """Chunked prefill: the engine's ``admit`` of one prompt per strategy (tokens/s, median of
    ``repeats`` after a warm-up) and, on one Mamba-2 layer of the preset, the chunked SSD scan
    the engine runs against mamba-ssm's ``mamba_chunk_scan_combined`` (same inputs, ms and the
    largest output difference)."""
    from replaylab.bench.peers import load_kernel_peers
    from replaylab.bench.timing import time_ms
    from replaylab.scan import ssd_chunked_scan

    model = _model(name)
    vocab, cfg = model.cfg.vocab_size, model.cfg
    rows = []
    for strategy in STRATEGIES:
        engine = DecodeEngine(model, 1, max(lengths) + 8, strategy, 16, prefill_chunk=chunk)
        for n in lengths:
            prompt = torch.randint(0, vocab, (n,), device=DEVICE)
            times = []
            for _ in range(repeats + 1):
                for s in engine.slots:
                    engine.retire(s)
                _sync()
                t0 = time.perf_counter()
                engine.admit(prompt)
                _sync()
                times.append(time.perf_counter() - t0)
            med = sorted(times[1:])[len(times[1:]) // 2]
            rows.append(dict(strategy=strategy, tokens=n, seconds=med, tokens_per_s=n / med))
        del engine
        torch.cuda.empty_cache()
    peers, errors = load_kernel_peers()
    H, P, N, G = cfg.ssm_heads, cfg.ssm_head_dim, cfg.d_state, cfg.n_groups
    layer = []
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for n in lengths:
        x = torch.randn(1, n, H, P, device=DEVICE, generator=g).bfloat16()
        dt = torch.randn(1, n, H, device=DEVICE, generator=g) * 0.5 - 2
        A = -torch.rand(H, device=DEVICE, generator=g) * 4
        B = torch.randn(1, n, G, N, device=DEVICE, generator=g).bfloat16()
        C = torch.randn(1, n, G, N, device=DEVICE, generator=g).bfloat16()
        D = torch.randn(H, device=DEVICE, generator=g)
        bias = torch.rand(H, device=DEVICE, generator=g) - 0.5
        ours = lambda: ssd_chunked_scan(  # noqa: E731
            x, dt, A, B, C, D, dt_bias=bias, dt_softplus=True, chunk_size=64
        )
        row = dict(tokens=n, replaylab_ms=time_ms(ours)[0])
        if "chunk_scan" in peers:
            theirs = lambda: peers["chunk_scan"](  # noqa: E731
                x, dt, A, B, C, chunk_size=256, D=D, dt_bias=bias, dt_softplus=True
            )
            row["mamba_chunk_scan_combined_ms"] = time_ms(theirs)[0]
            row["max_abs_diff"] = float((ours().y.float() - theirs().float()).abs().max())
        layer.append(row)
    return {
        "kind": "prefill",
        "preset": name,
        "chunk": chunk,
        "rows": rows,
        "layer": layer,
        "peer_errors": errors,
        "layer_shape": dict(H=H, P=P, N=N, G=G),
    }


def run_logit_error(
    name="8b-layers", log_lengths=(4, 16, 64), dtypes=("bfloat16", "float32"), n_new=128
):
    """Relative logit error ||l - l64|| / ||l64|| of the engine's decode steps (teacher-forced
    random tokens after a 16-token prompt) against a float64 forward of the same weights, per
    strategy, dtype (the model's, which the log and KV take; the state is fp32) and L; the
    error at each position with the folds done before it."""
    import copy

    rows = []
    g = torch.Generator().manual_seed(5)
    base = HybridLM(preset(name), seed=0).eval()
    tokens = torch.randint(0, base.cfg.vocab_size, (16 + n_new,), generator=g).to(DEVICE)
    for dtype in dtypes:
        model = copy.deepcopy(base).to(DEVICE, getattr(torch, dtype))
        with torch.no_grad():
            want = copy.deepcopy(model).double()(tokens[None], None)[0, 15:-1].float()
        for strategy in STRATEGIES:
            for L in log_lengths if strategy == "replay" else (log_lengths[0],):
                engine = DecodeEngine(model, 1, len(tokens) + 8, strategy, L)
                _, first = engine.admit(tokens[:16])
                got = [first.float()]
                for t in tokens[16:-1]:
                    got.append(engine.step(t.view(1, 1), check=False)[0, -1].float())
                got = torch.stack(got)
                err = ((got - want).norm(dim=-1) / want.norm(dim=-1)).tolist()
                positions = list(range(16, 16 + n_new))
                rows.append(
                    dict(
                        dtype=dtype,
                        strategy=strategy,
                        log_length=L if strategy == "replay" else None,
                        relative_error=err,
                        positions=positions,
                        folds_before=[p // L if strategy == "replay" else 0 for p in positions],
                        median=sorted(err)[len(err) // 2],
                        max=max(err),
                    )
                )
                del engine
        del model
        torch.cuda.empty_cache()
    return {"kind": "logit_error", "preset": name, "n_new": n_new, "rows": rows}


def serve_summary(result):
    """Short lines for a terminal: what parted, the decode and speculation table, the rest."""
    lines = []
    lossless, ragged = result.get("lossless"), result.get("ragged")
    if lossless:
        bad = [r for r in lossless["rows"] if not r["equal"]]
        lines.append(
            f"lossless ({lossless.get('matmul')}): {len(lossless['rows']) - len(bad)}/"
            f"{len(lossless['rows'])} configurations give greedy tokens bit for bit"
        )
        for r in bad[:12]:
            lines.append(
                f"  parted: {r['preset']} {r['strategy']} batch {r['batch']} k {r['k']} "
                f"a {r['acceptance']}: {r['sequences_parted']} seqs, first {r['first_parted']}"
            )
    for m in result.get("matmul_rows") or []:
        if m["k"] == 4:
            lines.append(
                f"matmul {m['weight']} b{m['batch']}: cublas rows equal {m['rows_equal']}, "
                f"row-invariant {m['row_invariant_rows_equal']}; verify us cublas "
                f"{m['cublas_us']['verify']:.1f} row-inv {m['row_invariant_us']['verify']:.1f}"
            )
    for r in ragged or []:
        lines.append(
            f"ragged {r['matmul']}: copy {r['copy_bandwidth_gbs']:.0f} GB/s, matrix "
            f"{r['matrix_rate_tflops']:.0f} TFLOP/s; crossover {r['crossover']}"
        )
        lines.append(
            f"{'strategy':>10} {'batch':>6} {'decode tok/s':>13} {'roofline':>9} {'binds':>6} "
            f"{'spec tok/s':>11} {'equal':>6}"
        )
        for row in r["rows"]:
            spec = row.get("speculative_tokens_per_s")
            lines.append(
                f"{row['strategy']:>10} {row['batch']:>6} {row['decode_tokens_per_s']:>13,.0f} "
                f"{row['roofline']['fraction']:>9.0%} {row['roofline']['binds']:>6} "
                f"{'' if spec is None else f'{spec:,.0f}':>11} "
                f"{str(row.get('speculative_equal_greedy', '')):>6}"
            )
    prefill = result.get("prefill")
    if prefill:
        for row in prefill["rows"]:
            lines.append(
                f"prefill {row['strategy']} {row['tokens']}: {row['tokens_per_s']:,.0f} tok/s"
            )
        for row in prefill["layer"]:
            lines.append(f"layer scan {row}")
    errors = result.get("logit_error")
    if errors:
        for row in errors["rows"]:
            lines.append(
                f"logit error {row['dtype']} {row['strategy']} L={row['log_length']}: "
                f"median {row['median']:.2e} max {row['max']:.2e}"
            )
    return lines
