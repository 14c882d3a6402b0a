"""Diagrams drawn by code (plotly shapes and labels, no data): the ideas the notebooks teach,
each where it is taught.

    memory_diagram          KV grows one row per token; the recurrent state stays one block (01)
    strategies_diagram      one branching sequence under snapshot, recompute and replay (03)
    replay_log_diagram      a checkpoint, the log of scan inputs after it, the cursor (05)
    verify_round_diagram    one speculative verify round: k drafts, j accepted, rollback (07)
    prefix_grid_diagram     a cached prefix on a block grid: KV per token, states on the grid,
                            replay's log after each state; where a second request resumes (14)

Glossary: t a token position; c the checkpoint position; S_c the recurrent state kept there;
the log holds one entry of scan inputs (x, dt, B, C) per token after c, at most L of them; the
cursor j says how many of them the current state has taken in; k drafts, j accepted.

Each figure is an ordinary ``go.Figure`` (axes hidden): shapes are rectangles and lines, every
label is an annotation, so tests read both back.
"""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = [
    "memory_diagram",
    "strategies_diagram",
    "replay_log_diagram",
    "verify_round_diagram",
    "prefix_grid_diagram",
]

COLORS = {
    "kv": "#1f77b4",
    "state": "#d62728",
    "snapshot": "#d62728",
    "recompute": "#1f77b4",
    "replay": "#2ca02c",
    "log": "#98df8a",
    "accepted": "#2ca02c",
    "rejected": "#ff9896",
    "token": "#c7c7c7",
    "new": "#ff7f0e",
    "text": "#333333",
}


def _canvas(title, width, height, x_range, y_range) -> go.Figure:
    fig = go.Figure()
    hidden = dict(visible=False, fixedrange=True)
    fig.update_layout(
        title=title,
        width=width,
        height=height,
        xaxis=dict(range=x_range, **hidden),
        yaxis=dict(range=y_range, scaleanchor="x", **hidden),
        plot_bgcolor="white",
        margin=dict(l=10, r=10, t=50, b=10),
        showlegend=False,
    )
    return fig


def _box(fig, x0, y0, x1, y1, color, text=None, opacity=0.9, dash=None, font=12):
    fig.add_shape(
        type="rect",
        x0=x0,
        y0=y0,
        x1=x1,
        y1=y1,
        fillcolor=color,
        opacity=opacity,
        line=dict(color="#555555", width=1, dash=dash),
        layer="below",
    )
    if text:
        _label(fig, (x0 + x1) / 2, (y0 + y1) / 2, text, font=font)


def _label(fig, x, y, text, font=12, anchor="center", color=None):
    fig.add_annotation(
        x=x,
        y=y,
        text=text,
        showarrow=False,
        xanchor=anchor,
        font=dict(size=font, color=color or COLORS["text"]),
    )


def _arrow(fig, x0, y0, x1, y1, text="", color="#333333"):
    """An arrow from (x0, y0) to (x1, y1), its label at the tail."""
    fig.add_annotation(
        x=x1,
        y=y1,
        ax=x0,
        ay=y0,
        xref="x",
        yref="y",
        axref="x",
        ayref="y",
        text=text,
        showarrow=True,
        arrowhead=2,
        arrowwidth=1.5,
        arrowcolor=color,
        font=dict(size=12, color=color),
    )


def labels(fig) -> list[str]:
    """Every annotation's text, in order (what the tests and a reader see)."""
    return [a.text for a in fig.layout.annotations]


def memory_diagram(steps=(2, 4, 8)) -> go.Figure:
    """One sequence at a few lengths t: the KV cache as t rows (one per token, it grows), the
    recurrent state as one block of the same size at every t (it is overwritten)."""
    cols = len(steps)
    fig = _canvas(
        "KV cache: one row per token  ·  recurrent state: one fixed block",
        900,
        380,
        [-0.5, 4.2 * cols],
        [-1.6, max(steps) * 0.5 + 1.2],
    )
    for i, t in enumerate(steps):
        x = 4.2 * i
        for row in range(t):  # KV: one row of K and V per token so far
            _box(fig, x, row * 0.5, x + 1.4, row * 0.5 + 0.42, COLORS["kv"], opacity=0.75)
        _label(fig, x + 0.7, t * 0.5 + 0.3, f"KV: {t} rows")
        _box(fig, x + 2.0, 0, x + 3.6, 1.6, COLORS["state"], "state<br>(H, P, N)", 0.55)
        _label(fig, x + 2.8, 1.9, "same size")
        _label(fig, x + 1.8, -0.8, f"after t = {t} tokens", font=13)
    return fig


