"""Notebook 14's teaching side against independent oracles: the token-only tree's match against
a brute-force longest common prefix, the attention-only ideal against the library's hit
reports, the fold data against the library's own grid states, where each strategy resumes
against hand arithmetic, and the explorer's figure against what its controls ask for."""

from __future__ import annotations

import random

import pytest
import torch

from replaylab.teaching.exercises_prefix import (
    RESUME_SCENARIO,
    TokenTree,
    _fold64,
    fold_case,
    resume_points,
    serve_stream,
    token_hit_rate,
)
from replaylab.teaching.plotting_prefix import (
    IDEAL,
    LABELS,
    PrefixExplorer,
    hit_rate_figure,
    hit_rates,
    hit_report_rows,
    ideal_hit_rate,
)


def _lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_token_tree_matches_the_longest_common_prefix_with_any_earlier_prompt():
    """Without a budget the tree holds every token of every prompt it saw, so its match is the
    longest common prefix with any of them: a brute force over the prompts, no tree."""
    rng = random.Random(1)
    for _ in range(300):
        b, vocab = rng.choice((2, 3, 4, 8)), rng.choice((2, 3))
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(5)]
        tree = TokenTree(b)
        for p in prompts:
            tree.insert(p)
        query = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        m, stop = tree.lookup(query)
        assert m == max(_lcp(query, p) for p in prompts), (b, prompts, query)
        assert stop == ("end of prompt" if m == len(query) else "unique tokens")


def _stream():
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 50, (45,), generator=g).tolist()
    return [shared + torch.randint(0, 50, (n,), generator=g).tolist() for n in (10, 7, 12, 3)]


def test_the_ideal_is_what_replay_reaches_and_the_reports_say(tiny_model):
    stream = _stream()
    hits, _ = serve_stream(tiny_model, "replay", stream, 16)
    total = sum(len(t) for t in stream)
    assert ideal_hit_rate(stream) == sum(min(h.matched, h.prompt_length - 1) for h in hits) / total
    assert token_hit_rate(hits) == ideal_hit_rate(stream)  # replay resumes at every match
    align, _ = serve_stream(tiny_model, "snapshot", stream, 16)
    assert [h.resumed_from for h in align] == [0, 32, 32, 32]  # 45 shared: the grid below is 32


def test_fold_case_blocks_chain_into_the_next_grid_state(tiny_model):
    """Folding a full block's whole log onto its checkpoint gives the next block's checkpoint,
    the state the cache saved at the grid point (fp32): the data are what the exercise says."""
    tokens = torch.randint(0, 50, (37,), generator=torch.Generator().manual_seed(4)).tolist()
    blocks, params = fold_case(tiny_model, tokens, 8, layer=2)
    assert [g for g, _, _ in blocks] == [0, 8, 16, 24, 32]
    assert blocks[0][1].abs().max() == 0 and blocks[-1][2]["x"].shape[0] == 5
    for (_, ckpt, log), (_, nxt, _) in zip(blocks, blocks[1:]):
        folded = _fold64(ckpt, log, 8, params)
        assert (folded - nxt).abs().max() <= 1e-6 * nxt.abs().max()


def test_resume_points_by_hand(tiny_model):
    s = RESUME_SCENARIO
    m, T, b, ci = s["shared"], s["T"], s["block_size"], s["checkpoint_interval"]
    assert m % b and m % ci  # the match ends off both grids
    got = resume_points(tiny_model, **s)
    assert got == {
        "replay": (m, T - m),
        "snapshot": (m - m % b, T - m + m % b),
        "recompute": (m - m % ci, T - m + m % ci),
    }


def test_hit_rates_refuse_a_budget_under_one_block_and_report_the_rest(tiny_model):
    rates = hit_rates(tiny_model, 64, 1000, ("replay",), ("shared_docs",))
    assert "refused" in rates["shared_docs"]["replay"]
    assert "budget_bytes" in rates["shared_docs"]["replay"]["refused"]
    rates = hit_rates(tiny_model, 64, None, ("snapshot",), ("shared_docs",))
    row = rates["shared_docs"]["snapshot"]
    lines = hit_report_rows({"snapshot": row["hits"]})
    assert len(lines) == len(row["hits"]) and lines[0].startswith("#0 T=")
    assert "not on the grid" in " ".join(lines) and "unique tokens" in lines[0]
    fig = hit_rate_figure(rates, budget_kb=100)
    assert [t.name for t in fig.data] == [LABELS["snapshot"], LABELS["snapshot"], IDEAL]
    assert list(fig.data[2].y) == [rates["shared_docs"]["ideal"]]
    assert fig.data[1].y[0] == pytest.approx(row["bytes_held"] / 1e3)
    assert fig.layout.shapes[0].y0 == 100 and fig.layout.shapes[0].yref == "y2"


def test_prefix_explorer_controls_move_the_bars(tiny_model, monkeypatch):
    from replaylab.teaching import plotting

    ex = PrefixExplorer(tiny_model, block_size=64, workloads=("shared_system",))
    replay, align = ex.figure.data[0], ex.figure.data[1]
    assert replay.name == "replay" and align.name == LABELS["snapshot"]
    assert align.y[0] > 0 and replay.y[0] == pytest.approx(ex.figure.data[4].y[0])  # the ideal
    ex.controls["block_size"].value = 256  # longer than the shared system prompt
    assert ex.figure.data[1].y[0] == 0 and ex.figure.data[0].y[0] == pytest.approx(replay.y[0])
    assert "block size 256" in ex.figure.layout.title.text
    ex.controls["block_size"].value = 64
    # under one replay block of 64 tokens, but it holds one without its log (the default
    # eviction, lru-fit): served, and replay hits no less than align
    ex.controls["budget_kb"].value = 50
    assert ex.figure.data[0].text == ("",) and ex.figure.data[1].text == ("",)
    assert ex.figure.data[0].y[0] >= ex.figure.data[1].y[0] > 0
    assert ex.figure.layout.shapes[0].y0 == 50
    title = ex.figure.layout.title.text
    assert "mean hit rate replay " in title and "refused" not in title
    ex.controls["block_size"].value = 512  # both refused: one label, no hit rate 0 in the title
    title = ex.figure.layout.title.text
    assert "replay, align (snapshot) refused (budget < one block)" in title
    assert "mean hit rate" not in title and "0.00" not in title
    assert ex.figure.data[0].text == ("refused",) and ex.figure.data[1].text == ("",)
    assert ex.figure.data[2].text == ("refused",) and ex.figure.data[3].text == ("",)
    ex.controls["budget_kb"].value = 0
    assert "budget no cap" in ex.figure.layout.title.text and not ex.figure.layout.shapes
    assert set(ex.results) == {(64, 0), (256, 0), (64, 50), (512, 50), (512, 0)}  # once each
    monkeypatch.setattr(plotting, "static_image", lambda fig, **kw: "<svg>prefix</svg>")
    assert ex._repr_mimebundle_()["image/svg+xml"] == "<svg>prefix</svg>"
