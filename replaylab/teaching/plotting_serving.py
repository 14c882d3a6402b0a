"""Figures of notebook 13 (serving): latency distributions of a served stream, which request
held which slot when, and the speculation crossover of ``replaylab bench serve-stream``; and
the prefix cache's token hit rate against bytes at serving block sizes
(``replaylab bench prefix --blocks``).

Glossary: TTFT time to first token, TPOT time per output token (``serving.request``); a
"run" is one served stream, given as ``bench.stream.stream_metrics`` output or as the
finished ``Request`` s.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from replaylab.results import load_bench

__all__ = [
    "load_stream_result",
    "latency_figure",
    "slot_timeline_figure",
    "crossover_figure",
    "round_split",
    "round_split_figure",
    "prefix_hit_rate_figure",
    "PREFIX_BLOCKS",
    "STREAM_GPU",
    "STREAM_CPU",
]

STREAM_GPU = "data/bench_serve_stream_h100_90b36f1.json"
STREAM_CPU = "data/bench_serve_stream_cpu.json"
PREFIX_BLOCKS = "data/bench_prefix_blocks_cpu.json"


def load_stream_result(gpu=STREAM_GPU, cpu=STREAM_CPU):
    """(result, path): the GPU request-stream result if it is committed, else the CPU smoke
    run's (tiny model: no performance figure)."""
    for path in (gpu, cpu):
        try:
            return load_bench(path), path
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"neither {gpu} nor {cpu} is committed")