def strategies_diagram(trunk=6, branch_at=4, branch_len=3) -> go.Figure:
    """One sequence of ``trunk`` tokens with a second branch leaving at ``branch_at`` (beam
    search, best-of-n, a rejected draft). One row per strategy shows what it keeps to get the
    state at the branch point back: snapshot a full copy, recompute a sparse checkpoint and a
    re-run of the model, replay one checkpoint plus the small log of inputs after it."""
    fig = _canvas(
        "one branching sequence, three ways to get the state at the branch point back",
        980,
        470,
        [-3.3, trunk + branch_len + 4.5],
        [-0.2, 9.0],
    )
    rows = {"snapshot": 7.2, "recompute": 4.2, "replay": 1.2}
    notes = {
        "snapshot": "copy the whole state at every point you may return to:<br>"
        "restore = one copy, memory = copies x state size",
        "recompute": "keep a sparse checkpoint; restore = re-run every<br>"
        "layer from it: little memory, time grows with distance",
        "replay": "keep one checkpoint per layer + a log of scan inputs;<br>"
        "restore = fold(checkpoint, log[:j]): no matmuls",
    }
    for name, y in rows.items():
        color = COLORS[name]
        _label(fig, -3.1, y + 0.3, f"<b>{name}</b>", font=14, anchor="left", color=color)
        for t in range(trunk):  # the trunk
            _box(fig, t, y, t + 0.8, y + 0.6, COLORS["token"], str(t), opacity=0.8, font=10)
        for s in range(branch_len):  # the branch, one row up
            x = branch_at + s
            _box(fig, x + 0.5, y + 1.0, x + 1.3, y + 1.6, COLORS["token"], "", 0.5, dash="dot")
        fig.add_shape(
            type="line",
            x0=branch_at - 0.1,
            y0=y + 0.6,
            x1=branch_at + 0.5,
            y1=y + 1.3,
            line=dict(color="#555555", width=1),
        )
        if name == "snapshot":  # a full copy at every possible return point
            for t in range(1, trunk):
                _box(fig, t + 0.15, y - 0.75, t + 0.65, y - 0.15, color, opacity=0.6)
            _label(fig, trunk + 0.2, y - 0.45, "state copies", anchor="left", color=color)
        elif name == "recompute":
            _box(fig, 0.15, y - 0.75, 0.65, y - 0.15, color, opacity=0.6)
            _label(fig, 0.4, y - 1.0, "checkpoint", color=color)
            _arrow(fig, 0.65, y - 0.45, branch_at - 0.1, y - 0.45, color=color)
            _label(
                fig,
                1.4,
                y - 1.0,
                f"re-run the model over 0..{branch_at - 1}",
                anchor="left",
                color=color,
            )
        else:
            _box(fig, 0.15, y - 0.75, 0.65, y - 0.15, color, opacity=0.6)
            _label(fig, 0.4, y - 1.0, "checkpoint", color=color)
            for t in range(1, trunk):  # one small log entry per token
                _box(fig, t + 0.3, y - 0.55, t + 0.5, y - 0.35, COLORS["log"], opacity=1.0)
            _label(fig, trunk + 0.2, y - 0.45, "log of inputs", anchor="left", color=color)
        _label(fig, trunk + branch_len + 0.3, y + 0.9, notes[name], font=11, anchor="left")
    return fig


