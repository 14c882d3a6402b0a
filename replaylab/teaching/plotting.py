"""Plot helpers for the notebooks: one renderer set-up, one figure per concept."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer as _MimetypeRenderer

from replaylab.results import load_bench
from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence
from replaylab.strategies import STRATEGY_NAMES

__all__ = [
    "use_notebook_renderer",
    "show",
    "static_image",
    "StaticImageRenderer",
    "memory_vs_context_figure",
    "load_bench",
    "kernel_time_vs_batch_figure",
    "kernel_bandwidth_figure",
    "fold_vs_copy_figure",
    "decode_throughput_figure",
    "branching_workloads_figure",
    "attention_gain_figure",
    "replay_frontier_figure",
    "log_length_per_workload_figure",
    "roofline_bytes_figure",
    "best_launch",
    "kernel_sweep_figure",
    "engine_decode_figure",
]

MIB = 2**20


STATIC_FORMAT = "image/svg+xml"  # the static copy saved beside each figure's plotly JSON
_STATIC = {"warned": False}


def static_image(fig, width=None, height=None) -> str | None:
    """The figure as an SVG string, drawn by plotly's static export (``kaleido``, which drives
    a local Chrome or Chromium), or ``None`` when that exporter is missing or fails: a warning
    is issued once, and the figure still shows as plotly JSON. ``REPLAYLAB_STATIC_FIGURES=0``
    switches the export off (the test suite does: the saved notebooks already carry the images,
    and ``tests/test_static_figures.py`` checks them)."""
    import os
    import warnings

    if os.environ.get("REPLAYLAB_STATIC_FIGURES") == "0":
        return None
    layout = (fig.get("layout", {}) if isinstance(fig, dict) else fig.layout.to_plotly_json()) or {}
    try:
        _start_browser()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            svg = pio.to_image(
                fig,
                format="svg",
                width=width or layout.get("width") or 900,
                height=height or layout.get("height") or 450,
                validate=False,
            )
    except Exception as err:  # no kaleido, no browser, a browser that fails to start
        if not _STATIC["warned"]:
            _STATIC["warned"] = True
            warnings.warn(
                f"figures are shown without a static image ({type(err).__name__}: {err}); "
                "install kaleido and Chrome/Chromium to save one with the notebook",
                stacklevel=2,
            )
        return None
    return svg.decode("utf-8") if isinstance(svg, bytes) else svg


def _start_browser():
    """One browser for every figure of this process (kaleido's sync server), not one per figure:
    a Chromium start costs seconds, an export after it a fraction of one."""
    if _STATIC.get("server"):
        return
    import atexit

    import kaleido

    if hasattr(kaleido, "start_sync_server"):  # kaleido >= 1.1
        kaleido.start_sync_server(silence_warnings=True)
        atexit.register(kaleido.stop_sync_server, silence_warnings=True)
    _STATIC["server"] = True


class StaticImageRenderer(_MimetypeRenderer):
    """A plotly renderer that adds the static SVG to the figure's MIME bundle (or nothing when
    ``static_image`` returns ``None``): combined with ``plotly_mimetype`` one output holds both,
    so JupyterLab shows the interactive figure and GitHub, nbviewer and HTML the image."""

    def to_mimebundle(self, fig_dict):
        svg = static_image(fig_dict)
        return {STATIC_FORMAT: svg} if svg else {}


pio.renderers["replaylab_static"] = StaticImageRenderer()


def use_notebook_renderer():
    """Figures render in JupyterLab (mimetype), each with a static SVG copy in the same output
    (``StaticImageRenderer``), so a saved notebook shows its figures where plotly.js does not
    run. For HTML written by ``./run.sh notebooks`` (``REPLAYLAB_OFFLINE_HTML=1``) plotly.js is
    embedded, so the pages work offline; the notebooks saved in the repository stay small (no
    embedded plotly.js)."""
    import os

    offline = os.environ.get("REPLAYLAB_OFFLINE_HTML") == "1"
    renderers = ["plotly_mimetype", "replaylab_static"] + (["notebook"] if offline else [])
    pio.renderers.default = "+".join(renderers)


def show(fig):
    """Display ``fig`` as one output holding the plotly JSON and its static SVG, whatever the
    default renderer is (``fig.show()`` does the same after ``use_notebook_renderer()``)."""
    from IPython.display import display

    bundle = {"text/plain": f"<{type(fig).__name__}: {fig.layout.title.text or 'untitled'}>"}
    bundle.update(pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()))
    bundle.update(pio.renderers["replaylab_static"].to_mimebundle(fig.to_dict()))
    display(bundle, raw=True)


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


# --- the seed article's caveats and the roofline (notebooks 08 and 09) -------------------------

STRATEGY_COLORS = {"snapshot": "#d62728", "recompute": "#1f77b4", "replay": "#2ca02c"}


def attention_gain_figure(predicted_rows, live_rows) -> go.Figure:
    """Replay's gain over per-draft snapshots against the share of attention layers. Left: the
    cost model on a published shape (``costmodel.gain_vs_attention`` rows): sequences that fit
    and speculative decode speed. Right: tiny models measured live on CPU
    (``experiments.gain_vs_attention_live`` rows): peak bytes held, measured beside predicted."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.12,
        subplot_titles=(
            "cost model, published shape (speculating, k=4)",
            "live on CPU: tiny models (peak bytes held)",
        ),
    )
    x = [r["attention_share"] for r in predicted_rows]
    labels = [r["pattern"] for r in predicted_rows]
    fig.add_scatter(
        x=x,
        y=[r["memory_gain"] for r in predicted_rows],
        text=labels,
        name="sequences that fit: snapshot held / replay held",
        mode="lines+markers",
        row=1,
        col=1,
    )
    fig.add_scatter(
        x=x,
        y=[r["speed_gain"] for r in predicted_rows],
        text=labels,
        name="decode speed: snapshot s/token / replay s/token",
        mode="lines+markers",
        line=dict(dash="dash"),
        row=1,
        col=1,
    )
    x = [r["attention_share"] for r in live_rows]
    fig.add_scatter(
        x=x,
        y=[r["gain_predicted"] for r in live_rows],
        name="tiny: predicted (cost model)",
        mode="lines",
        line=dict(color="gray"),
        row=1,
        col=2,
    )
    fig.add_scatter(
        x=x,
        y=[r["gain_measured"] for r in live_rows],
        text=[r["pattern"] for r in live_rows],
        textposition="top center",
        name="tiny: measured (HybridCache peak)",
        mode="markers+text",
        marker=dict(size=11, symbol="x", color="black"),
        row=1,
        col=2,
    )
    fig.update_xaxes(title_text="attention layers / all mixer layers", tickformat=".0%")
    fig.update_yaxes(title_text="replay's gain over snapshot (x)", row=1, col=1)
    fig.add_hline(y=1, line=dict(color="gray", dash="dot"))
    fig.update_layout(height=430, legend=dict(orientation="h", y=-0.25))
    return fig