def latency_figure(runs, title="latency per request") -> go.Figure:
    """Box plots of TTFT and TPOT in ms, one box per run: ``runs`` {label: stream_metrics
    dict (with ``ttft_s`` / ``tpot_s`` value lists)}."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms)", "TPOT (ms)"))
    for label, m in runs.items():
        for col, key in ((1, "ttft_s"), (2, "tpot_s")):
            fig.add_trace(
                go.Box(
                    y=[1e3 * v for v in m[key]["values"]],
                    name=label,
                    boxpoints="all",
                    showlegend=False,
                ),
                row=1,
                col=col,
            )
    fig.update_layout(title=title, height=380, margin=dict(t=60, b=40))
    return fig


def slot_timeline_figure(finished, title="which request held which slot") -> go.Figure:
    """One bar per request on its slot's row, from admission to its last token; the thin
    line before it is its wait in the queue. ``finished``: served ``Request`` s."""
    fig = go.Figure()
    for r in finished:
        fig.add_trace(
            go.Scatter(
                x=[1e3 * r.arrival, 1e3 * r.admitted_at],
                y=[r.slot, r.slot],
                mode="lines",
                line=dict(color="lightgray", width=2),
                showlegend=False,
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Bar(
                x=[1e3 * (r.finished_at - r.admitted_at)],
                base=[1e3 * r.admitted_at],
                y=[r.slot],
                orientation="h",
                text=[f"#{r.id}"],
                name=f"request {r.id}",
                showlegend=False,
                hovertemplate=f"request {r.id}: {len(r.tokens)} tokens<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        xaxis_title="ms on the scheduler's clock",
        yaxis=dict(title="slot", dtick=1),
        barmode="overlay",
        height=300,
    )
    return fig


def _ratio(row):
    """Speculative over plain tokens/s of a crossover row, in engine time where recorded."""
    if "speculative_engine_tokens_per_s" in row:
        return row["speculative_engine_tokens_per_s"] / row["decode_engine_tokens_per_s"]
    return row["speculative_tokens_per_s"] / row["decode_tokens_per_s"]


def crossover_figure(result) -> go.Figure:
    """Speculative over plain tokens/s against batch, per strategy: measured in engine time
    (solid; steps and rollbacks, without the Python drafters) and the
    cost model's prediction for an H200 (dashed), a line at 1 (below it speculation loses),
    and a dotted line where the cost model puts a (k+1)-row verify at compute-bound."""
    fig = go.Figure()
    colors = dict(snapshot="#636efa", recompute="#ef553b", replay="#00cc96")
    for strategy, row in result["strategies"].items():
        c = row.get("crossover")
        if not c:
            continue
        color = colors.get(strategy)
        meas = c["measured_rows"]
        fig.add_trace(
            go.Scatter(
                x=[r["batch"] for r in meas],
                y=[_ratio(r) for r in meas],
                name=f"{strategy} measured (engine time)",
                mode="lines+markers",
                line=dict(color=color),
            )
        )
        pred = c["predicted_rows"]
        fig.add_trace(
            go.Scatter(
                x=[r["batch"] for r in pred],
                y=[r["decode_s_per_token"] / r["speculative_s_per_token"] for r in pred],
                name=f"{strategy} cost model (H200)",
                mode="lines",
                line=dict(color=color, dash="dash"),
            )
        )
        bound = c.get("verify_compute_bound_from_batch")
        if bound:
            fig.add_vline(x=bound, line=dict(color=color, dash="dot"))
    fig.add_hline(y=1, line=dict(color="gray"))
    where = "GPU" if result.get("device_type") == "cuda" else "CPU, tiny model"
    fig.update_layout(
        title=f"speculative / plain tokens per second ({where}, k={result['k']})",
        xaxis=dict(title="batch", type="log"),
        yaxis_title="speedup of speculation",
        height=420,
    )
    return fig


def round_split(result):
    """Per (batch, arm) of a ``bench spec-steady`` result that records its widths
    (``steady_ms_by_width``, since e466a9d): the arm's steady iterations of its one width
    split into (step, rollback, host) ms, with the arm's rate over plain decode. step and
    rollback are medians; host is the median iteration less those two (an estimate of the
    rest, which can come out below zero). Arms: "plain", "k=<k>" for the main k and each
    other k; arms of several widths (the adaptive one) or without steady iterations are left
    out. Returns {batch: {arm: dict(step=, rollback=, host=, over_plain=)}}; a ValueError
    names a file without the widths."""
    out = {}
    for row in result["rows"]:
        plain = row["plain"]["steady_tokens_per_s"]
        if "steady_ms_by_width" not in row["plain"]:
            raise ValueError(
                "result: its rows record no steady_ms_by_width (bench spec-steady before "
                "e466a9d); expected a run that splits its iterations"
            )
        arms = {"plain": row["plain"], f"k={result['k']}": row["speculative"]}
        arms.update(row.get("arms", {}))
        out[row["batch"]] = {}
        for label, arm in arms.items():
            widths = arm.get("steady_ms_by_width", {})
            if len(widths) != 1 or not plain or not arm["steady_tokens_per_s"]:
                continue
            ((T, total),) = widths.items()
            step, rollback = (
                arm["steady_step_ms_by_width"][T],
                arm["steady_rollback_ms_by_width"][T],
            )
            out[row["batch"]][label] = dict(
                step=step, rollback=rollback, host=total - step - rollback,
                over_plain=arm["steady_tokens_per_s"] / plain,
            )  # fmt: skip
    return out


def round_split_figure(result, title="where a steady iteration's time goes") -> go.Figure:
    """Stacked bars, one per (batch, arm) of ``round_split(result)``: the engine step, the
    rollback and the host's work around them, ms; each bar's label its rate over plain."""
    split = round_split(result)
    x = [[str(b) for b, arms in split.items() for _ in arms],
         [label for arms in split.values() for label in arms]]  # fmt: skip
    parts = [("step", "engine step (device)", "#636efa"), ("rollback", "rollback", "#ab63fa"),
             ("host", "other (host)", "#ef553b")]  # fmt: skip
    fig = go.Figure()
    for key, name, color in parts:
        fig.add_trace(go.Bar(x=x, y=[a[key] for arms in split.values() for a in arms.values()],
                             name=name, marker_color=color))  # fmt: skip
    fig.add_trace(go.Scatter(
        x=x, y=[sum(a[k] for k, *_ in parts) for arms in split.values() for a in arms.values()],
        text=[f"{a['over_plain']:.2f}x" for arms in split.values() for a in arms.values()],
        mode="text", textposition="top center", showlegend=False,
    ))  # fmt: skip
    fig.update_layout(barmode="stack", title=title, yaxis_title="ms per steady iteration",
                      xaxis_title="batch, arm", height=420)  # fmt: skip
    return fig


def prefix_hit_rate_figure(result, block_sizes=None, workload=None) -> go.Figure:
    """Token hit rate against the byte budget, one panel per block size (``block_sizes``,
    default all in ``result``: a ``bench.prefix_blocks.run_block_bench`` result, e.g.
    ``load_bench(PREFIX_BLOCKS)``), one line per strategy (snapshot is vLLM's align) and the
    attention-only ideal (dashed); pooled over the workloads, or one ``workload``. The x axis
    is the budget scaled to Nemotron-H 8B bytes (GiB; the model's bytes times
    ``nemotron_scale``); budgets under one block of a strategy have no point."""
    from replaylab.bench.prefix_blocks import pooled_hit_rate

    rows = [r for r in result["rows"] if workload is None or r["workload"] == workload]
    if not rows:
        raise ValueError(f"workload: expected one of the result's workloads, got {workload!r}")
    blocks = block_sizes or sorted({r["block_size"] for r in rows})
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    scale = result["nemotron_scale"] / 2**30
    colors = dict(replay="#00cc96", snapshot="#636efa", recompute="#ef553b")
    names = dict(replay="replay", snapshot="snapshot (align)", recompute="recompute")
    fig = make_subplots(rows=1, cols=len(blocks), subplot_titles=[f"block {b}" for b in blocks])
    ideal = pooled_hit_rate(rows, "replay", blocks[0], None, field="ideal_hit_rate")
    for col, b in enumerate(blocks, start=1):
        for strategy in ("replay", "snapshot", "recompute"):
            ys = [pooled_hit_rate(rows, strategy, b, budget) for budget in budgets]
            fig.add_trace(
                go.Scatter(
                    x=[budget * scale for budget in budgets],
                    y=ys,
                    name=names[strategy],
                    legendgroup=strategy,
                    showlegend=col == 1,
                    mode="lines+markers",
                    line=dict(
                        color=colors[strategy], dash="dot" if strategy == "recompute" else None
                    ),
                ),
                row=1,
                col=col,
            )
        fig.add_trace(
            go.Scatter(
                x=[budgets[0] * scale, budgets[-1] * scale],
                y=[ideal, ideal],
                name="attention-only ideal",
                legendgroup="ideal",
                showlegend=col == 1,
                mode="lines",
                line=dict(color="gray", dash="dash"),
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(type="log", title_text="budget (Nemotron-H 8B GiB)", row=1, col=col)
    fig.update_yaxes(title_text="token hit rate", range=[0, 1], row=1, col=1)
    what = workload or "four workloads pooled"
    fig.update_layout(
        title=f"prefix-cache token hit rate against bytes ({what})",
        height=380,
        margin=dict(t=70, b=50),
    )
    return fig
