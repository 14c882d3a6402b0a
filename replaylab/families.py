"""Recurrent layer families side by side at published shapes: what one layer's state costs, what
one token's replay-log entry costs, what a decode step moves under the current-state and
replay strategies, and (measured live on this machine) a fold against a snapshot copy.

Glossary (code name -> meaning, shape per sequence and layer):
    family        "mamba2" (Nemotron-H), "mamba1" (Jamba), "gdn" (Qwen3-Next, Qwen3.5)
    state         Mamba-2 (H, P, N); Mamba-1 (D, N); Gated DeltaNet (H, K, V): fp32
    conv_dim      channels through the causal conv (the raw inputs a log keeps)
    entry         one token's replay-log entry, field -> bytes; activations in bf16 (2 bytes),
                  the Gated DeltaNet log decay g in fp32 (4 bytes), as ``replaylab``'s specs log them
    read fields   what an output from checkpoint + log reads of each past token: Mamba-2 x,
                  dt, B; Mamba-1 x, dt, B; Gated DeltaNet k, v, g, β
    L             the log length: a fold into a new checkpoint every L tokens

Decode bytes per token and layer (one sequence), the log holding j = 0 .. L-1 entries:
    current state  read S + write S                                      = 2 S
    replay         read S (checkpoint) + read j entries' read fields + write one entry,
                   plus a fold every L tokens (read S + L entries, write S): amortised over
                   the cycle, S + (L-1)/2 r + e + (2 S + L f) / L
The state is never written by a replay step; the log reads grow with L, so replay pays only
between a lower L (the fold's write amortised) and an upper L (the log reads catch up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

__all__ = [
    "FamilyShape",
    "FAMILY_SHAPES",
    "state_bytes",
    "entry_bytes",
    "minimal_entry_bytes",
    "decode_bytes",
    "replay_pays",
    "byte_table",
    "time_fold_vs_copy",
    "time_backward_recursion",
]

ACT, F32 = 2, 4  # bytes of a bf16 activation, of an fp32 value


@dataclass(frozen=True)
class FamilyShape:
    """One published model's recurrent layer shape. Mamba-2 uses H, P, N, G; Mamba-1 D, N, R
    (dt rank); Gated DeltaNet Hk, H, K, V. ``layers``: its number of recurrent layers."""

    name: str
    family: str
    layers: int
    d_conv: int = 4
    H: int = 0
    P: int = 0
    N: int = 0
    G: int = 0
    D: int = 0
    R: int = 0
    Hk: int = 0
    K: int = 0
    V: int = 0
    source: str = ""

    @property
    def state_elems(self) -> int:
        return {
            "mamba2": self.H * self.P * self.N,
            "mamba1": self.D * self.N,
            "gdn": self.H * self.K * self.V,
        }[self.family]

    @property
    def conv_dim(self) -> int:
        return {
            "mamba2": self.H * self.P + 2 * self.G * self.N,
            "mamba1": self.D,
            "gdn": 2 * self.Hk * self.K + self.H * self.V,
        }[self.family]


FAMILY_SHAPES = {
    s.name: s
    for s in [
        FamilyShape(
            "Nemotron-H 8B",
            "mamba2",
            layers=24,
            H=128,
            P=64,
            N=128,
            G=8,
            source="nvidia/Nemotron-H-8B-Base-8K config (replaylab.shapes.PUBLISHED_SHAPES)",
        ),
        FamilyShape(
            "Jamba 1.5 Mini",
            "mamba1",
            layers=28,
            D=8192,
            N=16,
            R=256,
            source="ai21labs/AI21-Jamba-1.5-Mini config.json: hidden_size 4096, mamba_expand 2, "
            "mamba_d_state 16, mamba_d_conv 4, mamba_dt_rank 256, 32 layers with attention at "
            "attn_layer_period 8 / offset 4 (Jamba-v0.1's layout; transformers' JambaConfig "
            "defaults give the same)",
        ),
        FamilyShape(
            "Qwen3-Next-80B-A3B",
            "gdn",
            layers=36,
            Hk=16,
            H=32,
            K=128,
            V=128,
            source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json (transformers Qwen3NextConfig "
            "defaults): linear_num_key_heads 16, linear_num_value_heads 32, key / value head dim "
            "128, linear_conv_kernel_dim 4, 48 layers of which every 4th is full attention",
        ),
        FamilyShape(
            "Qwen3.5 (text defaults)",
            "gdn",
            layers=24,
            Hk=16,
            H=32,
            K=128,
            V=128,
            source="transformers 5.24 Qwen3_5TextConfig defaults (documented against "
            "Qwen/Qwen3.5-27B): linear_num_key_heads 16, linear_num_value_heads 32, head dims "
            "128, conv 4, 32 layers of which every 4th is full attention",
        ),
    ]
}


def state_bytes(shape: FamilyShape) -> int:
    """One layer's fp32 recurrent state for one sequence."""
    return shape.state_elems * F32


