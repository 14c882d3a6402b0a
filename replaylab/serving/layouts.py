"""What the serving engine serves: the layer kinds and options of the reference path
(``unsupported_reason``), the layouts of the fused path (``fused_reason``), its strategies
(``serving.strategies``), and which path an engine takes on a device (``paths``).

The reference path serves every family the teaching cache does: Mamba-2 ("M": NemotronH,
Bamba), Mamba-1 ("S": Jamba) and Gated DeltaNet ("G": Qwen3-Next, Qwen3.5) layers, plain or
gated attention with or without RoPE, relu2 or SwiGLU MLPs. So does the fused path (Jamba's
Mamba-1 layers through the mixer's own math with row-invariant products, ``fused._mamba1``);
on a GPU it is the default for NemotronH layouts. The others opt in (``fused_by_default``):
Bamba's and the Gated DeltaNet layouts until timed against the reference path at every
batch, Jamba's because its speculation was slower there at batch 32 (data/README.md).
"""

from __future__ import annotations

__all__ = [
    "LAYER_KINDS", "unsupported_reason", "fused_reason", "fused_by_default", "fused_prefill", "paths",
    "default_strategy", "DEFAULT_SNAPSHOT_HINT",
]  # fmt: skip

LAYER_KINDS = {"M": "Mamba-2", "S": "Mamba-1", "G": "Gated DeltaNet", "*": "attention", "-": "MLP"}


def unsupported_reason(cfg, strategy=None):
    """Why the engine cannot serve a model of config ``cfg`` under ``strategy`` (a name; None:
    any) (None: it can)."""
    from replaylab.serving.strategies import REGISTRY

    if strategy is not None and strategy not in REGISTRY:
        return f"strategy {strategy!r} is not one of the engine's {tuple(REGISTRY)}"
    unknown = sorted(set(cfg.pattern) - set(LAYER_KINDS))
    if unknown:
        return (
            f"pattern: layer kinds {unknown} in {cfg.pattern!r} (the engine serves {LAYER_KINDS})"
        )
    if cfg.attention not in ("plain", "gated"):
        return f"attention: {cfg.attention!r} (the engine serves 'plain' and 'gated')"
    if cfg.mlp not in ("relu2", "swiglu"):
        return f"mlp: {cfg.mlp!r} (the engine serves 'relu2' and 'swiglu')"
    return None


def fused_reason(cfg):
    """What the fused path (GPU kernels, CUDA graphs) lacks for a model of config ``cfg``
    (None: nothing)."""
    missing = [f"layer kind {k!r}" for k in sorted(set(cfg.pattern) - set(LAYER_KINDS))]
    if cfg.attention not in ("plain", "gated"):
        missing.append(f"{cfg.attention} attention (attention={cfg.attention!r})")
    if cfg.mlp not in ("relu2", "swiglu"):
        missing.append(f"{cfg.mlp} MLPs (mlp={cfg.mlp!r})")
    return ", ".join(missing) or None


def default_strategy(cfg, use_kernels=True):
    """The engine's strategy when none is named: "snapshot" for layouts whose recurrent layers
    are all Mamba-1 (Jamba's) when the engine runs its kernels (``use_kernels``, the default on
    a GPU, and Mamba-1's step kernel, ``step_kernels`` not False), "replay" otherwise.
    Mamba-1's decay differs for every state element, so replaying a logged token costs an
    update of the whole state, as a snapshot step does, and saves only the state's write: at
    Jamba's shape the snapshot step (``kernels.mamba1.state_update``) decodes faster
    (``costmodel.mamba1_break_even``: no log length pays; the engine's rows in
    data/README.md). Without the kernels that was never timed, so replay stays. Replay keeps
    the smaller pools."""
    mamba1_only = set(cfg.pattern) & set("MSG") == {"S"}
    return "snapshot" if mamba1_only and use_kernels else "replay"


# appended to the errors of what only replay serves, when the engine chose snapshot itself
DEFAULT_SNAPSHOT_HINT = (
    " (snapshot: the engine's default for Mamba-1 layouts with the kernels, when no strategy "
    "is named)"
)


def fused_by_default(cfg):
    """Whether a GPU engine takes the fused path unasked: NemotronH layouts (Mamba-2, plain
    attention without RoPE, relu2 MLPs), the ones it is timed on; Bamba's, Jamba's,
    Qwen3-Next's and Qwen3.5's pass ``fused=True``."""
    nemotron_h = set(cfg.pattern) <= set("M*-") and cfg.attention == "plain"
    return fused_reason(cfg) is None and nemotron_h and not cfg.rotary_dim and cfg.mlp == "relu2"


def fused_prefill(cfg):
    """Whether the fused path's prompt chunks run its kernels (``prefill._chunk_fused``):
    NemotronH and Bamba layouts; the others prefill as the reference path does."""
    return set(cfg.pattern) <= set("M*-") and cfg.attention == "plain"


def paths(kind, cfg, device, use_kernels, graphs, fused, matmul):
    """(use_kernels, graphs, fused, matmul) of an engine under strategy class ``kind`` for a
    model of config ``cfg`` on ``device``, the defaults filled in (see ``DecodeEngine``);
    ValueError for a combination that cannot run."""
    lacks = fused_reason(cfg)
    cuda = device.type == "cuda"
    use_kernels = cuda if use_kernels is None else use_kernels
    graphable = kind.graphable(use_kernels)  # else host reads every step
    graphs = (cuda and graphable) if graphs is None else graphs
    fused = (cuda and use_kernels and fused_by_default(cfg)) if fused is None else fused
    if fused and lacks:
        raise ValueError(
            "fused: the fused kernels serve NemotronH, Bamba, Jamba, Qwen3-Next and Qwen3.5 "
            f"layouts and lack {lacks}; use fused=False (the reference path serves this model)"
        )
    if graphs and not cuda:
        raise ValueError("graphs: CUDA graphs need a CUDA device")
    if graphs and not graphable:
        raise ValueError(
            "graphs: replay without kernels reads each slot's log length on the host "
            "every step, which a CUDA graph cannot; use use_kernels=True or graphs=False"
        )
    if fused and not use_kernels:
        raise ValueError("fused: the fused path runs the replay kernels; use_kernels=True")
    if matmul is None:
        matmul = "row_invariant" if fused or (cuda and use_kernels) else "torch"
    if matmul not in ("torch", "row_invariant"):
        raise ValueError(f"matmul: expected 'torch' or 'row_invariant', got {matmul!r}")
    return use_kernels, graphs, fused, matmul
