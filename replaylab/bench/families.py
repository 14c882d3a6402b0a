"""The serving engine per recurrent family (GPU): a Qwen3.5-9B-class Gated DeltaNet stack, a
Jamba-1.5-Mini-class Mamba-1 stack and a Bamba-9B-class Mamba-2 + RoPE stack, under snapshot,
recompute and replay, batch by batch, in one run (``replaylab bench engine-families``).

What runs: ``DecodeEngine``'s reference path, each row with CUDA graphs (every step one graph
replay) or without (``graphs``: both arms on a GPU), and for the layouts the fused path serves
(Bamba's, Jamba's, Qwen3-Next's, Qwen3.5's; ``serving.layouts.fused_reason``) a third arm through
its kernels, graphed (``fused``, opt-in; each row's ``fused``), with ``use_kernels=True``:
under replay each recurrent layer's decode and verify run its Triton replay kernels for the
whole bucket (``kernels.gdn``, ``kernels.mamba1``, ``kernels.mamba2``) and its folds their
``fold``; snapshot and recompute run each layer through its family's ``state_update`` kernel
(``kernels.mamba1``, ``kernels.decode``, ``kernels.gdn``: the bucket in one launch; files
made before those kernels ran the spec's PyTorch token loop there, so their replay against
snapshot was kernels against PyTorch operations as well as one strategy against another).
For Gated DeltaNet the "fla snapshot" rows put fla's ``fused_recurrent_gated_delta_rule`` in the snapshot path's
one-token state update (decode only: a verify needs every intermediate state, which fla's
recurrent kernel does not return): the snapshot baseline a user of fla would get.

Per (preset, strategy, batch), every sequence at its own position (prompts of 8-40 tokens):
    decode        tokens/s of ``n_new`` greedy steps (step + argmax as a user calls it), timed
                  between CUDA events, median of ``repeats``, after a warm-up (the ``n_spec``
                  greedy tokens speculation is checked against); prefill excluded
    speculative   tokens/s of ``speculate_batch`` (synthetic drafters following each
                  sequence's own greedy tokens, right with probability ``acceptance``, every
                  sequence accepting its own drafts, k drafts a round), wall clock from the
                  first round to the last (prefill excluded; with graphs after an untimed
                  run that captures them); the acceptance measured; and whether every
                  sequence's tokens equal its greedy tokens bit for bit
    OOM           recorded as the row's error; the batch is skipped
Per (preset, batch), ``ratios``: replay's decode over snapshot's and over fla snapshot's, and
replay's speculative tokens/s over the best plain decode (issue 23's engine targets).
Rows run batch by batch across the presets (every preset's model held at once), so a run cut
by ``time_budget_s`` (rows not started then carry the error "time budget") still has every
preset's smaller batches.
Per (preset, strategy): the pools' bytes per slot (state, conv window, log or state copies, KV
for ``concurrency_max_len`` tokens) and how many sequences those pools fit in
``concurrency_gib`` GiB (weights and activations excluded).

Presets keep the published layer shapes and four mixer blocks (three recurrent, one attention,
each followed by an MLP block), random weights, bf16, a vocabulary of 32768 (not the published
one: its head would dominate a four-layer stack). Sources per preset in ``PRESETS``.
"""

from __future__ import annotations

import time

import torch

from replaylab.bench.serve import admit_all, greedy_ragged, matrix_weights, random_prompts
from replaylab.bench.timing import busy_fraction, spread, sync
from replaylab.decoding import SyntheticDrafter
from replaylab.gated_deltanet import GDNConfig
from replaylab.mamba1 import Mamba1Config
from replaylab.model import HybridConfig, HybridLM
from replaylab.scan import ScanResult
from replaylab.serving import STRATEGIES, DecodeEngine, fused_reason

__all__ = ["PRESETS", "run_families", "families_summary"]

_STACK = dict(vocab_size=32768, hidden_size=4096, mlp="swiglu")

