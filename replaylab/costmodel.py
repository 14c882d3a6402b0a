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
import numbers
from dataclasses import dataclass
from functools import cache

from replaylab.shapes import HybridShape
from replaylab.strategies import STRATEGY_NAMES
from replaylab.validation import as_int, as_real

__all__ = [
    "Hardware",
    "Workload",
    "ModelCosts",
    "model_costs",
    "bytes_held",
    "predict",
    "expected_accepted",
    "tokens_per_round",
    "revolve_cost",
    "optimal_frontier",
    "interval_tradeoff",
    "measure_hardware",
    "plain_decode_seconds_per_token",
    "HARDWARE",
    "shape_from_config",
    "STRATEGIES",
    "kernel_bytes",
    "mamba1_replay_vs_ssu",
    "mamba1_break_even",
    "measured_update_rate",
    "decode_step_bytes",
    "fold_bytes",
    "decode_token_bytes",
    "decode_floor_seconds",
    "H200_SPEC_BANDWIDTH",
    "pattern_shape",
    "attention_share",
    "speculative_held",
    "gain_vs_attention",
    "held_crossover_interval",
    "replay_vs_ssu",
    "replay_bytes_frontier",
    "measured_replay_vs_ssu",
    "WORKLOADS",
    "log_length_cost",
    "best_log_length",
]

STRATEGIES = STRATEGY_NAMES


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s a device copy moves (read + write counted)
    matmul_rate: float  # FLOP/s of dense matmuls
    source: str = ""


# The H200 preset, constants in code (the library reads no results): the device-copy bandwidth
# that `replaylab bench engine` measured (data/bench_engine.json, copy_bandwidth_gbs; a test checks
# they agree) and the datasheet's bf16 dense matmul rate.
H200_COPY_BANDWIDTH = 4284.930211815105e9  # bytes/s, read + write counted
H200_DATASHEET_MATMUL_RATE = 989e12  # FLOP/s
H200_SPEC_BANDWIDTH = 4.8e12  # bytes/s, the H200 datasheet's HBM3e bandwidth (a citation)


