"""Figures everyone can see: every plotly figure saved in a notebook also carries a static
image in the same output (GitHub, nbviewer and offline HTML run no plotly.js), every explorer
saves a static view of its figure, and the exporter behind both works or falls back cleanly."""

import json
import re
import shutil
import sys
import warnings
from pathlib import Path

import plotly.graph_objects as go
import pytest

from replaylab.teaching import plotting

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
STATIC = ("image/png", "image/svg+xml")


def _code_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            yield i, cell


def test_every_saved_plotly_figure_has_a_static_image():
    missing = []
    for path in NOTEBOOKS:
        for i, cell in _code_cells(path):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if PLOTLY in data and not any(m in data for m in STATIC):
                    missing.append(f"{path.name} cell {i}")
    assert not missing, "plotly figures saved without a static image: " + ", ".join(missing)


def _has_title(figure):
    layout = figure.get("layout", {})
    title = layout.get("title")
    text = title.get("text") if isinstance(title, dict) else title
    # make_subplots' subplot_titles are annotations above each subplot (paper coordinates,
    # anchored at their bottom, no arrow); a line's label is not a title
    axes = sum(1 for key in layout if key.startswith("xaxis"))
    titles = [
        a
        for a in layout.get("annotations", [])
        if a.get("yref") == "paper" and a.get("yanchor") == "bottom" and a.get("showarrow") is False
    ]
    return bool(text) or (axes > 1 and len(titles) >= axes)


def test_every_saved_plotly_figure_has_a_title():
    untitled = []
    for path in NOTEBOOKS:
        for i, cell in _code_cells(path):
            for out in cell.get("outputs", []):
                figure = out.get("data", {}).get(PLOTLY)
                if figure is not None and not _has_title(figure):
                    untitled.append(f"{path.name} cell {i}")
    assert not untitled, "plotly figures saved without a title: " + ", ".join(untitled)


def test_every_explorer_saves_a_static_view():
    """A cell that shows an explorer (its last line builds one, or names a variable that holds
    one) saves an image of it: a saved widget view without a kernel is blank."""
    blank = []
    for path in NOTEBOOKS:
        cells = list(_code_cells(path))
        names = {
            m.group(1)
            for _, cell in cells
            for m in re.finditer(r"^(\w+) = \w*Explorer\(", "".join(cell["source"]), re.M)
        }
        for i, cell in cells:
            lines = "".join(cell["source"]).strip().splitlines()
            last = lines[-1].strip() if lines else ""
            if not (re.match(r"\w*Explorer\(", last) or last in names):
                continue
            outputs = cell.get("outputs", [])
            if not any(m in o.get("data", {}) for o in outputs for m in STATIC):
                blank.append(f"{path.name} cell {i}")
    assert not blank, "explorers saved without a static view: " + ", ".join(blank)


def _figure():
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2], name="a line"))
    fig.update_layout(title="static export check", height=300)
    return fig


def test_static_export_draws_an_svg(monkeypatch):
    """The real exporter: kaleido driving a local Chromium (CI apt-installs Debian's)."""
    pytest.importorskip("kaleido")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("no Chromium here (apt-get install chromium; .ci/run does)")
    monkeypatch.setenv("REPLAYLAB_STATIC_FIGURES", "1")
    svg = plotting.static_image(_figure())
    assert svg is not None and svg.lstrip().startswith("<svg"), (svg or "")[:200]
    assert "static export check" in svg


def test_static_export_falls_back_with_one_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no browser")

    monkeypatch.setenv("REPLAYLAB_STATIC_FIGURES", "1")
    monkeypatch.setattr(plotting, "_start_browser", lambda: None)
    monkeypatch.setattr(plotting.pio, "to_image", broken)
    monkeypatch.setitem(plotting._STATIC, "warned", False)
    with pytest.warns(UserWarning, match="without a static image"):
        assert plotting.static_image(_figure()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the second figure is quiet
        assert plotting.static_image(_figure()) is None
        assert plotting.StaticImageRenderer().to_mimebundle(_figure().to_dict()) == {}


def test_renderer_and_show_put_both_in_one_output(monkeypatch):
    monkeypatch.setattr(plotting, "static_image", lambda fig, **kw: "<svg>stub</svg>")
    plotting.use_notebook_renderer()
    assert plotting.pio.renderers.default == "plotly_mimetype+replaylab_static"
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: shown.append(obj))
    plotting.show(_figure())
    (bundle,) = shown
    assert bundle["image/svg+xml"] == "<svg>stub</svg>"
    assert bundle[PLOTLY]["layout"]["title"]["text"] == "static export check"


def test_explorer_output_keeps_its_image_when_the_widget_is_stripped(monkeypatch):
    sys.path.insert(0, str(ROOT / "tools"))
    from notebook_hygiene import WIDGET_VIEW, problems, strip

    from replaylab.teaching.widgets import IntervalExplorer

    monkeypatch.setattr(plotting, "static_image", lambda fig, **kw: "<svg>explorer</svg>")
    bundle = IntervalExplorer(n=16, interval=4)._repr_mimebundle_()
    assert WIDGET_VIEW in bundle and bundle["image/svg+xml"] == "<svg>explorer</svg>"
    assert "VBox(" not in bundle["text/plain"]
    nb = {
        "metadata": {},
        "cells": [
            {"cell_type": "code", "execution_count": 1, "outputs": [{"data": dict(bundle)}]},
            {"cell_type": "code", "execution_count": 2, "outputs": [{"data": {WIDGET_VIEW: {}}}]},
        ],
    }
    strip(nb)
    assert problems(nb) == []
    assert nb["cells"][0]["outputs"][0]["data"]["image/svg+xml"] == "<svg>explorer</svg>"
    assert nb["cells"][1]["outputs"] == [] and nb["cells"][1]["execution_count"] is None


def test_a_line_label_is_not_a_title_and_subplot_titles_are():
    from plotly.subplots import make_subplots

    labelled = go.Figure(go.Scatter(y=[1, 2]))
    labelled.add_vline(x=1, annotation_text="checkpoint c")
    assert not _has_title(labelled.to_plotly_json())
    two = make_subplots(rows=1, cols=2, subplot_titles=("left", "right"))
    assert _has_title(two.to_plotly_json())
    assert _has_title(go.Figure(layout=dict(title="a title")).to_plotly_json())