def entry_bytes(shape: FamilyShape) -> dict:
    """One token's replay-log entry as replaylab's spec logs it, field -> bytes."""
    if shape.family == "mamba2":
        return dict(
            xBC=shape.conv_dim * ACT,
            x=shape.H * shape.P * ACT,
            dt=shape.H * ACT,
            B=shape.G * shape.N * ACT,
            C=shape.G * shape.N * ACT,
        )
    if shape.family == "mamba1":
        return dict(
            x_in=shape.D * ACT,
            x=shape.D * ACT,
            dt=shape.D * ACT,
            B=shape.N * ACT,
            C=shape.N * ACT,
        )
    return dict(
        qkv=shape.conv_dim * ACT,
        q=shape.Hk * shape.K * ACT,
        k=shape.Hk * shape.K * ACT,
        v=shape.H * shape.V * ACT,
        g=shape.H * F32,
        beta=shape.H * ACT,
    )


READ_FIELDS = {
    "mamba2": ("x", "dt", "B"),
    "mamba1": ("x", "dt", "B"),
    "gdn": ("k", "v", "g", "beta"),
}


def minimal_entry_bytes(shape: FamilyShape) -> int:
    """The least a log entry could be: the raw conv inputs (everything after the conv follows
    from them) and the per-token projections that do not pass the conv (Mamba-2 dt; Mamba-1
    the rank-R dt; Gated DeltaNet a and b, one each per head)."""
    extra = {"mamba2": shape.H, "mamba1": shape.R, "gdn": 2 * shape.H}[shape.family]
    return (shape.conv_dim + extra) * ACT


def decode_bytes(shape: FamilyShape, L: int) -> dict:
    """Bytes one decode step moves per layer and sequence, amortised over a log cycle of L:
    ``current`` (read and write the state) and ``replay`` (see the module docstring)."""
    if L < 1:
        raise ValueError(f"L: expected a log length >= 1, got {L}")
    S, e = state_bytes(shape), entry_bytes(shape)
    read = sum(e[f] for f in READ_FIELDS[shape.family])
    full = sum(e.values())
    replay = S + (L - 1) / 2 * read + full + (2 * S + L * read) / L
    return {"current": 2 * S, "replay": replay}


def replay_pays(shape: FamilyShape, max_L: int = 4096) -> tuple[int, int] | None:
    """The (smallest, largest) log length L at which a replay decode step moves fewer bytes
    than the current-state step, or None if none up to ``max_L`` does."""
    good = [
        L for L in range(1, max_L + 1) if (b := decode_bytes(shape, L))["replay"] < b["current"]
    ]
    return (good[0], good[-1]) if good else None


def byte_table(L: int = 16) -> list[dict]:
    """Per family shape: state bytes, log-entry bytes (as logged, and minimal), how many tokens
    of log cost one state, the bytes of a snapshot copy and of a fold of L tokens, the decode
    bytes at log length L and the range of L where replay pays. One row per ``FAMILY_SHAPES``
    entry."""
    rows = []
    for shape in FAMILY_SHAPES.values():
        S, e = state_bytes(shape), sum(entry_bytes(shape).values())
        b = decode_bytes(shape, L)
        read = sum(entry_bytes(shape)[f] for f in READ_FIELDS[shape.family])
        rows.append(
            dict(
                model=shape.name,
                family=shape.family,
                state_bytes=S,
                entry_bytes=e,
                minimal_entry_bytes=minimal_entry_bytes(shape),
                state_per_entry=S / e,
                copy_bytes=2 * S,  # a snapshot: read and write the state
                fold_bytes=2 * S + L * read,  # read state and L entries, write the state
                current_step_bytes=b["current"],
                replay_step_bytes=round(b["replay"]),
                replay_pays_for_L=replay_pays(shape),
            )
        )
    return rows