PRESETS = {
    "qwen3.5-9b-layers": dict(
        family="Gated DeltaNet",
        config=dict(
            pattern="G-G-G-*-",
            gdn=dict(k_heads=16, v_heads=32, k_head_dim=128, v_head_dim=128, d_conv=4),
            attention="gated",
            attn_heads=16,
            kv_heads=4,
            head_dim=256,
            rotary_dim=64,
            rope_theta=1.0e7,
            intermediate_size=12288,
            **_STACK,
        ),
        source="Qwen/Qwen3.5-9B model card (text model): hidden 4096, 32 layers as 8 x (3 x "
        "Gated DeltaNet + 1 x gated attention), each with an FFN of 12288; Gated DeltaNet 16 "
        "QK heads and 32 V heads of 128, conv 4; gated attention 16 Q / 4 KV heads of 256, "
        "RoPE on 64 dims (theta 1e7). Here: 3 Gated DeltaNet + 1 attention (its 3:1 ratio)",
    ),
    "jamba-1.5-mini-layers": dict(
        family="Mamba-1",
        config=dict(
            pattern="S-S-S-*-",
            mamba1=dict(d_inner=8192, d_state=16, d_conv=4, dt_rank=256),
            attn_heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            **_STACK,
        ),
        source="ai21labs/AI21-Jamba-1.5-Mini config (replaylab.families.FAMILY_SHAPES): hidden "
        "4096, Mamba-1 expand 2 (d_inner 8192), d_state 16, d_conv 4, dt_rank 256; attention "
        "32 / 8 KV heads of 128, no RoPE; MLP 14336 (transformers' JambaConfig defaults). Here: "
        "dense MLPs (its mixture-of-experts layers are not served) and 3 Mamba-1 + 1 attention "
        "(Jamba's ratio is 7:1)",
    ),
    "bamba-9b-layers": dict(
        family="Mamba-2",
        config=dict(
            pattern="M-M-M-*-",
            ssm_heads=128,
            ssm_head_dim=64,
            d_state=128,
            n_groups=1,
            attn_heads=32,
            kv_heads=8,
            head_dim=128,
            rotary_dim=64,
            intermediate_size=14336,
            **_STACK,
        ),
        source="ibm-ai-platform/Bamba-9B config (replaylab.shapes.PUBLISHED_SHAPES): hidden 4096, "
        "Mamba-2 128 heads of 64, d_state 128, 1 group; attention 32 / 8 KV heads of 128 with "
        "RoPE (64 of 128 dims assumed); MLP 14336 (expansion 3.5). Here: 3 Mamba-2 + 1 "
        "attention (Bamba's ratio is 29:3)",
    ),
}

_TINY = dict(vocab_size=64, hidden_size=32, attn_heads=2, kv_heads=1, head_dim=16)
TINY_PRESETS = {  # CPU smoke tests: the same layouts at toy sizes (Triton's interpreter)
    "tiny-gdn": dict(
        family="Gated DeltaNet",
        config=dict(
            pattern="G*-",
            gdn=dict(k_heads=1, v_heads=2, k_head_dim=8, v_head_dim=8),
            attention="gated",
            rotary_dim=8,
            mlp="swiglu",
            intermediate_size=64,
            **_TINY,
        ),
        source="toy",
    ),
    "tiny-mamba1": dict(
        family="Mamba-1",
        config=dict(pattern="S*-", mamba1=dict(d_inner=32, d_state=4, dt_rank=4), **_TINY),
        source="toy",
    ),
    "tiny-bamba": dict(
        family="Mamba-2",
        config=dict(
            pattern="M*-",
            ssm_heads=2,
            ssm_head_dim=8,
            d_state=8,
            n_groups=1,
            rotary_dim=8,
            mlp="swiglu",
            **_TINY,
        ),
        source="toy",
    ),
}


def load_preset(name):
    """(the preset's entry of ``PRESETS`` or ``TINY_PRESETS``, its ``HybridConfig``); a
    ValueError names the known presets."""
    known = {**PRESETS, **TINY_PRESETS}
    if name not in known:
        raise ValueError(f"preset: expected one of {sorted(known)}, got {name!r}")
    cfg = dict(known[name]["config"])
    for key, kind in (("gdn", GDNConfig), ("mamba1", Mamba1Config)):
        if key in cfg:
            cfg[key] = kind(**cfg[key])
    return known[name], HybridConfig(**cfg)


