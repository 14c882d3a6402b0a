"""The timeline of one speculative round (``replaylab.teaching.timeline``): what it records
equals what the cache's stats and bytes say, and what each strategy must do in that round, worked out
here from the round's arithmetic (prompt T, k drafts, j accepted, interval I, log length L)."""

import pytest
import torch

from replaylab.cache import CacheConfig
from replaylab.strategies import STRATEGY_NAMES
from replaylab.teaching.timeline import PANELS, Recorder, speculative_round, timeline_figure
from replaylab.testing import tiny_hybrid

MODEL = tiny_hybrid()
CFG = MODEL.cfg
H, P, N, G = CFG.ssm_heads, CFG.ssm_head_dim, CFG.d_state, CFG.n_groups
LAYERS = CFG.pattern.count("M")
FP32 = 4  # the tiny model computes in fp32; the state is fp32 anyway
CONV = H * P + 2 * G * N
# one position's memory, all recurrent layers: state + conv window
COPY = LAYERS * (H * P * N * FP32 + (CFG.d_conv - 1) * CONV * FP32)
# one token's replay log entry, all recurrent layers: xBC, x, dt, B and C
ENTRY = LAYERS * (CONV + H * P + H + 2 * G * N) * FP32
EVENTS = ["prefill", "snapshot", "verify", "truncate_to", "release", "decode"]


def series(steps, name):
    return [getattr(s, name) for s in steps]


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_recorded_numbers_are_the_caches_own(strategy):
    rec = speculative_round(MODEL, strategy, prompt_len=10, k=4, accepted=1)
    steps, stats = rec.steps, rec.cache.stats
    assert [s.event.split()[0] for s in steps] == EVENTS
    assert sum(series(steps, "rerun_tokens")) == stats.recomputed_tokens
    assert sum(series(steps, "restores")) == stats.restores == 1  # the truncate_to
    assert sum(series(steps, "folded_tokens")) == stats.folded_tokens
    assert steps[-1].nbytes == rec.cache.nbytes()
    assert max(s.total_bytes for s in steps) == stats.peak_bytes
    # positions: prompt, the pending token + 4 drafts, back to pending + 1 accepted, one more
    assert series(steps, "position") == [10, 10, 15, 12, 12, 13]
    assert series(steps, "kv_rows") == series(steps, "position")


@pytest.mark.parametrize("k, j", [(4, 1), (4, 0), (6, 3)])
def test_snapshot_copies_a_state_per_verified_token(k, j):
    steps = speculative_round(MODEL, "snapshot", prompt_len=10, k=k, accepted=j).steps
    # snapshot() copies once; the verify keeps a copy after each of its k + 1 tokens
    assert series(steps, "copies_made") == [0, 1, k + 1, 0, 0, 0]
    # truncate_to keeps the handle and the copies up to the kept position; release drops all
    assert series(steps, "copies_held") == [0, 1, k + 2, j + 2, 0, 0]
    assert [s.nbytes["snapshots"] for s in steps] == [
        c * COPY for c in series(steps, "copies_held")
    ]
    assert series(steps, "rerun_tokens") == [0] * 6


