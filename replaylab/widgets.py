"""Interactive explorers over the cost model: ipywidgets controls and a plotly FigureWidget,
one call each from a notebook. Each keeps its logic in ``update`` so tests can set a control's
value and read the figure without a browser.

    IntervalExplorer     checkpoint interval -> states kept and recomputation, vs the optimum
    AcceptanceExplorer   acceptance rate and draft length -> speedup and rollback cost
    BudgetExplorer       memory budget -> concurrent sequences per strategy
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from replaylab import costmodel as cm
from replaylab.shapes import PUBLISHED_SHAPES

__all__ = ["IntervalExplorer", "AcceptanceExplorer", "BudgetExplorer"]

COLORS = {"snapshot": "#d62728", "recompute": "#1f77b4", "replay": "#2ca02c"}
DEFAULT_SHAPE, DEFAULT_PARAMS = PUBLISHED_SHAPES["Nemotron-H 8B"], 8.1e9


class _Explorer:
    def __init__(self, controls):
        self.controls = controls
        for c in controls.values():
            c.observe(self.update, names="value")
        self.update()

    def widget(self):
        return widgets.VBox([widgets.HBox(list(self.controls.values())), self.figure])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget())


class IntervalExplorer(_Explorer):
    """Visit every state of an n-step chain in reverse: checkpoints every ``interval`` steps
    against Griewank's optimal schedule for the same number of kept states."""

    def __init__(self, n=64, interval=8):
        self.n = n
        frontier = cm.optimal_frontier(n, max_slots=n // 2)
        curve = [cm.interval_tradeoff(n, i) for i in range(1, n + 1)]
        self.figure = go.FigureWidget(
            [
                go.Scatter(
                    x=[s + 1 for s, _ in frontier],
                    y=[c for _, c in frontier],
                    name="optimal (binomial checkpointing)",
                    line=dict(color="black"),
                ),
                go.Scatter(
                    x=[c["states_kept"] for c in curve],
                    y=[c["steps_per_restore"] for c in curve],
                    name="a checkpoint every interval steps",
                    mode="markers",
                    marker=dict(color=COLORS["recompute"], opacity=0.35),
                ),
                go.Scatter(
                    x=[0],
                    y=[0],
                    name="this interval",
                    mode="markers",
                    marker=dict(size=14, color=COLORS["recompute"], symbol="diamond"),
                ),
            ]
        )
        ticks = [t for t in (1, 2, 4, 8, 16, 32, 64, 128, 256) if t <= n]
        worst = max(c["steps_per_restore"] for c in curve)
        self.figure.update_layout(
            xaxis=dict(
                title="states kept", type="log", tickvals=ticks, ticktext=[str(t) for t in ticks]
            ),
            yaxis=dict(title="recomputed steps per restored state", range=[0, worst * 1.05]),
            height=400,
        )
        super().__init__(
            {"interval": widgets.IntSlider(value=interval, min=1, max=n, description="interval")}
        )

    def update(self, *_):
        t = cm.interval_tradeoff(self.n, self.controls["interval"].value)
        with self.figure.batch_update():
            self.figure.data[2].x, self.figure.data[2].y = (
                [t["states_kept"]],
                [t["steps_per_restore"]],
            )
            self.figure.layout.title = (
                f"interval {self.controls['interval'].value}: "
                f"{t['states_kept']} states kept, "
                f"{t['steps_per_restore']:.1f} steps per restore"
            )


class AcceptanceExplorer(_Explorer):
    """Speculative decoding per strategy: expected speedup over plain decoding and the time a
    rejected draft adds (rollback cost)."""

    def __init__(
        self,
        shape=DEFAULT_SHAPE,
        n_params=DEFAULT_PARAMS,
        hardware=None,
        batch=32,
        interval=16,
        acceptance=0.8,
        k=4,
    ):
        self.shape, self.n_params = shape, n_params
        self.hardware = hardware or cm.HARDWARE["H200"]
        self.batch, self.interval = batch, interval
        names = list(cm.STRATEGIES)
        grid = make_subplots(
            rows=1,
            cols=2,
            horizontal_spacing=0.15,
            subplot_titles=("speedup over plain decoding (x)", "time a rejected draft adds (µs)"),
        )
        colors = [COLORS[n] for n in names]
        grid.add_bar(
            x=names, y=[0] * len(names), marker_color=colors, showlegend=False, row=1, col=1
        )
        grid.add_bar(
            x=names, y=[0] * len(names), marker_color=colors, showlegend=False, row=1, col=2
        )
        self.figure = go.FigureWidget(grid)
        super().__init__(
            {
                "acceptance": widgets.FloatSlider(
                    value=acceptance, min=0, max=1, step=0.05, description="acceptance"
                ),
                "k": widgets.IntSlider(value=k, min=1, max=16, description="draft length"),
            }
        )
        # fixed axes over the sliders' whole range, so a move changes the bars, not the scale
        top = [0.0, 0.0]
        for a in (0.0, 0.5, 1.0):
            for d in (1, 4, 16):
                for v in self.predictions(acceptance=a, k=d).values():
                    top = [max(top[0], v[0]), max(top[1], v[1])]
        self.figure.update_yaxes(range=[0, top[0] * 1.1], row=1, col=1)
        self.figure.update_yaxes(range=[0, max(top[1], 1e-3) * 1.1], row=1, col=2)
        self.figure.update_layout(height=400)

    def predictions(self, acceptance=None, k=None):
        """strategy -> (speedup over plain decoding, µs a rollback adds), at the sliders'
        values unless given."""
        w = cm.Workload(
            batch=self.batch,
            k=self.controls["k"].value if k is None else k,
            acceptance=self.controls["acceptance"].value if acceptance is None else acceptance,
            interval=self.interval,
        )
        plain = cm.plain_decode_seconds_per_token(self.shape, w, self.hardware, self.n_params)
        out = cm.predict(self.shape, w, self.hardware, self.n_params)
        return {
            n: (plain / r["seconds_per_token"], r["restore_seconds"] * 1e6) for n, r in out.items()
        }

    def update(self, *_):
        pred = self.predictions()
        with self.figure.batch_update():
            self.figure.data[0].y = [pred[n][0] for n in cm.STRATEGIES]
            self.figure.data[1].y = [pred[n][1] for n in cm.STRATEGIES]
            self.figure.layout.title = (
                f"k={self.controls['k'].value}, acceptance "
                f"{self.controls['acceptance'].value:.2f}, batch {self.batch}"
                f" ({self.hardware.name}, {self.shape.name})"
            )


class BudgetExplorer(_Explorer):
    """Concurrent sequences that fit a memory budget, per strategy, while speculating."""

    def __init__(
        self,
        shape=DEFAULT_SHAPE,
        n_params=DEFAULT_PARAMS,
        context_len=8192,
        k=4,
        interval=16,
        budget_gb=80.0,
    ):
        self.shape, self.n_params = shape, n_params
        self.workload = cm.Workload(k=k, interval=interval, context_len=context_len)
        names = list(cm.STRATEGIES)
        self.figure = go.FigureWidget(
            [go.Bar(x=names, y=[0] * 3, marker_color=[COLORS[n] for n in names])]
        )
        self.figure.update_layout(yaxis_title="sequences that fit", height=380)
        super().__init__(
            {
                "budget_gb": widgets.FloatSlider(
                    value=budget_gb, min=20, max=141, step=1, description="GB"
                )
            }
        )
        most = max(self.fits(141).values())  # the largest budget fixes the axis
        self.figure.update_yaxes(range=[0, most * 1.1])

    def fits(self, budget_gb=None):
        """strategy -> sequences that fit ``budget_gb`` (default: the slider's)."""
        budget = self.controls["budget_gb"].value if budget_gb is None else budget_gb
        out = cm.predict(
            self.shape,
            self.workload,
            cm.HARDWARE["H200"],
            self.n_params,
            memory_budget=budget * 1e9,
        )
        return {n: out[n]["max_sequences"] for n in cm.STRATEGIES}

    def update(self, *_):
        fits = self.fits()
        with self.figure.batch_update():
            self.figure.data[0].y = [fits[n] for n in cm.STRATEGIES]
            self.figure.layout.title = (
                f"{self.controls['budget_gb'].value:.0f} GB, "
                f"{self.shape.name}, {self.workload.context_len} tokens "
                f"of context, k={self.workload.k}"
            )