def replay_log_diagram(L=8, filled=6, cursor=4) -> go.Figure:
    """Replay's storage for one layer: the checkpoint state S_c at position c, a log with room
    for ``L`` entries of which ``filled`` hold the scan inputs of tokens c+1..c+filled, and the
    cursor at c+``cursor``: the state there is fold(S_c, log[:cursor]). Rolling back moves the
    cursor; a full log folds into a new checkpoint."""
    if not 0 <= cursor <= filled <= L:
        raise ValueError(f"need 0 <= cursor <= filled <= L, got {cursor}, {filled}, {L}")
    fig = _canvas(
        "replay: one checkpoint, a log of scan inputs, a cursor",
        900,
        330,
        [-2.6, L + 4.5],
        [-2.0, 3.0],
    )
    _box(fig, -2.2, -0.4, -0.4, 1.4, COLORS["replay"], "S<sub>c</sub><br>checkpoint", 0.55)
    _label(fig, -1.3, -0.8, "state at c (written<br>only at a fold)", font=11)
    for i in range(L):
        full = i < filled
        color = COLORS["log"] if full else "white"
        text = f"c+{i + 1}" if full else ""
        _box(fig, i, 0.0, i + 0.9, 1.0, color, text, opacity=1.0 if full else 0.4, font=11)
    _label(fig, L / 2, -0.45, f"log: x, dt, B, C of each token after c (room for L = {L})")
    x = cursor - 0.05
    fig.add_shape(type="line", x0=x, y0=-0.2, x1=x, y1=1.6, line=dict(color="black", width=3))
    _label(fig, x, 1.9, f"cursor j = {cursor}: state = fold(S<sub>c</sub>, log[:{cursor}])")
    _arrow(fig, filled - 0.05, -1.1, x + 0.05, -1.1, color="#555555")
    _label(fig, filled + 0.2, -1.1, "rollback: move the cursor back", anchor="left", font=11)
    _label(fig, L + 0.2, 0.5, "log full: fold<br>into a new S<sub>c</sub>", anchor="left", font=11)
    return fig


def verify_round_diagram(k=4, accepted=2) -> go.Figure:
    """One speculative round under replay: the pending token and ``k`` drafts are verified in
    one forward (k + 1 log entries written, no state write); the target agrees with the first
    ``accepted`` drafts, emits its own token after them, and the rest are rolled back by moving
    the cursor (snapshot would load the copy it kept at that position, recompute re-run the
    model from its last checkpoint)."""
    if not 0 <= accepted <= k:
        raise ValueError(f"need 0 <= accepted <= k, got {accepted}, {k}")
    fig = _canvas(
        f"one verify round: k = {k} drafts, {accepted} accepted, the rest rolled back",
        900,
        360,
        [-2.8, k + 5.5],
        [-2.2, 3.4],
    )
    _box(fig, -2.4, 0, -0.6, 1, COLORS["replay"], "S<sub>c</sub> + log", 0.55)
    _label(fig, 0.45, 1.35, "pending", font=11)
    _box(fig, 0, 0, 0.9, 1, COLORS["token"], "t<sub>0</sub>", 1.0)
    for i in range(1, k + 1):
        ok = i <= accepted
        color = COLORS["accepted"] if ok else COLORS["rejected"]
        _box(fig, i, 0, i + 0.9, 1, color, f"d<sub>{i}</sub>", 0.9)
        _label(fig, i + 0.45, 1.35, "accept" if ok else "reject", font=11)
    _label(fig, (k + 1.9) / 2, 2.1, f"verify: one forward over {k + 1} tokens")
    _label(fig, (k + 1.9) / 2, 2.7, f"{k + 1} log entries written, no state write", font=11)
    # the target's own token at the first rejected position
    x = accepted + 1
    _box(fig, x, -1.7, x + 0.9, -0.7, COLORS["accepted"], "target", 0.5, font=10)
    _arrow(fig, x + 0.45, -0.05, x + 0.45, -0.65)
    cursor = accepted + 1  # the pending token and the accepted drafts stay in the log
    fig.add_shape(
        type="line",
        x0=cursor - 0.05,
        y0=-0.4,
        x1=cursor - 0.05,
        y1=1.8,
        line=dict(color="black", width=3),
    )
    kept = ", ".join(["t<sub>0</sub>"] + [f"d<sub>{i}</sub>" for i in range(1, accepted + 1)])
    _label(fig, k + 1.2, 0.75, "rollback: move the cursor", anchor="left")
    _label(fig, k + 1.2, 0.3, f"({kept} stay in the log)", anchor="left", font=11)
    _label(
        fig,
        k + 1.2,
        -0.5,
        "(snapshot: load the copy kept there;<br>recompute: re-run from a checkpoint)",
        anchor="left",
        font=11,
    )
    return fig


