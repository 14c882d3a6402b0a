"""An analytic cost model of snapshot, recompute and replay: memory held, bytes moved, restore
cost, time per output token, and how many sequences fit a memory budget.

Glossary (code name -> meaning):
    S            bytes of one sequence's recurrent state over all SSM layers (fp32, H*P*N each)
    W            bytes of one sequence's conv windows over all SSM layers ((d_conv-1) x conv_dim)
    log_token    bytes one token adds to a replay log over all SSM layers (xBC, x, dt, B, C)
    k, alpha     draft length and per-draft acceptance probability (i.i.d.); a round verifies
                 the pending token and k drafts and keeps 1 + a tokens, E[a] = sum_i alpha^i
    interval     checkpoint interval (recompute) or log length L (replay)

Memory follows what ``replaylab.cache.HybridCache`` allocates, so the tests can compare the two
byte for byte; times are a roofline: each step takes max(bytes / bandwidth, flops / rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from replaylab.results import load_bench
from replaylab.shapes import HybridShape
from replaylab.strategies import STRATEGY_NAMES

__all__ = [
    "Hardware",
    "Workload",
    "ModelCosts",
    "model_costs",
    "bytes_held",
    "predict",
    "expected_accepted",
    "revolve_cost",
    "optimal_frontier",
    "interval_tradeoff",
    "measure_hardware",
    "plain_decode_seconds_per_token",
    "HARDWARE",
    "shape_from_config",
    "STRATEGIES",
    "kernel_bytes",
    "decode_step_bytes",
]

STRATEGIES = STRATEGY_NAMES


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s a device copy moves (read + write counted)
    matmul_rate: float  # FLOP/s of dense matmuls
    source: str = ""


def _h200():
    """H200 preset: copy bandwidth from the committed benchmark, matmul rate from the datasheet."""
    try:
        bw = load_bench()["copy_bandwidth_gbs"] * 1e9
        src = "copy bandwidth measured in data/bench_kernels.json"
    except (OSError, KeyError, ValueError):
        bw, src = 4.8e12, "vendor datasheet (4.8 TB/s)"
    return Hardware("H200", bw, 989e12, src + "; bf16 dense matmul 989 TFLOP/s (datasheet)")


HARDWARE = {
    "H200": _h200(),
    "laptop CPU": Hardware(
        "laptop CPU", 20e9, 200e9, "round numbers for a laptop; Hardware.measure() for yours"
    ),
}


def measure_hardware(device="cpu", name=None) -> Hardware:
    """Measure copy bandwidth and matmul rate on ``device`` (a second or two), with
    ``torch.utils.benchmark`` (which synchronises CUDA around the timed runs)."""
    import torch
    from torch.utils import benchmark

    x = torch.empty(2**25, device=device)
    y = torch.empty_like(x)
    a = torch.randn(1024, 1024, device=device)

    def seconds(stmt):
        timer = benchmark.Timer(stmt, globals=dict(x=x, y=y, a=a))
        return timer.blocked_autorange(min_run_time=0.2).median

    return Hardware(
        name or f"measured {device}",
        2 * x.numel() * 4 / seconds("y.copy_(x)"),
        2 * 1024**3 / seconds("a @ a"),
        "measured by replaylab.costmodel.measure_hardware",
    )


@dataclass(frozen=True)
class Workload:
    batch: int = 1
    k: int = 4
    acceptance: float | tuple = 0.8  # a probability, or per-position probabilities (k,)
    interval: int = 16
    context_len: int = 4096
    branches: int = 1  # beam width / best-of-n: sequences sharing a prefix
    state_bytes: int = 4
    act_bytes: int = 2  # KV, conv windows and logs


@dataclass(frozen=True)
class ModelCosts:
    """Per-sequence sizes of a model shape, in bytes, and its per-token compute."""

    S: int
    W: int
    log_token: int
    kv_token: int
    weight_bytes: int
    flops_per_token: float


def model_costs(shape: HybridShape, workload: Workload, n_params: float) -> ModelCosts:
    sb, ab = workload.state_bytes, workload.act_bytes
    if shape.ssm_form == "mamba2":
        per_layer_log = (
            shape.conv_channels
            + shape.ssm_heads * shape.ssm_head_dim
            + shape.ssm_heads
            + 2 * shape.n_groups * shape.d_state
        )
    else:
        per_layer_log = shape.conv_channels + shape.d_inner * 2 + 2 * shape.d_state
    return ModelCosts(
        S=shape.n_ssm * shape.ssm_state_elems * sb,
        W=shape.n_ssm * shape.conv_channels * (shape.d_conv - 1) * ab,
        log_token=shape.n_ssm * per_layer_log * ab,
        kv_token=shape.kv_elems_per_token * ab,
        weight_bytes=int(n_params * ab),
        flops_per_token=2.0 * n_params,
    )


def bytes_held(m: ModelCosts, strategy, *, copies=0, checkpoints=0, log_entries=0) -> dict:
    """The SSM-side bytes a cache holds for one sequence, by the component names of
    ``HybridCache.nbytes()``: state and conv windows, plus snapshot copies, recompute
    checkpoints or replay log entries."""
    held = {"ssm_state": m.S, "conv_state": m.W}
    if strategy == "snapshot":
        held["snapshots"] = copies * (m.S + m.W)
    elif strategy == "recompute":
        held["checkpoints"] = checkpoints * (m.S + m.W)
    elif strategy == "replay":
        held["logs"] = log_entries * m.log_token
    else:
        raise ValueError(f"strategy: the cost model knows {STRATEGIES}, got {strategy!r}")
    return held


def expected_accepted(k, acceptance) -> float:
    """E[a]: drafts accepted per round when draft i is accepted with probability p_i and a
    rejection ends the round (i.i.d. alpha: sum_{i=1..k} alpha^i)."""
    probs = [acceptance] * k if isinstance(acceptance, (int, float)) else list(acceptance)
    if len(probs) != k or not all(0 <= p <= 1 for p in probs):
        raise ValueError(
            f"acceptance: expected a probability or {k} probabilities in [0, 1], got {acceptance}"
        )
    total, alive = 0.0, 1.0
    for p in probs:
        alive *= p
        total += alive
    return total


def predict(
    shape: HybridShape,
    workload: Workload,
    hardware: Hardware,
    n_params: float,
    memory_budget: float | None = None,
) -> dict:
    """Per strategy: bytes held per sequence (peak, while speculating), state bytes moved per
    output token, seconds of one restore, seconds per output token, and sequences that fit
    ``memory_budget`` bytes (weights included)."""
    m = model_costs(shape, workload, n_params)
    w, k, L = workload, workload.k, workload.interval
    ea = expected_accepted(k, w.acceptance)
    tokens_per_round = ea + 1
    p_reject = 1 - _prob_all_accepted(k, w.acceptance)
    kv = m.kv_token * w.context_len

    # a forward reads the weights once (bandwidth counts bytes moved) and does the matmuls of
    # all its tokens: the verify forward has batch * (k+1) tokens
    def forward_seconds(tokens):
        return max(
            m.weight_bytes / hardware.bandwidth, m.flops_per_token * tokens / hardware.matmul_rate
        )

    forward = forward_seconds(w.batch * (k + 1))
    copy = lambda nbytes: 2 * nbytes / hardware.bandwidth  # noqa: E731 - read + write
    out = {}
    # snapshot: a copy at the snapshot and after each of the k+1 verified tokens
    held = kv + m.S + m.W + (k + 2) * (m.S + m.W)
    moved = (k + 1) * 2 * m.S + (k + 2) * 2 * (m.S + m.W) + p_reject * 2 * (m.S + m.W)
    restore = copy(m.S + m.W)
    out["snapshot"] = dict(held=held, moved_per_round=moved, restore_seconds=restore)
    # recompute: checkpoints every L tokens (about two kept), rollback re-runs the distance
    # from the checkpoint, on average L/2 tokens plus the accepted ones, in one forward
    held = kv + m.S + m.W + 2 * (m.S + m.W)
    distance = L / 2 + ea
    restore = forward_seconds(distance)
    moved = (k + 1) * 2 * m.S + p_reject * distance * 2 * m.S
    out["recompute"] = dict(held=held, moved_per_round=moved, restore_seconds=restore)
    # replay: one checkpoint and a log: it folds (up to the latest snapshot) once it reaches L
    # entries, so at most max(L - 1, k + 1) entries are held between steps; verify reads S
    # once; a fold (read + write S) every L tokens
    held = kv + m.S + m.W + max(L - 1, k + 1) * m.log_token
    moved = m.S + (L / 2 + k + 1) * m.log_token + tokens_per_round / L * 2 * m.S
    restore = 0.0  # a cursor move; the fold is counted in the bytes moved
    out["replay"] = dict(held=held, moved_per_round=moved, restore_seconds=restore)
    for name, r in out.items():
        state_time = r["moved_per_round"] * w.batch / hardware.bandwidth
        round_time = forward + state_time + p_reject * r["restore_seconds"] * (name != "replay")
        r["moved_per_token"] = r["moved_per_round"] / tokens_per_round
        r["seconds_per_token"] = round_time / (tokens_per_round * w.batch)
        r["tokens_per_round"] = tokens_per_round
        if memory_budget is not None:
            r["max_sequences"] = max(0, int((memory_budget - m.weight_bytes) // r["held"]))
    return out


def _prob_all_accepted(k, acceptance):
    probs = [acceptance] * k if isinstance(acceptance, (int, float)) else list(acceptance)
    return math.prod(probs)


def plain_decode_seconds_per_token(shape, workload, hardware, n_params) -> float:
    """Plain decoding, one token per step: weights read once per step, the state read and
    written once per token (what selective_state_update does)."""
    m = model_costs(shape, workload, n_params)
    step = max(
        m.weight_bytes / hardware.bandwidth,
        m.flops_per_token * workload.batch / hardware.matmul_rate,
    )
    return (step + workload.batch * 2 * m.S / hardware.bandwidth) / workload.batch


@cache
def revolve_cost(n: int, slots: int) -> int:
    """Fewest forward steps to visit the states of an n-step chain in reverse order, keeping at
    most ``slots`` states at once besides the start (Griewank's binomial checkpointing; this
    is its dynamic program: advance m steps, keep a checkpoint there, reverse the rest with
    one slot fewer, then reverse the first m)."""
    if n <= 1:
        return 0
    if slots == 0:
        return n * (n - 1) // 2
    return min(m + revolve_cost(n - m, slots - 1) + revolve_cost(m, slots) for m in range(1, n))


def optimal_frontier(n: int, max_slots: int) -> list[tuple[int, float]]:
    """(slots, recomputed steps per restored state) on the offline optimum for n steps."""
    return [(s, revolve_cost(n, s) / n) for s in range(0, max_slots + 1)]


def interval_tradeoff(n: int, interval: int) -> dict:
    """States kept and forward steps per restored state when every state of an n-step chain is
    visited in reverse with a checkpoint every ``interval`` steps, counted as ``revolve_cost``
    counts (the sweep that places the checkpoints included), so the two compare directly."""
    kept = math.ceil(n / interval)
    sweep = (kept - 1) * interval
    # within a segment, reversing from its stored start costs 0 + 1 + ... + (length - 1)
    recomputed = sweep + sum(
        j for seg_start in range(0, n, interval) for j in range(min(interval, n - seg_start))
    )
    return {"states_kept": kept, "steps_per_restore": recomputed / n}


def shape_from_config(cfg) -> HybridShape:
    """A HybridShape for a ``replaylab.model.HybridConfig`` (the tiny model of the notebooks)."""
    return HybridShape(
        name="HybridLM",
        n_attn=len(cfg.attn_layers),
        n_ssm=len(cfg.ssm_layers),
        kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        ssm_form="mamba2",
        d_state=cfg.d_state,
        d_conv=cfg.d_conv,
        ssm_heads=cfg.ssm_heads,
        ssm_head_dim=cfg.ssm_head_dim,
        n_groups=cfg.n_groups,
    )


def kernel_bytes(provider, batch, L, T, *, H, P, N, G, esize=2) -> int:
    """Bytes a replay-path kernel ``provider`` must move for ``batch`` sequences of one Mamba-2
    layer (H, P, N, G), a log of L tokens and T new tokens, counting what it reads and writes
    at least once (fp32 state, inputs in ``esize`` bytes). Providers: replay_step, ssu (one
    state copy kept per draft when T > 1), chunk_scan, fla_recurrent, fla_chunk, fold, copy."""
    state = batch * H * P * N * 4
    token = batch * (H * P + H + 2 * G * N) * esize  # x, dt, B, C of one token
    y = batch * T * H * P * esize
    gla = (
        2 * state + (L + T) * batch * H * (2 * N + P + 1) * esize + (L + T) * batch * H * P * esize
    )
    table = {
        "replay_step": state + (L + T) * token + T * token + y,  # read S_c, log, new; append
        "ssu": 2 * T * state + T * token + y + (T - 1) * state * (T > 1),  # + per-draft copies
        "chunk_scan": 2 * state + (L + T) * token + (L + T) * batch * H * P * esize,
        "fla_recurrent": gla,
        "fla_chunk": gla,
        "fold": 2 * state + L * token,
        "copy": 2 * state,
    }
    if provider not in table:
        raise ValueError(f"provider: expected one of {sorted(table)}, got {provider!r}")
    return table[provider]


def decode_step_bytes(cfg, strategy, batch, context, log_length, weights_bytes, esize=2) -> int:
    """Bytes one plain decode step must move for ``batch`` sequences of a ``HybridConfig``
    model at ``context`` tokens: the weights once, then per sequence, per Mamba-2 layer its
    state traffic (snapshot: read + write the fp32 state; replay: read the checkpoint and on
    average L/2 log entries, append one entry, and a fold every L tokens: 2 states + L entries
    over L) and conv window, per attention layer its keys and values read and one row written.
    The roofline time of a step is this over the device-copy bandwidth."""
    H, P, N, G = cfg.ssm_heads, cfg.ssm_head_dim, cfg.d_state, cfg.n_groups
    state = H * P * N * 4
    entry = (H * P + H + 2 * G * N + cfg.conv_dim) * esize  # x, dt, B, C and xBC of a token
    window = 2 * (cfg.d_conv - 1) * cfg.conv_dim * esize
    if strategy == "snapshot":
        ssm = 2 * state + window
    elif strategy == "replay":
        L = log_length
        ssm = state + (L / 2) * entry + entry + (2 * state + L * entry) / L + window
    else:
        raise ValueError(f"strategy: expected 'snapshot' or 'replay', got {strategy!r}")
    kv = 2 * cfg.kv_heads * cfg.head_dim * esize * (context + 1)
    per_sequence = len(cfg.ssm_layers) * ssm + len(cfg.attn_layers) * kv
    return int(weights_bytes + batch * per_sequence)
