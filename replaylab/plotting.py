"""Plot helpers for the notebooks: one renderer set-up, one figure per concept."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from replaylab.results import load_bench
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence
from replaylab.strategies import STRATEGY_NAMES

__all__ = [
    "use_notebook_renderer",
    "memory_vs_context_figure",
    "load_bench",
    "kernel_time_vs_batch_figure",
    "kernel_bandwidth_figure",
    "fold_vs_copy_figure",
    "decode_throughput_figure",
    "branching_workloads_figure",
]

MIB = 2**20


def use_notebook_renderer():
    """Figures render in JupyterLab (mimetype). For HTML written by ``./run.sh notebooks``
    (``REPLAYLAB_OFFLINE_HTML=1``) plotly.js is embedded, so the pages work offline; the
    notebooks saved in the repository stay small (no embedded plotly.js)."""
    import os

    offline = os.environ.get("REPLAYLAB_OFFLINE_HTML") == "1"
    pio.renderers.default = "plotly_mimetype+notebook" if offline else "plotly_mimetype"


def memory_vs_context_figure(context_lens, shapes=None) -> go.Figure:
    """Per-sequence MiB of KV vs recurrent state (+conv) against context length, per model."""
    shapes = shapes or list(PUBLISHED_SHAPES.values())
    fig = go.Figure()
    for i, shape in enumerate(shapes):
        mems = [memory_per_sequence(shape, n) for n in context_lens]
        color = f"hsl({i * 360 // len(shapes)}, 60%, 45%)"
        fig.add_scatter(
            x=list(context_lens),
            y=[m["kv"] / MIB for m in mems],
            name=f"{shape.name}: KV",
            line=dict(color=color),
        )
        fig.add_scatter(
            x=list(context_lens),
            y=[(m["ssm_state"] + m["conv_state"]) / MIB for m in mems],
            name=f"{shape.name}: SSM + conv state",
            line=dict(color=color, dash="dash"),
        )
    fig.update_layout(
        xaxis_title="context length (tokens)",
        yaxis_title="MiB per sequence",
        xaxis_type="log",
        yaxis_type="log",
        height=450,
        title="KV grows with the context; the recurrent state does not",
    )
    return fig


PROVIDER_NAMES = {
    "replay_step": "replaylab replay_step",
    "ssu": "mamba-ssm selective_state_update",
    "chunk_scan": "mamba-ssm mamba_chunk_scan_combined",
    "fla_chunk": "fla chunk_simple_gla",
    "fla_recurrent": "fla fused_recurrent_simple_gla",
    "fold": "replaylab fold",
    "copy": "snapshot restore (device copy)",
}


def _rows(bench, **match):
    return [r for r in bench["rows"] if "us" in r and all(r[k] == v for k, v in match.items())]


def kernel_time_vs_batch_figure(bench, T=1, log_len=16) -> go.Figure:
    """Microseconds per call against batch, every provider, for one (T, log length)."""
    fig = go.Figure()
    for provider in ("replay_step", "ssu", "chunk_scan", "fla_chunk", "fla_recurrent"):
        rows = sorted(
            _rows(bench, provider=provider, T=T, log_len=log_len)
            or _rows(bench, provider=provider, T=T),
            key=lambda r: r["batch"],
        )
        if provider == "ssu":  # timed once per (batch, T): it does not read a log
            rows = sorted({r["batch"]: r for r in rows}.values(), key=lambda r: r["batch"])
        fig.add_scatter(
            x=[r["batch"] for r in rows],
            y=[r["us"] for r in rows],
            name=PROVIDER_NAMES[provider],
            mode="lines+markers",
        )
    what = "decode step" if T == 1 else f"verify {T} tokens"
    fig.update_layout(
        title=f"{what}, log length {log_len}: time per call ({bench['device']})",
        xaxis_title="batch",
        yaxis_title="µs (median, CUDA graphs)",
        xaxis_type="log",
        yaxis_type="log",
        height=420,
    )
    return fig


def kernel_bandwidth_figure(bench, T=1) -> go.Figure:
    """Fraction of the device-copy bandwidth on the bytes each provider must move."""
    fig = go.Figure()
    for L in sorted({r["log_len"] for r in _rows(bench, provider="replay_step", T=T)}):
        rows = sorted(
            _rows(bench, provider="replay_step", T=T, log_len=L), key=lambda r: r["batch"]
        )
        fig.add_scatter(
            x=[r["batch"] for r in rows],
            y=[r["frac_copy_bw"] for r in rows],
            name=f"replay_step, log {L}",
            mode="lines+markers",
        )
    rows = sorted(
        {r["batch"]: r for r in _rows(bench, provider="ssu", T=T)}.values(),
        key=lambda r: r["batch"],
    )
    fig.add_scatter(
        x=[r["batch"] for r in rows],
        y=[r["frac_copy_bw"] for r in rows],
        name="selective_state_update",
        mode="lines+markers",
        line=dict(dash="dash"),
    )
    fig.update_layout(
        title="achieved bandwidth / device-copy bandwidth",
        xaxis_type="log",
        xaxis_title="batch",
        yaxis_title="fraction",
        height=380,
    )
    return fig


def fold_vs_copy_figure(bench) -> go.Figure:
    """Fold (restore by replaying L logged tokens) against restoring a snapshot by copy."""
    fig = go.Figure()
    for L in sorted({r["log_len"] for r in _rows(bench, provider="fold")}):
        rows = sorted(_rows(bench, provider="fold", log_len=L), key=lambda r: r["batch"])
        fig.add_scatter(
            x=[r["batch"] for r in rows],
            y=[r["us"] for r in rows],
            name=f"fold {L} tokens",
            mode="lines+markers",
        )
    rows = sorted(
        {r["batch"]: r for r in _rows(bench, provider="copy")}.values(), key=lambda r: r["batch"]
    )
    fig.add_scatter(
        x=[r["batch"] for r in rows],
        y=[r["us"] for r in rows],
        name="snapshot copy",
        mode="lines+markers",
        line=dict(dash="dash", width=3),
    )
    fig.update_layout(
        title="restore: fold vs snapshot copy",
        xaxis_type="log",
        yaxis_type="log",
        xaxis_title="batch",
        yaxis_title="µs",
        height=380,
    )
    return fig


def decode_throughput_figure(bench) -> go.Figure:
    """Decode tokens/s against batch: each strategy and transformers' generate (same weights)."""
    fig = go.Figure()
    rows = [r for r in bench["rows"] if r["workload"] == "decode"]
    for provider, strategy in sorted({(r["provider"], r["strategy"]) for r in rows}):
        sel = sorted(
            (r for r in rows if (r["provider"], r["strategy"]) == (provider, strategy)),
            key=lambda r: r["batch"],
        )
        fig.add_scatter(
            x=[r["batch"] for r in sel],
            y=[r["batch"] / r["seconds_per_token"]["median"] for r in sel],
            name=f"{provider} {strategy}",
            mode="lines+markers",
            line=dict(dash="dash" if provider == "transformers" else "solid"),
        )
    fig.update_layout(
        title=f"decode throughput, {bench['preset']} ({bench['device']})",
        xaxis_title="batch",
        yaxis_title="tokens/s",
        xaxis_type="log",
        yaxis_type="log",
        height=400,
    )
    return fig


def branching_workloads_figure(bench) -> go.Figure:
    """Tokens/s of one sequence per workload (speculative, beam, best-of-n) and strategy."""
    fig = go.Figure()
    rows = [r for r in bench["rows"] if r["batch"] == 1 and r["workload"] != "decode"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    for strategy in STRATEGY_NAMES:
        by = {r["workload"]: r for r in rows if r["strategy"] == strategy}
        fig.add_bar(
            x=workloads,
            y=[1 / by[w]["seconds_per_token"]["median"] if w in by else None for w in workloads],
            name=strategy,
        )
    fig.update_layout(
        title="one sequence: tokens/s per workload",
        barmode="group",
        yaxis_title="tokens/s",
        height=400,
    )
    return fig