def _fla_recurrent():
    """fla's ``fused_recurrent_gated_delta_rule``, or None and why it is missing."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as err:  # noqa: BLE001 - record why the peer is missing
        return None, f"{type(err).__name__}: {err}"[:300]
    return fused_recurrent_gated_delta_rule, None


class _FlaDecodeScan:
    """A Gated DeltaNet spec's ``scan`` with one-token calls (the snapshot path's decode
    step) through fla's recurrent kernel: state in, outputs and state out; longer calls (a
    prefill) go to the spec's own scan. Installed on the spec instance for the fla rows."""

    def __init__(self, spec, recurrent):
        self.own, self.recurrent = spec.scan, recurrent

    def __call__(self, state, entries, return_states=False):
        if entries["v"].shape[1] != 1:
            return self.own(state, entries, return_states)
        q, k, v, g, beta = (entries[f].contiguous() for f in ("q", "k", "v", "g", "beta"))
        o, final = self.recurrent(
            q=q, k=k, v=v, g=g, beta=beta, scale=1.0, initial_state=state,
            output_final_state=True,
        )  # fmt: skip
        final = final.float()
        return ScanResult(o, final, final[:, None] if return_states else None)


def _mamba_ssm_update():
    """mamba-ssm's ``selective_state_update``, or None and why it is missing."""
    from replaylab.bench.peers import load_kernel_peers

    peers, errors = load_kernel_peers()
    return peers.get("ssu"), errors.get("mamba_ssm")


class _SsuDecodeScan:
    """A Mamba-1 spec's ``scan`` with one-token calls (the snapshot path's decode step) through
    mamba-ssm's ``selective_state_update``, which writes the state in place; longer calls (a
    prefill, a verify) go to the spec's own scan. The returned state is the updated input, so a
    slot that takes no token in the step (ragged padding) is not kept at its old state: the
    bench's decode steps give every slot one token. Installed on the spec instance."""

    def __init__(self, spec, update):
        self.own, self.update, self.spec = spec.scan, update, spec

    def __call__(self, state, entries, return_states=False):
        if entries["x"].shape[1] != 1:
            return self.own(state, entries, return_states)
        p = self.spec.params()
        x, dt, B, C = (entries[f][:, 0].contiguous() for f in ("x", "dt", "B", "C"))
        y = self.update(state, x, dt, p.A.contiguous(), B, C, D=p.D, dt_bias=p.dt_bias,
                        dt_softplus=True)  # fmt: skip
        return ScanResult(y[:, None], state, state[:, None] if return_states else None)


PEERS = {  # row name -> (the layer letter it serves, its scan wrapper)
    "fla snapshot": ("G", _FlaDecodeScan),
    "ssu snapshot": ("S", _SsuDecodeScan),
}


def decode_seconds(engine, tok, n_new):
    """Seconds per greedy step over ``n_new`` steps from ``tok`` (batch, 1) (CUDA events on a
    GPU), and the last tokens (batch, 1)."""
    cuda = engine.device.type == "cuda"
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    else:
        t0 = time.perf_counter()
    for _ in range(n_new):
        tok = engine.step(tok, check=False)[:, -1].argmax(-1, keepdim=True)
    if cuda:
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e-3 / n_new, tok
    return (time.perf_counter() - t0) / n_new, tok


DRAFTERS = ("list", "batched", "device")  # timed_speculation's drafters


