"""Plot helpers for the notebooks: one renderer set-up, one figure per concept."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from replaylab.shapes import PUBLISHED_SHAPES, memory_per_sequence

__all__ = ["use_notebook_renderer", "memory_vs_context_figure"]

MIB = 2**20


def use_notebook_renderer():
    """Figures render in JupyterLab (mimetype) and in exported HTML (plotly.js from its CDN)."""
    pio.renderers.default = "plotly_mimetype+notebook_connected"


def memory_vs_context_figure(context_lens, shapes=None) -> go.Figure:
    """Per-sequence MiB of KV vs recurrent state (+conv) against context length, per model."""
    shapes = shapes or list(PUBLISHED_SHAPES.values())
    fig = go.Figure()
    for i, shape in enumerate(shapes):
        mems = [memory_per_sequence(shape, n) for n in context_lens]
        color = f"hsl({i * 360 // len(shapes)}, 60%, 45%)"
        fig.add_scatter(x=list(context_lens), y=[m["kv"] / MIB for m in mems], name=f"{shape.name}: KV",
                        line=dict(color=color))
        fig.add_scatter(x=list(context_lens),
                        y=[(m["ssm_state"] + m["conv_state"]) / MIB for m in mems],
                        name=f"{shape.name}: SSM + conv state", line=dict(color=color, dash="dash"))
    fig.update_layout(xaxis_title="context length (tokens)", yaxis_title="MiB per sequence",
                      xaxis_type="log", yaxis_type="log", height=450,
                      title="KV grows with the context; the recurrent state does not")
    return fig