@pytest.mark.parametrize(
    "prompt_len, j, interval",
    [(10, 1, 8), (14, 1, 8), (14, 0, 8), (10, 2, 4)],
)
def test_recompute_reruns_the_distance_from_its_checkpoint(prompt_len, j, interval):
    k = 4
    steps = speculative_round(
        MODEL, "recompute", prompt_len=prompt_len, k=k, accepted=j, interval=interval
    ).steps
    kept = prompt_len + 1 + j  # the pending token and j drafts
    # the checkpoint the rollback starts from: the last multiple of I at or before `kept`
    # (recompute keeps one every I tokens; snapshot() keeps the latest at or before its
    # position and those after it)
    base = interval * (prompt_len // interval)
    checkpoint = interval * (kept // interval)
    assert steps[3].rerun_tokens == kept - checkpoint
    assert sum(series(steps, "rerun_tokens")) == kept - checkpoint
    verified = tuple(range(base, prompt_len + k + 2, interval))
    assert steps[2].checkpoint_positions == tuple(p for p in verified if p > 0)
    assert steps[3].checkpoint_positions == tuple(p for p in verified if 0 < p <= checkpoint)
    for s in steps:
        assert s.nbytes["checkpoints"] == s.checkpoints_held * COPY
        assert s.copies_held == s.log_cursor == 0


@pytest.mark.parametrize("k, j", [(4, 1), (4, 0), (6, 3)])
def test_replay_moves_its_cursor_back_without_rerunning(k, j):
    T, L = 10, 8
    steps = speculative_round(MODEL, "replay", prompt_len=T, k=k, accepted=j, log_length=L).steps
    # the prefill fills the log past L: folded into a checkpoint at T; nothing else folds
    # (the snapshot pins the log at T, and the round stays short of T + L afterwards)
    assert series(steps, "folds") == [1, 0, 0, 0, 0, 0]
    assert all(s.checkpoint_positions == (T,) for s in steps)
    assert series(steps, "log_cursor") == [0, 0, k + 1, j + 1, j + 1, j + 2]
    assert steps[2].log_cursor - steps[3].log_cursor == k - j  # the rejected drafts
    assert series(steps, "rerun_tokens") == [0] * 6
    for s in steps:
        assert s.log_cursor == s.position - T
        assert s.nbytes["logs"] == s.log_cursor * ENTRY
        assert s.checkpoints_held == 1 and s.copies_held == 0


@torch.no_grad()
def test_replay_folds_every_L_tokens_while_decoding():
    T, L, steps_n = 6, 4, 11
    cache = CacheConfig("replay", log_length=L).build(MODEL, 1)
    rec = Recorder(cache)
    tok = torch.randint(0, CFG.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    logits = MODEL(tok, cache)
    rec.record("prefill")
    for _ in range(steps_n):
        logits = MODEL(logits[:, -1:].argmax(-1), cache)
        rec.record("decode 1")
    # prefill of T >= L: folded at T; then a fold each time the log reaches L entries
    expect_ck = [T + L * ((n - T) // L) for n in range(T, T + steps_n + 1)]
    assert [s.checkpoint_positions[0] for s in rec.steps] == expect_ck
    assert series(rec.steps, "log_cursor") == [(n - T) % L for n in range(T, T + steps_n + 1)]
    assert sum(series(rec.steps, "folds")) == 1 + steps_n // L
    assert sum(series(rec.steps, "folded_tokens")) == cache.stats.folded_tokens


@pytest.mark.figures
def test_figure_one_panel_per_strategy_same_fixed_range():
    timelines = {s: speculative_round(MODEL, s).steps for s in STRATEGY_NAMES}
    fig = timeline_figure(timelines)
    layout = fig.to_dict()["layout"]
    axes = [layout[f"yaxis{i if i > 1 else ''}"] for i in range(1, len(STRATEGY_NAMES) + 1)]
    ranges = {tuple(a["range"]) for a in axes}
    assert len(ranges) == 1  # the same fixed range on every panel
    top = max(getattr(st, q) for s in STRATEGY_NAMES for st in timelines[s] for q in PANELS[s])
    assert ranges.pop() == (0, top + 1)
    colours = {}
    for trace in fig.data:
        panel = int(trace.yaxis[1:] or 1) - 1
        strategy = STRATEGY_NAMES[panel]
        quantity = trace.legendgroup
        assert quantity in PANELS[strategy]
        assert list(trace.y) == series(timelines[strategy], quantity)
        colour = trace.marker.color if trace.type == "bar" else trace.line.color
        assert colours.setdefault(quantity, colour) == colour  # one colour per quantity
    assert len(set(colours.values())) == len(colours)  # and distinct
    assert sum(len(PANELS[s]) for s in STRATEGY_NAMES) == len(fig.data)


def test_round_checks_its_acceptance():
    with pytest.raises(ValueError, match="accepted"):
        speculative_round(MODEL, "replay", k=2, accepted=2)
