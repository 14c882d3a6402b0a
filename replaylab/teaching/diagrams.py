"""Diagrams drawn by code (plotly shapes and labels, no data): the ideas the notebooks teach,
each where it is taught.

    memory_diagram          KV grows one row per token; the recurrent state stays one block (01)
    strategies_diagram      one branching sequence under snapshot, recompute and replay (03)
    replay_log_diagram      a checkpoint, the log of scan inputs after it, the cursor (05)
    verify_round_diagram    one speculative verify round: k drafts, j accepted, rollback (07)
    prefix_grid_diagram     a cached prefix on a block grid: KV per token, states on the grid,
                            replay's log after each state; where a second request resumes (14)
    puzzle_access_diagram   one Triton puzzle's memory accesses: what program (b, h) loads,
                            keeps in registers and stores, and how often (06)

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
    "puzzle_access_diagram",
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
    "output": "#9467bd",
    "masked": "#ffffff",
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


# one puzzle's blocks: (label, kind, note); kinds: "tile" (P, N), "vec_p" (P,), "vec_n" (N,),
# "scalar", "log_p" (L, P), "log_n" (L, N), "log_1" (L,); a "+masked" tile is drawn as
# (BLOCK_P, BLOCK_N) with the lanes past P and N masked off
_S = ("S[b, h]", "tile", "read once")
_TOKEN = [
    ("x[b, h]", "vec_p", "x<sub>t</sub>"),
    ("dt[b, h]", "scalar", "Δ<sub>t</sub>"),
    ("B[b, h]", "vec_n", "B<sub>t</sub>"),
]
_C = ("C[b, h]", "vec_n", "C<sub>t</sub>")
_A, _D = ("A[h]", "scalar", "A"), ("D[h]", "scalar", "D")
_LOG = [
    ("log_x[b, :, h]", "log_p", "x<sub>s</sub>, each once"),
    ("log_dt[b, :, h]", "log_1", "Δ<sub>s</sub>"),
    ("log_B[b, :, h]", "log_n", "B<sub>s</sub>"),
]
PUZZLE_ACCESSES = {
    1: dict(
        title="puzzle 1, copy: one (P, N) tile per program, lanes past P and N masked off",
        loads=[("S[b, h] (strided)", "tile+masked", "read once, at its strides")],
        registers="tile = tl.load(ptrs, mask)<br>(BLOCK_P, BLOCK_N) lanes,<br>P x N of them real",
        stores=[("out[b, h]", "tile+masked", "written once")],
    ),
    2: dict(
        title="puzzle 2, reduce: y = S C, a sum over n in one program",
        loads=[_S, _C],
        registers="S * C[None, :]  (P, N)<br>tl.sum(axis=1): over n<br>→ (P,)",
        stores=[("y[b, h]", "vec_p", "written once")],
    ),
    3: dict(
        title="puzzle 3, one state update in place: the write replay avoids",
        loads=[_S, *_TOKEN, _A],
        registers="e<sup>Δ A</sup> · S  (a scalar per head)<br>+ (Δ x)[:, None] · B[None, :]"
        "<br>(an outer product, (P, N))",
        stores=[("S[b, h] in place", "tile", "written once: the snapshot write")],
    ),
    4: dict(
        title="puzzle 4, the output from the checkpoint: S read once, no state written",
        loads=[_S, *_TOKEN, _C, _A, _D],
        registers="e<sup>Δ A</sup> (S C)  (P,)<br>+ Δ (B · C) x<br>+ D x",
        stores=[("y[b, h]", "vec_p", "written once; S written 0 times")],
    ),
    5: dict(
        title="puzzle 5, the fold: the tile stays in registers across the log",
        loads=[_S, *_LOG, _A],
        registers="for s in range(L):<br>S = e<sup>Δ<sub>s</sub> A</sup> S + Δ<sub>s</sub> x<sub>s"
        "</sub> B<sub>s</sub><sup>T</sup><br>(P, N), never stored inside",
        stores=[("out[b, h]", "tile", "written once, after the loop")],
    ),
    6: dict(
        title="puzzle 6, the replay step: S and the log read once, no state written",
        loads=[_S, *_LOG, *_TOKEN, _C, _A, _D],
        registers="v = S C  (P,): the only use of S<br>for s: v = e<sup>Δ<sub>s</sub> A</sup> v"
        "<br>+ Δ<sub>s</sub> (B<sub>s</sub> · C) x<sub>s</sub><br>then the new token, + D x",
        stores=[("y[b, h]", "vec_p", "written once; S written 0 times")],
    ),
}


# kind -> (its shape as printed, its (rows, cols) in cells from P, N, L)
_KINDS = {
    "tile": ("(P, N)", lambda P, N, L: (P, N)),
    "vec_p": ("(P,)", lambda P, N, L: (1, P)),
    "vec_n": ("(N,)", lambda P, N, L: (1, N)),
    "scalar": ("", lambda P, N, L: (1, 1)),
    "log_p": ("(L, P)", lambda P, N, L: (L, P)),
    "log_n": ("(L, N)", lambda P, N, L: (L, N)),
    "log_1": ("(L,)", lambda P, N, L: (L, 1)),
}


def _block_shape(kind, P, N, L, block):
    """(rows, cols, real rows, real cols) of a block in cells."""
    rows, cols = _KINDS[kind.split("+")[0]][1](P, N, L)
    if kind.endswith("+masked"):
        return block[0], block[1], rows, cols
    return rows, cols, rows, cols


def _color(label, kind, stored):
    if stored:
        return COLORS["state"] if "in place" in label else COLORS["output"]
    if kind.startswith("tile"):
        return COLORS["state"]
    if kind.startswith("log"):
        return COLORS["log"]
    return COLORS["new"] if label[0] in "xdBC" else COLORS["token"]


def _cells(fig, shapes, x0, y_top, kind, label, note, P, N, L, block, stored, cell=0.32):
    """Draw one block's cells from (x0, y_top) down, appending them to ``shapes`` (the caller
    adds them all in one call: one ``add_shape`` per cell takes seconds for a few hundred);
    return its height."""
    rows, cols, real_r, real_c = _block_shape(kind, P, N, L, block)
    color = _color(label, kind, stored)
    for r in range(rows):
        for c in range(cols):
            real = r < real_r and c < real_c
            x, y = x0 + c * cell, y_top - (r + 1) * cell
            shapes.append(
                dict(
                    type="rect",
                    x0=x,
                    y0=y,
                    x1=x + cell * 0.92,
                    y1=y + cell * 0.92,
                    fillcolor=color if real else COLORS["masked"],
                    opacity=0.8 if real else 1.0,
                    line=dict(color="#555555", width=1, dash=None if real else "dot"),
                    layer="below",
                )
            )
    shape = _KINDS[kind.split("+")[0]][0]
    _label(fig, x0 + cols * cell + 0.15, y_top - 0.5 * cell, f"<b>{label}</b> {shape}", 11, "left")
    if note:
        _label(fig, x0 + cols * cell + 0.15, y_top - 1.3 * cell, note, 10, "left")
    return rows * cell


def puzzle_access_diagram(puzzle, P=4, N=8, L=5, block=(8, 8)) -> go.Figure:
    """What program (b, h) of notebook 06's puzzle ``puzzle`` (1-6, ``PUZZLE_ACCESSES``) touches:
    the blocks it loads (left: the state tile S[b, h] (P, N) in red, the log (L rows) in light
    green, the new token's vectors in orange, the per-head scalars in grey on one row), what it
    computes in registers (middle) and what it stores (right, purple; red where the state is
    written back), each with how often the check allows it to be read or written. Puzzle 1's
    tile is drawn as ``block`` = (BLOCK_P, BLOCK_N) lanes of which P x N = 5 x 6 are real (its
    sizes, ``puzzles.COPY_SIZES``): the dotted lanes are masked off. One cell per element."""
    if puzzle not in PUZZLE_ACCESSES:
        raise ValueError(f"puzzle: expected one of {sorted(PUZZLE_ACCESSES)}, got {puzzle!r}")
    if puzzle == 1:
        P, N = 5, 6  # the copy's sizes are not powers of two (puzzles.COPY_SIZES)
    spec = PUZZLE_ACCESSES[puzzle]
    cell, gap = 0.32, 0.6
    blocks = [b for b in spec["loads"] if b[1] != "scalar"]
    scalars = [b for b in spec["loads"] if b[1] == "scalar"]
    heights = [_block_shape(kind, P, N, L, block)[0] * cell for _, kind, _ in blocks]
    total = sum(heights) + gap * len(heights) + (cell + gap if scalars else 0)
    height = max(total, 4.0)
    fig = _canvas(spec["title"], 980, int(110 + 60 * height), [-0.3, 17.6], [-0.6, height + 0.4])
    y = height
    ends, cells = [], []
    for label, kind, note in blocks:
        h = _cells(fig, cells, 0.0, y, kind, label, note, P, N, L, block, stored=False, cell=cell)
        ends.append(y - h / 2)
        y -= h + gap
    for i, (label, kind, note) in enumerate(scalars):  # one row of per-token/per-head scalars
        _cells(fig, cells, 1.45 * i, y, kind, label, note, P, N, L, block, stored=False, cell=cell)
    if scalars:
        ends.append(y - cell / 2)
    mid = height / 2
    _box(fig, 6.8, mid - 1.5, 11.0, mid + 1.5, "#f2f2f2", opacity=1.0)
    _label(fig, 8.9, mid + 1.2, "<b>program (b, h)</b>: registers", 12)
    _label(fig, 8.9, mid - 0.15, spec["registers"], 11)
    for y_end in ends:
        _arrow(fig, 4.6, y_end, 6.75, mid + (y_end - mid) * 0.3, color="#555555")
    _label(fig, 5.6, height + 0.15, "tl.load", 12)
    _label(fig, 11.9, mid + 1.1, "tl.store", 12)
    y = mid + 0.6
    for label, kind, note in spec["stores"]:
        h = _cells(fig, cells, 11.6, y, kind, label, note, P, N, L, block, stored=True, cell=cell)
        _arrow(fig, 11.05, mid, 11.55, y - h / 2, color="#555555")
        y -= h + gap
    fig.update_layout(shapes=[*fig.layout.shapes, *cells])
    if puzzle == 1:
        _label(
            fig,
            8.9,
            -0.3,
            f"dotted: lanes p ≥ P = {P} or n ≥ N = {N} of the (BLOCK_P, BLOCK_N) = {block} "
            "block, masked off: neither read nor written",
            11,
        )
    return fig
