"""Figures and the explorer of notebook 14 (prefix caching): token hit rates per workload and
strategy beside an attention-only model's, and bytes held, served live on the tiny model
through ``replaylab.prefix.PrefixCache``; the explorer redoes it over block size and budget.

Glossary:
    token hit rate   sum of resumed_from over sum of prompt lengths: the prompt tokens a cache
                     did not compute (``exercises_prefix.token_hit_rate``)
    ideal            an attention-only model with room for every earlier prompt: KV rows can be
                     cut at any token, so each request reuses its longest common prefix with any
                     earlier request, capped at T - 1 (the last token is computed for its
                     logits); computed from the token ids alone (``ideal_hit_rate``)
    align            the snapshot strategy's prefix cache: vLLM's ``mamba_cache_mode=align``,
                     states only on the block grid
    budget           one byte cap on what the tree holds (KV + states + replay's logs); a
                     budget under one block (``floor_bytes``: under the default eviction,
                     replay's without its log) is refused by the cache ("refused")
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from replaylab.bench.prefix import WORKLOADS, workload
from replaylab.teaching.exercises_prefix import (
    WORKLOAD_STREAM_RESULTS,
    serve_stream,
    token_hit_rate,
)
from replaylab.teaching.widgets import COLORS, _Explorer

__all__ = [
    "LABELS",
    "workload_stream_rows",
    "ideal_hit_rate",
    "hit_rates",
    "hit_report_rows",
    "hit_rate_figure",
    "PrefixExplorer",
    "budget_label",
    "BLOCK_SIZES",
    "BUDGETS_KB",
    "TTFT_RESULTS",
    "TTFT_KERNEL_RESULTS",
    "TTFT_CHECKPOINT_RESULTS",
    "TTFT_ORDER_RESULTS",
    "PREFILL_PROFILES",
    "TTFT_FIRST_SEEN_RESULT",
    "TTFT_WARM_RESULTS",
    "TTFT_CONV_RESULTS",
    "TTFT_TRIMS_RESULTS",
    "ttft_rows",
    "ttft_figure",
]

# The H200 time-to-first-token runs (``replaylab bench prefix --engine --ttft --preset gpu``): a
# shared prompt on the block grid (2,048 tokens) and off it (2,000)
TTFT_RESULTS = ("data/bench_prefix_ttft_gpu.json", "data/bench_prefix_ttft_offgrid_gpu.json")
# the off-grid run twice in one device call: the prefill's PyTorch scans, then its kernels
TTFT_KERNEL_RESULTS = (
    "data/bench_prefix_ttft_offgrid_prefill_torch_gpu.json",
    "data/bench_prefix_ttft_offgrid_prefill_kernels_gpu.json",
)
# one H100 call, two rounds: the tree before replay's prefill took the scan's state as its
# checkpoint, then the tree after, in turn (fused path, prompt kernels, off the grid)
TTFT_CHECKPOINT_RESULTS = tuple(
    f"data/bench_prefix_ttft_scan_checkpoint_{tree}_{round_}_h100.json"
    for round_ in (1, 2)
    for tree in ("previous", "this")
)
# the tree after it, run twice in a row in another call: how far one tree's runs spread
TTFT_ORDER_RESULTS = tuple(f"data/bench_prefix_ttft_order_{n}_h100.json" for n in (1, 2))
# one cold admission and one hit under torch.profiler, before the change and after it
PREFILL_PROFILES = (
    "data/prefill_profile_fused_h100_before.json",
    "data/prefill_profile_fused_h100.json",
)

# one H100, two rounds: the code before Mamba-2's prompt conv became one launch (dbf9e4e) and
# after it (a5af96d), the code before going first in round 1 and second in round 2 (the files'
# dates): (round, before, after)
TTFT_CONV_RESULTS = tuple(
    (r, f"data/bench_prefix_ttft_conv_previous_{r}_h100.json",
     f"data/bench_prefix_ttft_conv_this_{r}_h100.json")
    for r in (1, 2)
)  # fmt: skip

# one H200, two rounds: the code before a hit's trims (91bc487) and after them (71f43c0: the
# prefill's attention in one call of torch's fused attention, the conv window as a view, the
# prompt scan in place), the code before going first in round 1 and second in round 2:
# (round, before, after)
TTFT_TRIMS_RESULTS = tuple(
    (r, f"data/bench_prefix_ttft_trims_previous_91bc487_{r}_h200.json",
     f"data/bench_prefix_ttft_trims_this_71f43c0_{r}_h200.json")
    for r in (1, 2)
)  # fmt: skip

# the bench before its warm-up met every timed shape, snapshot timed first (one H100 call)
TTFT_FIRST_SEEN_RESULT = "data/bench_prefix_ttft_previous_snapshot_first_h100.json"
# with it, in the same call: snapshot timed first, then replay timed first
TTFT_WARM_RESULTS = tuple(
    f"data/bench_prefix_ttft_warm_shapes_{first}_first_h100.json"
    for first in ("snapshot", "replay")
)

LABELS = {
    "replay": "replay",
    "replay:chunk": "replay, chunk resume",
    "snapshot": "align (snapshot)",
    "recompute": "recompute",
}
IDEAL = "attention-only ideal"
BLOCK_SIZES = (32, 64, 128, 256, 512)
BUDGETS_KB = (50, 100, 200, 400, 800, 1600, 0)  # 0: no cap


def ideal_hit_rate(stream) -> float:
    """The attention-only ideal of a stream of prompts (lists of ids): each request resumes at
    its longest common prefix with any earlier request, at most T - 1; over all prompt tokens."""
    saved = 0
    for i, tokens in enumerate(stream):
        best = 0
        for earlier in stream[:i]:
            n = 0
            while n < min(len(tokens), len(earlier)) and tokens[n] == earlier[n]:
                n += 1
            best = max(best, n)
        saved += min(best, len(tokens) - 1)
    return saved / sum(len(t) for t in stream)


def hit_rates(
    model, block_size, budget_bytes=None, strategies=("replay", "snapshot"), workloads=WORKLOADS
):
    """Serve each workload (``bench.prefix.workload``, seed 0) through a fresh ``PrefixCache``
    per strategy. Returns {workload: {"ideal": rate, strategy: {"hit_rate", "bytes_held",
    "computed", "hits"} or {"refused": message}}}: a budget under one block is refused."""
    out = {}
    for name in workloads:
        stream = workload(name)
        row = {"ideal": ideal_hit_rate(stream)}
        for strategy in strategies:
            try:
                hits, prefix = serve_stream(model, strategy, stream, block_size, budget_bytes)
            except ValueError as err:  # the budget is under one block of this strategy
                row[strategy] = {"refused": str(err)}
                continue
            row[strategy] = dict(
                hit_rate=token_hit_rate(hits),
                bytes_held=prefix.held_bytes,
                computed=sum(h.computed for h in hits),
                hits=hits,
            )
        out[name] = row
    return out


def hit_report_rows(hits_by_strategy):
    """One line per request: its length, what the tree matched and, per strategy, where it
    resumed and why reuse stopped there. ``hits_by_strategy``: {strategy: [PrefixHit, ...]}
    over the same stream."""
    strategies = list(hits_by_strategy)
    lines = []
    for i, reports in enumerate(zip(*hits_by_strategy.values())):
        head = f"#{i} T={reports[0].prompt_length:3d} matched {reports[0].matched:3d}"
        parts = []
        for s, h in zip(strategies, reports):
            extra = f", {h.recomputed} re-run" if h.recomputed else ""
            extra += f", {h.folded} folded" if h.folded else ""
            parts.append(f"{s} {h.resumed_from:3d} ({h.limited_by}{extra})")
        lines.append(head + " | " + " | ".join(parts))
    return lines


def _value(cell, key):
    return None if cell is None or "refused" in cell else cell[key]


def _bars(rates, strategies, key, scale=1.0):
    """Per strategy: (y values over the workloads, texts). A refused strategy's bar is 0 and
    reads "refused", once per workload: where several strategies are refused, only the first
    bar carries the label (side by side they would overlap)."""
    out = {s: ([], []) for s in strategies}
    for row in rates.values():
        labelled = False
        for s in strategies:
            v = _value(row.get(s), key)
            out[s][0].append(0.0 if v is None else v * scale)
            out[s][1].append("refused" if v is None and not labelled else "")
            labelled = labelled or v is None
    return out


REFUSED = "refused (budget < one block)"


def _title(rates, strategies, block_size, kb) -> str:
    """The explorer's title: the setting, each strategy's mean token hit rate over the
    workloads, and the ideal's. A strategy whose budget the cache refused is named as refused:
    a refusal is no hit rate, not a hit rate of 0."""
    rates_by, refused = [], []
    for s in strategies:
        values = [_value(row.get(s), "hit_rate") for row in rates.values()]
        if any(v is None for v in values):
            refused.append(LABELS[s])
        else:
            rates_by.append(f"{LABELS[s]} {sum(values) / len(values):.2f}")
    said = "mean hit rate " + ", ".join(rates_by) if rates_by else ""
    if refused:
        said += ("; " if said else "") + ", ".join(refused) + " " + REFUSED
    ideal = sum(row["ideal"] for row in rates.values()) / len(rates)
    return f"block size {block_size}, budget {budget_label(kb)}: {said}; ideal {ideal:.2f}"


def budget_label(kb) -> str:
    """A budget in kB as the explorer shows it: 0 is "no cap"."""
    return f"{kb} kB" if kb else "no cap"


def _budget_line(kb):
    """The budget as a dashed line across the bytes panel (the second subplot)."""
    return dict(
        type="line",
        xref="x2 domain",
        x0=0,
        x1=1,
        yref="y2",
        y0=kb,
        y1=kb,
        line=dict(color="gray", dash="dash"),
    )


def hit_rate_figure(
    rates, title="token hit rate per workload", budget_kb=None, strategies=None
) -> go.Figure:
    """Two panels over the workloads of ``rates`` (``hit_rates`` output): the token hit rate
    per strategy with the attention-only ideal as markers, and the bytes the tree holds (kB),
    with the budget as a dashed line when given. Traces: the strategies' hit-rate bars, their
    bytes bars, then the ideal."""
    if strategies is None:
        strategies = [s for s in LABELS if any(s in row for row in rates.values())]
    names = list(rates)
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=("token hit rate", "bytes the tree holds (kB)"),
    )
    for col, (key, scale) in ((1, ("hit_rate", 1.0)), (2, ("bytes_held", 1e-3))):
        for s, (ys, texts) in _bars(rates, strategies, key, scale).items():
            fig.add_trace(
                go.Bar(
                    x=names,
                    y=ys,
                    text=texts,
                    textposition="outside",
                    name=LABELS[s],
                    marker_color=COLORS[s],
                    legendgroup=s,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    fig.add_trace(
        go.Scatter(
            x=names,
            y=[row["ideal"] for row in rates.values()],
            name=IDEAL,
            mode="markers",
            marker=dict(symbol="diamond", size=12, color="black"),
        ),
        row=1,
        col=1,
    )
    if budget_kb:
        fig.add_shape(_budget_line(budget_kb))
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_layout(title=title, barmode="group", height=420, width=980)
    return fig


class PrefixExplorer(_Explorer):
    """Block size and byte budget -> token hit rate per workload and strategy (align against
    replay, beside the attention-only ideal) and bytes held, served live on ``model`` (the tiny
    hybrid: a few seconds per setting on a CPU, more for small blocks under a tight budget; each
    setting is computed once and kept). ``budget_kb``: the byte cap in kB, 0 for no cap.
    ``known``: {(block_size, budget_kb): ``hit_rates`` output} already computed (e.g. the
    notebook's own run at the starting setting)."""

    def __init__(
        self,
        model,
        block_size=64,
        budget_kb=0,
        strategies=("replay", "snapshot"),
        workloads=WORKLOADS,
        block_sizes=BLOCK_SIZES,
        budgets_kb=BUDGETS_KB,
        known=None,
    ):
        self.model, self.strategies, self.workloads = model, tuple(strategies), tuple(workloads)
        self.results = dict(known or {})  # (block_size, budget_kb) -> hit_rates output
        first = self.compute(block_size, budget_kb)
        self.figure = go.FigureWidget(
            hit_rate_figure(first, budget_kb=budget_kb, strategies=self.strategies)
        )
        options = [(budget_label(kb), kb) for kb in budgets_kb]
        super().__init__(
            {
                "block_size": widgets.SelectionSlider(
                    options=list(block_sizes),
                    value=block_size,
                    description="block size",
                    continuous_update=False,
                ),
                "budget_kb": widgets.SelectionSlider(
                    options=options, value=budget_kb, description="budget", continuous_update=False
                ),
            }
        )

    def compute(self, block_size, budget_kb):
        """``hit_rates`` at this block size and budget (kB, 0: no cap), computed once."""
        key = (block_size, budget_kb)
        if key not in self.results:
            self.results[key] = hit_rates(
                self.model,
                block_size,
                budget_kb * 1000 if budget_kb else None,
                self.strategies,
                self.workloads,
            )
        return self.results[key]

    def current(self):
        return self.compute(self.controls["block_size"].value, self.controls["budget_kb"].value)

    def update(self, *_):
        rates = self.current()
        b, kb = self.controls["block_size"].value, self.controls["budget_kb"].value
        hit = _bars(rates, self.strategies, "hit_rate")
        held = _bars(rates, self.strategies, "bytes_held", 1e-3)
        n = len(self.strategies)
        with self.figure.batch_update():
            for i, s in enumerate(self.strategies):
                self.figure.data[i].y, self.figure.data[i].text = hit[s]
                self.figure.data[n + i].y, self.figure.data[n + i].text = held[s]
            self.figure.layout.shapes = [_budget_line(kb)] if kb else []
            self.figure.layout.title = _title(rates, self.strategies, b, kb)


def ttft_rows(result) -> list[str]:
    """One line per strategy of a TTFT result (``run_engine_ttft``'s JSON): median cold and hit
    TTFT (ms), their ratio, prompt tokens computed with the hit, and the hit's first-token
    logits against the cold ones (largest difference over their scale)."""
    lines = [f"shared prompt {result['shared_tokens']:,} tokens, batch {result['batch']}, "
             f"block {result['block_size']} ({result['device']}, {result['date'][:10]})"]  # fmt: skip
    snap = result["strategies"]["snapshot"]["cold_ttft_s"]["median"]
    for s, r in result["strategies"].items():
        cold, hit = r["cold_ttft_s"]["median"], r["prefix_ttft_s"]["median"]
        lines.append(
            f"  {LABELS[s]:17s} cold {1e3 * cold:6.1f} ms ({cold / snap:4.2f}x align's)  "
            f"hit {1e3 * hit:5.1f} ms  cut {cold / hit:4.1f}x  computed "
            f"{r['prefix_computed_tokens']:,} of {r['cold_computed_tokens']:,}  "
            f"hit vs cold {r['max_logit_diff_over_scale']:.1e}"
        )
    return lines


def ttft_figure(results) -> go.Figure:
    """One panel per TTFT result (``run_engine_ttft``'s JSON): median time to first token (ms)
    per strategy, cold and with the prefix hit. Traces: per panel, the cold bars then the hit
    bars."""
    fig = make_subplots(
        rows=1,
        cols=len(results),
        subplot_titles=[f"shared prompt {r['shared_tokens']:,} tokens" for r in results],
    )
    for col, result in enumerate(results, 1):
        names = [LABELS[s] for s in result["strategies"]]
        for key, label, opacity in (
            ("cold_ttft_s", "cold (pale)", 0.45),
            ("prefix_ttft_s", "hit", 1.0),
        ):
            ys = [1e3 * r[key]["median"] for r in result["strategies"].values()]
            fig.add_trace(
                go.Bar(
                    x=names,
                    y=ys,
                    name=label,
                    opacity=opacity,
                    showlegend=col == 1,
                    marker_color=[COLORS[s] for s in result["strategies"]],
                    text=[f"{y:.0f}" for y in ys],
                    textposition="outside",
                ),  # fmt: skip
                row=1,
                col=col,
            )
    fig.update_yaxes(title_text="time to first token, median (ms)", col=1)
    fig.update_layout(
        barmode="group",
        title="H200, 8b-layers, bf16: time to first token, cold and with a prefix hit",
        height=420,
    )
    return fig


def workload_stream_rows(paths=WORKLOAD_STREAM_RESULTS) -> list[str]:
    """The GPU request streams (one file per workload), plain decode: the run, then per
    workload its objective and per strategy the bytes the budget counts a request, the most
    requests that ran at once, the token hit
    rate at the lowest rate, the sustainable rate (">=": a lower bound,
    ``workload_stream.unbounded``) and its failed probe just above (rate, p99 TPOT, p90
    wait), then replay's rate over snapshot's and the burst point: n requests over the
    batch-1 time to serve one (above it, all n arrive before one served alone finishes; a rate
    there is marked). "most at once" is the most over the rows at every rate."""
    from replaylab.bench.workload_stream import (
        burst_point,
        stopping_probe,
        unbounded,
        workload_budget,
    )
    from replaylab.results import load_bench

    lines = []
    for w, path in paths.items():
        run = load_bench(path)
        if not lines:
            lines.append(f"{run['device']}, {run['date'][:10]}, commit {run['commit']}; "
                         f"plain decode")  # fmt: skip
        r = run["workloads"][w]
        obj = r["objective"]
        lines.append(f"{w}: budget {workload_budget(r, 'decode') / 1e6:.0f} MB, objective p99 TPOT <= "
                     f"{1e3 * obj['tpot_p99_max_s']:.2f} ms, p90 wait <= "
                     f"{1e3 * obj['wait_p90_max_s']:.0f} ms")  # fmt: skip
        found, burst = {}, burst_point(r)
        for s in ("replay", "snapshot"):
            rows = [x for x in r["rows"] if x["strategy"] == s and x["mode"] == "decode"]
            low = min(rows, key=lambda x: x["rate"])
            entry = next(x for x in r["rates"] if x["strategy"] == s and x["mode"] == "decode")
            found[s] = entry["sustainable_rate"]
            stop = stopping_probe(entry)
            stopped = "none failed" if stop is None else (
                f"failed at {stop['rate']:.1f}: p99 TPOT {1e3 * stop['tpot_p99_s']:.2f} ms, p90 "
                f"wait {1e3 * stop['wait_p90_s']:.0f} ms")  # fmt: skip
            rate = "none met" if found[s] is None else (
                f"{'>= ' if unbounded(entry) else ''}{found[s]:.1f} req/s")  # fmt: skip
            if found[s] is not None and found[s] > burst:
                rate += ", above the burst point: a burst, not a steady rate"
            held = low["accounted_bytes_per_request"]["mean"] / 1e6
            lines.append(f"  {s:9s} {held:4.1f} MB a request, most at once "
                         f"{max(x['peak_running'] for x in rows):2d}, hit rate "
                         f"{low['token_hit_rate']:.3f} at {low['rate']:g} req/s, sustainable "
                         f"{rate} ({stopped})")  # fmt: skip
        ratio = "-" if None in found.values() else f"{found['replay'] / found['snapshot']:.2f}x"
        serve_ms = 1e3 * r["prompts"] / burst
        lines.append(f"  sustainable rate, replay / snapshot {ratio}; burst point {burst:.0f} "
                     f"req/s ({r['prompts']} requests / {serve_ms:.0f} ms to serve one alone)")  # fmt: skip
    return lines
