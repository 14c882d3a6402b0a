"""Interactive explorers over the cost model: ipywidgets controls and a plotly FigureWidget,
one call each from a notebook. Each keeps its logic in ``update`` so tests can set a control's
value and read the figure without a browser.

    IntervalExplorer     checkpoint interval -> states kept and recomputation, vs the optimum
    AcceptanceExplorer   acceptance rate and draft length -> speedup and rollback cost
    SpeculativeExplorer  acceptance, k, L, batch -> speedup, bytes held, restores and re-run
                         tokens per strategy; "run live" measures them on the tiny model (CPU)
    LogLengthExplorer    replay's log length L -> amortised decode time on an H200 (measured,
                         data/bench_kernels.json) beside the cost model's bytes / bandwidth
    BudgetExplorer       memory budget -> concurrent sequences per strategy
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from replaylab import costmodel as cm
from replaylab.shapes import PUBLISHED_SHAPES

__all__ = [
    "IntervalExplorer",
    "AcceptanceExplorer",
    "SpeculativeExplorer",
    "LogLengthExplorer",
    "BudgetExplorer",
    "live_speculative",
    "live_model",
]

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

    def static_figure(self):
        """A plain plotly copy of the figure as it stands (for the saved notebook)."""
        return go.Figure(self.figure)

    def _repr_mimebundle_(self, include=None, exclude=None):
        """One output: the live widget, and a static SVG of the figure as it starts. JupyterLab
        with a kernel shows the widget; a saved notebook (widget views are stripped on save,
        ``tools/notebook_hygiene.py``), GitHub and nbviewer show the image."""
        from replaylab.teaching.plotting import STATIC_FORMAT, static_image

        bundle = dict(self.widget()._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/plain"] = f"{type(self).__name__}: run the notebook to use its controls"
        svg = static_image(self.static_figure())
        if svg:
            bundle[STATIC_FORMAT] = svg
        return bundle


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


# ---------------------------------------------------------------------------------------------
# Speculative decoding with every knob at once, and a live run of the tiny model

BATCHES = (1, 8, 32, 64, 128)  # the batches of the H200 measurements in data/
WIDTH = 980  # pixels: the two-panel explorers; plotly's default squeezes their panel titles


def _probability(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number in [0, 1], got {value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{name}: expected a probability in [0, 1], got {value}")
    return float(value)


def _choice(name, value, options):
    if value not in options:
        raise ValueError(f"{name}: expected one of {list(options)}, got {value!r}")
    return value


def live_model():
    """The tiny hybrid that ``SpeculativeExplorer.run_live`` decodes on the CPU (notebook 07's
    model): NemotronH layout "M*M-M-" (three Mamba-2 layers of 8 heads x 16 channels, state 64,
    one attention layer, two MLPs), vocabulary 128, fixed random weights (seed 0)."""
    from replaylab.model import HybridConfig, HybridLM

    cfg = HybridConfig(pattern="M*M-M-", ssm_heads=8, ssm_head_dim=16, d_state=64, n_groups=1)
    return HybridLM(cfg, seed=0).eval()


def live_speculative(
    model, prompt, n_new, k, acceptance, interval, seed=0, strategies=None
) -> dict:
    """Speculative decoding of ``n_new`` tokens after ``prompt`` (1, T) with a synthetic drafter
    of the given per-draft acceptance, under each strategy (``interval``: recompute's checkpoint
    interval and replay's log length L). Per strategy: rounds, accepted and proposed drafts,
    restores and tokens re-run per round, the SSM-side bytes held (the cache's per-component
    peaks, KV left out: what ``costmodel.bytes_held`` counts), whether the tokens equal greedy
    decoding's, and seconds."""
    import torch

    from replaylab.cache import CacheConfig
    from replaylab.decoding import SyntheticDrafter, greedy, speculative

    reference = greedy(model, prompt, n_new + k).tokens  # so the last round's drafts exist too
    full = torch.cat([prompt, reference], 1)
    out = {}
    for strategy in strategies or cm.STRATEGIES:
        config = CacheConfig(strategy, checkpoint_interval=interval, log_length=interval)
        run = speculative(
            model, prompt, n_new, SyntheticDrafter(full, acceptance, seed), k=k, cache=config
        )
        rounds = run.proposed / k
        peak = run.stats.peak_by_component
        out[strategy] = dict(
            rounds=rounds,
            accepted=run.accepted,
            proposed=run.proposed,
            restores_per_round=run.restores / rounds,
            rerun_tokens_per_round=run.recomputed_tokens / rounds,
            held_bytes=sum(v for c, v in peak.items() if c != "kv"),
            same_tokens_as_greedy=bool(torch.equal(run.tokens, reference[:, :n_new])),
            seconds=run.seconds,
        )
    return out


class SpeculativeExplorer(_Explorer):
    """Speculative decoding, every knob at once: per-draft acceptance, draft length k, replay's
    log length L (also recompute's checkpoint interval) and batch. Four panels, one bar per
    strategy: the predicted speedup over plain decoding (``shape`` on ``hardware`` at the chosen
    batch), and for one sequence of the tiny model that "run live" decodes: SSM-side bytes held,
    restores per round and tokens re-run per round. ``run_live()`` (the button) decodes
    ``n_new`` tokens of that model on this CPU under each strategy with the current controls and
    overlays what it measured on the predictions.

    ``predictions()`` returns what ``AcceptanceExplorer.predictions`` does (speedup, µs a
    rollback adds), ``counts()`` the tiny model's predicted counts, ``measured`` the last live
    run (None before one, or after a control it depends on moved)."""

    def __init__(
        self,
        shape=DEFAULT_SHAPE,
        n_params=DEFAULT_PARAMS,
        hardware=None,
        batch=32,
        interval=16,
        acceptance=0.8,
        k=4,
        model=None,
        n_new=48,
        prompt_len=16,
        seed=0,
        batches=BATCHES,
        max_k=16,
        max_interval=64,
    ):
        import torch

        from replaylab.validation import as_int

        self.batches = tuple(batches)
        acceptance = _probability("acceptance", acceptance)
        k = as_int("k", k, 1, max_k)
        interval = as_int("interval", interval, 1, max_interval)
        batch = _choice("batch", batch, self.batches)
        self.shape, self.n_params = shape, n_params
        self.hardware = hardware or cm.HARDWARE["H200"]
        self.model = model if model is not None else live_model()
        self.n_new, self.seed = as_int("n_new", n_new, 1), seed
        vocab = self.model.cfg.vocab_size
        g = torch.Generator().manual_seed(seed)
        self.prompt = torch.randint(0, vocab, (1, as_int("prompt_len", prompt_len, 1)), generator=g)
        self.live_shape = cm.shape_from_config(self.model.cfg)
        self.live_params = sum(p.numel() for p in self.model.parameters())
        self._act_bytes = next(self.model.parameters()).element_size()
        self.measured, self._measured_at = None, None
        self.names = list(cm.STRATEGIES)
        colors = [COLORS[n] for n in self.names]
        grid = make_subplots(
            rows=2,
            cols=2,
            horizontal_spacing=0.12,
            vertical_spacing=0.2,
            subplot_titles=(
                f"speedup over plain decoding (x), {shape.name}",
                "SSM-side memory per sequence (KiB)",
                "restores per round",
                "tokens re-run per round",
            ),
        )
        cells = [(1, 1), (1, 2), (2, 1), (2, 2)]
        for row, col in cells:
            grid.add_bar(
                x=self.names,
                y=[0] * len(self.names),
                marker_color=colors,
                name="predicted (cost model)",
                showlegend=False,
                row=row,
                col=col,
            )
        for i, (row, col) in enumerate(cells[1:]):
            grid.add_scatter(
                x=[],
                y=[],
                mode="markers",
                name="measured: live run of the tiny model on this CPU",
                legendgroup="measured",
                showlegend=i == 0,
                marker=dict(
                    color="black", symbol="diamond", size=13, line=dict(color="white", width=1)
                ),
                row=row,
                col=col,
            )
        self.figure = go.FigureWidget(grid)
        self.figure.update_layout(
            width=WIDTH,
            height=680,
            title_font_size=14,
            legend=dict(orientation="h", yanchor="top", y=-0.08, x=0),
            margin=dict(t=110),
        )
        self.figure.update_annotations(font_size=14)  # the panel titles
        style, wide = {"description_width": "initial"}, widgets.Layout(width="470px")
        controls = {
            "acceptance": widgets.FloatSlider(
                value=acceptance,
                min=0,
                max=1,
                step=0.05,
                description="acceptance (probability per draft)",
                style=style,
                layout=wide,
            ),
            "k": widgets.IntSlider(
                value=k,
                min=1,
                max=max_k,
                description="draft length k (tokens)",
                style=style,
                layout=wide,
            ),
            "interval": widgets.IntSlider(
                value=interval,
                min=1,
                max=max_interval,
                description="log length L = recompute interval (tokens)",
                style=style,
                layout=wide,
            ),
            "batch": widgets.Dropdown(
                options=list(self.batches),
                value=batch,
                description="batch (sequences)",
                style=style,
            ),
        }
        self.button = widgets.Button(
            description="run live", icon="play", tooltip="decode the tiny model on this CPU"
        )
        self.status = widgets.Label(
            value=f"run live: {n_new} tokens of the tiny model per strategy, on this CPU"
        )
        self.button.on_click(self.run_live)
        self._fix_ranges(max_k, max_interval)
        super().__init__(controls)

    # the controls, by the names AcceptanceExplorer keeps as attributes
    acceptance = property(lambda self: self.controls["acceptance"].value)
    k = property(lambda self: self.controls["k"].value)
    interval = property(lambda self: self.controls["interval"].value)
    batch = property(lambda self: self.controls["batch"].value)

    def _fix_ranges(self, max_k, max_interval):
        """Axis ranges over the controls' whole range, computed once. The speedup is largest
        at acceptance 1 (no rollback, most tokens per round); bytes held grow with k and L;
        a round restores at most once; a restore re-runs fewer than L tokens."""
        speedup = max(
            v[0]
            for b in self.batches
            for k in range(1, max_k + 1)
            for L in range(1, max_interval + 1)
            for v in self.predictions(1.0, k, L, b).values()
        )
        held = max(
            c["held_bytes"]
            for k in (1, max_k)
            for L in (1, max_interval)
            for c in self.counts(0.5, k, L).values()
        )
        rerun = max(max_interval - 1, max_k + max_interval / 2)
        tops = [speedup * 1.1, held / 1024 * 1.15, 1.05, rerun * 1.05]
        for (row, col), top in zip([(1, 1), (1, 2), (2, 1), (2, 2)], tops):
            self.figure.update_yaxes(range=[0, top], row=row, col=col)

    def _workload(self, acceptance, k, interval, batch, **extra):
        return cm.Workload(
            batch=self.batch if batch is None else batch,
            k=self.k if k is None else k,
            acceptance=self.acceptance if acceptance is None else acceptance,
            interval=self.interval if interval is None else interval,
            **extra,
        )

    def predictions(self, acceptance=None, k=None, interval=None, batch=None):
        """strategy -> (speedup over plain decoding, µs a rollback adds) for ``shape`` on
        ``hardware``, at the controls' values unless given."""
        w = self._workload(acceptance, k, interval, batch)
        plain = cm.plain_decode_seconds_per_token(self.shape, w, self.hardware, self.n_params)
        out = cm.predict(self.shape, w, self.hardware, self.n_params)
        return {
            n: (plain / r["seconds_per_token"], r["restore_seconds"] * 1e6) for n, r in out.items()
        }

    def counts(self, acceptance=None, k=None, interval=None):
        """strategy -> the cost model's held_bytes (SSM side, one sequence of the tiny model),
        restores_per_round and rerun_tokens_per_round, at the controls' values unless given.
        ``costmodel.predict`` assumes a rejected round restores once (probability
        1 - acceptance^k) and recompute re-runs L/2 + E[accepted] tokens on a restore."""
        w = self._workload(acceptance, k, interval, 1, act_bytes=self._act_bytes)
        m = cm.model_costs(self.live_shape, w, self.live_params)
        out = cm.predict(self.live_shape, w, self.hardware, self.live_params)
        p_reject = 1 - w.acceptance**w.k
        rerun = p_reject * (w.interval / 2 + cm.expected_accepted(w.k, w.acceptance))
        return {
            n: dict(
                held_bytes=r["held"] - m.kv_token * w.context_len,
                restores_per_round=p_reject,
                rerun_tokens_per_round=rerun if n == "recompute" else 0.0,
            )
            for n, r in out.items()
        }

    def _settings(self):
        return (self.acceptance, self.k, self.interval)

    def update(self, *_):
        pred, counts = self.predictions(), self.counts()
        if self._measured_at is not None and self._measured_at != self._settings():
            self.measured, self._measured_at = None, None
            self.status.value = "the controls moved since the live run: press run live again"
        with self.figure.batch_update():
            self.figure.data[0].y = [pred[n][0] for n in self.names]
            for i, key in enumerate(("held_bytes", "restores_per_round", "rerun_tokens_per_round")):
                scale = 1 / 1024 if key == "held_bytes" else 1
                self.figure.data[1 + i].y = [counts[n][key] * scale for n in self.names]
            self._overlay()
            ea = cm.expected_accepted(self.k, self.acceptance)
            self.figure.layout.title = (
                f"k={self.k}, acceptance {self.acceptance:.2f} per draft, L={self.interval}, "
                f"batch {self.batch}: {ea + 1:.2f} tokens per round expected, accepted/proposed "
                f"{ea / self.k:.2f}<br>speedup: {self.shape.name} on {self.hardware.name} at "
                f"batch {self.batch}; the other panels: one sequence of the tiny model"
            )

    def _overlay(self):
        for i, key in enumerate(("held_bytes", "restores_per_round", "rerun_tokens_per_round")):
            trace = self.figure.data[4 + i]
            if self.measured is None:
                trace.x, trace.y = [], []
            else:
                scale = 1 / 1024 if key == "held_bytes" else 1
                trace.x = self.names
                trace.y = [self.measured[n][key] * scale for n in self.names]

    def run_live(self, *_):
        """Decode the tiny model on this CPU under each strategy with the controls' acceptance,
        k and L (``live_speculative``), overlay the measurements and return them."""
        import time

        a, k, L = self._settings()
        self.button.disabled = True
        self.status.value = f"running… {self.n_new} tokens per strategy, k={k}, L={L}"
        t0 = time.perf_counter()
        try:
            measured = live_speculative(
                self.model, self.prompt, self.n_new, k, a, L, self.seed, self.names
            )
        except Exception as err:
            self.status.value = f"the live run failed: {err!r}"
            raise
        finally:
            self.button.disabled = False
        self.measured, self._measured_at = measured, (a, k, L)
        r = measured[self.names[0]]
        same = all(m["same_tokens_as_greedy"] for m in measured.values())
        # the status first: the front end then shows it by the time the markers appear
        self.status.value = (
            f"measured in {time.perf_counter() - t0:.1f} s: {r['rounds']:.0f} rounds, accepted "
            f"{r['accepted']}/{r['proposed']} drafts = {r['accepted'] / r['proposed']:.2f}; "
            f"tokens equal greedy decoding's under every strategy: {same}"
        )
        with self.figure.batch_update():
            self._overlay()
        return measured

    def widget(self):
        c = self.controls
        return widgets.VBox(
            [
                widgets.HBox([c["acceptance"], c["k"]]),
                widgets.HBox([c["interval"], c["batch"]]),
                widgets.HBox([self.button, self.status]),
                self.figure,
            ]
        )


# ---------------------------------------------------------------------------------------------
# Replay's log length on an H200: measured points beside the cost model


class LogLengthExplorer(_Explorer):
    """Replay's decode cost against its log length L at one batch, from the H200 run in
    ``data/bench_kernels.json``: the measured amortised time per decode step, step(L) +
    fold(L) / L (``bench.mamba2_kernels.amortised_decode``: a step with L entries in the log, and its
    share of the fold a full log forces), and mamba-ssm's ``selective_state_update`` (which reads
    and writes the state every token) at the same batch; beside each, the cost model's line:
    the bytes the kernel must move (``costmodel.kernel_bytes``) over the device-copy bandwidth
    measured in the same run. The best L is marked, measured and modelled."""

    TICKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def __init__(self, bench=None, batch=32, L=16, max_L=64):
        from replaylab.bench.mamba2_kernels import SHAPE, amortised_decode
        from replaylab.results import load_bench
        from replaylab.validation import as_int

        self.bench = load_bench() if bench is None else bench
        self.table = amortised_decode(self.bench)
        self.kernel_shape = dict(self.bench.get("shape") or SHAPE)
        self.bandwidth = self.bench["copy_bandwidth_gbs"] * 1e9  # bytes/s, read + write
        self.batches = sorted({r["batch"] for r in self.table})
        if not self.batches:
            raise ValueError("bench: no rows with replay_step, fold and ssu timings")
        batch = _choice("batch", batch, self.batches)
        self.max_L = as_int("max_L", max_L, max(r["L"] for r in self.table))
        L = as_int("L", L, 1, self.max_L)
        self.Ls = list(range(1, self.max_L + 1))
        green, light_green, purple, light_purple = "#2ca02c", "#98df8a", "#9467bd", "#c5b0d5"
        grid = make_subplots(
            rows=1,
            cols=2,
            horizontal_spacing=0.12,
            subplot_titles=(
                "time per decode step, amortised (µs, log scale)",
                "speedup over selective_state_update (x)",
            ),
        )
        traces = [  # (name, panel, style): the order is data's order
            (
                "replay, measured: step + fold / L",
                1,
                dict(mode="markers", marker=dict(color=green, size=11)),
            ),
            (
                "replay, cost model: bytes / copy bandwidth",
                1,
                dict(mode="lines", line=dict(color=light_green, width=3, dash="dash")),
            ),
            (
                "selective_state_update (mamba-ssm), measured",
                1,
                dict(mode="lines", line=dict(color=purple, width=2)),
            ),
            (
                "selective_state_update, cost model",
                1,
                dict(mode="lines", line=dict(color=light_purple, width=3, dash="dash")),
            ),
            (
                "best L, measured",
                1,
                dict(mode="markers", marker=dict(color="#ff7f0e", size=20, symbol="star")),
            ),
            (
                "best L, cost model",
                1,
                dict(
                    mode="markers",
                    marker=dict(color="#e377c2", size=16, symbol="star-open", line=dict(width=3)),
                ),
            ),
            ("this L", 1, dict(mode="lines", line=dict(color="black", width=1, dash="dot"))),
            (
                "speedup, measured",
                2,
                dict(
                    mode="markers",
                    marker=dict(color=green, size=11),
                    showlegend=False,
                ),
            ),
            (
                "speedup, cost model",
                2,
                dict(
                    mode="lines",
                    line=dict(color=light_green, width=3, dash="dash"),
                    showlegend=False,
                ),
            ),
            ("break-even (1x)", 2, dict(mode="lines", line=dict(color="#7f7f7f", dash="dot"))),
            (
                "this L ",
                2,
                dict(mode="lines", line=dict(color="black", width=1, dash="dot"), showlegend=False),
            ),
        ]
        for name, col, style in traces:
            grid.add_scatter(x=[], y=[], name=name.strip(), row=1, col=col, **style)
        self.figure = go.FigureWidget(grid)
        self._fix_ranges()
        self.figure.update_layout(
            width=WIDTH,
            height=560,
            title_font_size=14,
            margin=dict(t=100),
            legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
        )
        self.figure.update_annotations(font_size=14)  # the panel titles
        style = {"description_width": "initial"}
        super().__init__(
            {
                "L": widgets.IntSlider(
                    value=L,
                    min=1,
                    max=self.max_L,
                    description="log length L (tokens)",
                    style=style,
                    layout=widgets.Layout(width="470px"),
                ),
                "batch": widgets.Dropdown(
                    options=self.batches,
                    value=batch,
                    description="batch (sequences)",
                    style=style,
                ),
            }
        )

    def model_us(self, L, batch):
        """The cost model's (replay amortised, selective_state_update) µs per decode step:
        bytes each must move over the run's device-copy bandwidth."""
        kb = lambda provider, L, T: cm.kernel_bytes(provider, batch, L, T, **self.kernel_shape)  # noqa: E731
        replay = kb("replay_step", L, 1) + kb("fold", L, 0) / L
        return replay / self.bandwidth * 1e6, kb("ssu", L, 1) / self.bandwidth * 1e6

    def measured(self, batch=None):
        """The measured rows of ``amortised_decode`` at ``batch`` (default: the control's)."""
        batch = self.controls["batch"].value if batch is None else batch
        return [r for r in self.table if r["batch"] == batch]

    def best_L(self, batch=None):
        """{"measured": the measured L with the lowest amortised time, "model": the L in
        1..max_L the cost model puts lowest} at ``batch``."""
        batch = self.controls["batch"].value if batch is None else batch
        rows = self.measured(batch)
        return {
            "measured": min(rows, key=lambda r: r["amortised_us"])["L"],
            "model": min(self.Ls, key=lambda L: self.model_us(L, batch)[0]),
        }

    def _fix_ranges(self):
        """Axes fixed once over every batch in the data, so neither control rescales them."""
        times, speedups = [], []
        for b in self.batches:
            for r in self.measured(b):
                times += [r["amortised_us"], r["ssu_us"]]
                speedups.append(r["speedup"])
            for L in self.Ls:
                ours, ssu = self.model_us(L, b)
                times += [ours, ssu]
                speedups.append(ssu / ours)
        self._y = (min(times) / 1.4, max(times) * 1.4)
        self._speedup_top = max(max(speedups), 1) * 1.1
        ticks = [t for t in self.TICKS if t <= self.max_L]
        x = dict(
            type="log",
            range=[math.log10(0.8), math.log10(self.max_L * 1.25)],
            tickvals=ticks,
            ticktext=[str(t) for t in ticks],
            title="log length L (tokens)",
        )
        self.figure.update_xaxes(**x)
        decades = range(math.floor(math.log10(self._y[0])), math.ceil(math.log10(self._y[1])))
        yticks = [m * 10**e for e in decades for m in (1, 2, 5) if self._y[0] <= m * 10**e]
        yticks = [t for t in yticks if t <= self._y[1]]
        self.figure.update_yaxes(
            type="log",
            range=[math.log10(v) for v in self._y],
            tickvals=yticks,
            ticktext=[f"{t:g}" for t in yticks],
            col=1,
        )
        self.figure.update_yaxes(range=[0, self._speedup_top], col=2)

    def update(self, *_):
        batch, L = self.controls["batch"].value, self.controls["L"].value
        rows = self.measured(batch)
        model = [self.model_us(x, batch) for x in self.Ls]
        best = self.best_L(batch)
        best_row = next(r for r in rows if r["L"] == best["measured"])
        ssu = rows[0]["ssu_us"]
        ends = [self.Ls[0], self.Ls[-1]]
        d = self.figure.data
        with self.figure.batch_update():
            d[0].x, d[0].y = [r["L"] for r in rows], [r["amortised_us"] for r in rows]
            d[1].x, d[1].y = self.Ls, [m[0] for m in model]
            d[2].x, d[2].y = ends, [ssu, ssu]
            d[3].x, d[3].y = self.Ls, [m[1] for m in model]
            d[4].x, d[4].y = [best["measured"]], [best_row["amortised_us"]]
            d[5].x, d[5].y = [best["model"]], [model[best["model"] - 1][0]]
            d[6].x, d[6].y = [L, L], list(self._y)
            d[7].x, d[7].y = [r["L"] for r in rows], [r["speedup"] for r in rows]
            d[8].x, d[8].y = self.Ls, [m[1] / m[0] for m in model]
            d[9].x, d[9].y = ends, [1, 1]
            d[10].x, d[10].y = [L, L], [0, self._speedup_top]
            here = next((r for r in rows if r["L"] == L), None)
            ours, ssu_model = model[L - 1]
            said = (
                f"measured {here['amortised_us']:.1f} µs ({here['speedup']:.2f}x "
                f"selective_state_update)"
                if here
                else "not measured at this L (measured: "
                + ", ".join(str(r["L"]) for r in rows)
                + ")"
            )
            self.figure.layout.title = (
                f"batch {batch}, L={L}: {said};<br>cost model {ours:.1f} µs "
                f"({ssu_model / ours:.2f}x). Best L: measured {best['measured']}, "
                f"cost model {best['model']}"
            )

    def widget(self):
        c = self.controls
        return widgets.VBox([widgets.HBox([c["L"], c["batch"]]), self.figure])