def timed_speculation(engine, prompts, ref, k, acceptance, warm=False, drafter="list"):
    """Batched speculative decoding of ``prompts`` (a list of (n,)) against the engine's own
    greedy tokens ``ref`` (a list of (n_spec,)), k drafts per round; a row dict. ``warm``:
    a whole untimed run first (with CUDA graphs: the verify and rerun steps are captured
    there, not in the timed run). ``drafter``: "list", a ``SyntheticDrafter`` per sequence,
    "batched", one ``serving.BatchSyntheticDrafter``, or "device", that drafter with the
    rounds on the device (``speculate_batch(on_device=True)``; replay with its kernels)."""
    from replaylab.serving import BatchSyntheticDrafter

    if drafter not in DRAFTERS:
        raise ValueError(f"drafter: expected one of {DRAFTERS}, got {drafter!r}")
    on_device = drafter == "device"
    n_spec = ref[0].numel()

    def start():
        pending = admit_all(engine, prompts).argmax(-1, keepdim=True)
        references = [torch.cat([p, r]) for p, r in zip(prompts, ref)]
        if drafter in ("batched", "device"):
            return pending, BatchSyntheticDrafter(references, acceptance, seed=0)
        drafters = [SyntheticDrafter(r, acceptance, seed=i) for i, r in enumerate(references)]
        return pending, drafters

    if warm:
        pending, drafters = start()
        engine.speculate_batch(prompts, pending, n_spec, drafters, k=k, on_device=on_device)
    rollbacks, reruns = engine.stats.rollbacks, engine.stats.reruns  # the timed run's own
    pending, drafters = start()
    sync(engine.device)
    t0 = time.perf_counter()
    tokens, proposed, accepted = engine.speculate_batch(
        prompts, pending, n_spec, drafters, k=k, on_device=on_device
    )
    sync(engine.device)
    seconds = time.perf_counter() - t0
    parted = [i for i, (t, r) in enumerate(zip(tokens, ref)) if not torch.equal(t.cpu(), r)]
    return dict(
        drafter=drafter,
        speculative_tokens_per_s=len(prompts) * n_spec / seconds,
        speculative_equal_greedy=not parted,
        sequences_parted=len(parted),
        measured_acceptance=sum(accepted) / max(1, sum(proposed)),
        drafts_proposed=sum(proposed),
        rollbacks=engine.stats.rollbacks - rollbacks,
        reruns=engine.stats.reruns - reruns,
    )


def step_bytes(engine):
    """Bytes one decode step (one token per live slot) must move, at the slots' current
    positions: the weights once (the embedding table's rows of the batch only), and per slot,
    per recurrent layer, the conv window read and written and the state traffic (snapshot,
    recompute: the fp32 state read and written; replay: the checkpoint read, the log entries
    held read (the fields the kernels read), one entry written (every logged field), and a
    fold every L tokens (state read and written, L entries read) over L), per attention layer
    its keys and values at positions 0 .. position read (the new token's row included; its
    write is not counted again). Activations and the bucket's padding slots are left out. The
    roofline time of a step is this over the device-copy bandwidth."""
    model, slots = engine.model, engine.slots
    embed = model.model.embeddings.weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head.weight is not embed:
        weights -= embed.numel() * embed.element_size()
    total = weights + len(slots) * embed[0].numel() * embed.element_size()
    for pool in engine.ssm.values():
        state, window = pool.state[0].nbytes, pool.conv[0].nbytes
        written = sum(buf[0, 0].nbytes for buf in pool.log.values())
        read = pool.kernel_fields if pool.kernels else pool.log
        entry = sum(pool.log[f][0, 0].nbytes for f in read)
        for s in slots:
            total += 2 * window
            if engine.strategy == "replay":
                held = engine.log_len[s] % engine.L
                total += state + held * entry + written + (2 * state + engine.L * entry) / engine.L
            else:
                total += 2 * state
    for pool in engine.kv.values():
        row = 2 * pool.k[0, :, 0].nbytes  # K and V of one position, every KV head
        total += sum((engine.pos[s] + 1) * row for s in slots)
    return int(total)