def _random_log(shape: FamilyShape, L: int, generator):
    """A random layer state (1, *state) fp32 and L log entries at ``shape`` (fp32 values)."""
    r = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    if shape.family == "mamba2":
        state = r(1, shape.H, shape.P, shape.N)
        log = dict(
            x=r(1, L, shape.H, shape.P),
            dt=r(1, L, shape.H) - 2,
            B=r(1, L, shape.G, shape.N),
            C=r(1, L, shape.G, shape.N),
        )
        return state, log
    if shape.family == "mamba1":
        state = r(1, shape.D, shape.N)
        log = dict(x=r(1, L, shape.D), dt=r(1, L, shape.D) - 2, B=r(1, L, shape.N))
        return state, log
    state = r(1, shape.H, shape.K, shape.V)
    unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731
    log = dict(
        q=unit(r(1, L, shape.Hk, shape.K)) * shape.K**-0.5,
        k=unit(r(1, L, shape.Hk, shape.K)),
        v=r(1, L, shape.H, shape.V),
        g=-torch.rand(1, L, shape.H, generator=generator),
        beta=torch.rand(1, L, shape.H, generator=generator),
    )
    return state, log


def _fold_fn(shape: FamilyShape):
    from replaylab.scan import gdn_chunked_scan, s6_fold, ssd_scan

    if shape.family == "mamba2":
        A = -torch.linspace(1, 8, shape.H)
        return lambda s, log: (
            ssd_scan(
                log["x"], log["dt"], A, log["B"], log["B"], dt_softplus=True, initial_state=s
            ).state
        )
    if shape.family == "mamba1":
        A = -torch.linspace(1, 8, shape.N).expand(shape.D, -1)
        return lambda s, log: s6_fold(s, log["x"], log["dt"], A, log["B"], dt_softplus=True)
    return lambda s, log: (
        gdn_chunked_scan(None, log["k"], log["v"], log["g"], log["beta"], initial_state=s).state
    )


def _median_seconds(repeats, fn, *args):
    """Median wall time of ``fn(*args)`` over ``repeats`` runs after one warm-up run."""
    fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def time_fold_vs_copy(L: int = 16, repeats: int = 5, seed: int = 0) -> list[dict]:
    """Measured here (CPU, reference PyTorch code): folding L logged tokens into one layer's
    state at each family's published shape, against copying that state (a snapshot).
    Returns rows {model, family, fold_s, copy_s, fold_per_copy}."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for shape in FAMILY_SHAPES.values():
        state, log = _random_log(shape, L, g)
        fold = _fold_fn(shape)
        with torch.no_grad():
            fold_s = _median_seconds(repeats, fold, state, log)
            copy_s = _median_seconds(repeats, torch.clone, state)
        rows.append(
            dict(
                model=shape.name,
                family=shape.family,
                fold_s=fold_s,
                copy_s=copy_s,
                fold_per_copy=fold_s / copy_s,
            )
        )
    return rows


def time_backward_recursion(
    shape_name: str = "Qwen3-Next-80B-A3B", lengths=(1, 4, 16, 64, 256), repeats=5, seed=0
) -> list[dict]:
    """Measured here: one Gated DeltaNet output from checkpoint + a log of L tokens by the
    backward query recursion (no state written), against one current-state step (read,
    update and write the state: ``gdn_step``), at a published layer shape.
    Returns rows {L, backward_s, step_s, backward_per_step}."""
    from replaylab.scan import gdn_replay_outputs, gdn_step

    shape = FAMILY_SHAPES[shape_name]
    if shape.family != "gdn":
        raise ValueError(f"shape_name: expected a Gated DeltaNet shape, got {shape_name!r}")
    g = torch.Generator().manual_seed(seed)
    rows = []
    with torch.no_grad():
        for L in lengths:
            state, log = _random_log(shape, L + 1, g)
            past = {f: t[:, :L] for f, t in log.items() if f != "q"}
            new = {f: t[:, L:] for f, t in log.items()}
            step_args = [new[f][:, 0] for f in ("q", "k", "v", "g", "beta")]
            backward_s = _median_seconds(repeats, gdn_replay_outputs, state, past, new)
            step_s = _median_seconds(repeats, gdn_step, state, *step_args)
            rows.append(
                dict(
                    L=L, backward_s=backward_s, step_s=step_s, backward_per_step=backward_s / step_s
                )
            )
    return rows
