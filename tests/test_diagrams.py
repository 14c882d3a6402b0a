"""The code-drawn diagrams hold the shapes and labels that carry their idea."""

import pytest

from replaylab.teaching import diagrams as d


def _rects(fig):
    return [s for s in fig.layout.shapes if s.type == "rect"]


def test_memory_diagram_kv_grows_and_the_state_does_not():
    fig = d.memory_diagram(steps=(2, 4, 8))
    rects = _rects(fig)
    kv = [r for r in rects if r.fillcolor == d.COLORS["kv"]]
    state = [r for r in rects if r.fillcolor == d.COLORS["state"]]
    assert len(kv) == 2 + 4 + 8  # one row per token
    assert len(state) == 3 and len({(r.y1 - r.y0) for r in state}) == 1  # one size
    text = " ".join(d.labels(fig))
    for t in (2, 4, 8):
        assert f"KV: {t} rows" in text and f"after t = {t} tokens" in text


def test_strategies_diagram_one_row_per_strategy():
    fig = d.strategies_diagram(trunk=6, branch_at=4, branch_len=3)
    text = " ".join(d.labels(fig))
    for name in ("snapshot", "recompute", "replay"):
        assert f"<b>{name}</b>" in text
    assert "state copies" in text and "log of inputs" in text and "re-run the model" in text
    copies = [r for r in _rects(fig) if r.fillcolor == d.COLORS["snapshot"]]
    logs = [r for r in _rects(fig) if r.fillcolor == d.COLORS["log"]]
    assert len(copies) == 5 and len(logs) == 5  # a copy / a log entry after each token
    assert sum(1 for r in _rects(fig) if r.fillcolor == d.COLORS["recompute"]) == 1