def prefix_grid_diagram(block_size=4, blocks=3, matched=10, extra=3) -> go.Figure:
    """A prefix cache on a grid of ``block_size`` tokens, after a first request of ``blocks``
    full blocks: KV rows for every token, the recurrent state only at the grid positions
    (after each full block), replay's log of scan inputs for every token after each state. A
    second request shares the first ``matched`` tokens and has ``extra`` of its own; where each
    strategy resumes it: attention at the match, align (snapshot) at the grid position below
    it, replay at the match by a fold, recompute at the grid position and a re-run."""
    b, n = block_size, block_size * blocks
    if not 0 < matched < n:
        raise ValueError(f"matched: expected 1..{n - 1} (inside the cached tokens), got {matched}")
    g = matched // b * b
    j, T2 = matched - g, matched + extra
    fig = _canvas(
        f"a prefix cache on a grid of b = {b} tokens; a second request shares {matched} tokens",
        980,
        520,
        [-7.2, n + 1.0],
        [-3.6, 6.6],
    )
    rows = {"tokens": 5.2, "kv": 4.3, "state": 3.4, "log": 2.5, "second": 1.2}
    left = {
        "tokens": "request 1 (held)",
        "kv": "KV rows: every token",
        "state": "state S<sub>g</sub>: grid only",
        "log": "replay log: every token",
        "second": "request 2",
    }
    for key, y in rows.items():
        _label(fig, -7.0, y + 0.3, left[key], anchor="left", font=12)
    for t in range(n):
        _box(
            fig, t, rows["tokens"], t + 0.9, rows["tokens"] + 0.6, COLORS["token"], str(t), font=10
        )
        _box(fig, t + 0.1, rows["kv"], t + 0.8, rows["kv"] + 0.5, COLORS["kv"], opacity=0.75)
        _box(
            fig,
            t + 0.25,
            rows["log"] + 0.1,
            t + 0.65,
            rows["log"] + 0.4,
            COLORS["replay"] if g <= t < matched else COLORS["log"],  # the entries folded
            opacity=1.0,
        )
    for k in range(blocks + 1):  # the grid
        x = k * b - 0.05
        fig.add_shape(
            type="line",
            x0=x,
            y0=rows["log"] - 0.2,
            x1=x,
            y1=rows["tokens"] + 0.9,
            line=dict(color="#555555", width=1, dash="dot"),
        )
        _label(fig, x, rows["tokens"] + 1.1, f"g = {k * b}", font=11)
        if k:
            _box(
                fig,
                x - 0.45,
                rows["state"],
                x + 0.45,
                rows["state"] + 0.6,
                COLORS["state"],
                f"S<sub>{k * b}</sub>",
                0.6,
                font=10,
            )
    for t in range(T2):  # the second request
        color = COLORS["token"] if t < matched else COLORS["new"]
        _box(fig, t, rows["second"], t + 0.9, rows["second"] + 0.6, color, str(t), font=10)
    x = matched - 0.05
    fig.add_shape(
        type="line",
        x0=x,
        y0=rows["second"] - 0.3,
        x1=x,
        y1=rows["tokens"] + 0.8,
        line=dict(color="black", width=3),
    )
    _label(fig, x, rows["second"] - 0.55, f"match m = {matched}", font=12)
    notes = [
        f"attention only: resume at m = {matched} (cut the KV rows there)",
        f"align (snapshot): resume at g = {g}, the grid position below m; prefill {g}..{T2 - 1}",
        f"replay: S<sub>{g}</sub> + fold(log[:{j}]) = the state at {matched}: resume at m, "
        f"prefill {matched}..{T2 - 1}",
        f"recompute: S<sub>{g}</sub>, then re-run tokens {g}..{matched - 1} through the model",
    ]
    for i, text in enumerate(notes):
        _label(fig, -7.0, -0.6 - 0.75 * i, text, anchor="left", font=12)
    return fig