HARDWARE = {
    "H200": Hardware(
        "H200",
        H200_COPY_BANDWIDTH,
        H200_DATASHEET_MATMUL_RATE,
        "copy bandwidth measured in data/bench_engine.json; "
        "bf16 dense matmul 989 TFLOP/s (datasheet)",
    ),
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

    def __post_init__(self):
        for name, low in (
            ("batch", 1),
            ("k", 0),
            ("interval", 1),
            ("context_len", 0),
            ("branches", 1),
            ("state_bytes", 1),
            ("act_bytes", 1),
        ):
            as_int(name, getattr(self, name), low=low)
        if isinstance(self.acceptance, numbers.Real):  # k probabilities: checked where used
            _acceptance_probs(1, self.acceptance)


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
    for name, count in (
        ("copies", copies),
        ("checkpoints", checkpoints),
        ("log_entries", log_entries),
    ):
        as_real(name, count, low=0)  # averages may be fractional
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


def _acceptance_probs(k, acceptance) -> list:
    """The k per-draft probabilities of ``acceptance`` (one probability or k), checked."""
    k = as_int("k", k, low=0)
    some = "a probability in [0, 1]" if k <= 1 else f"a probability or {k} probabilities in [0, 1]"
    if hasattr(acceptance, "tolist") and not isinstance(acceptance, numbers.Real):
        acceptance = acceptance.tolist()  # a tensor or an array: a number or a list
    scalar = isinstance(acceptance, numbers.Real)  # numpy scalars too
    if isinstance(acceptance, (bool, str)) or not (scalar or hasattr(acceptance, "__iter__")):
        raise ValueError(
            f"acceptance: expected {some}, got {type(acceptance).__name__} {acceptance!r}"
        )
    probs = [acceptance] * k if scalar else list(acceptance)
    ok = all(isinstance(p, numbers.Real) and not isinstance(p, bool) and 0 <= p <= 1 for p in probs)
    if len(probs) != k or not ok:
        raise ValueError(f"acceptance: expected {some}, got {acceptance}")
    return probs


def expected_accepted(k, acceptance) -> float:
    """E[a]: drafts accepted per round when draft i is accepted with probability p_i and a
    rejection ends the round (i.i.d. alpha: sum_{i=1..k} alpha^i)."""
    probs = _acceptance_probs(k, acceptance)
    total, alive = 0.0, 1.0
    for p in probs:
        alive *= p
        total += alive
    return total


def tokens_per_round(k, acceptance, L, capacity=None) -> float:
    """Tokens a replay sequence keeps per speculation round in the long run, 1 + E[a] less what
    the fold grid clips: a round verifies min(k, room - 1) drafts, where room is the log
    ring's rows left after the step's fold (``DecodeEngine.room``: ring of ``capacity`` rows,
    default L; a log of n >= L entries folds its oldest L first). The log length at a round's
    start is a Markov chain over 0 .. capacity; this is its stationary mean of 1 + a. With
    capacity L + k no round is clipped and it equals 1 + ``expected_accepted(k, acceptance)``.
    """
    import numpy as np

    from replaylab.serving.cursor import held_after_fold

    probs = _acceptance_probs(k, acceptance)
    L = as_int("L", L, low=1)
    C = L if capacity is None else as_int("capacity", capacity)
    if not L <= C <= 2 * L:
        raise ValueError(f"capacity: expected L <= capacity <= 2L with L >= 1, got L={L}, {C}")
    step = np.zeros((C + 1, C + 1))  # log length at one round's start -> the next's
    kept = np.zeros(C + 1)  # E[1 + a] from each
    for n in range(C + 1):
        held = held_after_fold(n, L)
        drafts = max(0, min(k, min(k + 1, C - held) - 1))
        alive = 1.0
        for a in range(drafts + 1):  # a drafts accepted, then a rejection (or the last one)
            p = alive * (1 - probs[a]) if a < drafts else alive
            step[n, held + a + 1] += p
            kept[n] += p * (a + 1)
            alive *= probs[a] if a < drafts else 0.0
    # the stationary distribution: pi (step - I) = 0 with sum(pi) = 1, by least squares
    system = np.vstack([step.T - np.eye(C + 1), np.ones(C + 1)])
    target = np.zeros(C + 2)
    target[-1] = 1.0
    pi = np.linalg.lstsq(system, target, rcond=None)[0]
    return float(pi @ kept)


def predict(
    shape: HybridShape,
    workload: Workload,
    hardware: Hardware,
    n_params: float,
    memory_budget: float | None = None,
) -> dict:
    """Per strategy: bytes held per sequence (peak, while speculating), state bytes moved per
    round and per output token, seconds of one rollback, seconds per output token, and
    sequences that fit ``memory_budget`` bytes (weights included).

    State traffic is counted as a fused kernel must move it, each byte once: the verify forward
    reads the state once, and writes only the states a strategy keeps.

    * snapshot: the state of every verified position is written once, into its own slot: that
      write *is* the snapshot (k + 1 state writes a round, k more than a plain forward of the
      round would need); a rejection copies the accepted position's state and window back.
    * recompute: one state write a round, a checkpoint copy every ``interval`` tokens; a
      rejection re-runs the forward from the checkpoint (on average interval/2 + E[a] tokens).
    * replay: the checkpoint is read, never written, in a step; the log is read (on average
      L/2 entries) and k + 1 entries appended; a rollback is a cursor move, but the log then
      refills and a fold of L entries (read + write the state, read L entries) is paid every L
      kept tokens. ``restore_seconds`` is that deferred fold per kept token, fold bytes / L
      over the bandwidth; ``fold_bytes_per_round`` is what a round pays for it.
    """
    if memory_budget is not None:  # NaN failed in int(), a negative budget fitted 0
        as_real("memory_budget", memory_budget, above=0, unit=" (bytes)")
    as_real("n_params", n_params, low=0)
    as_real("hardware.bandwidth", hardware.bandwidth, above=0, unit=" (bytes/s)")
    as_real("hardware.matmul_rate", hardware.matmul_rate, above=0, unit=" (FLOP/s)")
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
    # snapshot: a slot per verified position (plus the one the round starts from)
    held = kv + m.S + m.W + (k + 2) * (m.S + m.W)
    moved = m.S + (k + 1) * (m.S + m.W) + p_reject * 2 * (m.S + m.W)
    out["snapshot"] = dict(
        held=held,
        moved_per_round=moved,
        restore_seconds=copy(m.S + m.W),
        state_writes_per_round=float(k + 1),
    )
    # recompute: checkpoints every L tokens (about two kept); a rollback re-runs the distance
    # from the checkpoint, on average L/2 tokens plus the accepted ones, in one forward
    held = kv + m.S + m.W + 2 * (m.S + m.W)
    distance = L / 2 + ea
    moved = 2 * m.S + tokens_per_round / L * 2 * (m.S + m.W) + p_reject * 2 * m.S
    out["recompute"] = dict(
        held=held,
        moved_per_round=moved,
        restore_seconds=forward_seconds(distance),
        state_writes_per_round=1 + tokens_per_round / L + p_reject,
    )
    # replay: one checkpoint and a log: it folds (up to the latest snapshot) once it reaches L
    # entries, so at most max(L - 1, k + 1) entries are held between steps
    held = kv + m.S + m.W + max(L - 1, k + 1) * m.log_token
    fold = fold_bytes(m, L)
    moved = m.S + (L / 2 + k + 1) * m.log_token + tokens_per_round * fold / L
    out["replay"] = dict(
        held=held,
        moved_per_round=moved,
        restore_seconds=fold / L / hardware.bandwidth,
        state_writes_per_round=tokens_per_round / L,
        fold_bytes_per_round=tokens_per_round * fold / L,
    )
    for name, r in out.items():
        state_time = r["moved_per_round"] * w.batch / hardware.bandwidth
        rerun = p_reject * r["restore_seconds"] if name == "recompute" else 0.0
        round_time = forward + state_time + rerun
        r["moved_per_token"] = r["moved_per_round"] / tokens_per_round
        r["seconds_per_token"] = round_time / (tokens_per_round * w.batch)
        r["tokens_per_round"] = tokens_per_round
        if memory_budget is not None:
            r["max_sequences"] = max(0, int((memory_budget - m.weight_bytes) // r["held"]))
    return out


def fold_bytes(m: ModelCosts, L: int) -> float:
    """Bytes one fold of L logged tokens moves for one sequence: read and write the state of
    every SSM layer, read L log entries."""
    return 2 * m.S + L * m.log_token


def _prob_all_accepted(k, acceptance):
    return math.prod(_acceptance_probs(k, acceptance))


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
    n, slots = as_int("n", n, low=0), as_int("slots", slots, low=0)
    if n <= 1:
        return 0
    if slots == 0:
        return n * (n - 1) // 2
    return min(m + revolve_cost(n - m, slots - 1) + revolve_cost(m, slots) for m in range(1, n))


def optimal_frontier(n: int, max_slots: int) -> list[tuple[int, float]]:
    """(slots, recomputed steps per restored state) on the offline optimum for n steps."""
    n, max_slots = as_int("n", n, low=1), as_int("max_slots", max_slots, low=0)
    return [(s, revolve_cost(n, s) / n) for s in range(0, max_slots + 1)]


def interval_tradeoff(n: int, interval: int) -> dict:
    """States kept and forward steps per restored state when every state of an n-step chain is
    visited in reverse with a checkpoint every ``interval`` steps, counted as ``revolve_cost``
    counts (the sweep that places the checkpoints included), so the two compare directly."""
    n, interval = as_int("n", n, low=1), as_int("interval", interval, low=1)
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


def decode_token_bytes(
    shape: HybridShape,
    strategy,
    *,
    batch=1,
    context_len=4096,
    log_length=16,
    interval=16,
    weight_bytes=0,
    kv_bytes=2,
    state_bytes=4,
    act_bytes=2,
) -> dict:
    """Bytes one plain decode step moves per sequence (per output token), by component: the
    weights (read once per step, shared by the ``batch`` sequences: weight_bytes / batch), the
    KV read (``context_len`` rows) and written (one row), the recurrent state read and written,
    the conv windows (read + write), the replay log read and written, and recompute's
    checkpoint copies.

    snapshot: read + write the state. recompute: the same, plus a copy of state and window
    every ``interval`` tokens. replay: read the checkpoint, read on average L/2 log entries and
    append one; a fold every L tokens reads and writes the state and reads L entries, so per
    token S/L more read, S/L written and one entry read."""
    as_real("log_length", log_length, low=1)  # batch, context_len and the sizes: Workload's
    as_real("interval", interval, low=1)
    as_real("weight_bytes", weight_bytes, low=0)
    as_real("kv_bytes", kv_bytes, above=0, unit=" (bytes per element)")
    w = Workload(batch=batch, context_len=context_len, state_bytes=state_bytes, act_bytes=act_bytes)
    m = model_costs(shape, w, 0)
    out = dict(
        weights=weight_bytes / batch,
        kv_read=shape.kv_elems_per_token * context_len * kv_bytes,
        kv_write=shape.kv_elems_per_token * kv_bytes,
        state_read=m.S,
        state_write=m.S,
        conv=2 * m.W,
        log_read=0.0,
        log_write=0.0,
        checkpoint=0.0,
    )
    if strategy == "recompute":
        out["checkpoint"] = 2 * (m.S + m.W) / interval
    elif strategy == "replay":
        L = log_length
        out.update(
            state_read=m.S + m.S / L,
            state_write=m.S / L,
            log_read=(L / 2) * m.log_token + m.log_token,
            log_write=m.log_token,
        )
    elif strategy != "snapshot":
        raise ValueError(f"strategy: the cost model knows {STRATEGIES}, got {strategy!r}")
    return out


def decode_floor_seconds(shape, strategy, batch, bandwidth, **kw) -> float:
    """The memory-bound floor of one decode step (= time per output token of each sequence):
    ``batch`` x ``decode_token_bytes`` over ``bandwidth``."""
    return batch * sum(decode_token_bytes(shape, strategy, batch=batch, **kw).values()) / bandwidth


def decode_step_bytes(cfg, strategy, batch, context, log_length, weights_bytes, esize=2) -> int:
    """Bytes one plain decode step must move for ``batch`` sequences of a ``HybridConfig``
    model at ``context`` tokens: ``decode_token_bytes`` of its shape times the batch (the
    weights once, then per sequence, per Mamba-2 layer its state traffic (snapshot: read +
    write the fp32 state; replay: read the checkpoint and on average L/2 log entries, append
    one entry, and a fold every L tokens: 2 states + L entries over L) and conv window, per
    attention layer its keys and values read and one row written). The roofline time of a step
    is this over the device-copy bandwidth."""
    if strategy not in ("snapshot", "replay"):
        raise ValueError(f"strategy: expected 'snapshot' or 'replay', got {strategy!r}")
    parts = decode_token_bytes(
        shape_from_config(cfg),
        strategy,
        batch=batch,
        context_len=context,
        log_length=log_length,
        weight_bytes=weights_bytes,
        kv_bytes=esize,
        act_bytes=esize,
    )
    return int(round(batch * sum(parts.values())))


# --- the seed article's caveats, as numbers ----------------------------------------------------


def pattern_shape(pattern: str, base: HybridShape, repeat: int = 1) -> HybridShape:
    """``base``'s layer dimensions with its layer counts taken from a ``HybridConfig``-style
    pattern ("M": a Mamba-2 layer, "*": attention, "-": MLP) repeated ``repeat`` times."""
    from dataclasses import replace

    return replace(
        base,
        name=f"{base.name} as {pattern}" + (f" x{repeat}" if repeat > 1 else ""),
        n_attn=pattern.count("*") * repeat,
        n_ssm=pattern.count("M") * repeat,
    )


def attention_share(shape: HybridShape) -> float:
    """Attention layers / (attention + recurrent layers)."""
    if shape.n_attn + shape.n_ssm <= 0:
        raise ValueError(
            f"shape: {shape.name!r} has no layers (n_attn {shape.n_attn}, n_ssm {shape.n_ssm})"
        )
    return shape.n_attn / (shape.n_attn + shape.n_ssm)


def speculative_held(m: ModelCosts, strategy, *, k, log_length, context_len) -> float:
    """Bytes one sequence holds at its peak while speculating (KV at ``context_len`` tokens,
    plus ``bytes_held`` at the peak: snapshot keeps k + 2 copies, replay max(L-1, k+1) log
    entries) -- what ``HybridCache`` allocates."""
    if strategy == "snapshot":
        ssm = bytes_held(m, "snapshot", copies=k + 2)
    elif strategy == "replay":
        ssm = bytes_held(m, "replay", log_entries=max(log_length - 1, k + 1))
    else:
        raise ValueError(f"strategy: expected 'snapshot' or 'replay', got {strategy!r}")
    return m.kv_token * context_len + sum(ssm.values())


def gain_vs_attention(
    patterns,
    base: HybridShape,
    n_params,
    *,
    repeat=1,
    context_len=8192,
    batch=32,
    k=4,
    acceptance=0.8,
    log_length=16,
    hardware=None,
    state_bytes=4,
    act_bytes=2,
) -> list[dict]:
    """The first caveat: replay's gain over per-draft snapshots against the share of attention
    layers, one row per pattern: attention share, sequences that fit (snapshot held / replay
    held while speculating) and the predicted speculative decode speedup (snapshot seconds
    per token / replay's), both from this cost model."""
    hardware = hardware or HARDWARE["H200"]
    rows = []
    for pattern in patterns:
        shape = pattern_shape(pattern, base, repeat)
        w = Workload(
            batch=batch,
            k=k,
            acceptance=acceptance,
            interval=log_length,
            context_len=context_len,
            state_bytes=state_bytes,
            act_bytes=act_bytes,
        )
        m = model_costs(shape, w, n_params)
        held = {
            s: speculative_held(m, s, k=k, log_length=log_length, context_len=context_len)
            for s in ("snapshot", "replay")
        }
        out = predict(shape, w, hardware, n_params)
        rows.append(
            dict(
                pattern=pattern,
                attention_share=attention_share(shape),
                held_snapshot=held["snapshot"],
                held_replay=held["replay"],
                memory_gain=held["snapshot"] / held["replay"],
                speed_gain=out["snapshot"]["seconds_per_token"]
                / out["replay"]["seconds_per_token"],
            )
        )
    return rows


def held_crossover_interval(m: ModelCosts, checkpoints_kept=2) -> float:
    """The log length L above which replay holds more than recompute: replay holds up to L - 1
    log entries, recompute about ``checkpoints_kept`` copies of state and window, so the two
    are equal at L = checkpoints_kept * (S + W) / log_token + 1."""
    return checkpoints_kept * (m.S + m.W) / m.log_token + 1


def replay_vs_ssu(batch, L, *, H, P, N, G, bandwidth, floors_us=None, esize=2) -> dict:
    """The second caveat, one decode token of one Mamba-2 layer for ``batch`` sequences:
    replay's amortised time (``replay_step`` over a log of L entries + ``fold`` of L entries
    / L) against mamba-ssm's ``selective_state_update`` (read + write the state), each kernel
    ``kernel_bytes`` over ``bandwidth``. ``floors_us``: optional per-kernel latency floors
    {"replay_step", "fold", "ssu": µs} -- a kernel then takes max(floor, bytes / bandwidth).
    Returns µs of each and ``speedup`` = ssu / replay (> 1: replay pays)."""
    for name, value in (("batch", batch), ("L", L), ("H", H), ("P", P), ("N", N), ("G", G)):
        as_int(name, value, low=1)
    as_real("bandwidth", bandwidth, above=0, unit=" (bytes/s)")
    floors = floors_us or {}

    def us(provider, **kw):
        t = (
            kernel_bytes(
                provider, batch, kw.get("L", L), kw.get("T", 1), H=H, P=P, N=N, G=G, esize=esize
            )
            / bandwidth
            * 1e6
        )
        return max(t, floors.get(provider, 0.0))

    step, fold, ssu = us("replay_step"), us("fold", T=0), us("ssu")
    replay = step + fold / L
    return dict(
        batch=batch,
        L=L,
        replay_us=replay,
        step_us=step,
        fold_us=fold,
        ssu_us=ssu,
        speedup=ssu / replay,
    )


def replay_bytes_frontier(*, H, P, N, G, esize=2) -> float:
    """The log length at which replay's amortised bytes (step + fold / L) equal
    selective_state_update's, for any batch (both scale with it): the root of
    (L + 3) t + 2 s / L = s + t with s the state's bytes and t one token's inputs."""
    s = H * P * N * 4
    t = (H * P + H + 2 * G * N) * esize
    # L t + 3 t + 2 s / L - s - t = 0  ->  t L^2 + (2 t - s) L + 2 s = 0
    b, c = 2 * t - s, 2 * s
    disc = b * b - 4 * t * c
    return (-b + math.sqrt(disc)) / (2 * t)


def measured_replay_vs_ssu(bench) -> list[dict]:
    """From a kernel benchmark (``data/bench_kernels.json``): per (batch, L) measured at T=1,
    replay's amortised µs (replay_step + fold(L) / L) and selective_state_update's, and
    their ratio ``speedup``."""
    rows = [r for r in bench["rows"] if "us" in r]

    def find(**kw):
        return next((r for r in rows if all(r.get(a) == v for a, v in kw.items())), None)

    out = []
    for r in rows:
        if r["provider"] != "replay_step" or r["T"] != 1:
            continue
        fold = find(provider="fold", batch=r["batch"], log_len=r["log_len"])
        ssu = find(provider="ssu", batch=r["batch"], T=1)
        if fold is None or ssu is None:
            continue
        replay = r["us"] + fold["us"] / r["log_len"]
        out.append(
            dict(
                batch=r["batch"],
                L=r["log_len"],
                replay_us=replay,
                ssu_us=ssu["us"],
                speedup=ssu["us"] / replay,
            )
        )
    return sorted(out, key=lambda r: (r["batch"], r["L"]))


def mamba1_replay_vs_ssu(batch, L, *, D, N, bandwidth, update_rate, esize=2) -> dict:
    """One decode token of one Mamba-1 layer (D channels, d_state N) for ``batch`` sequences:
    replay's amortised time (``replay_step`` over the mean log of (L - 1) / 2 entries, plus a
    ``fold`` of L entries every L tokens) against ``selective_state_update`` (read and write the
    state), each kernel max(its bytes / ``bandwidth``, its state-element updates /
    ``update_rate``).

    Mamba-1's decay exp(Δ_t[d] A[d, n]) differs per state element, so a replay step cannot
    skip the state: it updates every element once per log entry and once for the new token
    (Mamba-2's scalar decay per head folds the log into a few dot products instead). The
    updates per element per token are (L - 1) / 2 + 1 for the step and 1 for the fold, against
    selective_state_update's 1. ``update_rate``: element updates per second the kernel
    sustains (``measured_update_rate``). Returns µs of each, ``speedup`` = ssu / replay (> 1:
    replay pays) and ``replay_binds`` ("bytes" or "updates")."""
    for name, value in (("batch", batch), ("L", L), ("D", D), ("N", N)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    for name, value in (("bandwidth", bandwidth), ("update_rate", update_rate)):
        if not value > 0:
            raise ValueError(f"{name}: expected a rate > 0, got {value!r}")
    state = batch * D * N * 4
    token = batch * (2 * D + N) * esize  # x, dt, B of one token (C read only for the new one)
    new = batch * (3 * D + 2 * N) * esize  # x, dt, B, C in, y out (no gate z: applied outside)
    elements = batch * D * N
    mean_log = (L - 1) / 2

    def us(nbytes, updates):
        return max(nbytes / bandwidth, updates / update_rate) * 1e6

    step_bytes, step_updates = state + mean_log * token + new, (mean_log + 1) * elements
    fold_bytes_, fold_updates = 2 * state + L * token, L * elements
    step, fold = us(step_bytes, step_updates), us(fold_bytes_, fold_updates)
    ssu = us(2 * state + new, elements)
    binds = "updates" if step_updates / update_rate > step_bytes / bandwidth else "bytes"
    replay = step + fold / L
    return dict(batch=batch, L=L, N=N, replay_us=replay, step_us=step, fold_us=fold, ssu_us=ssu,
                speedup=ssu / replay, replay_binds=binds)  # fmt: skip


def mamba1_break_even(bandwidth, update_rate) -> float:
    """The log length below which Mamba-1 replay could match ``selective_state_update``
    when both run at their bound (state bytes large next to the inputs): replay's
    (L + 3) / 2 updates per element per token against the 8 bytes per element the snapshot
    step moves, (L + 3) / 2 / update_rate = 8 / bandwidth. d_state cancels: both sides scale
    with D x N. Below 1 no log length pays. Assumes the snapshot step is bound by its bytes
    (update_rate > bandwidth / 8 bytes: one update per element is cheaper than moving it);
    ``update_rate`` is the replay kernel's, so a faster kernel moves the break-even up."""
    if not bandwidth > 0 or not update_rate > 0:
        raise ValueError(
            f"rates: expected > 0, got bandwidth {bandwidth!r}, update_rate {update_rate!r}"
        )
    return 16 * update_rate / bandwidth - 3


def measured_update_rate(bench) -> float:
    """Element updates per second the Mamba-1 replay step sustains in a kernel benchmark
    (``data/bench_mamba1_kernels.json``): at its largest batch and longest log, where the
    updates bind, ``exps_per_token`` x batch / the step's time."""
    row = max(bench["batches"], key=lambda r: r["batch"])
    longest = max(row["L"], key=int)
    step = row["L"][longest]["step"]
    return step["exps_per_token"] * row["batch"] / (step["us"] * 1e-6)


WORKLOADS = ("best-of-n", "beam search", "speculative")


def log_length_cost(m: ModelCosts, workload, L, *, k=4, acceptance=0.8) -> float:
    """The third caveat: replay's state-side bytes per generated token per sequence at log
    length L, for one workload. Every step reads the checkpoint and on average L/2 entries and
    appends what it adds; a fold of L entries (``fold_bytes``) is paid every L kept tokens.

    * best-of-n: samples fork once and never reorder: S + (L/2 + 1) e + fold / L.
    * beam search: every step reorders the beams, and a beam takes its parent's log: on
      average L/2 entries copied (read + write), L e more a step.
    * speculative: the checkpoint and the log are read once a round for 1 + E[a] kept tokens,
      k + 1 entries appended a round: (S + (L/2 + k + 1) e) / (1 + E[a]) + fold / L.
    """
    L = as_int("L", L, low=1)
    e, fold = m.log_token, fold_bytes(m, L) / L
    if workload == "best-of-n":
        return m.S + (L / 2 + 1) * e + fold
    if workload == "beam search":
        return m.S + (L / 2 + 1) * e + L * e + fold
    if workload == "speculative":
        tpr = expected_accepted(k, acceptance) + 1
        return (m.S + (L / 2 + k + 1) * e) / tpr + fold
    raise ValueError(f"workload: expected one of {WORKLOADS}, got {workload!r}")


def best_log_length(m: ModelCosts, workload, lengths=range(1, 257), **kw) -> int:
    """The log length in ``lengths`` with the fewest bytes per token (``log_length_cost``)."""
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths: expected at least one log length to choose from, got none")
    return min(lengths, key=lambda L: log_length_cost(m, workload, L, **kw))