def replay_frontier_figure(grid, measured, bytes_frontier=None, batch_ticks=None) -> go.Figure:
    """Where replay stops paying, over batch x log length. ``grid``: rows (batch, L, speedup)
    from the cost model (``costmodel.replay_vs_ssu``) drawn as a map with the frontier
    (speedup 1) as a thick line; ``measured``: rows from ``costmodel.measured_replay_vs_ssu``
    as labelled markers (filled: replay pays); ``bytes_frontier``: the L where bytes alone say
    replay stops paying (a dashed line)."""
    import math

    batches = sorted({r["batch"] for r in grid})
    lengths = sorted({r["L"] for r in grid})
    z = {(r["batch"], r["L"]): r["speedup"] for r in grid}
    lx, ly = [math.log2(b) for b in batches], [math.log2(L) for L in lengths]
    zz = [[z[(b, L)] for b in batches] for L in lengths]
    fig = go.Figure()
    fig.add_contour(
        x=lx,
        y=ly,
        z=zz,
        colorscale="RdYlGn",
        zmid=1,
        contours=dict(coloring="heatmap", showlines=False),
        line=dict(width=0),
        colorbar=dict(title="predicted<br>speedup"),
        name="cost model",
        hovertemplate="batch 2^%{x:.1f}, L 2^%{y:.1f}: %{z:.2f}x<extra></extra>",
    )
    fig.add_contour(
        x=lx,
        y=ly,
        z=zz,
        autocontour=False,
        contours=dict(start=1, end=1, size=1, coloring="lines", showlabels=False),
        colorscale=[[0, "black"], [1, "black"]],
        line=dict(width=3),
        showscale=False,
        name="predicted frontier (speedup 1)",
        showlegend=True,
        hoverinfo="skip",
    )
    if bytes_frontier is not None:
        fig.add_scatter(
            x=[lx[0], lx[-1]],
            y=[math.log2(bytes_frontier)] * 2,
            mode="lines",
            line=dict(dash="dash", color="black"),
            name=f"bytes alone: stops paying at L = {bytes_frontier:.0f}",
        )
    pays = [r for r in measured if r["speedup"] >= 1]
    loses = [r for r in measured if r["speedup"] < 1]
    for rows, name, symbol in (
        (pays, "measured H200: replay pays", "circle"),
        (loses, "measured H200: replay loses", "circle-open"),
    ):
        fig.add_scatter(
            x=[math.log2(r["batch"]) for r in rows],
            y=[math.log2(r["L"]) for r in rows],
            text=[f"{r['speedup']:.2f}" for r in rows],
            textposition="middle right",
            mode="markers+text",
            marker=dict(size=12, symbol=symbol, color="black", line=dict(width=2)),
            name=name,
        )
    ticks = batch_ticks or batches
    fig.update_layout(
        title="replay (step + fold(L)/L) vs selective_state_update: where replay stops paying",
        xaxis=dict(
            title="batch",
            tickvals=[math.log2(b) for b in ticks],
            ticktext=[str(b) for b in ticks],
        ),
        yaxis=dict(title="log length L", tickvals=ly, ticktext=[str(L) for L in lengths]),
        height=480,
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def log_length_per_workload_figure(curves, optima, relative=True) -> go.Figure:
    """Replay's bytes per generated token against log length, one curve per workload
    (``curves``: workload -> [(L, bytes)]), each optimum marked (``optima``: workload -> L).
    ``relative``: each curve divided by its own minimum, so the optima line up on one scale."""
    fig = go.Figure()
    for i, (workload, pts) in enumerate(curves.items()):
        color = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")[i % 4]
        scale = min(b for _, b in pts) if relative else MIB
        fig.add_scatter(
            x=[L for L, _ in pts],
            y=[b / scale for _, b in pts],
            name=workload,
            mode="lines",
            line=dict(color=color),
        )
        best = optima[workload]
        fig.add_scatter(
            x=[best],
            y=[dict(pts)[best] / scale],
            mode="markers+text",
            text=[f"L = {best}"],
            textposition="bottom center",
            marker=dict(size=13, color=color, symbol="star"),
            name=f"{workload}: best L = {best}",
        )
    fig.update_layout(
        title="the best log length differs per workload",
        xaxis=dict(title="log length L (replay)", type="log"),
        yaxis=dict(
            title="bytes per generated token / its workload's minimum"
            if relative
            else "state-side MiB moved per generated token, per sequence"
        ),
        height=430,
    )
    return fig


ROOFLINE_PARTS = {
    "weights": "weights (/ batch)",
    "kv_read": "KV read",
    "kv_write": "KV write",
    "state_read": "state read",
    "state_write": "state write",
    "conv": "conv window",
    "log_read": "log read",
    "log_write": "log write",
    "checkpoint": "checkpoint copies",
}


def roofline_bytes_figure(parts, title="bytes per decode token") -> go.Figure:
    """Stacked bars of the bytes one decode token moves per sequence, by component, one panel
    per batch (each with its own scale: at batch 1 the weights dwarf the rest).
    ``parts``: {(batch, strategy): ``costmodel.decode_token_bytes`` dict}."""
    from plotly.subplots import make_subplots

    batches = list(dict.fromkeys(b for b, _ in parts))
    fig = make_subplots(
        rows=1,
        cols=len(batches),
        subplot_titles=[f"batch {b}" for b in batches],
        horizontal_spacing=0.08,
    )
    colors = dict(
        zip(
            ROOFLINE_PARTS,
            (
                "#7f7f7f",
                "#1f77b4",
                "#aec7e8",
                "#d62728",
                "#ff9896",
                "#9467bd",
                "#2ca02c",
                "#98df8a",
                "#ff7f0e",
            ),
        )
    )
    for part, label in ROOFLINE_PARTS.items():
        if not any(p[part] for p in parts.values()):
            continue
        for col, b in enumerate(batches, start=1):
            keys = [key for key in parts if key[0] == b]
            fig.add_bar(
                x=[s for _, s in keys],
                y=[parts[key][part] / MIB for key in keys],
                name=label,
                legendgroup=part,
                showlegend=col == 1,
                marker_color=colors[part],
                row=1,
                col=col,
            )
    fig.update_layout(barmode="stack", title=title, height=450)
    fig.update_yaxes(title_text="MiB per token per sequence", row=1, col=1)
    return fig


# --- the engine and the kernel sweep (notebooks 06 and 09) --------------------------------------

SWEEP_KERNELS = {
    "replay_step T=1 L=16": ("replay_step (log of 16)", "#2ca02c"),
    "state_update T=1": ("our state_update (snapshot)", "#d62728"),
    "mamba-ssm selective_state_update T=1": ("mamba-ssm selective_state_update", "#9467bd"),
    "fold L=16": ("fold (16 entries)", "#ff7f0e"),
    "fold L=16 streaming": ("fold with streaming hints", "#ffbb78"),
    "torch copy of the state": ("torch copy of the state", "#7f7f7f"),
}


def best_launch(sweep) -> dict:
    """``{(kernel, batch): row}``, the fastest launch configuration (block_p, num_warps) of
    each kernel at each batch in a ``replaylab bench sweep`` result."""
    best = {}
    for r in sweep["rows"]:
        if "us" not in r:
            continue
        key = (r["kernel"], r["batch"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return best


def _log_range(values, pad=1.25):
    import math

    lo, hi = min(values) / pad, max(values) * pad
    return [math.log10(lo), math.log10(hi)]


def kernel_sweep_figure(sweep) -> go.Figure:
    """Left: µs per call against batch, best launch per kernel. Right: the same calls as a
    fraction of the device-copy bandwidth of the run. Both axes fixed to the data's range."""
    from plotly.subplots import make_subplots

    best = best_launch(sweep)
    batches = sorted({b for _, b in best})
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["time per call (best launch)", "fraction of the copy bandwidth"],
        horizontal_spacing=0.12,
    )
    for kernel, (label, color) in SWEEP_KERNELS.items():
        rows = [best[(kernel, b)] for b in batches if (kernel, b) in best]
        if not rows:
            continue
        for col, field in ((1, "us"), (2, "copy_fraction")):
            fig.add_scatter(
                x=[r["batch"] for r in rows],
                y=[r[field] for r in rows],
                name=label,
                legendgroup=kernel,
                showlegend=col == 1,
                mode="lines+markers",
                line=dict(color=color, dash="dash" if kernel.startswith("mamba") else "solid"),
                row=1,
                col=col,
            )
    us = [r["us"] for r in best.values()]
    fractions = [r["copy_fraction"] for r in best.values()]
    xrange = _log_range(batches, pad=1.5)
    fig.update_xaxes(type="log", title_text="batch", range=xrange, row=1, col=1)
    fig.update_xaxes(type="log", title_text="batch", range=xrange, row=1, col=2)
    fig.update_yaxes(type="log", title_text="µs", range=_log_range(us), row=1, col=1)
    fig.update_yaxes(
        title_text="bytes moved / time / copy bandwidth",
        range=[0, max(1.0, max(fractions)) * 1.1],
        row=1,
        col=2,
    )
    fig.update_layout(
        title=f"the engine's state kernels, best launch per batch ({sweep['device']})",
        height=420,
    )
    return fig


ENGINE_SERIES = {
    ("replay", None): ("engine replay", "#2ca02c", "solid"),
    ("snapshot", None): ("engine snapshot", "#d62728", "solid"),
    (None, "mamba-ssm generate(cg=True)"): ("mamba-ssm, CUDA graphs", "#9467bd", "dash"),
    (None, "transformers generate"): ("transformers generate", "#7f7f7f", "dot"),
}


def engine_decode_figure(engine) -> go.Figure:
    """``replaylab bench engine``: decode tokens/s (left) and fraction of the roofline (right)
    against batch, the fused engine's two strategies beside the providers of the same run."""
    from plotly.subplots import make_subplots

    rows = [
        r
        for r in engine["rows"]
        if "seconds_per_token" in r and "workload" not in r and r.get("fused", True)
    ]
    preset = rows[0]["preset"] if rows else "?"
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["decode tokens/s", "fraction of the roofline"],
        horizontal_spacing=0.12,
    )
    tps, fractions, batches = [], [], []
    for (strategy, provider), (label, color, dash) in ENGINE_SERIES.items():
        sel = sorted(
            (
                r
                for r in rows
                if r.get("strategy") == strategy
                and r.get("provider") == provider
                and r["preset"] == preset
            ),
            key=lambda r: r["batch"],
        )
        if not sel:
            continue
        values = [r["batch"] / r["seconds_per_token"]["median"] for r in sel]
        tps += values
        batches += [r["batch"] for r in sel]
        style = dict(color=color, dash=dash)
        fig.add_scatter(
            x=[r["batch"] for r in sel],
            y=values,
            name=label,
            legendgroup=label,
            mode="lines+markers",
            line=style,
            row=1,
            col=1,
        )
        roof = [r for r in sel if r.get("roofline_fraction") is not None]
        fractions += [r["roofline_fraction"] for r in roof]
        if roof:
            fig.add_scatter(
                x=[r["batch"] for r in roof],
                y=[r["roofline_fraction"] for r in roof],
                name=label,
                legendgroup=label,
                showlegend=False,
                mode="lines+markers",
                line=style,
                row=1,
                col=2,
            )
    xrange = _log_range(batches or [1], pad=1.5)
    fig.update_xaxes(type="log", title_text="batch", range=xrange, row=1, col=1)
    fig.update_xaxes(type="log", title_text="batch", range=xrange, row=1, col=2)
    fig.update_yaxes(type="log", title_text="tokens/s", range=_log_range(tps or [1]), row=1, col=1)
    fig.update_yaxes(title_text="fraction", range=[0, max([1.0, *fractions]) * 1.05], row=1, col=2)
    fig.update_layout(
        title=f"decode, {preset} ({engine['device']}): the engine beside the providers",
        height=420,
    )
    return fig