def test_replay_log_diagram_cursor_and_entries():
    fig = d.replay_log_diagram(L=8, filled=6, cursor=4)
    full = [r for r in _rects(fig) if r.fillcolor == d.COLORS["log"]]
    empty = [r for r in _rects(fig) if r.fillcolor == "white"]
    assert (len(full), len(empty)) == (6, 2)
    (cursor,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert full[3].x1 < cursor.x0 < full[4].x0  # after the 4th entry
    text = " ".join(d.labels(fig))
    assert "cursor j = 4" in text and "fold" in text and "rollback" in text
    with pytest.raises(ValueError):
        d.replay_log_diagram(L=4, filled=6, cursor=2)


def test_verify_round_diagram_accepts_then_rolls_back():
    fig = d.verify_round_diagram(k=4, accepted=2)
    ok = [r for r in _rects(fig) if r.fillcolor == d.COLORS["accepted"] and r.x0 >= 0]
    bad = [r for r in _rects(fig) if r.fillcolor == d.COLORS["rejected"]]
    assert len(bad) == 2 and len(ok) == 2 + 1  # two drafts accepted, the target's own token
    text = d.labels(fig)
    assert text.count("accept") == 2 and text.count("reject") == 2
    assert any("5 log entries written" in t for t in text)
    assert any("rollback" in t for t in text)
    (cursor,) = [s for s in fig.layout.shapes if s.type == "line"]
    assert ok[1].x1 < cursor.x0 < bad[0].x0
    with pytest.raises(ValueError):
        d.verify_round_diagram(k=2, accepted=3)


WHERE_TAUGHT = {
    "memory_diagram": "01_two_memories.ipynb",
    "strategies_diagram": "03_branching_strategies.ipynb",
    "replay_log_diagram": "05_recompute_vs_replay.ipynb",
    "verify_round_diagram": "07_speculative_rollback.ipynb",
    "puzzle_access_diagram": "06_replay_kernel.ipynb",
}


@pytest.mark.parametrize("name", sorted(WHERE_TAUGHT))
def test_each_diagram_is_drawn_where_its_idea_is_taught(name):
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "notebooks" / WHERE_TAUGHT[name]
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [
        c for c in nb["cells"] if c["cell_type"] == "code" and f"{name}(" in "".join(c["source"])
    ]
    assert cells, f"{path.name} does not draw {name}"
    saved = [o.get("data", {}) for c in cells for o in c.get("outputs", [])]
    assert any("image/svg+xml" in d for d in saved), f"{path.name}: {name} saved without its image"


def test_prefix_grid_diagram_states_on_the_grid_and_a_fold_to_the_match():
    fig = d.prefix_grid_diagram(block_size=4, blocks=3, matched=10, extra=3)
    rects = _rects(fig)
    kv = [r for r in rects if r.fillcolor == d.COLORS["kv"]]
    states = [r for r in rects if r.fillcolor == d.COLORS["state"]]
    log = [r for r in rects if r.fillcolor in (d.COLORS["log"], d.COLORS["replay"])]
    folded = [r for r in rects if r.fillcolor == d.COLORS["replay"]]
    new = [r for r in rects if r.fillcolor == d.COLORS["new"]]
    assert len(kv) == len(log) == 12  # one KV row and one log entry per held token
    assert len(states) == 3  # a state only at the end of each full block
    assert sorted(round((r.x0 + r.x1) / 2, 2) for r in states) == [3.95, 7.95, 11.95]
    assert len(folded) == 2 and all(8 <= r.x0 < 10 for r in folded)  # entries 8, 9: m - g
    assert len(new) == 3 and min(r.x0 for r in new) == 10  # the second request's own tokens
    text = " ".join(d.labels(fig))
    assert "match m = 10" in text and "resume at g = 8" in text
    assert "fold(log[:2])" in text and "re-run tokens 8..9" in text
    with pytest.raises(ValueError, match="matched"):
        d.prefix_grid_diagram(block_size=4, blocks=3, matched=12)


def _cells_of(fig, color):
    return [r for r in _rects(fig) if r.fillcolor == color]


def test_puzzle_access_diagram_one_cell_per_element_and_what_is_written():
    """Each puzzle's diagram draws one cell per element a program (b, h) touches, the masked
    lanes of the copy dotted, and the state written back only where the puzzle writes it."""
    P, N, L = 4, 8, 5
    copy = d.puzzle_access_diagram(1, P=P, N=N, L=L, block=(8, 8))
    masked = _cells_of(copy, d.COLORS["masked"])
    assert len(masked) == 2 * (8 * 8 - 5 * 6)  # the copy's own sizes: P = 5, N = 6
    assert all(r.line.dash == "dot" for r in masked)
    assert len(_cells_of(copy, d.COLORS["state"])) == len(_cells_of(copy, d.COLORS["output"])) == 30
    assert any("masked off" in t for t in d.labels(copy))
    reduce = d.puzzle_access_diagram(2, P=P, N=N, L=L)
    assert len(_cells_of(reduce, d.COLORS["state"])) == P * N
    assert len(_cells_of(reduce, d.COLORS["output"])) == P  # y (P,)
    update = d.puzzle_access_diagram(3, P=P, N=N, L=L)
    assert len(_cells_of(update, d.COLORS["state"])) == 2 * P * N  # read, then written back
    assert any("the snapshot write" in t for t in d.labels(update))
    fold = d.puzzle_access_diagram(5, P=P, N=N, L=L)
    assert len(_cells_of(fold, d.COLORS["log"])) == L * (P + 1 + N)  # x, dt, B per token
    assert len(_cells_of(fold, d.COLORS["output"])) == P * N  # out, once
    step = d.puzzle_access_diagram(6, P=P, N=N, L=L)
    assert len(_cells_of(step, d.COLORS["state"])) == P * N  # read once, never written
    assert len(_cells_of(step, d.COLORS["output"])) == P
    assert any("S written 0 times" in t for t in d.labels(step))
    for puzzle in range(1, 7):
        text = " ".join(d.labels(d.puzzle_access_diagram(puzzle)))
        assert "tl.load" in text and "tl.store" in text and "program (b, h)" in text
    with pytest.raises(ValueError, match="puzzle"):
        d.puzzle_access_diagram(7)