def _one(model, strategy, batch, args, peer=None, graphs=False):
    """One (strategy, batch) row and its greedy tokens (a list of (n_spec,), or None): greedy
    decoding of ``n_spec`` tokens (the speculation's reference, and the warm-up: Triton
    compiles, folds run, graphs are captured), timed decode steps after it, then speculation
    from a fresh prefill (not for the peer rows). ``peer``: (row name of ``PEERS``, kernel):
    the peer's kernel in the snapshot decode step. ``graphs``: every step a CUDA graph
    replay; "fused": the fused path's kernels (``serving.fused``), graphed."""
    n_new, repeats, n_spec, k = args["n_new"], args["repeats"], args["n_spec"], args["k"]
    max_len = 40 + repeats * n_new + max(n_spec, n_new) + k + 8
    engine = DecodeEngine(
        model, batch, max_len, strategy, args["log_length"], max_verify=k + 1, use_kernels=True,
        graphs=graphs is True or (graphs == "fused" and next(model.parameters()).is_cuda),
        fused=graphs == "fused", step_kernels=args.get("step_kernels", True),
    )  # fmt: skip
    prompts = random_prompts(batch, model.cfg.vocab_size, seed=7)
    specs = [pool.spec for pool in engine.ssm.values()]
    if peer is not None:
        wrap = PEERS[peer[0]][1]
        for pool in engine.ssm.values():
            pool.spec.scan = wrap(pool.spec, peer[1])
            pool.step_kernel = False  # the spec's token loop, where the peer's kernel sits
    try:
        ref = None
        if n_spec:
            ref, _ = greedy_ragged(engine, prompts, n_spec)
            tok = torch.stack([r[-1] for r in ref])[:, None].to(engine.device)
        else:
            tok = admit_all(engine, prompts).argmax(-1, keepdim=True)
            _, tok = decode_seconds(engine, tok, n_new)
        runs, moved = [], []
        for _ in range(repeats):
            before = step_bytes(engine)
            seconds, tok = decode_seconds(engine, tok, n_new)
            runs.append(seconds)
            moved.append((before + step_bytes(engine)) / 2)
        row = dict(
            strategy=peer[0] if peer is not None else strategy,
            graphs=engine.graphs,
            fused=engine.fused,
            batch=batch,
            seconds_per_step=spread(runs),
            decode_tokens_per_s=batch / spread(runs)["median"],
            bytes_per_step=int(sum(moved) / len(moved)),
            log_length=engine.L,
            folds=engine.stats.folds,
        )
        if args.get("copy_gbs"):
            step = row["seconds_per_step"]["median"]
            byte_s = row["bytes_per_step"] / (args["copy_gbs"] * 1e9)
            flop_s = 2 * matrix_weights(model) * batch / (args["matrix_tflops"] * 1e12)
            row["roofline_fraction"] = byte_s / step
            row["roofline"] = dict(
                byte_seconds=byte_s,
                flop_seconds=flop_s,
                binds="bytes" if byte_s >= flop_s else "flops",
                share=max(byte_s, flop_s) / step,
            )
        if args.get("busy"):
            row["gpu_busy"], tok = busy_fraction(engine, tok, steps=8)
        if peer is None and n_spec:
            warm = engine.graphs  # a whole untimed run first, where it captures the graphs
            row.update(timed_speculation(engine, prompts, ref, k, args["acceptance"], warm=warm))
        return row, ref
    finally:
        for spec in specs:
            spec.__dict__.pop("scan", None)


def _pool_bytes(model, strategy, max_len, k, log_length):
    """Pool bytes one slot holds (state, window, log or copies, KV for max_len tokens)."""
    engine = DecodeEngine(
        model, 1, max_len, strategy, log_length, max_verify=k + 1, use_kernels=True
    )
    return engine.nbytes_per_slot()


