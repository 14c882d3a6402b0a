"""The Gated DeltaNet replay kernels (``replaylab.kernels.gdn``) timed on a GPU beside
flash-linear-attention, side by side in one run, under CUDA graphs, for a Qwen3-Next / Qwen3.5
layer (16 key heads, 32 value heads, K = V = 128; state 2 MiB per sequence in fp32):

    fla_step       fla's ``fused_recurrent_gated_delta_rule``, one token: the state read from
                   ``initial_state`` and written to the final state (snapshot's decode step)
    replay_step    ours: one token's output from checkpoint + n log entries, no state write,
                   timed at n = 0, L/2 and L - 1 (its cost is affine in n: their mean is the
                   mean over a fold cycle)
    fold           ours: the state after L entries, written in place
    amortised      replay's decode cost per token: mean step + fold / L
    fla_chunk      fla's ``chunk_gated_delta_rule`` over L tokens from a state (outputs and the
                   final state: what a fold by fla's prefill kernel costs)
    copy           one state copy (what snapshot pays per kept draft)

Each row carries the bytes the provider must move and the fraction of the device-copy
bandwidth measured in the same run. Correctness is checked in the same run: our outputs and
folded states against fla's over the same tokens.
"""

from __future__ import annotations

import torch

from replaylab.bench.timing import copy_bandwidth_gbs, time_ms

__all__ = [
    "SHAPE",
    "run_gdn_kernels",
    "sweep_launch",
    "best_launches",
    "summary",
    "step_bytes",
    "fold_bytes",
]

SHAPE = dict(H=32, Hk=16, K=128, V=128)
BATCHES = [1, 8, 32, 128, 256]
LOG_LENS = [4, 8, 16, 32, 64]


def _entry_bytes(H, Hk, K, V, act=2):
    """One log entry: k (Hk, K) in the activations' dtype, u (H, V) and g (H) in fp32."""
    return Hk * K * act + H * V * 4 + H * 4


def _token_bytes(H, Hk, K, V, act=2):
    """One new token's inputs and output: q, k (Hk, K), v, o (H, V), g fp32, β."""
    return 2 * Hk * K * act + 2 * H * V * act + H * (4 + act)


def step_bytes(batch, n, H=32, Hk=16, K=128, V=128):
    """Bytes a replay step must move: the checkpoint once, n log entries, the token, one
    appended entry."""
    return batch * (H * K * V * 4 + (n + 1) * _entry_bytes(H, Hk, K, V) + _token_bytes(H, Hk, K, V))


def fold_bytes(batch, L, H=32, Hk=16, K=128, V=128):
    """Bytes a fold must move: the state read and written, L log entries."""
    return batch * (2 * H * K * V * 4 + L * _entry_bytes(H, Hk, K, V))


def _fla_step_bytes(batch, H=32, Hk=16, K=128, V=128):
    return batch * (2 * H * K * V * 4 + _token_bytes(H, Hk, K, V))


def token_inputs(batch, T, gen_device="cuda"):
    """T random tokens' q, k (batch, T, Hk, K), v (batch, T, H, V), beta (batch, T, H) in bf16
    and g (batch, T, H) fp32 at ``SHAPE``; q and k L2-normalised (q also scaled by K^-1/2)."""
    from replaylab.gated_deltanet import l2_normalize

    H, Hk, K, V = SHAPE["H"], SHAPE["Hk"], SHAPE["K"], SHAPE["V"]
    r = lambda *s: torch.randn(*s, device=gen_device)  # noqa: E731
    return dict(
        q=(l2_normalize(r(batch, T, Hk, K)) * K**-0.5).bfloat16(),
        k=l2_normalize(r(batch, T, Hk, K)).bfloat16(),
        v=r(batch, T, H, V).bfloat16(),
        g=-torch.rand(batch, T, H, device=gen_device) * 0.2,
        beta=torch.rand(batch, T, H, device=gen_device).bfloat16(),
    )


def filled_log(batch, Lmax, n, states):
    """A log of n entries written by our own steps (so u is the real corrected update)."""
    from replaylab.kernels.gdn import replay_step

    H, Hk, K, V = SHAPE["H"], SHAPE["Hk"], SHAPE["K"], SHAPE["V"]
    log = dict(
        log_k=torch.zeros(batch, Lmax, Hk, K, dtype=torch.bfloat16, device="cuda"),
        log_u=torch.zeros(batch, Lmax, H, V, device="cuda"),
        log_g=torch.zeros(batch, Lmax, H, device="cuda"),
    )
    log_len = torch.zeros(batch, dtype=torch.int32, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    toks = token_inputs(batch, n) if n else None
    if n:
        replay_step(states, slots, **log, log_len=log_len, **toks)
    return log, log_len, slots, toks


def fla_kernels():
    """((fla's ``fused_recurrent_gated_delta_rule``, its ``chunk_gated_delta_rule``), None), or
    (None, why fla could not be imported)."""
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except Exception as err:  # noqa: BLE001 - record why the peer is missing
        return None, repr(err)[:300]
    return (fused_recurrent_gated_delta_rule, chunk_gated_delta_rule), None


def check_against_fla(batch=4, T=24):
    """Max |difference| of our outputs (decode token by token through the log) and our fold
    against fla's recurrent kernel over the same T tokens from the same state."""
    from replaylab.kernels.gdn import fold, replay_step

    fla, error = fla_kernels()
    if fla is None:
        return dict(error=error)
    recurrent, chunk = fla
    H, K, V = SHAPE["H"], SHAPE["K"], SHAPE["V"]
    states = torch.randn(batch, H, K, V, device="cuda") * 0.05
    checkpoint = states.clone()
    log, log_len, slots, _ = filled_log(batch, T, 0, states)
    toks = token_inputs(batch, T)
    ours = replay_step(states, slots, **log, log_len=log_len, **toks)  # token by token
    o_fla, s_fla = recurrent(
        q=toks["q"], k=toks["k"], v=toks["v"], g=toks["g"], beta=toks["beta"], scale=1.0,
        initial_state=checkpoint, output_final_state=True,
    )  # fmt: skip
    fold(states, slots, states, slots, **log, fold_len=log_len)
    o_chunk, s_chunk = chunk(
        q=toks["q"], k=toks["k"], v=toks["v"], g=toks["g"], beta=toks["beta"], scale=1.0,
        initial_state=checkpoint, output_final_state=True,
    )  # fmt: skip
    return dict(
        tokens=T,
        batch=batch,
        outputs_vs_fla_recurrent=float((ours.float() - o_fla.float()).abs().max()),
        outputs_scale=float(o_fla.float().abs().max()),
        fold_vs_fla_recurrent_state=float((states - s_fla.float()).abs().max()),
        fold_vs_fla_chunk_state=float((states - s_chunk.float()).abs().max()),
        state_scale=float(s_fla.float().abs().max()),
    )


def _row(name, batch, ms, nbytes, copy_gbs, **extra):
    gbs = nbytes / (ms * 1e-3) / 1e9
    return dict(
        provider=name, batch=batch, us=ms * 1e3, bytes=nbytes, GBs=gbs, of_copy=gbs / copy_gbs,
        **extra,
    )  # fmt: skip


def run_gdn_kernels(batches=None, log_lens=None, progress=True):
    """Every provider at every batch (and L for ours); returns a dict with ``rows``, the
    amortised comparison ``decode``, the copy bandwidth and the correctness check."""
    from replaylab.bench.provenance import provenance
    from replaylab.kernels.gdn import fold, replay_step

    batches, log_lens = batches or BATCHES, log_lens or LOG_LENS
    H, K, V = SHAPE["H"], SHAPE["K"], SHAPE["V"]
    fla, fla_error = fla_kernels()
    copy_gbs, copy_methods = copy_bandwidth_gbs(methods=True)
    rows, decode = [], []
    for batch in batches:
        states = torch.randn(batch, H, K, V, device="cuda") * 0.05
        one = token_inputs(batch, 1)
        fla_us = None
        if fla is not None:
            recurrent, chunk = fla
            ms, graphed = time_ms(
                lambda: recurrent(**one, scale=1.0, initial_state=states, output_final_state=True)
            )
            fla_us = ms * 1e3
            rows.append(
                _row("fla_step", batch, ms, _fla_step_bytes(batch), copy_gbs, graph=graphed)
            )
        dst = torch.empty_like(states)
        ms, _ = time_ms(lambda: dst.copy_(states))
        rows.append(_row("copy", batch, ms, 2 * states.numel() * 4, copy_gbs))
        for L in log_lens:
            log, log_len, slots, toks = filled_log(batch, L + 1, L, states.clone())
            head = torch.zeros(batch, dtype=torch.int32, device="cuda")
            o = torch.empty_like(one["v"])
            step_us = []
            for n in sorted({0, L // 2, L - 1}):
                at = torch.full((batch,), n, dtype=torch.int32, device="cuda")
                ms, _ = time_ms(
                    lambda at=at: replay_step(
                        states, slots, **log, log_len=at, **one, log_head=head, out=o,
                        advance=False, check=False,
                    )
                )  # fmt: skip
                step_us.append(ms * 1e3)
                rows.append(
                    _row("replay_step", batch, ms, step_bytes(batch, n), copy_gbs, L=L, n=n)
                )
            full = torch.full((batch,), L, dtype=torch.int32, device="cuda")
            work = states.clone()
            ms, _ = time_ms(
                lambda: fold(
                    work, slots, work, slots, **log, fold_len=full, log_head=head, check=False
                )
            )
            fold_us = ms * 1e3
            rows.append(_row("fold", batch, ms, fold_bytes(batch, L), copy_gbs, L=L))
            if fla is not None:
                seq = {name: t[:, :L] for name, t in toks.items()}
                ms, _ = time_ms(
                    lambda seq=seq: chunk(
                        **seq, scale=1.0, initial_state=states, output_final_state=True
                    )
                )
                rows.append(_row("fla_chunk", batch, ms, fold_bytes(batch, L), copy_gbs, L=L))
            mean_step = sum(step_us) / len(step_us)
            amortised = mean_step + fold_us / L
            decode.append(
                dict(
                    batch=batch, L=L, step_us=mean_step, fold_us=fold_us, amortised_us=amortised,
                    fla_step_us=fla_us, vs_fla=None if fla_us is None else fla_us / amortised,
                )
            )  # fmt: skip
            if progress:
                print(f"  batch {batch:4d} L {L:3d}: amortised {amortised:8.1f} us, fla {fla_us}")
    return dict(
        provenance=provenance(),
        shape=SHAPE,
        copy_GBs=copy_gbs,
        copy_methods=copy_methods,
        fla_error=fla_error,
        check=check_against_fla(),
        rows=rows,
        decode=decode,
    )


STEP_LAUNCHES = [(bv, w, bl) for bv in (16, 32, 64) for w in (1, 2, 4, 8) for bl in (8, 16)]
FOLD_LAUNCHES = [(bv, w, p) for bv in (16, 32, 64) for w in (2, 4, 8) for p in ("tf32x3", "ieee")]
UPDATE_LAUNCHES = [(bv, w, None) for bv in (16, 32, 64) for w in (1, 2, 4, 8)]


def sweep_launch(batches=(128,), L=16, budget_s=150.0, on_row=None, kinds=("replay_step", "fold")):
    """Launches of the step (at n = L/2: ``STEP_LAUNCHES``, BLOCK_V x num_warps x BLOCK_L),
    of the fold (L entries: ``FOLD_LAUNCHES``, BLOCK_V x num_warps x precision) and of the
    snapshot step ``state_update`` (one token: ``UPDATE_LAUNCHES``, BLOCK_V x num_warps, with
    fla's recurrent step on the same token beside it where fla imports) at each batch, for
    each of ``kinds``, beside a copy of the state's bytes under the same timer, until
    ``budget_s`` seconds have passed; ``on_row(row)`` sees each row as it comes (write it out:
    a cut-off run keeps what it measured). The numbers behind ``kernels.gdn.LAUNCH`` and
    ``STATE_UPDATE_LAUNCH``."""
    import time

    from replaylab.kernels.gdn import fold, replay_step, state_update

    H, K, V = SHAPE["H"], SHAPE["K"], SHAPE["V"]
    copy_gbs = copy_bandwidth_gbs()
    rows, t0 = [], time.time()

    def keep(row):
        rows.append(row)
        if on_row:
            on_row(row)

    for batch in batches:
        states = torch.randn(batch, H, K, V, device="cuda") * 0.05
        one = token_inputs(batch, 1)
        log, _, slots, _ = filled_log(batch, L + 1, L, states.clone())
        head = torch.zeros(batch, dtype=torch.int32, device="cuda")
        o = torch.empty_like(one["v"])
        at = torch.full((batch,), L // 2, dtype=torch.int32, device="cuda")
        full = torch.full((batch,), L, dtype=torch.int32, device="cuda")
        work = states.clone()
        ms, _ = time_ms(lambda: work.copy_(states))  # the same bytes as a copy, same timer
        keep(_row("copy", batch, ms, 2 * states.numel() * 4, copy_gbs))
        plan = {
            "replay_step": STEP_LAUNCHES,
            "fold": FOLD_LAUNCHES,
            "state_update": UPDATE_LAUNCHES,
        }
        fla, _ = fla_kernels() if "state_update" in kinds else (None, None)
        if fla:  # the peer's step on the same token: the state read, the new one written
            fn = lambda: fla[0](**one, scale=1.0, initial_state=work, output_final_state=True)  # noqa: E731
            ms, _ = time_ms(fn)
            keep(_row("fla state_update", batch, ms, _fla_step_bytes(batch), copy_gbs))
        for kind in kinds:
            for a, warps, c in plan[kind]:
                if time.time() - t0 > budget_s:
                    return dict(copy_GBs=copy_gbs, rows=rows, cut_at_s=budget_s)
                if kind == "replay_step":
                    fn = lambda a=a, w=warps, c=c: replay_step(  # noqa: E731
                        states, slots, **log, log_len=at, **one, log_head=head, out=o,
                        advance=False, check=False, block_v=a, num_warps=w, block_l=c,
                    )  # fmt: skip
                    extra = dict(n=L // 2, block_l=c)
                    nbytes = step_bytes(batch, L // 2)
                elif kind == "state_update":
                    fn = lambda a=a, w=warps: state_update(  # noqa: E731
                        work, **one, check=False, block_v=a, num_warps=w
                    )
                    extra, nbytes = {}, _fla_step_bytes(batch)
                else:
                    fn = lambda a=a, w=warps, c=c: fold(  # noqa: E731
                        work, slots, work, slots, **log, fold_len=full, log_head=head,
                        check=False, block_v=a, num_warps=w, precision=c,
                    )  # fmt: skip
                    extra = dict(L=L, precision=c)
                    nbytes = fold_bytes(batch, L)
                ms, _ = time_ms(fn)
                keep(_row(kind, batch, ms, nbytes, copy_gbs, block_v=a, num_warps=warps, **extra))
    return dict(copy_GBs=copy_gbs, rows=rows)


def best_launches(rows):
    """(kernel, batch) -> the fastest row of a sweep."""
    best = {}
    for r in rows:
        if r["provider"] == "copy":
            continue
        key = (r["provider"], r["batch"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return best


def summary(result):
    """A short table: per batch, fla's step, our best amortised decode (and its L), the ratio,
    and the fold's share of the copy bandwidth at L = 16."""
    lines = [f"copy {result['copy_GBs']:.0f} GB/s; check {result['check']}"]
    lines.append(
        f"{'batch':>6} {'fla us':>8} {'best L':>6} {'ours us':>8} {'x fla':>6} {'fold@16':>8}"
    )
    for batch in sorted({d["batch"] for d in result["decode"]}):
        mine = [d for d in result["decode"] if d["batch"] == batch]
        best = min(mine, key=lambda d: d["amortised_us"])
        fold16 = [
            r["of_copy"]
            for r in result["rows"]
            if r["provider"] == "fold" and r["batch"] == batch and r.get("L") == 16
        ]
        fla = best["fla_step_us"]
        lines.append(
            f"{batch:6d} {fla or float('nan'):8.1f} {best['L']:6d} {best['amortised_us']:8.1f} "
            f"{best['vs_fla'] or float('nan'):6.2f} {fold16[0] if fold16 else float('nan'):8.2f}"
        )
    return "\n".join(lines)