def run_families(
    presets=tuple(PRESETS),
    strategies=STRATEGIES,
    batches=(1, 8, 32, 128, 256),
    n_new=16,
    repeats=3,
    n_spec=24,
    k=4,
    acceptance=0.8,
    log_length=16,
    concurrency_gib=24,
    concurrency_max_len=2048,
    device=None,
    fla=True,
    ssu=True,
    graphs=None,
    fused=False,
    progress=True,
    time_budget_s=None,
    checkpoint=None,
    rates=None,
    step_kernels=True,
):
    """Every row of the module docstring, for each preset, batch by batch (every preset's
    model held at once). ``n_spec=0`` skips speculation; ``time_budget_s``: no new row starts
    after that many seconds of rows (the rest are recorded as skipped);
    ``fla``: the "fla snapshot" rows for Gated DeltaNet presets where fla imports on a GPU (a
    callable with fla's signature: that one, on any device), each with the fraction of its
    greedy tokens equal to the snapshot row's (two arithmetics: bf16 near-ties part them).
    ``ssu``: likewise the "ssu snapshot" rows for Mamba-1 presets, mamba-ssm's
    ``selective_state_update`` in the snapshot decode step (a callable with its signature:
    that one).
    ``graphs``: the arms, each row run with CUDA graphs (True) or without (default: both on
    a GPU, without on CPU). ``fused``: also the fused path's arm for the presets it serves
    (default: on a GPU). ``checkpoint``: called with the result so far after every row (the
    CLI writes it, so a run cut short keeps the rows it finished). On a GPU each row's
    ``roofline_fraction`` is ``step_bytes`` over the device-copy bandwidth measured at the
    start of the run, over the median step time, and its ``roofline`` the two-term share:
    max(bytes / copy bandwidth, 2 x matrix weights x batch / matrix rate, both measured at the
    start) over the step time, with the term that binds; ``gpu_busy`` the profiler's share of
    kernel time in the wall time of 8 steps. ``rates`` (copy GB/s, matrix TFLOP/s) sets both
    rates instead of measuring them (on CPU too: a smoke run of the arithmetic).
    ``step_kernels``: the engines' (True: every family's ``state_update`` kernel in snapshot
    and recompute; False: the spec's token loop, the path before those kernels, the
    side-by-side arm for them)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    args = dict(
        n_new=n_new, repeats=repeats, n_spec=n_spec, k=k, acceptance=acceptance,
        log_length=log_length, step_kernels=bool(step_kernels),
    )  # fmt: skip
    cuda = device.type == "cuda"
    arms = tuple(graphs) if graphs is not None else ((False, True) if cuda else (False,))
    if rates is not None:
        args["copy_gbs"], args["matrix_tflops"] = rates
    elif cuda:
        from replaylab.bench.serve import matrix_rate_tflops
        from replaylab.bench.timing import copy_bandwidth_gbs

        args["copy_gbs"] = copy_bandwidth_gbs()
        args["matrix_tflops"] = max(matrix_rate_tflops() for _ in range(3))
    args["busy"] = cuda
    recurrent, fla_error = _fla_recurrent() if fla and cuda else (None, None)
    if callable(fla):
        recurrent, fla_error = fla, None
    update, ssu_error = _mamba_ssm_update() if ssu is True and cuda else (None, None)
    if callable(ssu):
        update, ssu_error = ssu, None
    kernels = {"fla snapshot": recurrent, "ssu snapshot": update}
    rows, memory, errors, models, built = [], [], [], {}, {}
    for name in presets:  # every preset's model on the device first (2.1-2.5 GiB each)
        info, cfg = load_preset(name)
        t0 = time.perf_counter()
        built[name] = model = HybridLM(cfg, seed=0).to(device, dtype).eval()
        models[name] = dict(
            family=info["family"],
            pattern=cfg.pattern,
            source=info["source"],
            weights_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
            build_seconds=round(time.perf_counter() - t0, 1),
        )
        for strategy in strategies:
            per_slot = _pool_bytes(model, strategy, concurrency_max_len, k, log_length)
            memory.append(
                dict(
                    preset=name,
                    strategy=strategy,
                    pool_bytes_per_slot=per_slot,
                    max_len=concurrency_max_len,
                    k=k,
                    budget_gib=concurrency_gib,
                    sequences_in_budget=int(concurrency_gib * 2**30 // per_slot),
                )
            )
    # batch by batch, so that a run stopped by the time budget has every preset's small batches
    plan = []
    for batch in batches:
        for name in presets:
            served = fused_reason(built[name].cfg) is None
            for graphed in arms + (("fused",) if fused and served else ()):
                plan += [(name, s, batch, None, graphed) for s in strategies]
                if graphed == "fused":
                    continue  # the peers run in the reference path's snapshot step
                for label, (letter, _) in PEERS.items():
                    fn = kernels[label]
                    if fn is not None and letter in built[name].cfg.pattern:
                        if "snapshot" in strategies:
                            plan.append((name, "snapshot", batch, (label, fn), graphed))

    def result():
        return dict(
            kind="engine-families",
            path=(
                "DecodeEngine reference path, with and without CUDA graphs (each row's "
                "'graphs'), and with fused=True the fused path for the layouts it serves "
                "(rows with 'fused'), "
                "use_kernels=True: replay runs the Triton replay kernels batched over the slots; "
                "snapshot and recompute run each layer through its family's state_update kernel; "
                "'fla snapshot' runs "
                "fla's fused_recurrent_gated_delta_rule there, 'ssu snapshot' mamba-ssm's "
                "selective_state_update"
            ),
            graph_arms=list(arms),
            memory_note=(
                f"pool bytes per slot (state, conv window, log or state copies, KV for "
                f"{concurrency_max_len} tokens, verify of k + 1 = {k + 1}); sequences in "
                f"{concurrency_gib} GiB of pools: weights and activations excluded"
            ),
            device=str(device),
            dtype=str(dtype),
            models=models,
            rows=rows,
            ratios=ratios(rows),
            memory=memory,
            errors=errors,
            fla=None if recurrent is None else "fused_recurrent_gated_delta_rule",
            fla_error=fla_error,
            ssu=None if update is None else "mamba_ssm selective_state_update",
            ssu_error=ssu_error,
            time_budget_s=time_budget_s,
            **args,
        )

    start, greedy = time.perf_counter(), {}  # (preset, strategy, batch, graphs) -> tokens
    for name, strategy, batch, peer, graphed in plan:
        shown = peer[0] if peer else strategy
        label = f"{name} {shown} b={batch}" + {False: "", True: " graphs"}.get(graphed, " fused")
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            rows.append(
                dict(
                    preset=name,
                    strategy=shown,
                    graphs=bool(graphed) and cuda,
                    fused=graphed == "fused",
                    batch=batch,
                    error="time budget",
                )  # fmt: skip
            )
            continue
        if progress:
            print(f"  {label} ...", flush=True)
        try:
            row, ref = _one(built[name], strategy, batch, args, peer=peer, graphs=graphed)
            greedy[name, row["strategy"], batch, graphed] = ref
            theirs = greedy.get((name, "snapshot", batch, graphed))
            ungraphed = greedy.get((name, row["strategy"], batch, False))
            if graphed is True and ref is not None and ungraphed is not None:
                row["greedy_equal_ungraphed"] = all(map(torch.equal, ref, ungraphed))
            if peer is not None and ref is not None and theirs is not None:
                same = [float((a == b).float().mean()) for a, b in zip(ref, theirs)]
                row["greedy_equal_snapshot"] = sum(same) / len(same)
            rows.append(dict(preset=name, **row))
        except torch.OutOfMemoryError:
            rows.append(dict(preset=name, strategy=shown, graphs=bool(graphed) and cuda,
                             fused=graphed == "fused", batch=batch, error="OOM"))  # fmt: skip
        except Exception as err:  # noqa: BLE001 - record, go on
            errors.append(f"{label}: {type(err).__name__}: {err}"[:400])
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if checkpoint is not None:
            checkpoint(result())
    del built
    return result()


def ratios(rows):
    """Per preset, batch and arm (graphs False / True, or "fused"), from the rows' medians:
    replay's decode over snapshot's and over fla snapshot's, replay's speculative tokens/s over
    the best plain decode of any strategy (the issue's targets), and in the fused arm its
    replay decode over the graphed reference path's; None where a row is missing."""
    arm = lambda r: "fused" if r.get("fused") else bool(r.get("graphs", False))  # noqa: E731
    found = {(r["preset"], r["strategy"], r["batch"], arm(r)): r for r in rows if "error" not in r}
    out = []
    for preset, batch, graphs in dict.fromkeys((r["preset"], r["batch"], arm(r)) for r in rows):
        mine = {s: found.get((preset, s, batch, graphs)) for s in (*STRATEGIES, *PEERS)}
        decode = {s: r["decode_tokens_per_s"] for s, r in mine.items() if r}
        replay = mine["replay"] or {}

        def over(value, other):
            return value / other if value and other else None

        out.append(
            dict(
                preset=preset,
                batch=batch,
                graphs=graphs,
                replay_over_snapshot=over(decode.get("replay"), decode.get("snapshot")),
                replay_over_fla_snapshot=over(decode.get("replay"), decode.get("fla snapshot")),
                replay_over_ssu_snapshot=over(decode.get("replay"), decode.get("ssu snapshot")),
                replay_speculative_over_best_decode=over(
                    replay.get("speculative_tokens_per_s"), max(decode.values(), default=None)
                ),
                **(
                    dict(
                        fused_replay_over_graphed_reference=over(
                            decode.get("replay"),
                            (found.get((preset, "replay", batch, True)) or {}).get(
                                "decode_tokens_per_s"
                            ),
                        )
                    )
                    if graphs == "fused"
                    else {}
                ),  # fmt: skip
            )
        )
    return out


def _arm_label(graphs):
    return {False: "", True: " graphs", None: ""}.get(graphs, f" {graphs}")


def families_summary(result):
    """Lines for the terminal, the short table last."""
    lines = [result["path"], result["memory_note"]]
    for m in result["memory"]:
        lines.append(
            f"{m['preset']:22s} {m['strategy']:10s} {m['pool_bytes_per_slot'] / 2**20:9.2f} MiB "
            f"per slot: {m['sequences_in_budget']} sequences in {m['budget_gib']} GiB"
        )
    lines.extend(f"error: {e}" for e in result["errors"])
    if result.get("fla_error"):
        lines.append(f"fla: {result['fla_error']}")
    if result.get("ssu_error"):
        lines.append(f"mamba-ssm: {result['ssu_error']}")
    fmt = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    for q in result["ratios"]:
        lines.append(
            f"{q['preset']:22s} b={q['batch']:3d}{_arm_label(q.get('graphs'))}: "
            f"replay / snapshot decode "
            f"{fmt(q['replay_over_snapshot'])}, replay / fla snapshot "
            f"{fmt(q['replay_over_fla_snapshot'])}, replay / ssu snapshot "
            f"{fmt(q.get('replay_over_ssu_snapshot'))}, replay speculative / best decode "
            f"{fmt(q['replay_speculative_over_best_decode'])}"
            + (
                f", fused replay / graphed reference {fmt(q['fused_replay_over_graphed_reference'])}"
                if "fused_replay_over_graphed_reference" in q
                else ""
            )
        )
    lines.append("")
    lines.append(
        f"{'preset':22s} {'strategy':13s} {'graphs':>6s} {'batch':>5s} {'decode tok/s':>13s} "
        f"{'roofline':>14s} {'busy':>5s} {'spec tok/s':>11s} {'acc':>5s} {'spec = greedy':>13s}"
    )
    order = {name: i for i, name in enumerate(result["models"])}
    strategies = {s: i for i, s in enumerate((*STRATEGIES, *PEERS))}
    arm = lambda r: "fused" if r.get("fused") else str(r.get("graphs", False))  # noqa: E731
    key = lambda r: (order[r["preset"]], strategies[r["strategy"]], arm(r), r["batch"])  # noqa: E731
    for r in sorted(result["rows"], key=key):
        head = f"{r['preset']:22s} {r['strategy']:13s} {arm(r):>6s} "
        if "error" in r:
            lines.append(f"{head}{r['batch']:5d} {r['error']}")
            continue
        spec = r.get("speculative_tokens_per_s")
        roof = r.get("roofline")
        roof = "-" if roof is None else f"{roof['share']:.0%} ({roof['binds']})"
        busy = "-" if r.get("gpu_busy") is None else f"{r['gpu_busy']:.0%}"
        lines.append(
            f"{head}{r['batch']:5d} {r['decode_tokens_per_s']:13.1f} {roof:>14s} {busy:>5s} "
            + (
                f"{spec:11.1f} {r['measured_acceptance']:5.2f} "
                f"{str(r['speculative_equal_greedy']):>13s}"
                if spec is not None
                else f"{'-':>11s} {'-':>5s} {'-':>13s}"
            )
            + (
                f"  (greedy tokens = snapshot's: {r['greedy_equal_snapshot']:.0%})"
                if "greedy_equal_snapshot" in r
                else ""
            )
        )
    return lines
